"""`collector report RUN [-o report.html] [--target X]`: one self-contained HTML page of a run.

What a person reviewing a sweep wants on one page, with nothing to install and nothing
fetched: the run's identity (fingerprint, models, budgets, providers, when, how long,
episodes, commits, the `collector check` verdict), the truncation table with Wilson
intervals and the target pick (the numbers of `collector stats --format json`, carried
unrounded in each cell's ``data-value``), the figures per model as inline SVG
(`collector.analysis.svgplot`), and a transcript viewer over a sample of episodes per cell,
cut ones first, with the cut turn, the replayed ``"{}"``, the settled error results, the
discarded turns and the captured tokens (ids, logprobs, loss mask) marked.

Why every value is escaped and the page carries a Content-Security-Policy: transcripts
are model output, and a model can write ``<script>``. Everything from the run goes through
`html.escape`; on top of that the policy lets only the page's own inline script run (by its
sha256) and forbids every fetch, so an escaping slip still cannot run code or call out.
Nothing is read that the record did not store, and the record is already scrubbed.

Why it is fast on 100,000 episodes (bench/report.py): the tables read only their columns
(`compute_stats`, `compute_turn_stats`), the sample is chosen from a few flat columns,
and only the shards holding sampled episodes are read whole.

Tests: tests/analysis/test_report.py (in a real headless Chromium).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import math
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from collector.analysis.colours import MODEL_COLOURS, stop_colour
from collector.analysis.episodes import trainable_text
from collector.analysis.output import write_output
from collector.analysis.report_data import (
    DEFAULT_TARGET,
    PER_CELL,
    ReportData,
    clip_strings,
    collect,
)
from collector.analysis.report_tools import size_figure, tools_section
from collector.analysis.stats import RETRY_CAUSES
from collector.analysis.svgplot import DASHES, Bar, Line, bar_chart, esc, line_chart
from collector.analysis.turnstats import TurnStatsResult
from collector.record.chat import chat_messages
from collector.record.episode import ChatMessage, Episode, MessageRecord, TurnRecord
from collector.stop import StopReason
from collector.storage.mirror import resolve_run

__all__ = ["DEFAULT_TARGET", "PER_CELL", "build_report", "report_command", "write_report"]

#: Output tokens shown per turn in the token view (the rest are counted).
MAX_TOKENS_SHOWN = 300
#: HTML characters of one transcript: past this its remaining messages are counted, not shown.
MAX_TRANSCRIPT_CHARS = 250_000
#: HTML characters of all transcripts together: past this the remaining ones are counted.
MAX_TRANSCRIPTS_CHARS = 12_000_000

_REASONS = [r.value for r in StopReason]


def _clean(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def _pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


# --- the page ------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 24px 40px;color:#222;background:#fff}
h1{font-size:22px;margin:18px 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;font-size:12.5px}td,th{padding:3px 6px;border-bottom:1px solid #eee;
text-align:right;white-space:nowrap}th{background:#f5f5f5;position:sticky;top:0}
#stats th{white-space:normal;vertical-align:bottom;max-width:5.5em}
td.k,th.k{text-align:left}table.sortable th{cursor:pointer}
table.sortable th:after{content:" \\2195";color:#aaa}
table.identity td{text-align:left}table.identity td:first-child{color:#666}
.ok{color:#1a7f37;font-weight:600}.bad{color:#b42318;font-weight:600}
.pick{background:#fff4cc}#filters{position:sticky;top:0;background:#fffe;padding:8px 0;z-index:2;
border-bottom:1px solid #ddd}#filters label{margin-right:14px}
.figs{display:flex;flex-wrap:wrap;gap:8px}svg.figure{border:1px solid #eee;background:#fff}
svg text{font:10px system-ui,sans-serif;fill:#333}svg text.small{font-size:7.5px}.wide{overflow-x:auto}
svg text.t{font-size:12px;font-weight:600}
svg .grid{stroke:#eee}svg .axis{stroke:#888;fill:none}svg .target{stroke:#555;stroke-dasharray:4 3}
svg .line,svg .key{fill:none;stroke-width:2}svg .band{opacity:.18;stroke:none}
details.ep{border:1px solid #ddd;border-radius:4px;margin:4px 0}details.ep>summary{cursor:pointer;
padding:4px 8px;background:#fafafa}details.ep[open]>summary{border-bottom:1px solid #ddd}
.body{padding:6px 10px}.msg{border-left:3px solid #ccc;margin:6px 0;padding:2px 8px}
.role-assistant{border-color:#1f77b4}.role-reasoning{border-color:#bcbd22;background:#fbfbef}.role-tool{border-color:#2ca02c}.role-user{border-color:#9467bd}
.msg.discarded{background:#fff1f0;border-color:#d62728}.msg pre{white-space:pre-wrap;margin:2px 0;
font:12px ui-monospace,monospace}.tag{color:#555;font-size:12px}.call{font:12px ui-monospace,monospace}
.badge{display:inline-block;border-radius:3px;padding:0 5px;margin-left:4px;font-size:11px;color:#fff}
.b-cut{background:#ff7f0e}.b-discarded{background:#d62728}.b-replayed{background:#8c564b}
.b-settled{background:#7f7f7f}.b-exec{background:#2ca02c}.b-noexec{background:#bbb}
.b-malformed{background:#d62728}.b-retry{background:#9467bd}
.tokens{font:11px ui-monospace,monospace;line-height:1.9;margin:4px 0;display:flex;flex-wrap:wrap}
.tok{padding:1px 2px;margin:0 1px;border-radius:2px}
.tok.m0{text-decoration:line-through;outline:1px dashed #d62728}
[hidden]{display:none!important}.muted{color:#777}
"""

_JS = """
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  function apply() {
    var m = $("f-model").value, b = $("f-budget").value, s = $("f-stop").value, shown = 0;
    document.querySelectorAll("[data-model]").forEach(function (el) {
      var d = el.dataset;
      var ok = (!m || d.model === m) && (!b || d.budget === undefined || d.budget === b) &&
               (!s || d.stop === undefined || d.stop === s);
      el.hidden = !ok;
      if (ok && el.classList.contains("ep")) { shown += 1; }
    });
    $("shown").textContent = String(shown);
  }
  ["f-model", "f-budget", "f-stop"].forEach(function (id) { $(id).addEventListener("change", apply); });
  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("th").forEach(function (th, col) {
      th.addEventListener("click", function () {
        var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        var dir = th.dataset.dir === "asc" ? -1 : 1;
        th.dataset.dir = dir === 1 ? "asc" : "desc";
        function key(row) {
          var v = JSON.parse(row.cells[col].dataset.value);
          return v === null ? -Infinity : v;
        }
        rows.sort(function (a, b) {
          var x = key(a), y = key(b);
          return (x < y ? -1 : x > y ? 1 : 0) * dir;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  apply();
})();
"""


def _options(id_: str, label: str, values: Iterable[Any]) -> str:
    opts = "".join(f'<option value="{esc(v)}">{esc(v)}</option>' for v in values)
    return f'<label>{esc(label)} <select id="{id_}"><option value="">all</option>{opts}</select></label>'


#: The table's columns after the key columns: (stats json name, header, how shown).
_COLUMNS: list[tuple[str, str, str]] = [
    ("episodes", "episodes", "int"), ("valid", "valid", "int"), ("truncated", "truncated", "int"),
    ("truncation_rate", "truncation", "pct"), ("trunc_low", "95% low", "pct"),
    ("trunc_high", "95% high", "pct"), ("thinking_cut_rate", "thinking cut", "pct"),
    ("malformed_rate", "malformed", "pct"), ("done_rate", "done", "pct"),
    ("length_rate", "length", "pct"), ("max_steps_rate", "max steps", "pct"),
    ("timeout_rate", "timeout", "pct"), ("context_overflow_rate", "context overflow", "pct"),
    ("error_rate", "error", "pct"), ("mean_reward", "reward", "num"),
    ("wasted_output_tokens", "wasted tok", "int"), ("wasted_fraction", "wasted", "pct"),
    ("retries", "retries", "int"), ("target_budget", "target budget", "int"),
    ("target_budget_confident", "confident budget", "int"),
    # The cause of each error, and where the wall time went (`collector.analysis.outside`):
    # shown when a run recorded them (every run since the timing column; causes when errors).
    ("error_causes", "error causes", "str"), ("mean_episode_s", "s/episode", "num"),
    ("model_share", "model time", "pct"), ("tools_share", "tool time", "pct"),
    ("sandbox_share", "sandbox time", "pct"), ("verifier_share", "verifier time", "pct"),
    ("worker_hours_per_million", "worker-h per 1M episodes", "num"),
]


#: The time-outside-the-model columns (`collector.analysis.outside`).
_TIME_COLUMNS = frozenset({"mean_episode_s", "model_share", "tools_share", "sandbox_share", "verifier_share",
                           "worker_hours_per_million"})


def _shown(value: Any, how: str) -> str:
    if value is None:
        return "-"
    if how == "pct":
        return _pct(float(value))
    if how == "num":
        return f"{float(value):.3f}"
    return str(value)


def _stats_table(data: ReportData) -> str:
    rows = data.stats_json["rows"]
    by = data.stats_json["by"]
    present = {k for r in rows for k, v in r.items() if v not in (None, 0, 0.0)}
    # A rate column that is zero or empty everywhere is left out, as `collector stats` does.
    always = {"episodes", "valid", "truncated", "truncation_rate", "trunc_low", "trunc_high", "done_rate",
              "malformed_rate", "error_rate", "mean_reward", "wasted_output_tokens", "wasted_fraction"}
    cols = [c for c in _COLUMNS if c[0] in always or (c[0] in present and c[0] in rows[0])] if rows else []
    if "sandbox_share" not in present:
        # Where the time went is shown for sandboxed runs, as `collector stats` shows it: every
        # episode records its model time, so the columns would be there, and say little, for all.
        cols = [c for c in cols if c[0] not in _TIME_COLUMNS]
    head = "".join(f'<th class="k" data-key="{esc(c)}">{esc(c)}</th>' for c in by)
    head += "".join(f'<th data-key="{esc(k)}">{esc(h)}</th>' for k, h, _ in cols)
    body = []
    for r in rows:
        cells = "".join(f'<td class="k" data-key="{esc(c)}" data-value="{esc(json.dumps(r[c]))}">'
                        f"{esc(r[c])}</td>" for c in by)
        for k, _, how in cols:
            pick = ' class="pick"' if k == "truncation_rate" and r.get("target_budget") == r.get("budget") \
                and r.get("target_budget") is not None else ""
            cells += (f'<td{pick} data-key="{esc(k)}" data-value="{esc(json.dumps(r.get(k)))}">'
                      f"{esc(_shown(r.get(k), how))}</td>")
        attrs = f' data-model="{esc(r.get("model"))}" data-budget="{esc(r.get("budget"))}"'
        body.append(f"<tr{attrs}>{cells}</tr>")
    return (f'<table id="stats" class="sortable"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _picks_table(data: ReportData) -> str:
    target = data.stats_json.get("target")
    if target is None:
        return ""
    rows = []
    for p in data.stats_json.get("picks", []):
        name = ", ".join(str(v) for v in p["key"].values()) or "all"
        budget = ("none meets it" if p["budget"] is None
                  else f"{p['budget']} (measured {_pct(p['budget_rate'])})")
        sure = ("none with 95% confidence" if p["budget_confident"] is None
                else f"{p['budget_confident']} (upper bound {_pct(p['confident_upper'])})")
        rows.append(f'<tr data-model="{esc(p["key"].get("model"))}"><td class="k">{esc(name)}</td>'
                    f"<td>{esc(budget)}</td><td>{esc(sure)}</td>"
                    f"<td>{esc(p['best_budget'])} ({esc(_pct(p['best_rate']))})</td></tr>")
    return (f"<h3>Smallest budget with truncation at or under {esc(_pct(target))}</h3>"
            '<table id="picks"><thead><tr><th class="k">model</th><th>budget</th><th>with 95% confidence</th>'
            f"<th>lowest measured</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _series_label(key: dict[str, Any]) -> str:
    rest = [str(v) for k, v in key.items() if k not in ("model", "budget")]
    return ", ".join(rest)


def _model_figures(data: ReportData, model: str, colour: str) -> str:
    stats = data.stats
    target = stats.target
    groups = [g for g in stats.groups if g.key.get("model") == model]
    budgets = sorted({int(g.key["budget"]) for g in groups})
    series: dict[str, list[Any]] = defaultdict(list)
    for g in sorted(groups, key=lambda g: g.key["budget"]):
        series[_series_label(g.key)].append(g)
    picks = {_series_label(p.key): p for p in stats.picks if p.key.get("model") == model}
    figs: list[str] = []

    def name(label: str) -> str:
        return f"{model} [{label}]" if label else model

    trunc_lines = []
    for i, (label, gs) in enumerate(series.items()):
        dash = DASHES[i % len(DASHES)]
        pick = picks.get(label)
        stars = [(g.key["budget"], g.truncation_rate) for g in gs
                 if pick is not None and pick.budget == g.key["budget"]]
        trunc_lines.append(Line(name(label), colour, [(g.key["budget"], g.truncation_rate) for g in gs],
                                [g.truncation_interval for g in gs], dash, stars))
    figs.append(line_chart("Truncation rate, Wilson 95%", "share of episodes cut", budgets, trunc_lines,
                           top=1.0, hline=target))
    # Stop-reason mix: one bar per budget (and setting), the shares of every ending.
    cats, per_cat = [], []
    for label, gs in series.items():
        for g in gs:
            cats.append(f"{g.key['budget']}" + (f" {label}" if len(series) > 1 else ""))
            per_cat.append(g)
    reasons = [r for r in _REASONS if any(g.reasons.get(r) for g in per_cat)]
    reasons += sorted({r for g in per_cat for r in g.reasons} - set(reasons))
    bars = [Bar(r, stop_colour(r), [g.reasons.get(r, 0) / g.episodes if g.episodes else 0.0 for g in per_cat])
            for r in reasons]
    figs.append(bar_chart("Stop-reason mix per budget", "share of episodes", cats, bars, top=1.0,
                          percent=True))
    figs.append(line_chart("Wasted output tokens per episode", "tokens on cut or discarded turns", budgets,
                           [Line(name(label), colour,
                                 [(g.key["budget"], g.wasted_output_tokens / g.episodes if g.episodes
                                   else math.nan) for g in gs], None, DASHES[i % len(DASHES)])
                            for i, (label, gs) in enumerate(series.items())], percent=False))
    figs.append(line_chart("Mean reward against budget", "mean reward (stop_on reasons: 0)", budgets,
                           [Line(name(label), colour, [(g.key["budget"], g.mean_reward) for g in gs], None,
                                 DASHES[i % len(DASHES)]) for i, (label, gs) in enumerate(series.items())],
                           top=1.0, percent=False))
    figs.append(_turn_figure(data.turns, model, colour, target))
    figs.append(size_figure(data.tools, model, colour))
    if any(g.thinking_cut for g in groups):
        figs.append(line_chart(
            "Thinking cut per reasoning setting", "share: cap spent on reasoning", budgets,
            [Line(name(label), MODEL_COLOURS[i % len(MODEL_COLOURS)],
                  [(g.key["budget"], g.thinking_cut_rate) for g in gs], None, DASHES[i % len(DASHES)])
             for i, (label, gs) in enumerate(series.items())], top=1.0))
    retried = [Bar(c, MODEL_COLOURS[i], [sum(g.retries.get(c, 0) for g in gs_at(groups, b)) for b in budgets])
               for i, c in enumerate(RETRY_CAUSES)]
    retried = [b for b in retried if any(b.values)]
    kinds = sorted({k for b in budgets for k in data.errors.get((model, b), {})})
    failed = [Bar(k, MODEL_COLOURS[(i + 5) % len(MODEL_COLOURS)],
                  [float(data.errors.get((model, b), {}).get(k, 0)) for b in budgets])
              for i, k in enumerate(kinds)]
    if retried:
        figs.append(bar_chart("Retried requests by cause", "requests retried", [str(b) for b in budgets],
                              retried))
    if failed:
        figs.append(bar_chart("Error episodes by cause", "episodes ended as error", [str(b) for b in budgets],
                              failed))
    note = "" if retried or failed else '<p class="muted">No request was retried and no episode failed.</p>'
    return f'<div class="figs">{"".join(figs)}</div>{note}'


def gs_at(groups: Sequence[Any], budget: int) -> list[Any]:
    return [g for g in groups if g.key["budget"] == budget]


def _turn_figure(turns: TurnStatsResult, model: str, colour: str, target: float | None) -> str:
    rows = [g for g in turns.groups if g.key.get("model") == model and g.key.get("turn_kind") is not None]
    budgets = sorted({int(g.key["budget"]) for g in rows})
    lines = []
    for i, kind in enumerate(("call", "answer")):
        per: dict[str, list[Any]] = defaultdict(list)
        for g in sorted((g for g in rows if g.key["turn_kind"] == kind), key=lambda g: g.key["budget"]):
            per[", ".join(str(v) for k, v in g.key.items() if k not in ("model", "budget", "turn_kind",
                                                                          "turn_index"))].append(g)
        for label, gs in per.items():
            lines.append(Line(f"{kind} turns" + (f" [{label}]" if label else ""), colour,
                              [(g.key["budget"], g.truncation_rate) for g in gs],
                              [g.truncation_interval for g in gs], DASHES[i]))
    return line_chart("Turns cut: calls vs answers", "share of turns cut", budgets or [1], lines, top=1.0,
                      hline=target)


# --- transcripts ---------------------------------------------------------------------------


def _badge(kind: str, text: str) -> str:
    return f'<span class="badge b-{kind}">{esc(text)}</span>'


def _clip(text: str) -> str:
    # Strings of a sampled episode are clipped when read (`report_data.clip_strings`); this
    # keeps an Episode built elsewhere to the same bound (clipping twice changes nothing).
    clipped: str = clip_strings(text)
    return clipped


def _text(text: str) -> str:
    return f"<pre>{esc(_clip(text))}</pre>" if text else ""


def _logprob_colour(lp: float | None) -> str:
    # Probability 1 is pale green, 0 is red: a sampled token the model doubted stands out.
    if lp is None or math.isnan(lp):
        return "#eee"
    p = min(max(math.exp(lp), 0.0), 1.0)
    return f"hsl({120 * p:.0f},70%,{88 - 10 * (1 - p):.0f}%)"


def _token_view(t: TurnRecord) -> str:
    if t.tokens_withheld:
        return '<div class="muted">token ids withheld (the episode held a redacted value)</div>'
    ids = t.output_token_ids
    if ids is None:
        return ""
    lps = t.output_logprobs if t.output_logprobs is not None and len(t.output_logprobs) == len(ids) else None
    mask = 0 if t.discarded else 1
    spans = []
    for i, tok in enumerate(ids[:MAX_TOKENS_SHOWN]):
        lp = lps[i] if lps is not None else None
        shown_lp = "-" if lp is None or math.isnan(lp) else f"{lp:.3f}"
        spans.append(f'<span class="tok m{mask}" style="background:{_logprob_colour(lp)}" '
                     f'title="id {int(tok)} · logprob {shown_lp} · loss mask {mask}">{int(tok)}</span>')
    more = len(ids) - MAX_TOKENS_SHOWN
    prompt = len(t.prompt_token_ids) if t.prompt_token_ids is not None else 0
    head = (f"turn {t.index}: {len(ids)} output ids, loss mask {mask}"
            f"{' (discarded turn: not trained on)' if not mask else ''}; {prompt} new prompt ids "
            f"(from position {t.prompt_ids_offset or 0}); counts "
            f"{'ok' if t.token_counts_ok else 'unknown' if t.token_counts_ok is None else 'MISMATCH'}")
    tail = f' <span class="muted">... {more} more</span>' if more > 0 else ""
    return (f'<div class="tokens" data-turn="{t.index}"><div class="tag">{esc(head)}</div>'
            f'{"".join(spans)}{tail}</div>')


def _message(replayed_chat: Sequence[ChatMessage], i: int, m: MessageRecord, turns: dict[int, TurnRecord],
             executed: set[tuple[int, str]]) -> str:
    turn = turns.get(m.turn_index) if m.turn_index is not None else None
    cut = turn is not None and turn.finish_class == "length"
    discarded = turn is not None and turn.discarded
    badges = []
    if m.role == "assistant":
        tag = f"assistant · turn {m.turn_index}" if m.turn_index is not None else "assistant · prompt"
        if cut and turn is not None:
            badges.append(_badge("cut", "cut at the cap: " + ",".join(turn.length_signals)))
        if discarded:
            badges.append(_badge("discarded", "discarded turn"))
    elif m.role == "tool":
        tag = f"tool {m.name or '?'} · {m.call_id}"
        if m.is_error:
            badges.append(_badge("settled", "settled error result" if discarded or cut else "error result"))
    else:
        tag = m.role
    chat = replayed_chat[i] if i < len(replayed_chat) and replayed_chat[i].role == m.role else None
    calls = []
    for j, c in enumerate(m.tool_calls):
        replayed = (chat.tool_calls[j].function.arguments if chat is not None and j < len(chat.tool_calls)
                    else None)
        if c.arguments_json is None:
            chars = f"{c.unparsed_chars} chars" if c.unparsed_chars is not None else "a fragment"
            args = f"<{c.status}: {chars} not parsed, not stored>"
            marks = _badge("malformed", c.status)
            if replayed is not None:
                marks += _badge("replayed", f"replayed as {_clip(replayed)}")
        else:
            args, marks = _clip(c.arguments_json), (_badge("malformed", c.status) if c.status != "ok" else "")
        ran = m.turn_index is not None and (m.turn_index, c.id) in executed
        marks += _badge("exec", "executed") if ran else _badge("noexec", "not executed")
        head = f"-&gt; {esc(_clip(c.name))} [{esc(_clip(c.id))}]"
        calls.append(f'<div class="call">{head} {esc(args)}{marks}</div>')
    cls = f"msg role-{esc(m.role)}" + (" discarded" if discarded else "") + (" cut" if cut else "")
    return (f'<div class="{cls}"><div class="tag">{esc(tag)}{"".join(badges)}</div>{_text(m.text)}'
            f'{"".join(calls)}</div>')


def _bounded(blocks: Iterable[str], count: int, limit: int, what: str, why: str) -> str:
    """The `count` `blocks` joined while they fit in `limit` characters, the rest counted in
    one line. `blocks` may be lazy: a block past the bound is never built."""
    shown: list[str] = []
    size = 0
    for block in blocks:
        if size + len(block) > limit and shown:
            more = count - len(shown)
            shown.append(f'<div class="muted">... {more} more {esc(what)} not shown ({esc(why)})</div>')
            break
        shown.append(block)
        size += len(block)
    return "".join(shown)


def _transcript(ep: Episode) -> str:
    turns = {t.index: t for t in ep.turns}
    executed = {(c.turn_index, c.call_id) for c in ep.executed_tool_calls}
    cut = ep.is_truncated
    summary = (f"{esc(ep.episode_id[:12])} · task {esc(ep.task_id)} #{ep.sample} · {esc(ep.model)} · "
               f"budget {ep.budget}"
               f"{' · ' + esc(ep.reasoning) if ep.reasoning else ''} · {esc(ep.stop_reason.value)} · "
               f"{ep.num_turns} turns · reward {ep.reward:g}" + (_badge("cut", "cut") if cut else ""))
    meta = (f"episode {ep.episode_id} · task {ep.task_id} · sample {ep.sample} · provider {ep.provider}"
            " · "
            f"env {ep.env} · tokens in {ep.input_tokens} out {ep.output_tokens} "
            f"(wasted {ep.wasted_output_tokens}) · {ep.duration_s:.2f}s · trainable {trainable_text(ep)}")
    rows = []
    for t in ep.turns:
        notes = []
        if t.length_signals:
            notes.append(_badge("cut", "cut: " + ",".join(t.length_signals)))
        if t.discarded:
            notes.append(_badge("discarded", "discarded"))
        if t.malformed_calls:
            notes.append(_badge("malformed", f"{t.malformed_calls} malformed"))
        if t.retries:
            notes.append(_badge("retry", "retried: " + ",".join(t.retries)))
        if t.unparsed_tool_call:
            notes.append(esc("unparsed tool call in text"))
        if t.invisible_output:
            notes.append(esc("invisible output"))
        rows.append(f'<tr><td>{t.index}</td><td class="k">{esc(t.finish_class)} ({esc(t.raw_finish_reason)})'
                    f"</td><td>{t.output_tokens}/{t.max_output_tokens}</td><td>{t.reasoning_tokens or 0}</td>"
                    f'<td>{t.latency_s:.2f}s</td><td class="k">{"".join(notes)}</td></tr>')
    error = (f'<p class="bad">error {esc(_clip(ep.error.type))}: {esc(_clip(ep.error.message))}</p>'
             if ep.error is not None else "")
    # What was replayed to the model is the stored `chat` column; a version-2 shard has none,
    # and its replay is what `chat_messages` rebuilds (the adapters' "{}" for a malformed call).
    replayed = ep.chat or chat_messages(ep.messages)
    # The reasoning the provider returned (stored redacted like message text): where a thinking
    # cut spent the cap.
    thoughts = [t for t in ep.turns if t.reasoning_text]
    blocks = itertools.chain(
        (_message(replayed, i, m, turns, executed) for i, m in enumerate(ep.messages)),
        (f'<div class="msg role-reasoning"><div class="tag">reasoning · turn {t.index}'
         f"{_badge('cut', 'thinking cut') if 'reasoning' in t.length_signals else ''}</div>"
         f"{_text(t.reasoning_text or '')}</div>" for t in thoughts))
    messages = _bounded(blocks, len(ep.messages) + len(thoughts), MAX_TRANSCRIPT_CHARS, "messages",
                        f"this transcript's bound; all of it: collector show {ep.episode_id}")
    tokens = _bounded((_token_view(t) for t in ep.turns), len(ep.turns), MAX_TRANSCRIPT_CHARS,
                      "turns' tokens", "this transcript's bound")
    token_block = f"<h4>Tokens</h4>{tokens}" if tokens else ""
    return (f'<details class="ep" data-model="{esc(ep.model)}" data-budget="{ep.budget}" '
            f'data-stop="{esc(ep.stop_reason.value)}" data-cut="{int(cut)}" id="ep-{esc(ep.episode_id)}">'
            f'<summary>{summary}</summary><div class="body"><div class="muted">{esc(meta)}</div>{error}'
            '<table class="turns"><thead><tr><th>turn</th><th class="k">finish (raw)</th><th>out/cap</th>'
            f'<th>reasoning</th><th>latency</th><th class="k">notes</th></tr></thead><tbody>{"".join(rows)}'
            f"</tbody></table>{messages}{token_block}</div></details>")


def render(data: ReportData, compare: str = "") -> str:
    """The page as one string (see the module docstring for what it holds and why)."""
    rows = data.stats_json["rows"]
    models = sorted({str(r["model"]) for r in rows})
    budgets = sorted({int(r["budget"]) for r in rows})
    colours = {m: MODEL_COLOURS[i % len(MODEL_COLOURS)] for i, m in enumerate(models)}
    script_hash = base64.b64encode(hashlib.sha256(_JS.encode()).digest()).decode()
    csp = (f"default-src 'none'; script-src 'sha256-{script_hash}'; style-src 'unsafe-inline'; "
           "img-src data:; base-uri 'none'; form-action 'none'")
    identity = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in data.identity)
    verdict = ('<span class="ok" id="verdict">collector check: ok</span>' if data.check_ok else
               f'<span class="bad" id="verdict">collector check: {data.check_problems} problem(s)</span>')
    check_lines = "".join(f"<li>{esc(line)}</li>" for line in data.check_lines)
    sections = []
    for m in models:
        sections.append(f'<section class="model" data-model="{esc(m)}"><h3>{esc(m)}</h3>'
                        f"{_model_figures(data, m, colours[m])}</section>")
    transcripts = _bounded((_transcript(ep) for ep in data.sample), len(data.sample), MAX_TRANSCRIPTS_CHARS,
                           "transcripts", "the page's bound")
    reasons = [r for r in _REASONS if any(ep.stop_reason.value == r for ep in data.sample)]
    footer = (f"{data.stats.episodes} episodes; rates except error are over episodes that did not end in "
              "error; the table's cells carry the unrounded numbers of `collector stats --format json`.")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{esc(csp)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>collector report: {esc(data.source)}</title><style>{_CSS}</style></head>
<body>
<h1>collector report</h1><div class="muted">{esc(data.source)}</div>
<div id="filters">{_options("f-model", "model", models)}{_options("f-budget", "budget", budgets)}
{_options("f-stop", "stop reason", reasons)}<span class="muted"><span id="shown">{len(data.sample)}</span> of
{len(data.sample)} sampled transcripts shown</span></div>
<h2>Run</h2><table class="identity">{identity}<tr><td>check</td><td>{verdict}</td></tr></table>
{f"<ul id=check-lines>{check_lines}</ul>" if check_lines else ""}
<h2>Truncation per model and budget</h2>
<p class="muted">Click a header to sort. {esc(footer)}</p>
<div class="wide">{_stats_table(data)}</div>
{_picks_table(data)}
{tools_section(data.tools)}
{compare}
<h2>Figures</h2>{"".join(sections)}
<h2>Transcripts</h2>
<p class="muted">Up to {PER_CELL} episodes per cell, cut ones first. Marked: the turn cut at the cap, calls
whose arguments did not parse (replayed to the model as <code>{{}}</code>), the error results that settled
them, discarded turns (nothing from them ran; their tokens have loss mask 0).</p>
<div id="transcripts">{transcripts}</div>
<script>{_JS}</script>
</body></html>
"""


def build_report(run: str | Path, target: float | None = DEFAULT_TARGET, per_cell: int = PER_CELL,
                 source: str | None = None, other: str | Path | None = None) -> str:
    """The report of `run` (a run dir or ``s3://bucket/prefix``) as one HTML string; with
    `other`, a section comparing it with that run cell by cell (`report_compare`)."""
    compare = ""
    if other is not None:
        from collector.analysis.report_compare import comparison_section

        compare = comparison_section(run, other, str(source or run), str(other), target)
    return render(collect(run, target, per_cell, source), compare)


def write_report(run: str | Path, out: str | Path, target: float | None = DEFAULT_TARGET,
                 source: str | None = None, other: str | Path | None = None) -> int:
    """Write the report to `out` (atomically, never inside the run dir; ``-``: stdout); its bytes."""
    page = build_report(run, target, source=source, other=other).encode("utf-8")

    def write(f: BinaryIO) -> int:
        f.write(page)
        return len(page)

    return write_output(out, write, resolve_run(run))


def report_command(run: str | Path, out: str | Path, target: float | None, shown: str,
                   other: str | None = None) -> int:
    """`collector report RUN [OTHER]`: write the page, say where on stderr; the exit code."""
    size = write_report(run, out, DEFAULT_TARGET if target is None else target, source=shown, other=other)
    against = f" compared with {other}" if other else ""
    print(f"{out}: report of {shown}{against} ({size / 1e6:.2f} MB)", file=sys.stderr)
    return 0
