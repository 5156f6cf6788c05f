"""What the READMEs show runs: every ```python block of README.md and the commands it shows
after `bash scripts/demo`, and `examples/my_env/README.md`'s command, each after the command
that precedes it.

A directory laid out like the repository (`configs/`, `examples/`, `.venv` linked to this
one) gets the demo, shrunk with `--set` (two models, two budgets, five tasks, one sample), so
`runs/demo` resolves as it does after `bash scripts/demo`; every `collector` command shown is
run there verbatim (shrunk the same way when it is a `collector run`), and the Python blocks
run in order, in one namespace, in a subprocess (except the one marked as run against a
local S3 server by `tests/storage/test_s3_readers.py`). A block may import only what the collector
installs or what a `pip install` line shown before it names. The one name the README leaves
to the reader, a Hugging Face `tokenizer` (downloaded from the Hub), is given as a Jinja
ChatML-with-tools template with the same `apply_chat_template` call: no network in tests.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MY_ENV_README = REPO / "examples" / "my_env" / "README.md"
TEMPLATE = REPO / "tests" / "analysis" / "chatml_tools.jinja"
BIN = Path(sys.executable).parent
#: Applied to every `collector run` shown: the same sweep's shape, a few seconds of work.
SHRINK = ["--set", 'sweep.models=["sim-terse","sim-verbose"]', "--set", "sweep.budgets=[32,256]",
          "--set", "samples_per_task=1", "--set", "env.tasks=5"]
#: Marks the README block that reads a bucket: run against a loopback S3 server elsewhere.
S3_MARK = "<!-- run by tests/storage/test_s3_readers.py against a local S3 server -->"
#: A generous guard against a hung command, never a measurement.
GUARD_S = 600

pytestmark = pytest.mark.slow


def python_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line number, code, the text between the previous fence and this block) per ```python block."""
    blocks, previous_end = [], 0
    for match in re.finditer(r"^```(\w*)\n(.*?)^```\n", text, flags=re.S | re.M):
        if match.group(1) == "python":
            line = text.count("\n", 0, match.start()) + 1
            blocks.append((line, match.group(2), text[previous_end:match.start()]))
        previous_end = match.end()
    return blocks


def indented_commands(text: str, after: str) -> list[str]:
    """The commands of the indented block following the first line containing `after`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) + 1
    while not lines[start].startswith("    "):
        start += 1
    commands = []
    for line in lines[start:]:
        if not line.startswith("    "):
            break
        if line.strip() and not line.strip().startswith("#"):
            commands.append(line.strip())
    return commands


def without_comment(command: str) -> str:
    """The command with a trailing `# ...` comment removed (shlex keeps quoted `#`s)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=False)
    lexer.whitespace_split, lexer.commenters = True, "#"
    return shlex.join(list(lexer))


def user_env(root: Path) -> dict[str, str]:
    """A user's shell: the venv's bin first, no test-session Ray variables, Hugging Face offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(HF_HOME=str(root / ".hf"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", MPLBACKEND="Agg")
    return env


def shell(root: Path, command: str) -> subprocess.CompletedProcess[str]:
    """Run one command as shown (a `collector run` shrunk), in `root`."""
    words = shlex.split(without_comment(command))
    if any(w.endswith("collector") for w in words) and "run" in words:
        words += SHRINK
    return subprocess.run(shlex.join(words), shell=True, cwd=root, env=user_env(root), text=True,
                          capture_output=True, timeout=GUARD_S)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory laid out like the repository, after a (shrunk) `bash scripts/demo`."""
    root = tmp_path_factory.mktemp("repo")
    for name in ("configs", "examples"):
        (root / name).symlink_to(REPO / name)
    (root / ".venv").symlink_to(BIN.parent)
    # scripts/demo is `.venv/bin/collector run configs/demo.toml "$@"`: the same, shrunk.
    done = shell(root, ".venv/bin/collector run configs/demo.toml --quiet")
    assert done.returncode == 0, done.stderr
    return root


def test_commands_after_the_demo_run_as_shown(root: Path) -> None:
    """Each command README.md shows after `bash scripts/demo` exits 0 on the demo's run dir."""
    text = README.read_text(encoding="utf-8")
    commands = indented_commands(text, "The demo writes `runs/demo/`")
    assert len(commands) >= 6
    assert all(c.startswith(".venv/bin/collector ") for c in commands)
    listing = shell(root, ".venv/bin/collector episodes runs/demo --limit 1 --format json")
    episode_id = json.loads(listing.stdout.splitlines()[0])["episode_id"]
    for command in commands:
        done = shell(root, command.replace("<episode_id>", episode_id))
        assert done.returncode == 0, f"{command}: {done.stderr}"
        assert done.stdout.strip(), command
    for command in indented_commands(text, "## Train on it"):
        done = shell(root, command)
        assert done.returncode == 0, f"{command}: {done.stderr}"


def test_python_blocks_import_only_what_is_installed_or_said() -> None:
    """A README block imports only the collector's dependencies or what a `pip install` before it names."""
    installed = _collector_distributions()
    owners = importlib.metadata.packages_distributions()
    for line, code, before in python_blocks(README.read_text(encoding="utf-8")):
        said = {_normal(re.split(r"[\[<>=]", w, maxsplit=1)[0])
                for m in re.finditer(r"pip install ([^\n]+)", before) for w in shlex.split(m.group(1))
                if not w.startswith("-")}
        for module in _third_party_imports(code):
            dists = {_normal(d) for d in owners.get(module, [module])}
            assert dists & (installed | said), f"README.md:{line} imports {module}: not installed, not said"


def test_python_blocks_run_after_the_commands_before_them(root: Path) -> None:
    """Every ```python block of README.md runs, in order, in the demo's directory."""
    text = README.read_text(encoding="utf-8")
    for command in indented_commands(text, "## Loading shards into a trainer"):
        if "collector run" in command:  # the Parquet run the first readers open
            done = shell(root, command)
            assert done.returncode == 0, f"{command}: {done.stderr}"
    # A block that needs an S3 server is marked so and run by tests/storage/test_s3_readers.py.
    blocks = [(line, code) for line, code, before in python_blocks(text) if S3_MARK not in before]
    assert len(blocks) >= 4
    script = root / "readme_blocks.py"
    script.write_text(RUNNER.format(template=str(TEMPLATE), blocks=json.dumps(blocks)), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=root, env=user_env(root), text=True,
                          capture_output=True, timeout=GUARD_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == f"{len(blocks)} blocks ran"


def test_my_env_readme_command_runs(root: Path) -> None:
    """`examples/my_env/README.md`'s commands run from the repository root (shrunk like the demo)."""
    lines = MY_ENV_README.read_text(encoding="utf-8").replace("\\\n", " ").splitlines()
    shown = "PYTHONPATH=examples collector run"
    commands = [line.strip() for line in lines if line.strip().startswith(shown)]
    assert len(commands) == 2
    for index, command in enumerate(commands):
        done = shell(root, f"{command} --set output.path=runs/my_env{index} --quiet")
        assert done.returncode == 0, f"{command}: {done.stderr}"
        assert "episodes committed" in done.stderr


RUNNER = '''
import json, sys, traceback

import jinja2


class ChatTemplateTokenizer:
    """`tokenizer.apply_chat_template(messages, tools=..., tokenize=False)` over a ChatML template."""

    def __init__(self, path):
        env = jinja2.Environment(undefined=jinja2.StrictUndefined)
        env.globals["raise_exception"] = lambda message: (_ for _ in ()).throw(jinja2.TemplateError(message))
        self._template = env.from_string(open(path, encoding="utf-8").read())

    def apply_chat_template(self, messages, tools=None, tokenize=True):
        assert not tokenize
        return self._template.render(messages=messages, tools=tools, add_generation_prompt=False)


namespace = {{"__name__": "__readme__", "tokenizer": ChatTemplateTokenizer({template!r})}}
blocks = json.loads({blocks!r})
for line, code in blocks:
    try:
        exec(compile(code, f"README.md:{{line}}", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"README.md block at line {{line}} failed")
        sys.exit(1)
print(f"{{len(blocks)}} blocks ran")
'''


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _third_party_imports(code: str) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m != "collector"}


def _collector_distributions() -> set[str]:
    """The collector and everything its plain install pulls in (no extras), by distribution name."""
    seen: set[str] = set()
    todo = ["collector"]
    while todo:
        name = _normal(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            if "extra ==" in requirement:
                continue
            todo.append(re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0])
    return seen
