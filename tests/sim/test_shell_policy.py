"""The simulator works a coding harness's shell task: real bash commands, then the finishing command."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from typing import Any

import jinja2
import yaml

from collector.sim.app import simulate
from collector.sim.generate import generate
from collector.sim.plans import MAX_ATTEMPTS
from collector.sim.policy import decide
from collector.sim.presets import PRESETS
from collector.sim.truth import binomial_interval, plan_fixed_tokens, turn_cut_probability

TASK = "Write the sum of 17 and 25 to answer.txt."
WORK = "echo $((17 + 25)) > answer.txt"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
BASH = frozenset({"bash"})
# mini-swe-agent's tool, as its LitellmModel offers it (minisweagent.models.utils.actions_toolcall).
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to execute"}},
            "required": ["command"],
        },
    },
}


def mini_swe_agent_instance(task: str) -> str:
    """The first user message mini-swe-agent sends, rendered from its installed tool-calling config."""
    spec = importlib.util.find_spec("minisweagent")  # the file only: importing it writes a config dir
    assert spec is not None
    assert spec.submodule_search_locations
    config = yaml.safe_load((Path(spec.submodule_search_locations[0]) / "config" / "mini.yaml").read_text())
    template = jinja2.Template(config["agent"]["instance_template"], undefined=jinja2.StrictUndefined)
    return template.render(task=task, system="Linux", release="6.1", version="#1", machine="x86_64")


def _ran(history: list[tuple[Any, ...]], command: str, result: str, call_id: str) -> None:
    history += [("call", call_id, "bash", {"command": command}), ("result", call_id, "bash", result, False)]


def test_mini_swe_agents_task_gets_the_command_then_its_finishing_command_then_an_answer() -> None:
    """On mini-swe-agent's own prompt the model writes the file with bash, then submits as the prompt says."""
    history: list[tuple[Any, ...]] = [("user", mini_swe_agent_instance(TASK))]
    plan = decide(history, BASH)
    assert [(c.name, dict(c.arguments)) for c in plan.calls] == [("bash", {"command": WORK})]
    _ran(history, WORK, '{"returncode": 0, "output": ""}', "c1")  # mini.yaml's JSON observation
    plan = decide(history, BASH)
    assert [(c.name, dict(c.arguments)) for c in plan.calls] == [("bash", {"command": SUBMIT})]
    _ran(history, SUBMIT, '{"returncode": 0, "output": "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\\n"}', "c2")
    assert decide(history, BASH).answer == "Wrote 42 to answer.txt."


def test_a_prompt_without_a_finishing_command_gets_the_work_then_an_answer() -> None:
    """A harness that names no finishing command gets the file written, then a text answer."""
    history: list[tuple[Any, ...]] = [("user", TASK)]
    assert dict(decide(history, BASH).calls[0].arguments) == {"command": WORK}
    _ran(history, WORK, "", "c1")  # a plain harness: the command's empty output
    plan = decide(history, BASH)
    assert plan.calls == ()
    assert plan.answer == "Wrote 42 to answer.txt."
    assert decide([("user", TASK)], frozenset({"calculator"})).answer.startswith("I do not have the tools")


def test_a_failed_or_wrong_command_is_issued_again_then_given_up() -> None:
    """A failed command, or one not due, does not count: the due command comes again, four calls at most."""
    history: list[tuple[Any, ...]] = [("user", TASK)]
    failures = [
        '{"returncode": 1, "output": "bash: answer.txt: Permission denied"}',  # mini.yaml's observation
        "<returncode>2</returncode>\n<output>\n</output>",  # mini-swe-agent's text observation
    ]
    for i, result in enumerate(failures):
        assert dict(decide(history, BASH).calls[0].arguments) == {"command": WORK}
        _ran(history, WORK, result, f"f{i}")
    _ran(history, "echo $((17 + 26)) > answer.txt", '{"returncode": 0, "output": ""}', "w")  # wrong argument
    assert dict(decide(history, BASH).calls[0].arguments) == {"command": WORK}
    _ran(history, WORK, "error: disk full", "e")
    assert len([h for h in history if h[0] == "call"]) == MAX_ATTEMPTS
    plan = decide(history, BASH)
    assert plan.calls == ()
    assert plan.answer == "I could not complete the request."


def test_shell_turns_are_cut_at_the_truths_rate_and_a_cap_of_their_size_cuts_after_whole_arguments() -> None:
    """A shell turn has a fixed size: cut at the truth's rate; a cap of its size cuts after its arguments."""
    prompt = mini_swe_agent_instance(TASK)
    history: list[tuple[Any, ...]] = [("user", prompt)]
    plans = [decide(history, BASH)]
    _ran(history, WORK, '{"returncode": 0, "output": ""}', "c1")
    plans.append(decide(history, BASH))
    assert [plan_fixed_tokens("sim-perfect", p) for p in plans] == [15, 18]
    for plan in plans:  # sim-perfect writes no preamble: a cap of the call's size cuts right after it
        size = plan_fixed_tokens("sim-perfect", plan)
        cut = generate(plan, PRESETS["sim-perfect"], size, random.Random(0))
        assert cut.cut  # the end-of-turn token did not fit
        assert cut.calls[0].arguments_done
        assert not generate(plan, PRESETS["sim-perfect"], size + 1, random.Random(0)).cut
    model, budget, n = "sim-hidden-cut", 48, 2000
    truth = turn_cut_probability(model, budget, "call", plan_fixed_tokens(model, plans[0]))
    assert 0.2 < truth < 0.8
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "tools": [BASH_TOOL],
            "max_completion_tokens": budget}
    generations = [simulate(11, "chat", body, sim_seed=str(i)) for i in range(n)]  # through the chat parser
    assert all(g.calls[0].full_object == {"command": WORK} for g in generations if not g.cut)
    lo, hi = binomial_interval(truth, n)
    assert lo <= sum(g.cut for g in generations) <= hi
