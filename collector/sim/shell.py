"""The simulated policy for a shell task: real bash commands through a `bash` tool, then the
harness's own way of finishing.

A coding harness such as mini-swe-agent offers one tool, ``bash`` (``{"command": ...}``),
runs each command in a subshell of the episode's working directory and shows the model the
command's output and exit status. For a task written as

    Write the sum of 17 and 25 to answer.txt.

the simulated model:

1. calls ``bash`` with ``echo $((17 + 25)) > answer.txt`` (the shell does the sum: the file
   holds ``42``);
2. if the task's user message says how to finish, as mini-swe-agent's does ("... finish your
   work by issuing the following command: `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`"),
   calls ``bash`` with that command (the harness ends when its output says so);
3. then answers in text, ``Wrote 42 to answer.txt.`` (a harness that finishes by command
   never asks for this turn).

One call per turn, with arguments fixed by the task, so each turn's size is fixed and the
preset's cut rate for it is exact (`collector.sim.truth.plan_fixed_tokens`). A command
counts as done when its result is not an error (`collector.sim.plans.is_error_result`) and
shows no non-zero exit status (mini-swe-agent's observation, JSON ``"returncode": N`` or
text ``<returncode>N</returncode>``); a command that failed, or a call whose command is not
the one due (a wrong argument from the preset's `error_rate`), is followed by the due
command again, at most `MAX_ATTEMPTS` calls without progress before the model gives up.

Nothing here imports the rest of `collector`. Tests: tests/sim/test_shell_policy.py.
"""

from __future__ import annotations

import json
import re

from collector.sim.plans import MAX_ATTEMPTS, HistoryItem, Plan, PlannedCall, is_error_result

TOOL = "bash"
"""The tool a shell task needs; its one argument is `ARGUMENT` (mini-swe-agent's BASH_TOOL)."""
ARGUMENT = "command"

TEMPLATE = re.compile(r"Write the sum of (?P<a>-?\d+) and (?P<b>-?\d+) to (?P<file>[A-Za-z0-9_.\-]+)\.")
"""The shell task the simulated model works (the policy's template list includes it)."""

_FINISH = re.compile(r"finish your work by issuing the following command: `(?P<command>[^`\n]+)`")
_RETURNCODE_TEXT = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")


def commands_for(match: re.Match[str], message: str) -> tuple[str, ...]:
    """The bash commands the task needs, in order: the work, then the harness's finishing
    command when `message` (the task's user message) names one."""
    work = f"echo $(({match['a']} + {match['b']})) > {match['file']}"
    finish = _FINISH.search(message)
    return (work, finish["command"]) if finish else (work,)


def _exit_status(text: str) -> int | None:
    """The exit status a bash result reports, if it reports one."""
    if text.lstrip().startswith("{"):
        try:
            shown = json.loads(text)
        except ValueError:
            shown = None
        if isinstance(shown, dict) and isinstance(shown.get("returncode"), int):
            return int(shown["returncode"])
    found = _RETURNCODE_TEXT.search(text)
    return int(found.group(1)) if found else None


def _succeeded(text: str, flagged: bool) -> bool:
    return not is_error_result(text, flagged) and _exit_status(text) in (0, None)


def shell_plan(match: re.Match[str], message: str, since: list[HistoryItem], tools: frozenset[str]) -> Plan:
    """The next move on the shell task `match` found in user `message`, given the history
    `since` that message."""
    if TOOL not in tools:
        return Plan(answer="I do not have the tools this request needs.", task="shell")
    commands = commands_for(match, message)
    issued: dict[str, object] = {}
    done = 0
    tries = 0
    for item in since:
        if item[0] == "call" and item[2] == TOOL:
            arguments = item[3] if isinstance(item[3], dict) else {}
            issued[item[1]] = arguments.get(ARGUMENT)
            tries += 1
        elif (item[0] == "result" and item[1] in issued and done < len(commands)
              and issued[item[1]] == commands[done] and _succeeded(item[3], item[4])):
            done, tries = done + 1, 0
    if done == len(commands):
        return Plan(answer=f"Wrote {int(match['a']) + int(match['b'])} to {match['file']}.", task="shell")
    if tries >= MAX_ATTEMPTS:
        return Plan(answer="I could not complete the request.", task="shell")
    return Plan(calls=(PlannedCall(TOOL, ((ARGUMENT, commands[done]),)),), task="shell")
