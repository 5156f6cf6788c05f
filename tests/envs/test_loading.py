"""Loading environments by name or `package.module:attr`, and tasks from JSONL/Parquet files."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collector.envs.arithmetic import ArithmeticEnv
from collector.envs.base import Environment, EpisodeWorld, Task
from collector.envs.loading import TaskFileEnvironment, load_environment
from collector.envs.support_desk import SupportDeskEnv
from collector.envs.tasks import load_tasks
from collector.errors import ConfigError
from collector.turn import ArgStatus, AssistantMessage, SystemMessage, ToolResultMessage, UserMessage

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CHAT_PROMPT = [
    {"role": "system", "content": "You are a support agent."},
    {"role": "user", "content": "What is the status of order A-1?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "fs1",
                "type": "function",
                "function": {"name": "lookup_order", "arguments": '{"order_id": "A-1"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "fs1", "content": '{"status": "shipped"}'},
    {"role": "assistant", "content": "It is shipped."},
    {"role": "user", "content": [{"type": "text", "text": "What is the status of order A-1007?"}]},
]


def test_builtins_load_by_name_with_options() -> None:
    """Built-in names load their environment; options go to the constructor."""
    env = load_environment("arithmetic", {"num_tasks": 3, "seed": 1})
    assert isinstance(env, ArithmeticEnv)
    assert len(env.tasks()) == 3
    assert env.name == "arithmetic"
    assert isinstance(load_environment("support_desk", {}), SupportDeskEnv)


def test_module_attr_specs_load_instances_classes_and_factories() -> None:
    """`package.module:attr` accepts a class, a factory or an instance."""
    assert isinstance(
        load_environment("collector.envs.arithmetic:ArithmeticEnv", {"num_tasks": 2}), ArithmeticEnv
    )
    env = load_environment("collector.envs.support_desk:SupportDeskEnv", None)
    assert env.name == "support_desk"


@pytest.mark.parametrize(
    ("spec", "options", "message"),
    [
        ("nope", {}, "neither a built-in"),
        ("no_such_module_xyz:Env", {}, "cannot import module"),
        ("collector.envs.arithmetic:Missing", {}, "has no attribute"),
        ("arithmetic", {"bogus": 1}, "rejected the options"),
        ("collector.envs.arithmetic:PROMPT", {}, "not an Environment"),
        ("collector.envs.arithmetic:evaluate", {"expression": "1"}, "did not produce an Environment"),
    ],
)
def test_bad_specs_are_one_line_config_errors(spec: str, options: dict[str, object], message: str) -> None:
    """Every loading failure is a one-line ConfigError naming the problem."""
    with pytest.raises(ConfigError, match=message) as info:
        load_environment(spec, options)
    assert "\n" not in str(info.value)


def test_example_environment_outside_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example user environment in examples/my_env loads from `my_env:environment`."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delitem(sys.modules, "my_env", raising=False)
    env = load_environment("my_env:environment", {})
    assert env.name == "unit_prices"
    assert len(env.tasks()) > 0
    env = load_environment("my_env:UnitPricesEnv", {"num_tasks": 4})
    assert len(env.tasks()) == 4


def test_options_for_an_instance_name_the_class_to_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """Options given to an exported instance are refused in one line naming the exported class,
    and that name takes the same options."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delitem(sys.modules, "my_env", raising=False)
    with pytest.raises(ConfigError) as info:
        load_environment("my_env:environment", {"num_tasks": 3})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("env.options: 'my_env:environment' is an environment instance")
    assert message.endswith("env.name = 'my_env:UnitPricesEnv'")
    assert len(load_environment("my_env:UnitPricesEnv", {"num_tasks": 3}).tasks()) == 3


def test_jsonl_tasks_with_chat_prompts(tmp_path: Path) -> None:
    """JSONL rows load with string or chat-message prompts, few-shot tool calls included."""
    file = tmp_path / "tasks.jsonl"
    rows = [
        {"id": "a", "prompt": "What is 2 + 3? Use the calculator tool, then reply with the number only."},
        {"prompt": CHAT_PROMPT, "metadata": json.dumps({"source": "x"})},
    ]
    file.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    tasks = load_tasks(file)
    assert [t.id for t in tasks] == ["a", "tasks-2"]
    assert tasks[1].metadata == {"source": "x"}
    prompt = tasks[1].prompt
    assert isinstance(prompt, list)
    assert [type(m) for m in prompt] == [
        SystemMessage,
        UserMessage,
        AssistantMessage,
        ToolResultMessage,
        AssistantMessage,
        UserMessage,
    ]
    assert isinstance(prompt[2], AssistantMessage)
    assert prompt[2].tool_calls[0].arguments == {"order_id": "A-1"}
    assert isinstance(prompt[3], ToolResultMessage)
    assert prompt[3].name == "lookup_order"


def test_parquet_tasks_and_task_file_option(tmp_path: Path) -> None:
    """A Parquet task file feeds a built-in env through options["task_file"]; worlds come from prompts."""
    file = tmp_path / "desk.parquet"
    table = pa.Table.from_pylist(
        [
            {"id": "p1", "prompt": "What is the status of order A-1007?"},
        ]
    )
    pq.write_table(table, file)
    env = load_environment("support_desk", {"task_file": str(file)})
    assert isinstance(env, TaskFileEnvironment)
    assert env.name == "support_desk"
    (task,) = env.tasks()
    world = env.start(task)
    assert "A-1007" in world.orders

    chat_file = tmp_path / "chat.parquet"
    flat = [*CHAT_PROMPT[:-1], {"role": "user", "content": "What is the status of order A-1007?"}]
    pq.write_table(pa.Table.from_pylist([{"id": "c", "prompt": flat, "metadata": {"k": "v"}}]), chat_file)
    (chat,) = load_tasks(chat_file)
    assert isinstance(chat.prompt, list)
    assert chat.metadata == {"k": "v"}
    world = load_environment("support_desk", {}).start(chat)
    assert world.kind == "lookup"
    assert world.params["order_id"] == "A-1007"


def test_malformed_few_shot_arguments_are_kept_malformed(tmp_path: Path) -> None:
    """Few-shot arguments that are not a JSON object load as MALFORMED (replayed as "{}"), never repaired."""
    prompt = [dict(m) for m in CHAT_PROMPT]
    prompt[2] = {
        "role": "assistant",
        "tool_calls": [
            {"id": "fs1", "function": {"name": "lookup_order", "arguments": '{"order_id": "A-1"'}}
        ],
    }
    file = tmp_path / "t.jsonl"
    file.write_text(json.dumps({"id": "x", "prompt": prompt}))
    (task,) = load_tasks(file)
    assert isinstance(task.prompt, list)
    assert isinstance(task.prompt[2], AssistantMessage)
    assert task.prompt[2].tool_calls[0].status is ArgStatus.MALFORMED


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"id": "x"}, "missing column 'prompt'"),
        ({"prompt": 5}, "prompt must be a string"),
        ({"prompt": "p", "metadata": "{"}, "metadata is not valid JSON"),
        ({"prompt": CHAT_PROMPT[:3]}, "have no result"),
        ({"prompt": [*CHAT_PROMPT[:3], CHAT_PROMPT[1]]}, "have no result before this message"),
        ({"prompt": [CHAT_PROMPT[1], CHAT_PROMPT[3]]}, "unknown or already answered call id"),
        ({"prompt": [{"role": "robot", "content": "x"}]}, "unknown role"),
    ],
)
def test_bad_task_rows_name_file_and_row(tmp_path: Path, row: dict[str, object], message: str) -> None:
    """A bad row is a one-line ConfigError naming the file and row, raised at load time."""
    file = tmp_path / "bad.jsonl"
    file.write_text(json.dumps({"id": "ok", "prompt": "fine"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match=message) as info:
        load_tasks(file)
    assert "row 2" in str(info.value) or "line 2" in str(info.value)


def test_missing_and_unreadable_task_files(tmp_path: Path) -> None:
    """A missing file, broken JSON or a non-Parquet .parquet file is a ConfigError."""
    with pytest.raises(ConfigError, match="no such file"):
        load_tasks(tmp_path / "absent.jsonl")
    broken = tmp_path / "b.jsonl"
    broken.write_text("{not json\n")
    with pytest.raises(ConfigError, match="line 1: not valid JSON"):
        load_tasks(broken)
    fake = tmp_path / "f.parquet"
    fake.write_text("nope")
    with pytest.raises(ConfigError, match="not a readable Parquet file"):
        load_tasks(fake)


@pytest.mark.parametrize(
    ("env_name", "row", "problem"),
    [
        ("support_desk", {"id": "odd-1", "prompt": "Please water my plants."}, "not a support_desk prompt"),
        ("arithmetic", {"id": "odd-2", "prompt": "What is love?"}, "no expression"),
        ("arithmetic", {"id": "odd-3", "prompt": "x", "metadata": {"expression": "2 ** 8"}}, "only integers"),
    ],
)
def test_task_file_prompts_that_do_not_fit_the_environment_fail_at_load(
    tmp_path: Path, env_name: str, row: dict[str, object], problem: str
) -> None:
    """A task the built-in cannot build a world from is a one-line ConfigError naming file, task and cause."""
    good = {"id": "ok-1", "prompt": "What is the status of order A-1007?"}
    if env_name == "arithmetic":
        good = {"id": "ok-1", "prompt": ArithmeticEnv(num_tasks=1).tasks()[0].prompt}
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ConfigError) as caught:
        load_environment(env_name, {"task_file": str(path)})
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message
    assert f"task {row['id']}" in message
    assert problem in message


def test_fitting_task_file_loads_and_user_envs_are_not_second_guessed(tmp_path: Path) -> None:
    """Prompts in the built-in's phrasing load; an environment keeping the default check accepts any task."""
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"id": "t", "prompt": "What is the status of order A-1007?"}) + "\n")
    env = load_environment("support_desk", {"task_file": str(path)})
    assert [t.id for t in env.tasks()] == ["t"]
    env.start(env.tasks()[0])
    wrapped = TaskFileEnvironment(_AnyTask(), load_tasks(path))
    assert wrapped.check_task(wrapped.tasks()[0]) is None


class _AnyTask(Environment):
    """A user environment that does not override `check_task`."""

    name = "any"

    def tasks(self) -> list[Task]:
        return []

    def start(self, task: Task) -> EpisodeWorld:
        raise NotImplementedError


def test_task_file_rows_name_the_models_they_apply_to(tmp_path: Path) -> None:
    """A `models` column restricts a task to those models; a non-list is a one-line error."""
    prompt = "What is 2 + 3? Use the calculator tool, then reply with the number only."
    file = tmp_path / "tasks.jsonl"
    file.write_text(json.dumps({"id": "a", "prompt": prompt, "models": ["sim-terse"]}) + "\n"
                    + json.dumps({"id": "b", "prompt": prompt}) + "\n")
    first, second = load_tasks(file)
    assert (first.models, second.models) == (("sim-terse",), None)
    file.write_text(json.dumps({"id": "a", "prompt": prompt, "models": "sim-terse"}) + "\n")
    with pytest.raises(ConfigError, match="row 1: models must be a list of model names"):
        load_tasks(file)


def _project(root: Path) -> Path:
    """A project directory: a config naming its task file and environment relative to itself."""
    proj = root / "proj"
    (proj / "envpkg").mkdir(parents=True)
    (proj / "envpkg").joinpath("__init__.py").write_text(
        "from collector.envs.arithmetic import ArithmeticEnv as Env\n"
    )
    task = {"id": "t1", "prompt": "x", "metadata": {"expression": "2+3"}}
    (proj / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    (proj / "config.toml").write_text(
        'name = "rel"\n[sweep]\nmodels = ["sim-terse"]\nbudgets = [32]\n'
        '[env]\nname = "envpkg:Env"\npython_path = ["."]\ntask_file = "tasks.jsonl"\n'
    )
    return proj


def test_paths_in_a_config_file_are_relative_to_it_and_set_paths_to_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`env.task_file` and `env.python_path` in a config file resolve against the file's directory
    (so `collector validate proj/config.toml` works from the parent), `--set` paths against the
    working directory; the fingerprint hashes the task file as written, so it is the same from
    any directory."""
    from collector.cli import main
    from collector.config import RunConfig, config_fingerprint, load_config

    proj = _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    cfg = load_config("proj/config.toml")
    assert cfg.env.task_file == str(proj / "tasks.jsonl")
    assert cfg.env.python_path == [str(proj / ".")]
    assert main(["validate", "proj/config.toml"]) == 0
    from_parent = config_fingerprint(cfg)
    monkeypatch.chdir(proj)
    assert config_fingerprint(load_config("config.toml")) == from_parent
    shutil.copytree(proj, tmp_path / "moved")  # the project moved: the same data
    assert config_fingerprint(load_config(tmp_path / "moved" / "config.toml")) == from_parent
    # What a run started from the project's directory hashed before paths were resolved.
    as_before = {"name": "rel", "sweep": {"models": ["sim-terse"], "budgets": [32]},
                 "env": {"name": "envpkg:Env", "python_path": ["."], "task_file": "tasks.jsonl"}}
    assert config_fingerprint(RunConfig.model_validate(as_before)) == from_parent
    other = {"id": "o1", "prompt": "x", "metadata": {"expression": "1"}}
    (tmp_path / "other.jsonl").write_text(json.dumps(other) + "\n")
    monkeypatch.chdir(tmp_path)
    over = load_config("proj/config.toml", ["env.task_file=other.jsonl"])
    assert over.env.task_file == "other.jsonl"  # relative to the working directory, as given
    assert config_fingerprint(over) != from_parent
    assert load_config(proj / "config.toml", [f"env.task_file={tmp_path}/other.jsonl"]).env.task_file == (
        f"{tmp_path}/other.jsonl"
    )
