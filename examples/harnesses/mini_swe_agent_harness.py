"""mini-swe-agent (PyPI `mini-swe-agent`, 2.x) as a harness: its own agent, bash environment and
LiteLLM model, pointed at the collector's gateway.

This is mini-swe-agent's `hello_world` set-up with its tool-calling config (`mini.yaml`): a
`DefaultAgent` driving a `LitellmModel` (one `bash` tool; the agent ends when a command's
output starts with `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`) and a `LocalEnvironment` that
runs each command with `bash` in a subshell of the working directory. Only what a run needs
is changed: the model is the gateway's (`OPENAI_BASE_URL`, `OPENAI_API_KEY`), cost tracking
is off (the gateway's models have no price), the step limit is 8, and each command
is logged before it runs (one JSON line per execution in `executions.jsonl`: the id of the
tool call it came from, and the command), next to mini-swe-agent's own trajectory
(`trajectory.json`).

mini-swe-agent runs the call of any reply whose arguments parse, a reply cut at the cap
included (it reads `finish_reason` only to word its message after a reply with no call): the
gateway is what keeps a cut turn's call from running.

    python examples/harnesses/mini_swe_agent_harness.py "Write the sum of 17 and 25 to answer.txt."

It exits 0 when the agent stopped on its own (submitted, or gave up at its limits): the
grader reads the working directory. A refused request (the gateway ended the episode) is an
exception and a non-zero exit.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

WORKDIR = Path.cwd()
# Before mini-swe-agent is imported: its start-up banner and its global config directory
# (under the working directory, not the user's home), and LiteLLM's bundled price table
# (it would fetch one from the network otherwise). One attempt per query: the gateway
# already retries the provider, and an error it returns is final.
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", str(WORKDIR / ".mini-swe-agent"))
os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import yaml  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import builtin_config_dir  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402


class LoggedEnvironment(LocalEnvironment):
    """mini-swe-agent's local environment, logging each command before it runs."""

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        entry = {"id": action.get("tool_call_id"), "command": action.get("command", "")}
        with (WORKDIR / "executions.jsonl").open("a") as log:
            log.write(json.dumps(entry) + "\n")
        return super().execute(action, cwd, timeout=timeout)


def main(task: str, step_limit: int = 8) -> int:
    config = yaml.safe_load((builtin_config_dir / "mini.yaml").read_text())
    model = LitellmModel(
        model_name="openai/gateway",  # LiteLLM's OpenAI route; the gateway answers with the cell's model
        model_kwargs={
            **config["model"].get("model_kwargs", {}),
            "api_base": os.environ["OPENAI_BASE_URL"],
            "api_key": os.environ["OPENAI_API_KEY"],
        },
        observation_template=config["model"]["observation_template"],
        format_error_template=config["model"]["format_error_template"],
        cost_tracking="ignore_errors",
    )
    environment = LoggedEnvironment(cwd=str(WORKDIR), **config["environment"])
    agent_config = {**config["agent"], "step_limit": step_limit, "cost_limit": 0.0}
    agent = DefaultAgent(model, environment, **agent_config, output_path=WORKDIR / "trajectory.json")
    result = agent.run(task)
    print(result.get("exit_status", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
