"""The fenced blocks of README.md and docs/*.md, and the conventions that say who runs each.

A block is a fence with a language: `python` (executed), `toml` (loaded by the config
loader), `sh` (commands: `collector` ones parsed by the real CLI parser, and run in a demo
run's directory) or `text` (checked against the code). An HTML comment on the line right
before the fence changes that:

- `<!-- run by tests/PATH.py ... -->`: that test runs the block (a bucket, a wheel, a sweep of
  its own); it must exist, and for a python block it must read this page;
- `<!-- not run: WHY -->`: a shell block nothing here can run (a cluster, a key, a browser);
  its commands are still parsed and checked (`tests/test_docs.py`);
- `<!-- checked: KIND ... -->`: a block checked as KIND (`usage`: the synopsis against the CLI
  parser; `layout`: a run directory's tree; `the two commands`).

Used by tests/test_docs.py (what can be checked without running anything) and
tests/system/test_readme.py (what runs on a demo run).
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
LANGUAGES = {"python", "toml", "sh", "text"}
CHECKED_KINDS = ("usage", "layout", "the two commands")
_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```[ \t]*\n", flags=re.S | re.M)
_MARKER = re.compile(r"<!--\s*(.*?)\s*-->\s*$")


def pages() -> list[Path]:
    """README.md, then every page of docs/ (sorted), as the suite reads them."""
    return [README, *sorted(DOCS.glob("*.md"))]


def rel(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    marker: str
    """The comment on the line before the fence, without `<!--`/`-->` ("" when none)."""
    before: str
    """The page's text between the previous fence and this one."""

    @property
    def where(self) -> str:
        return f"{rel(self.page)}:{self.line}"

    @property
    def run_by(self) -> str | None:
        """The test file a `run by` marker names, or None."""
        found = re.match(r"run by (tests/\S+\.py)", self.marker)
        return found.group(1) if found else None

    @property
    def not_run(self) -> bool:
        return self.marker.startswith("not run:")

    @property
    def checked(self) -> str | None:
        """The KIND of a `checked: KIND` marker, or None."""
        if not self.marker.startswith("checked:"):
            return None
        rest = self.marker.removeprefix("checked:").strip()
        return next((kind for kind in CHECKED_KINDS if rest.startswith(kind)), rest)


def blocks(page: Path) -> list[Block]:
    """Every fenced block of a page, with the marker before it (fences indented in a list too)."""
    text = page.read_text(encoding="utf-8")
    found, previous_end = [], 0
    for match in _FENCE.finditer(text):
        preceding = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.search(preceding)
        found.append(Block(
            page=page, line=text.count("\n", 0, match.start()) + 1, lang=match.group(2),
            code=textwrap.dedent(match.group(3)) if match.group(1) else match.group(3),
            marker=marker.group(1) if marker else "", before=text[previous_end:match.start()],
        ))
        previous_end = match.end()
    return found


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]


def outside_fences(page: Path) -> str:
    """The page's text with every fenced block blanked out (line numbers kept)."""
    text = page.read_text(encoding="utf-8")
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def without_comment(command: str) -> str:
    """The command with a trailing `# ...` comment removed (shlex keeps quoted `#`s)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=False)
    lexer.whitespace_split, lexer.commenters = True, "#"
    return shlex.join(list(lexer))


def commands(code: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = code.replace("\\\n", " ")
    return [c for line in joined.splitlines() if (c := without_comment(line))]


def words_of(command: str) -> list[list[str]]:
    """Each simple command of `a && b` as words, leading `NAME=value` assignments dropped."""
    simple: list[list[str]] = [[]]
    for word in shlex.split(command):
        if word == "&&":
            simple.append([])
        elif simple[-1] or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", word):
            simple[-1].append(word)
    return simple


def is_collector(words: list[str]) -> bool:
    return bool(words) and words[0] in ("collector", ".venv/bin/collector")
