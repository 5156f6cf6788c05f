"""`collector export RUN OUT --format atif`: episodes as Agent Trajectory Interchange Format.

ATIF (Harbor's trajectory format, written here as version ``ATIF-v1.7``) is one JSON object
per trajectory: ``schema_version``, ``session_id``, ``agent`` (``name``, ``version``,
``model_name``), ``steps`` and optional ``final_metrics`` / ``extra``. The export writes one
trajectory per line (JSON Lines), one per committed episode:

- ``session_id`` is the episode id; ``agent`` is the collector and the episode's model;
- each stored message is a step, numbered from 1: ``system`` and ``user`` messages as
  steps of that source, an assistant message as an ``agent`` step whose ``tool_calls``
  (``tool_call_id``, ``function_name``, ``arguments`` as an object) are the turn's calls
  and whose ``observation.results`` are the tool results that settled them
  (``source_call_id``, ``content``); the turn's token counts, ids and log-probabilities
  are its ``metrics`` (``prompt_token_ids`` the whole prompt, rebuilt from the stored
  deltas by `collector.analysis.trainer.full_prompts`) and its reasoning text its
  ``reasoning_content``;
- what ATIF has no field for stays in ``extra``: per step the turn index, finish class and
  whether the turn was discarded, per call its argument status (a malformed call's
  arguments are ``{}`` with ``extra.arguments_unparsed`` true: the fragment was never
  stored), per result ``is_error``; per trajectory the run, task, sample, budget, provider,
  stop reason, reward and trainable flag.

`trajectory_messages` reads a trajectory back into the stored messages' shape: the round
trip (tests/analysis/test_atif.py) gives every message, call and result back unchanged.

Validation. The tests validate every exported trajectory against an independent
implementation of the spec, NVIDIA NeMo Agent Toolkit's ATIF-v1.7 pydantic models
(`nvidia-nat-atif`: unknown fields forbidden, step ids and call references checked) and the
JSON Schema they generate. `validate_trajectory` checks the required structure by hand
(required fields and their types, step ids 1..n, sources, tool fields only on agent steps,
every ``source_call_id`` naming a call of its step) for users without that package.

Tests: tests/analysis/test_atif.py
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from collector import __version__
from collector.analysis import json_values
from collector.analysis.trainer import full_prompts

if TYPE_CHECKING:
    from collector.analysis.source import Source

__all__ = ["ATIF_VERSION", "episode_trajectory", "read_atif", "trajectory_messages", "validate_trajectory",
           "write_atif"]

ATIF_VERSION = "ATIF-v1.7"
_COLUMNS = ["episode_id", "run_id", "model", "provider", "budget", "task_id", "sample", "stop_reason",
            "reward", "trainable", "messages", "turns"]
_ROOT_EXTRA = ("episode_id", "run_id", "task_id", "sample", "budget", "provider", "stop_reason", "reward",
               "trainable")


def _metrics(turn: dict[str, Any] | None, prompt_ids: list[int] | None) -> dict[str, Any] | None:
    if turn is None:
        return None
    metrics: dict[str, Any] = {"prompt_tokens": turn["input_tokens"],
                               "completion_tokens": turn["output_tokens"]}
    if prompt_ids is not None:
        metrics["prompt_token_ids"] = prompt_ids
    if turn.get("output_token_ids") is not None:
        metrics["completion_token_ids"] = turn["output_token_ids"]
    if turn.get("output_logprobs") is not None:
        metrics["logprobs"] = turn["output_logprobs"]
    if turn.get("reasoning_tokens"):
        metrics["extra"] = {"reasoning_tokens": turn["reasoning_tokens"]}
    return metrics


def episode_trajectory(row: dict[str, Any]) -> dict[str, Any]:
    """One stored episode (a row with `_COLUMNS`) as an ATIF trajectory."""
    ordered = sorted(row["turns"] or [], key=lambda t: t["index"])
    turns = {t["index"]: t for t in ordered}
    # ATIF's `prompt_token_ids` is a turn's whole prompt; the record stores deltas.
    prompts = dict(zip(turns, full_prompts(ordered), strict=True))
    steps: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None  # the agent step tool results attach to
    for m in row["messages"] or []:
        role = m["role"]
        if role == "tool" and current is not None:
            result = {"source_call_id": m["call_id"], "content": m["text"],
                      "extra": {"is_error": bool(m["is_error"]), "name": m["name"]}}
            current.setdefault("observation", {"results": []})["results"].append(result)
            continue
        step: dict[str, Any] = {"step_id": len(steps) + 1, "source": "agent" if role == "assistant" else role,
                                "message": m["text"] or ""}
        if role == "assistant":
            turn = turns.get(m["turn_index"]) if m["turn_index"] is not None else None
            step["model_name"] = row["model"]
            if turn is not None and turn.get("reasoning_text"):
                step["reasoning_content"] = turn["reasoning_text"]
            if m["tool_calls"]:
                step["tool_calls"] = [{
                    "tool_call_id": c["id"], "function_name": c["name"],
                    "arguments": json.loads(c["arguments_json"]) if c["arguments_json"] is not None else {},
                    "extra": {"status": c["status"], "arguments_unparsed": c["arguments_json"] is None,
                              "unparsed_chars": c["unparsed_chars"]},
                } for c in m["tool_calls"]]
            metrics = _metrics(turn, prompts.get(m["turn_index"]))
            if metrics is not None:
                step["metrics"] = metrics
            step["extra"] = {"turn_index": m["turn_index"],
                             "finish_class": turn["finish_class"] if turn is not None else None,
                             "discarded": bool(turn["discarded"]) if turn is not None else None}
            current = step
        else:
            current = None
        steps.append(step)
    all_turns = list(turns.values())
    return {
        "schema_version": ATIF_VERSION,
        "session_id": row["episode_id"],
        "agent": {"name": "collector", "version": __version__, "model_name": row["model"]},
        "steps": steps,
        "final_metrics": {"total_prompt_tokens": sum(t["input_tokens"] for t in all_turns),
                          "total_completion_tokens": sum(t["output_tokens"] for t in all_turns),
                          "total_steps": len(steps)},
        "extra": {k: row[k] for k in _ROOT_EXTRA},
    }


def trajectory_messages(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """The stored messages' shape back from an ATIF trajectory (role, text, tool_calls with
    id/name/arguments_json/status/unparsed_chars, call_id, name, is_error, turn_index)."""
    out: list[dict[str, Any]] = []
    for step in trajectory["steps"]:
        extra = step.get("extra") or {}
        if step["source"] != "agent":
            out.append({"role": step["source"], "text": step["message"], "tool_calls": [], "call_id": None,
                        "name": None, "is_error": False, "turn_index": None})
            continue
        calls = [{"id": c["tool_call_id"], "name": c["function_name"],
                  "arguments_json": None if (c.get("extra") or {}).get("arguments_unparsed")
                  else json.dumps(c["arguments"]),
                  "status": (c.get("extra") or {}).get("status"),
                  "unparsed_chars": (c.get("extra") or {}).get("unparsed_chars")}
                 for c in step.get("tool_calls") or []]
        out.append({"role": "assistant", "text": step["message"], "tool_calls": calls, "call_id": None,
                    "name": None, "is_error": False, "turn_index": extra.get("turn_index")})
        for r in (step.get("observation") or {}).get("results", []):
            rx = r.get("extra") or {}
            out.append({"role": "tool", "text": r.get("content") or "", "tool_calls": [],
                        "call_id": r.get("source_call_id"), "name": rx.get("name"),
                        "is_error": bool(rx.get("is_error")), "turn_index": extra.get("turn_index")})
    return out


def _problems(t: Any) -> Iterable[str]:
    if not isinstance(t, dict):
        yield "trajectory: not an object"
        return
    if not isinstance(t.get("schema_version"), str) or not t["schema_version"].startswith("ATIF-v"):
        yield f"schema_version: {t.get('schema_version')!r} is not ATIF-v<version>"
    if not isinstance(t.get("session_id"), str) or not t["session_id"]:
        yield "session_id: missing or not a string"
    agent = t.get("agent")
    if not isinstance(agent, dict) or not all(isinstance(agent.get(k), str) for k in ("name", "version")):
        yield "agent: needs string name and version"
    steps = t.get("steps")
    if not isinstance(steps, list) or not steps:
        yield "steps: missing or empty"
        return
    for i, step in enumerate(steps, start=1):
        where = f"steps[{i - 1}]"
        if not isinstance(step, dict):
            yield f"{where}: not an object"
            continue
        if step.get("step_id") != i:
            yield f"{where}.step_id: {step.get('step_id')!r}, expected {i}"
        if step.get("source") not in ("system", "user", "agent"):
            yield f"{where}.source: {step.get('source')!r} is not system, user or agent"
        if not isinstance(step.get("message"), str):
            yield f"{where}.message: not a string"
        if step.get("source") != "agent":
            for agent_only in ("tool_calls", "metrics", "reasoning_content", "model_name"):
                if agent_only in step:
                    yield f"{where}.{agent_only}: only agent steps have it"
        ids = set()
        for j, call in enumerate(step.get("tool_calls") or []):
            if not (isinstance(call.get("tool_call_id"), str) and isinstance(call.get("function_name"), str)
                    and isinstance(call.get("arguments"), dict)):
                yield (f"{where}.tool_calls[{j}]: needs string tool_call_id, function_name and "
                       "object arguments")
            ids.add(call.get("tool_call_id"))
        observation = step.get("observation")
        if observation is not None:
            if not isinstance(observation.get("results"), list):
                yield f"{where}.observation.results: missing"
                continue
            for j, r in enumerate(observation["results"]):
                if r.get("source_call_id") is not None and r["source_call_id"] not in ids:
                    yield (f"{where}.observation.results[{j}].source_call_id: "
                           f"{r['source_call_id']!r} names no call")


def validate_trajectory(trajectory: Any) -> list[str]:
    """The ways `trajectory` breaks ATIF's required structure (module docstring); [] when none."""
    return list(_problems(trajectory))


def write_atif(source: Source, out: BinaryIO) -> int:
    """The export writer: one ATIF trajectory per committed episode, one per line."""
    rows = source.read(_COLUMNS).to_pylist()
    for row in rows:
        trajectory = episode_trajectory(row)
        if source.annotation is not None:
            trajectory["extra"]["reward_annotation"] = source.annotation
        out.write((json_values.dumps(trajectory, ensure_ascii=False) + "\n").encode("utf-8"))
    return len(rows)


def read_atif(path: str | Path) -> list[dict[str, Any]]:
    """The trajectories of an `--format atif` export."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
