"""The documentation follows the code: generated pages are current, every block is checked.

Nothing here runs a collection (tests/system/test_readme.py runs what needs a demo run): the
reference pages are compared with what `scripts/gen_docs.py` renders from the code now;
every fenced block of README.md and docs/ has a language and, where the suite does not run
it itself, a marker saying who does (`tests/docblocks.py`); TOML is loaded by the config
loader, shell commands are parsed by the real CLI parser, the synopsis is compared with it
option by option, and every relative link resolves to a file and a heading. And every
module of `collector/` has a test named after it, or names its tests in its docstring.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from collector.cli import build_parser
from collector.config import RunConfig, check_run_config, config_from_dict, load_config
from collector.stop import StopReason
from tests.docblocks import (
    DOCS,
    LANGUAGES,
    README,
    REPO,
    Block,
    all_blocks,
    blocks,
    commands,
    is_collector,
    outside_fences,
    pages,
    rel,
    words_of,
)

GEN_DOCS = REPO / "scripts" / "gen_docs.py"
REGENERATE = ".venv/bin/python scripts/gen_docs.py"
#: Programs a shell block may show besides `collector`, and how each is checked here.
OTHER_PROGRAMS = {"pip", ".venv/bin/pip", "bash", "python", ".venv/bin/python", ".venv/bin/jupyter", "export",
                  "cd", "ray"}


def _gen_docs() -> ModuleType:
    """scripts/gen_docs.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("gen_docs", GEN_DOCS)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- generated pages ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["configuration.md", "modules.md"])
def test_generated_page_matches_the_code(name: str) -> None:
    """The committed page is exactly what the script renders from today's code."""
    gen = _gen_docs()
    assert set(gen.PAGES) == {"configuration.md", "modules.md"}
    committed = (DOCS / name).read_text(encoding="utf-8") if (DOCS / name).exists() else ""
    assert committed == gen.PAGES[name](), (
        f"docs/{name} differs from the code: run `{REGENERATE}` and commit the page")


def _fields(model: type, prefix: str = "") -> list[str]:
    """Every dotted field path below a pydantic model, walked independently of the generator."""
    found = []
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        found.append(f"{prefix}{name}")
        for sub in _models_in(field.annotation):
            if sub is not model:
                found += _fields(sub, f"{prefix}{name}.")
    return found


def _models_in(annotation: object) -> list[type]:
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models_in(arg)]


def test_configuration_page_documents_every_field_with_its_description() -> None:
    """Each field of RunConfig (nested tables included) has a row under its table, with its
    docstring: a generator that skipped a kind of field would still match itself."""
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    heading = r"^## `?\[*([\w.]+|Top level)\]*`?\n(.*?)(?=^## |\Z)"
    sections = dict(re.findall(heading, page, flags=re.S | re.M))
    top = RunConfig.model_fields
    paths = _fields(RunConfig)
    assert len(paths) > 60
    for path in paths:
        table, _, name = path.rpartition(".")
        if table.startswith("sweep.providers"):
            continue  # documented once, under [provider]
        section = sections.get(table or "Top level")
        assert section is not None, f"docs/configuration.md has no section for [{table}] ({path})"
        assert f"| `{name}` |" in section, f"docs/configuration.md: [{table or 'top level'}] lacks {name}"
    assert all(f["description"] for f in _descriptions(RunConfig)), "a field without a docstring"
    assert top["sweep"].description in page


def _descriptions(model: type) -> list[dict[str, str | None]]:
    rows = []
    for field in model.model_fields.values():  # type: ignore[attr-defined]
        rows.append({"description": field.description})
        for sub in _models_in(field.annotation):
            if sub is not model:
                rows += _descriptions(sub)
    return rows


def test_module_map_lists_every_module() -> None:
    """Every module of collector/ (and bench/) has a row in docs/modules.md."""
    page = (DOCS / "modules.md").read_text(encoding="utf-8")
    for path in [*(REPO / "collector").rglob("*.py"), *(REPO / "bench").glob("[!_]*.py")]:
        assert f"[`{rel(path)}`]" in page, f"docs/modules.md lacks {rel(path)}: run `{REGENERATE}`"


def test_gen_docs_check_mode_fails_on_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--check` exits 1 naming the page when a committed page differs, 0 once rewritten."""
    gen = _gen_docs()
    monkeypatch.setattr(gen, "DOCS", tmp_path)
    assert gen.main([]) == 0  # writes both pages
    (tmp_path / "modules.md").write_text("stale\n", encoding="utf-8")
    assert gen.main(["--check"]) == 1
    assert (tmp_path / "modules.md").read_text(encoding="utf-8") == "stale\n"
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0


# --- every module names its tests -------------------------------------------------------------


def _module_name(path: Path) -> str:
    """What a test file would be named after: the module, or the package for `__init__.py`."""
    return path.parent.name if path.name == "__init__.py" else path.stem


def _named_tests(path: Path) -> list[str]:
    """The paths a module's docstring names after `Tests:` (one line or wrapped)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    named = []
    for match in re.finditer(r"[Tt]ests:\s*((?:[^\n]|\n(?!\s*\n))*)", doc):
        named += re.findall(r"tests/[\w/.-]*\w(?:::\w+)?", match.group(1))
    return named


def test_every_module_has_a_test_named_after_it_or_names_its_tests() -> None:
    """`collector/a/b.py` has `tests/**/test_b.py`, or its docstring says `Tests: tests/...`
    naming files (or folders) that exist."""
    test_names = {p.stem for p in (REPO / "tests").rglob("test_*.py")}
    failing = []
    for path in sorted((REPO / "collector").rglob("*.py")):
        named = _named_tests(path)
        missing = [n for n in named if not (REPO / n.split("::")[0]).exists()]
        if missing:
            failing.append(f"{rel(path)} (names missing {', '.join(missing)})")
        elif not named and f"test_{_module_name(path)}" not in test_names:
            failing.append(rel(path))
    listed = "\n  ".join(failing)
    assert failing == [], f"modules with no test named after them and no `Tests:` line:\n  {listed}"


def test_named_tests_are_read_from_the_docstring(tmp_path: Path) -> None:
    """The `Tests:` reader takes wrapped lists and stops at the paragraph's end."""
    module = tmp_path / "m.py"
    module.write_text('"""Title.\n\nTests: tests/a/test_x.py,\ntests/b/test_y.py::test_z.\n\n'
                      'Not tests/c."""\n')
    assert _named_tests(module) == ["tests/a/test_x.py", "tests/b/test_y.py::test_z"]


# --- every block is run or checked ---------------------------------------------------------------


def test_every_block_has_a_language_and_a_known_marker() -> None:
    """A block the suite cannot run by its language says who runs it, or how it is checked."""
    found = all_blocks()
    assert len(found) >= 20
    for block in found:
        assert block.lang in LANGUAGES, f"{block.where}: fence language {block.lang!r}"
        if block.marker:
            known = block.run_by or block.not_run or block.checked
            assert known, f"{block.where}: unknown marker {block.marker!r}"
        if block.lang == "text":
            assert block.checked in ("usage", "layout"), f"{block.where}: a text block must be `checked: ...`"
        if block.not_run:
            assert block.lang == "sh", f"{block.where}: only a shell block may be `not run`"
        if block.checked == "the two commands":
            assert block.page == README


def test_run_by_markers_name_tests_that_exist_and_read_the_page() -> None:
    """`run by tests/x.py` names a real test file; for Python, one that reads this page's block."""
    for block in all_blocks():
        if block.run_by:
            test = REPO / block.run_by
            assert test.is_file(), f"{block.where}: {block.run_by} does not exist"
            if block.lang == "python":
                assert rel(block.page) in test.read_text(encoding="utf-8"), (
                    f"{block.where}: {block.run_by} does not read {rel(block.page)}")


def test_no_code_is_left_in_an_indented_block() -> None:
    """Code is fenced (so the checks above see it): no 4-space block after a blank line."""
    for page in pages():
        lines = outside_fences(page).split("\n")
        for i in range(1, len(lines)):
            if lines[i].startswith("    ") and lines[i].strip() and not lines[i - 1].strip():
                raise AssertionError(f"{rel(page)}:{i + 1}: an indented code block; fence it")


def _demo_data() -> dict[str, object]:
    with open(REPO / "configs" / "demo.toml", "rb") as f:
        return tomllib.load(f)


def _merge(base: dict[str, object], extra: dict[str, object]) -> dict[str, object]:
    merged = dict(base)
    for key, value in extra.items():
        old = merged.get(key)
        merged[key] = _merge(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return merged


def test_toml_blocks_load_with_the_config_loader(tmp_path: Path) -> None:
    """A whole config (it has `[sweep]`) loads as a file; a fragment loads into the demo config."""
    toml_blocks = [b for b in all_blocks() if b.lang == "toml"]
    assert len(toml_blocks) >= 2
    for i, block in enumerate(toml_blocks):
        data = tomllib.loads(block.code)
        if "sweep" in data:
            path = tmp_path / f"block{i}.toml"
            path.write_text(block.code, encoding="utf-8")
            load_config(path)
        else:
            check_run_config(config_from_dict(_merge(_demo_data(), data), block.where), block.where)


def test_a_bad_toml_block_would_fail(tmp_path: Path) -> None:
    """The loader the blocks go through refuses a misspelt field (so the test above can fail)."""
    with pytest.raises(Exception, match=r"loop\.max_step: Extra inputs are not permitted"):
        config_from_dict(_merge(_demo_data(), {"loop": {"max_step": 4}}), "x")


def _parse(words: list[str], where: str) -> argparse.Namespace:
    parser = build_parser()
    try:
        return parser.parse_args(words)
    except SystemExit as exit:
        raise AssertionError(f"{where}: `collector {' '.join(words)}` is refused by the CLI parser") from exit


def _check_command(block: Block, words: list[str], runnable: bool) -> None:
    """One simple command: collector ones parse; the others are what they say they are."""
    program, args = words[0], words[1:]
    where = f"{block.where}: {' '.join(words)}"
    if is_collector(words):
        parsed = _parse([a.replace("<episode_id>", "0") for a in args], where)
        config = getattr(parsed, "config", None)
        if config and config.startswith("configs/"):
            load_config(REPO / config)  # a shipped config the docs point at loads as it is
        return
    assert program in OTHER_PROGRAMS, f"{where}: no check for `{program}`; say how it is run or checked"
    if program.endswith("pip"):
        assert args[0] == "install", where
        _check_requirements(args[1:], where)
        return
    assert not runnable, f"{where}: only `collector` and `pip install` may be shown unmarked (they run)"
    if program == "bash":
        assert (REPO / args[0]).is_file(), where
    elif program.endswith("python"):
        assert args[0] == "-m", where
        assert importlib.util.find_spec(args[1]) is not None, where
    elif program == "ray":  # Ray's own CLI, only to start a node of a cluster
        assert args[0] == "start", where
    elif program.endswith("jupyter"):
        assert args[0] in ("lab", "execute"), where
        assert (REPO / args[1]).is_file(), where


def _check_requirements(args: list[str], where: str) -> None:
    """`pip install` names this checkout (with extras it has), or distributions this venv holds."""
    with open(REPO / "pyproject.toml", "rb") as f:
        extras = set(tomllib.load(f)["project"]["optional-dependencies"])
    for arg in args:
        if arg.startswith("-"):
            continue
        name, _, extra = re.match(r"([^\[]+)(\[(.*)\])?", arg).groups()  # type: ignore[union-attr]
        if name in (".", "collector"):
            assert not extra or set(extra.split(",")) <= extras, f"{where}: no extra {extra!r}"
            continue
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise AssertionError(f"{where}: {name} is not what the suite has installed") from None


def test_shell_commands_parse_and_name_what_exists() -> None:
    """Every shell command of README.md and docs/: `collector` ones parse with the real parser
    (and the configs they name load); the rest are checked for what they name."""
    shown = [b for b in all_blocks() if b.lang == "sh"]
    assert len(shown) >= 8
    for block in shown:
        runnable = not (block.run_by or block.not_run or block.checked)
        for command in commands(block.code):
            for words in words_of(command):
                if words[:1] == ["export"]:
                    assert not runnable, block.where
                    assert re.fullmatch(r"[A-Z_]+=\.\.\.", words[1]), block.where
                elif words[:1] == ["cd"]:
                    assert not runnable, block.where
                else:
                    _check_command(block, words, runnable)


def test_a_command_the_parser_refuses_fails_the_check() -> None:
    """The parser check bites: an option `collector stats` does not have is refused."""
    with pytest.raises(AssertionError, match="refused by the CLI parser"):
        _parse(["stats", "runs/demo", "--per", "week"], "x")


def _synopsis() -> list[str]:
    found = [b for b in all_blocks() if b.checked == "usage"]
    assert len(found) == 1, "one block is the synopsis (`checked: usage`)"
    return [line for line in found[0].code.splitlines() if line.strip()]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_synopsis_lists_every_subcommand_and_option_the_parser_has() -> None:
    """docs/commands.md's synopsis and `collector.cli.build_parser` agree, option for option."""
    lines = _synopsis()
    subs = _subparsers()
    shown: dict[str, str] = {}
    for line in lines:
        usage = line.split("  #", 1)[0]
        words = usage.split()
        assert words[0] == "collector", line
        if words[1].startswith("--"):
            assert words[1] in build_parser()._option_string_actions, line
            continue
        assert words[1] in subs, f"synopsis: no subcommand {words[1]!r}"
        shown[words[1]] = usage
    assert set(shown) == set(subs), f"synopsis lacks {sorted(set(subs) - set(shown))}"
    for name, usage in shown.items():
        options = {o for a in subs[name]._actions for o in a.option_strings if o.startswith("--")}
        options.discard("--help")
        written = set(re.findall(r"--[a-z][a-z-]*", usage))
        assert written == options, f"synopsis of {name}: {sorted(written)}, the parser: {sorted(options)}"
        # `[--format table|csv|json]`: the values shown are the parser's choices, where it has some.
        for option, values in re.findall(r"(--[a-z][a-z-]*) ([\w-]+(?:\|[\w-]+)+)\]", usage):
            choices = subs[name]._option_string_actions[option].choices
            if choices is not None:
                assert set(values.split("|")) == set(choices), f"synopsis of {name} {option}: {values}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", outside_fences(page), flags=re.M)}


def test_relative_links_resolve_to_files_and_headings() -> None:
    """Every `[text](path#anchor)` of README.md and docs/ points at a file and a heading in it."""
    checked = 0
    for page in pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", outside_fences(page)):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            assert resolved.exists(), f"{rel(page)}: link to {target}: no such file"
            if anchor and resolved.suffix == ".md":
                assert anchor in _anchors(resolved), f"{rel(page)}: link to {target}: no such heading"
            checked += 1
    assert checked >= 30


def test_slugs_follow_github() -> None:
    assert _slug("`[loop.reward]`") == "loopreward"
    assert _slug("Object storage: the commit protocol") == "object-storage-the-commit-protocol"
    assert _slug("What is retried, and what becomes `error`") == "what-is-retried-and-what-becomes-error"


# --- the pages' promises -------------------------------------------------------------------------


def test_the_two_commands_are_the_readme_contract() -> None:
    """README.md shows exactly `bash scripts/demo` and `bash scripts/test`, and they do what it says:
    the demo sets up and runs configs/demo.toml; the test sets up dev and runs ruff, mypy, pytest."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## The two commands", 1)[1]
    first = next(b for b in blocks(README) if b.checked == "the two commands")
    assert first.code in section.split("\n## ", 1)[0]
    assert commands(first.code) == ["bash scripts/demo", "bash scripts/test"]
    demo = (REPO / "scripts" / "demo").read_text(encoding="utf-8")
    assert "bash scripts/setup\n" in demo
    assert re.search(r"^\.venv/bin/collector run configs/demo\.toml", demo, flags=re.M)
    test = (REPO / "scripts" / "test").read_text(encoding="utf-8")
    assert "bash scripts/setup dev" in test
    for step in (".venv/bin/ruff check", ".venv/bin/mypy", ".venv/bin/python -m pytest"):
        assert step in test, f"scripts/test no longer runs {step}"


def test_readme_is_a_front_page_that_links_every_page() -> None:
    """Under 250 lines, and every page of docs/ is reachable from it (and only real pages)."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)", text))
    assert linked == {p.name for p in DOCS.glob("*.md")}


def test_readme_names_every_part_of_the_package() -> None:
    """README's "Where things live" has a row for every subpackage of collector/ (a new wing too)."""
    section = README.read_text(encoding="utf-8").split("## Where things live", 1)[1]
    rows = set(re.findall(r"^\| `(\w+)/` \|", section, flags=re.M))
    packages = {p.parent.name for p in (REPO / "collector").glob("*/__init__.py")}
    assert rows == packages


def test_stop_reasons_page_has_a_row_for_every_stop_reason() -> None:
    page = (DOCS / "stop-reasons.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(\w+)` \|", page, flags=re.M))
    assert rows >= {reason.value for reason in StopReason}


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
