"""Config loading: TOML files, `--set` overrides, one-line errors, and the data fingerprint."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.config import (
    RunConfig,
    apply_overrides,
    config_fingerprint,
    data_identity,
    load_config,
    parse_override,
    resolved_config,
    run_id,
    url_credentials,
    without_url_credentials,
)
from collector.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

MINIMAL = """
name = "t"
[sweep]
models = ["sim-terse"]
budgets = [32, 64]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.toml"
    path.write_text(text)
    return path


def test_minimal_config_loads_with_defaults(tmp_path: Path) -> None:
    """A config with only a sweep gets the simulator, the default loop and local Ray."""
    cfg = load_config(write(tmp_path, MINIMAL))
    assert cfg.provider.kind == "sim"
    assert cfg.sweep.budgets == [32, 64]
    assert cfg.ray.address is None


def test_bad_value_is_one_line_naming_file_field_and_value(tmp_path: Path) -> None:
    """A negative budget is reported as `file: sweep.budgets.0: message (got -5)` on one line."""
    path = write(tmp_path, MINIMAL.replace("[32, 64]", "[-5, 64]"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message == f"{path}: sweep.budgets.0: Input should be greater than 0 (got -5)"
    assert "\n" not in message


def test_unknown_field_is_refused_by_name(tmp_path: Path) -> None:
    """A typo in a field name is an error naming the field, not a silently ignored setting."""
    path = write(tmp_path, MINIMAL + "\n[loop]\nmax_step = 3\n")
    with pytest.raises(
        ConfigError, match=r"x\.toml: loop\.max_step: Extra inputs are not permitted \(got 3\)"
    ):
        load_config(path)


def test_missing_required_field_named(tmp_path: Path) -> None:
    """A config without a sweep names `sweep` as the missing field."""
    with pytest.raises(ConfigError, match=r"x\.toml: sweep: Field required$"):
        load_config(write(tmp_path, 'name = "t"\n'))


def test_toml_syntax_error_names_file(tmp_path: Path) -> None:
    """Broken TOML is one ConfigError line naming the file, not a traceback."""
    with pytest.raises(ConfigError, match=r"x\.toml: not valid TOML"):
        load_config(write(tmp_path, "name = \n"))


def test_missing_file_is_config_error(tmp_path: Path) -> None:
    """A config path that does not exist is a ConfigError naming it."""
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.toml")


def test_real_provider_requires_base_url(tmp_path: Path) -> None:
    """A real provider kind without base_url is refused at load time."""
    path = write(tmp_path, MINIMAL + '\n[provider]\nkind = "anthropic"\n')
    with pytest.raises(ConfigError, match=r"provider: Value error, base_url is required"):
        load_config(path)


def test_stop_on_rejects_non_fault_reasons(tmp_path: Path) -> None:
    """stop_on may only list the turn faults (length, malformed_tool_call)."""
    path = write(tmp_path, MINIMAL + '\n[loop]\nstop_on = ["length", "done"]\n')
    with pytest.raises(ConfigError, match=r"loop\.stop_on"):
        load_config(path)


def test_duplicate_budget_refused(tmp_path: Path) -> None:
    """A budget listed twice would collide on episode ids, so it is refused."""
    with pytest.raises(ConfigError, match="budgets lists a value twice"):
        load_config(write(tmp_path, MINIMAL.replace("[32, 64]", "[32, 32]")))


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("sweep.budgets=[64,128]", ["sweep", "budgets"], [64, 128]),
        ("loop.max_steps=4", ["loop", "max_steps"], 4),
        ("provider.streaming=true", ["provider", "streaming"], True),
        ('name="quoted"', ["name"], "quoted"),
        ("output.path=runs/x", ["output", "path"], "runs/x"),
    ],
)
def test_override_values_parse_as_toml(text: str, path: list[str], value: object) -> None:
    """`--set` values are TOML values; anything that is not valid TOML is a bare string."""
    assert parse_override(text) == (path, value)


def test_override_without_equals_is_refused() -> None:
    """An override without `=` is a ConfigError showing the expected form."""
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("sweep.budgets")


def test_overrides_apply_before_validation(tmp_path: Path) -> None:
    """Overrides replace file values and are validated like the file (bad ones named by path)."""
    path = write(tmp_path, MINIMAL)
    cfg = load_config(path, ["sweep.budgets=[8,16,24]", "ray.workers=1", "env.options.digits=3"])
    assert cfg.sweep.budgets == [8, 16, 24]
    assert cfg.ray.workers == 1
    assert cfg.env.options == {"digits": 3}
    with pytest.raises(ConfigError, match=r"ray\.workers: Input should be greater than 0 \(got 0\)"):
        load_config(path, ["ray.workers=0"])


def test_override_into_scalar_refused() -> None:
    """Setting `name.x` when `name` is a string is a clear error, not a crash."""
    with pytest.raises(ConfigError, match="name is a value, not a table"):
        apply_overrides({"name": "t"}, ["name.x=1"])


def base() -> RunConfig:
    return RunConfig.model_validate({"name": "t", "sweep": {"models": ["m"], "budgets": [16]}})


def with_(cfg: RunConfig, **changes: object) -> RunConfig:
    data = resolved_config(cfg)
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return RunConfig.model_validate(data)


def test_fingerprint_ignores_execution_and_selection_fields() -> None:
    """Output, Ray, concurrency, timeouts and the sweep's cells do not change the fingerprint."""
    cfg = base()
    same = with_(
        cfg,
        output__path="elsewhere",
        ray__workers=7,
        ray__episodes_in_flight=3,
        provider__request_timeout_s=5.0,
        sweep__budgets=[16, 32],
        samples_per_task=4,
    )
    assert config_fingerprint(same) == config_fingerprint(cfg)
    assert run_id(same) == run_id(cfg)


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 1},
        {"name": "other"},
        {"loop__max_steps": 3},
        {"loop__stop_on": ["length"]},
        {"sampling__temperature": 0.7},
        {"provider__streaming": True},
        {"env__name": "support_desk"},
    ],
)
def test_fingerprint_changes_with_data_defining_fields(change: dict[str, object]) -> None:
    """Seed, name, loop policy, sampling, streaming and environment all change the fingerprint."""
    assert config_fingerprint(with_(base(), **change)) != config_fingerprint(base())


def test_resolved_config_holds_key_name_not_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """The saved config carries the API-key variable's name, never the key."""
    monkeypatch.setenv("MY_KEY", "sk-secret-value")
    cfg = with_(base(), provider__kind="chat", provider__base_url="http://x", provider__api_key_env="MY_KEY")
    text = repr(resolved_config(cfg))
    assert "MY_KEY" in text
    assert "sk-secret-value" not in text


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_validate(path: Path) -> None:
    """Every config shipped in configs/ loads and validates."""
    load_config(path)


def test_the_shipped_configs_are_found() -> None:
    """The parametrized check above sees the demo and one config per provider kind (it cannot go empty)."""
    names = {p.name for p in CONFIGS.glob("*.toml")}
    assert {"demo.toml", "openai_chat.toml", "anthropic.toml", "gemini.toml"} <= names


def test_default_output_path_is_per_run_name(tmp_path: Path) -> None:
    """Without output.path a config writes to runs/<name>, so two configs never share a directory."""
    first = load_config(write(tmp_path, MINIMAL))
    second = load_config(write(tmp_path, MINIMAL.replace('name = "t"', 'name = "other"')))
    assert (first.output.path, second.output.path) == ("runs/t", "runs/other")
    placed = load_config(write(tmp_path, MINIMAL), ["output.path=/data/{name}-x"])
    assert placed.output.path == "/data/t-x"
    assert RunConfig.model_validate(resolved_config(placed)).output.path == "/data/t-x"


@pytest.mark.parametrize("field", ["loop__episode_timeout_s", "loop__tool_timeout_s"])
def test_loop_timeouts_are_part_of_the_fingerprint(field: str) -> None:
    """The loop's timeouts decide which episodes time out, so changing one changes the fingerprint."""
    assert config_fingerprint(with_(base(), **{field: 1.5})) != config_fingerprint(base())


def test_every_config_field_has_a_docstring() -> None:
    """Each field of every config model carries a description (its attribute docstring)."""
    from collector import config

    models = [config.RetryConfig, config.ProviderConfig, config.SamplingConfig, config.SweepConfig,
              config.EnvConfig, config.RewardConfig, config.RedactionConfig, config.LoopConfig,
              config.RayConfig, config.OutputConfig, config.RunConfig]
    missing = [f"{m.__name__}.{name}" for m in models for name, info in m.model_fields.items()
               if not info.description]
    assert not missing, missing


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ('name="../../escaped"', ["name:", "'../../escaped'", "names the run directory"]),
        ('name=""', ["name:", "(got '')"]),
        ('name="two\\nlines"', ["name:", "(got 'two\\nlines')"]),
        ('sweep.budgets=["64"]', ["sweep.budgets.0", "valid integer", "'64'"]),
        ("sweep.budgets=[9223372036854775808]", ["sweep.budgets.0", "9223372036854775807"]),
        ("provider.request_timeout_s=inf", ["provider.request_timeout_s", "finite", "inf"]),
        ("sweep.providers=[]", ["sweep.providers", "at least 1"]),
        ("seed=18446744073709551616", ["seed:", "9223372036854775807"]),
        ("seed=true", ["seed:", "valid integer"]),
        ('sweep.models=[""]', ["sweep.models", "1 to 512 printable"]),
        (f'sweep.models=["{"m" * 513}"]', ["sweep.models", "1 to 512 printable"]),
        ('output.worker_writes="yes"', ["output.worker_writes", '"auto", true or false', "'yes'"]),
    ],
    ids=["escaping-name", "empty-name", "newline-name", "string-budget", "int64-budget", "inf-timeout",
         "no-providers", "seed-2**64", "bool-seed", "empty-model", "long-model", "worker-writes-yes"],
)
def test_values_that_would_break_a_run_are_refused_in_one_line(
    tmp_path: Path, override: str, fragments: list[str]
) -> None:
    """Names that are no directory name, non-integer or out-of-int64 budgets and seeds, an infinite
    timeout, an empty provider list, unusable model names and a worker_writes that is neither
    "auto" nor a bool (a "yes" read as true would declare a shared filesystem) are one-line
    config errors."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, MINIMAL), [override])
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("ray.workers=100000", ["ray.workers", "1024"]),
        ("ray.episodes_in_flight=1000000000", ["ray.episodes_in_flight", "4096"]),
        ("samples_per_task=1000000000", ["samples_per_task", "100000"]),
        ("env.tasks=1000000000", ["env.tasks", "1000000"]),
        ("samples_per_task=100000", ["more than 1,000,000 episodes", "several runs"]),
    ],
    ids=["workers", "in-flight", "samples", "tasks", "episodes"],
)
def test_counts_that_would_exhaust_the_machine_are_refused(
    tmp_path: Path, override: str, fragments: list[str]
) -> None:
    """Worker, concurrency, sample, task and total episode counts have upper bounds (README, Limits)."""
    text = MINIMAL + "\n[env]\ntasks = 20\n"
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), [override])
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_the_bounds_themselves_are_accepted(tmp_path: Path) -> None:
    """A config at every upper bound (and a budget and seed at the int64 edge) is valid."""
    cfg = load_config(write(tmp_path, MINIMAL), [
        "ray.workers=1024", "ray.episodes_in_flight=4096", "samples_per_task=100000",
        "sweep.budgets=[9223372036854775807]", "seed=-9223372036854775808", 'name="a.b_c-9"',
    ])
    assert cfg.sweep.budgets == [2**63 - 1]
    assert cfg.output.path == "runs/a.b_c-9"


def _mcp(server: str) -> RunConfig:
    return RunConfig.model_validate(
        {
            "name": "t",
            "sweep": {"models": ["m"], "budgets": [16]},
            "env": {"name": "mcp", "options": {"server": server}},
        }
    )


def test_mcp_url_credentials_are_neither_saved_nor_fingerprinted() -> None:
    """`env.options.server = "http://user:PASS@host/mcp?api_key=KEY"`: the resolved config keeps
    the public URL; rotating PASS or KEY keeps the fingerprint (and a URL that never had
    credentials keeps the one it had), while another host, path or plain query changes it."""
    with_keys = _mcp("http://ann:PASS-1@h:9/mcp?api_key=KEY-1&team=blue")
    assert resolved_config(with_keys)["env"]["options"]["server"] == "http://h:9/mcp"
    assert "PASS-1" not in repr(resolved_config(with_keys))
    assert "KEY-1" not in repr(resolved_config(with_keys))
    rotated = _mcp("http://ann:PASS-2@h:9/mcp?api_key=KEY-2&team=blue")
    assert config_fingerprint(rotated) == config_fingerprint(with_keys)
    assert config_fingerprint(with_keys) == config_fingerprint(_mcp("http://h:9/mcp?team=blue"))
    for other in ("http://h:9/mcp?team=red", "http://h:9/other", "http://g:9/mcp?team=blue"):
        assert config_fingerprint(_mcp(other)) != config_fingerprint(with_keys), other
    plain = _mcp("http://h:9/mcp?team=blue")
    assert data_identity(plain)["env"]["options"]["server"] == "http://h:9/mcp?team=blue"  # unchanged


@pytest.mark.parametrize(
    ("url", "secrets"),
    [
        ("http://ann:p%40ss@h/mcp", {"p@ss", "p%40ss", "ann:p@ss", "ann:p%40ss"}),
        ("http://TOKEN123@h/mcp", {"TOKEN123"}),
        ("https://h/mcp?key=K1&x-api-key=K2&accessToken=K3&sig=K4&team=blue", {"K1", "K2", "K3", "K4"}),
        ("https://h/mcp?team=blue&page=2", set()),
    ],
)
def test_url_credentials_lists_every_secret_form(url: str, secrets: set[str]) -> None:
    """User info and credential-named query values, decoded and as written; nothing else."""
    found = set(url_credentials(url))
    assert secrets <= found
    assert not {"ann", "blue", "2", "team"} & found
    assert bool(found) == bool(secrets)
    assert not any(s in without_url_credentials(url) for s in secrets)


def test_the_tool_result_bound_is_in_the_fingerprint_only_when_changed() -> None:
    """`loop.max_tool_result_bytes` defaults to toolkit's 1 MiB and, at the default, leaves
    existing run ids as they were; another value changes what the data holds."""
    from collector.envs.toolkit import DEFAULT_MAX_RESULT_BYTES

    assert base().loop.max_tool_result_bytes == DEFAULT_MAX_RESULT_BYTES
    assert "max_tool_result_bytes" not in data_identity(base())["loop"]
    assert config_fingerprint(with_(base(), loop__max_tool_result_bytes=4096)) != config_fingerprint(base())


def test_each_swept_provider_has_its_own_extra_body(tmp_path: Path) -> None:
    """`sweep.providers[i].extra_body` is merged over `sampling.extra_body` for that provider
    alone (objects key by key); unset, the fingerprint is what it was; set, it changes."""
    path = write(tmp_path, MINIMAL + """
[sampling]
extra_body = { top_k = 20, chat_template_kwargs = { enable_thinking = false, mode = "a" } }
[[sweep.providers]]
kind = "chat"
base_url = "http://127.0.0.1:1/v1"
label = "vllm"
extra_body = { chat_template_kwargs = { enable_thinking = true }, min_p = 0.1 }
[[sweep.providers]]
kind = "gemini"
base_url = "http://127.0.0.1:2"
label = "gemini"
extra_body = { top_k = "replaced", generationConfig = { seed = 3 } }
[[sweep.providers]]
kind = "sim"
""")
    vllm, gemini, sim = load_config(path).sweep.providers or []
    sampling = load_config(path).sampling.extra_body
    assert vllm.request_extra_body(sampling) == {
        "top_k": 20, "chat_template_kwargs": {"enable_thinking": True, "mode": "a"}, "min_p": 0.1,
    }
    assert gemini.request_extra_body(sampling) == {
        "top_k": "replaced", "chat_template_kwargs": {"enable_thinking": False, "mode": "a"},
        "generationConfig": {"seed": 3},
    }
    assert sim.request_extra_body(sampling) == sampling
    assert sampling == {"top_k": 20, "chat_template_kwargs": {"enable_thinking": False, "mode": "a"}}
    assert "extra_body" not in data_identity(base())["provider"]
    changed = with_(base(), provider__extra_body={"min_p": 0.1})
    assert config_fingerprint(changed) != config_fingerprint(base())
