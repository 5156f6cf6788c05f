"""A harness that misbehaves on purpose, chosen by its first argument (the system tests' subject).

- `hang-after-cut`: starts a child that would sleep for minutes (its pid in `child.pid`), asks
  the model once at a cap that cuts, then sleeps itself: the gateway must end the episode and
  the runner stop both processes.
- `crash`: writes to stderr and exits with status 3.
- `silent`: exits 0 without calling the model.
- `sleep`: never exits on its own (the wall-clock limit ends it).
- `env`: writes its environment to `env.json`, then calls the model once.
- `fork-and-sleep`: starts a child, writes both pids (`child.pid`, `harness.pid`), sleeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def ask(task: str) -> None:
    OpenAI(max_retries=0).chat.completions.create(
        model="any", messages=[{"role": "user", "content": task}], tools=TOOLS
    )  # type: ignore[arg-type]


def main() -> None:
    mode, task = sys.argv[1], sys.argv[2]
    if mode == "hang-after-cut":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        Path("child.pid").write_text(str(child.pid))
        ask(task)
        time.sleep(300)
    elif mode == "crash":
        print("boom: the harness fell over", file=sys.stderr)
        sys.exit(3)
    elif mode == "silent":
        return
    elif mode == "sleep":
        time.sleep(300)
    elif mode == "fork-and-sleep":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        Path("child.pid").write_text(str(child.pid))
        Path("harness.pid").write_text(str(os.getpid()))
        time.sleep(300)
    elif mode == "env":
        Path("env.json").write_text(json.dumps(dict(os.environ)))
        ask(task)


if __name__ == "__main__":
    main()
