"""What the README and docs/ show runs: every block the suite can run, on a demo run.

A directory laid out like the repository (`configs/`, `examples/`, `.venv` linked to this
one) gets the demo, shrunk with `--set` (two models, two budgets, five tasks, one sample), so
`runs/demo` resolves as it does after `bash scripts/demo`. Then, for README.md and every page
of docs/ (`tests/docblocks.py` finds the blocks and their markers): every `collector`
command of an unmarked shell block is run there verbatim (shrunk the same way when it is a
`collector run`; the runs first, since the readers read them), and the Python blocks run in
order, one namespace per page, in a subprocess (except those marked as run by another test,
such as the bucket readers `tests/storage/test_s3_readers.py` runs against a local S3
server). A block may import only what the collector installs or what a `pip install` line
shown before it names. The one name the docs leave to the reader, a Hugging Face
`tokenizer` (downloaded from the Hub), is given as a Jinja ChatML-with-tools template with
the same `apply_chat_template` call: no network in tests. The run directory's tree shown in
docs/data-format.md is compared with the demo's. `examples/my_env/README.md`'s commands run
too. What needs no run (TOML, the parser, links, generated pages) is in tests/test_docs.py.
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

from tests.docblocks import REPO, Block, all_blocks, commands, is_collector, rel, without_comment, words_of

README = REPO / "README.md"
MY_ENV_README = REPO / "examples" / "my_env" / "README.md"
TEMPLATE = REPO / "tests" / "analysis" / "chatml_tools.jinja"
BIN = Path(sys.executable).parent
#: Applied to every `collector run` shown: the same sweep's shape, a few seconds of work, its
#: workers in process (`--in-process`): what is checked is the run directory the readers' commands
#: read, which is the same whichever pool wrote it, and a Ray start (about 13 s, in every xdist
#: worker that sets up `root`) would add nothing. A user's `collector run` on the embedded
#: cluster is tests/system/run/test_embedded_cluster.py's and test_cli_process.py's.
SHRINK = ["--set", 'sweep.models=["sim-terse","sim-verbose"]', "--set", "sweep.budgets=[32,256]",
          "--set", "samples_per_task=1", "--set", "env.tasks=5", "--in-process"]
#: Marks the block that reads a bucket (docs/clusters.md): run against a loopback S3 server elsewhere.
S3_MARK = "<!-- run by tests/system/storage/test_s3_readme.py against a local S3 server -->"
#: A generous guard against a hung command, never a measurement.
GUARD_S = 600



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


def runnable_shell_blocks() -> list[Block]:
    """The shell blocks no marker leaves to another test or to a reader with a cluster."""
    return [b for b in all_blocks() if b.lang == "sh" and not (b.run_by or b.not_run or b.checked)]


def shown_collector_commands(run: bool) -> list[tuple[Block, str]]:
    """The `collector` commands of those blocks: the `collector run`s, or every other one."""
    found = []
    for block in runnable_shell_blocks():
        for command in commands(block.code):
            words = words_of(command)[0]
            if is_collector(words) and (words[1] == "run") == run:
                found.append((block, command))
    return found


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory laid out like the repository, after a (shrunk) `bash scripts/demo`, and after
    every `collector run` the pages show (the Parquet run the readers open)."""
    root = tmp_path_factory.mktemp("repo")
    for name in ("configs", "examples"):
        (root / name).symlink_to(REPO / name)
    (root / ".venv").symlink_to(BIN.parent)
    # scripts/demo is `.venv/bin/collector run configs/demo.toml "$@"`: the same, shrunk.
    done = shell(root, ".venv/bin/collector run configs/demo.toml --quiet")
    assert done.returncode == 0, done.stderr
    for block, command in shown_collector_commands(run=True):
        done = shell(root, command)
        assert done.returncode == 0, f"{block.where}: {command}: {done.stderr}"
    return root


def _after_the_demo() -> Block:
    """README.md's block of commands to try on the demo's run."""
    [after] = [b for b in runnable_shell_blocks()
               if b.page == README and "The demo writes `runs/demo/`" in b.before]
    return after


@pytest.fixture(scope="module")
def episode_id(root: Path) -> str:
    """An id `collector show runs/demo <episode_id>` can be given (listed the way the README says)."""
    listing = shell(root, ".venv/bin/collector episodes runs/demo --limit 1 --format json")
    return str(json.loads(listing.stdout.splitlines()[0])["episode_id"])


def test_readme_commands_after_the_demo_run_as_shown(root: Path, episode_id: str) -> None:
    """Each command README.md shows after `bash scripts/demo` exits 0 and prints something."""
    shown = commands(_after_the_demo().code)
    assert len(shown) >= 6
    assert all(c.startswith(".venv/bin/collector ") for c in shown)
    for command in shown:
        done = shell(root, command.replace("<episode_id>", episode_id))
        assert done.returncode == 0, f"{command}: {done.stderr}"
        assert done.stdout.strip(), command


def test_every_collector_command_shown_runs(root: Path, episode_id: str) -> None:
    """Every other `collector` command of an unmarked shell block (README.md and docs/) exits 0."""
    shown = [(b, c) for b, c in shown_collector_commands(run=False) if b != _after_the_demo()]
    assert {rel(b.page) for b, _ in shown} >= {"docs/data-format.md"}
    for block, command in shown:
        done = shell(root, command.replace("<episode_id>", episode_id))
        assert done.returncode == 0, f"{block.where}: {command}: {done.stderr}"


def _python_blocks() -> list[Block]:
    """The Python blocks this module runs: all but those marked as run by another test."""
    return [b for b in all_blocks() if b.lang == "python" and not b.run_by]


def test_python_blocks_import_only_what_is_installed_or_said() -> None:
    """A block imports only the collector's dependencies or what a `pip install` before it names."""
    installed = _collector_distributions()
    owners = importlib.metadata.packages_distributions()
    for block in [b for b in all_blocks() if b.lang == "python"]:
        text = block.page.read_text(encoding="utf-8")
        before = text[:text.index(block.code)]
        said = {_normal(re.split(r"[\[<>=]", w, maxsplit=1)[0])
                for m in re.finditer(r"pip install ([^\n]+)", before)
                for w in shlex.split(without_comment(m.group(1))) if not w.startswith("-")}
        for module in _third_party_imports(block.code):
            dists = {_normal(d) for d in owners.get(module, [module])}
            assert dists & (installed | said), f"{block.where} imports {module}: not installed, not said"


def test_python_blocks_run_in_order_page_by_page(root: Path) -> None:
    """Every Python block of README.md and docs/ runs, in order, one namespace per page, in the
    demo's directory."""
    blocks = _python_blocks()
    assert {rel(b.page) for b in blocks} >= {"README.md", "docs/data-format.md"}
    assert len(blocks) >= 5
    script = root / "doc_blocks.py"
    shown = [(rel(b.page), b.line, b.code) for b in blocks]
    script.write_text(RUNNER.format(template=str(TEMPLATE), blocks=json.dumps(shown)), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=root, env=user_env(root), text=True,
                          capture_output=True, timeout=GUARD_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == f"{len(blocks)} blocks ran"


def _storage_strings() -> set[str]:
    """Every string literal of collector/storage (the names the run directory's files get)."""
    found = set()
    for path in (REPO / "collector" / "storage").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return found


def test_run_directory_tree_shown_matches_a_run(root: Path) -> None:
    """Each entry of docs/data-format.md's run-directory tree is in the demo's run directory, or
    (a file only a crash or a long run leaves: a commit record, quarantine) named by the storage."""
    [layout] = [b for b in all_blocks() if b.checked == "layout"]
    lines = layout.code.splitlines()
    run = root / lines[0].strip().rstrip("/")
    assert run.is_dir(), f"{layout.where}: {lines[0]} is not where the demo writes"
    strings, seen = _storage_strings(), 0
    for line in lines[1:]:
        entry = line.split()[0]
        if "..." in entry:
            continue
        pattern = re.sub(r"[0-9a-f]{6,}", "*", entry.rstrip("/"))
        if any(p.is_dir() == entry.endswith("/") for p in run.glob(pattern)):
            seen += 1
            continue
        stem = Path(pattern).name.split("*")[0]  # "commit-", "quarantine"
        assert any(stem in s for s in strings), f"{layout.where}: {entry}: in no run, not in storage"
    assert seen >= 4, f"{layout.where}: only {seen} entries found in a real run directory"


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


tokenizer = ChatTemplateTokenizer({template!r})
blocks = json.loads({blocks!r})
namespaces = {{}}
for page, line, code in blocks:
    # One namespace per page: a page's blocks build on each other, never on another page's.
    namespace = namespaces.setdefault(page, {{"__name__": "__docs__", "tokenizer": tokenizer}})
    try:
        exec(compile(code, f"{{page}}:{{line}}", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"{{page}} block at line {{line}} failed")
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
