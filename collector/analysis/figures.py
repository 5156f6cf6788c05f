"""The figures of `notebooks/truncation_analysis.ipynb`, as functions a test can inspect.

Needs matplotlib and pandas (`pip install 'collector[analysis]'`); nothing else in the package
imports this module. Every function takes the tables of `collector.analysis` as pandas frames
and returns a matplotlib Figure. The conventions are the same in every figure:

- the x axis is the budget on a log2 scale with a tick at every budget swept (and only
  those), so 96 and 192 have their own labelled tick;
- a stop reason has one colour in every figure of every run (`STOP_COLOURS`), whichever
  reasons a run happens to contain; a model keeps its colour across the figures of a run;
- quantities per cell are per episode, never raw sums (a sum follows the cell's size);
- a table grouped by the reasoning setting too (a `reasoning` column: a sweep with
  `sweep.reasoning`, `collector.analysis.reasoning_grouping`) gets one line per model and
  setting, the setting told by its marker (`SETTING_MARKERS`) and named in the label; the
  truncation figure adds, dotted, the thinking-cut rate of every line that had any. A table
  without the column draws as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from collector.analysis.colours import MODEL_COLOURS, STOP_COLOURS, stop_colour

#: One marker per reasoning setting, in the settings' sorted order (the first is the marker
#: of a run without settings).
SETTING_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
#: A pandas DataFrame of a `collector.analysis` table (pandas ships no type stubs).
Frame: TypeAlias = Any


def series(frame: Frame) -> list[tuple[str, str, str, Frame]]:
    """The lines of a figure: (label, colour, marker, rows) per model, or per model and reasoning
    setting when the frame has a `reasoning` column; the colour is the model's."""
    colours = model_colours(list(frame["model"].unique()))
    if "reasoning" not in frame:
        return [(m, c, SETTING_MARKERS[0], frame[frame["model"] == m]) for m, c in colours.items()]
    settings = sorted({str(s) for s in frame["reasoning"]})
    out = []
    for model, colour in colours.items():
        for i, setting in enumerate(settings):
            rows = frame[(frame["model"] == model) & (frame["reasoning"].astype(str) == setting)]
            if len(rows):
                out.append((f"{model} [{setting}]", colour, SETTING_MARKERS[i % len(SETTING_MARKERS)], rows))
    return out


def ordered_reasons(reasons: Iterable[str]) -> list[str]:
    """Known reasons in the enum's order, then any others sorted."""
    present = set(reasons)
    return [r for r in STOP_COLOURS if r in present] + sorted(present - STOP_COLOURS.keys())


def model_colours(models: Sequence[str]) -> dict[str, str]:
    return {m: MODEL_COLOURS[i % len(MODEL_COLOURS)] for i, m in enumerate(sorted(models))}


def budget_axis(ax: Axes, budgets: Iterable[int]) -> None:
    """Log2 budget axis with one labelled tick per swept budget and no others."""
    ticks = sorted({int(b) for b in budgets})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(ticks, [str(b) for b in ticks])
    ax.set_xlabel("output-token budget per turn")


def truncation_figure(trunc: Frame, target: float | None = None) -> Figure:
    """Truncation rate against budget per model, Wilson 95% bands, the target line and, per
    model, the budget picked for it (the `target_budget` column) marked with a star."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, colour, marker, rows in series(trunc):
        g = rows.sort_values("budget")
        ax.plot(g["budget"], g["truncation_rate"], marker=marker, color=colour, label=label)
        ax.fill_between(g["budget"], g["trunc_low"], g["trunc_high"], color=colour, alpha=0.2)
        if "thinking_cut_rate" in g and float(g["thinking_cut_rate"].fillna(0).max()) > 0:
            # The part of the truncation rate whose cap went on reasoning (`LengthSignal.REASONING`).
            ax.plot(g["budget"], g["thinking_cut_rate"], marker=marker, color=colour, linestyle=":",
                    linewidth=1, markerfacecolor="none", label=f"{label}: thinking cut")
        picked = g["target_budget"].dropna().unique() if "target_budget" in g else []
        if len(picked):
            budget = int(picked[0])
            rate = float(g.loc[g["budget"] == budget, "truncation_rate"].iloc[0])
            ax.plot([budget], [rate], marker="*", markersize=16, color=colour, linestyle="none",
                    label=f"{label}: picked {budget}")
            ax.axvline(budget, color=colour, linestyle=":", linewidth=1)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:.0%}")
    budget_axis(ax, trunc["budget"])
    ax.set_ylabel("truncation rate")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("Truncation rate with Wilson 95% intervals")
    return fig


def error_figure(trunc: Frame) -> Figure:
    """Error rate against budget per model: the truncation rate leaves `error` episodes out,
    so a cell where the provider failed often looks healthy without this one."""
    fig, ax = plt.subplots(figsize=(7, 3))
    for label, colour, marker, rows in series(trunc):
        g = rows.sort_values("budget")
        ax.plot(g["budget"], g["error_rate"], marker=marker, color=colour, label=label)
    budget_axis(ax, trunc["budget"])
    ax.set_ylabel("share of episodes in error")
    ax.set_ylim(0, max(0.05, float(trunc["error_rate"].max()) * 1.1))
    ax.legend(fontsize=8)
    ax.set_title("Error rate (provider or environment failures)")
    return fig


#: A turn index drawn in `per_turn_figure` needs this many turns in a cell for its band (and
#: point): a later turn that few episodes reach has a band spanning most of the axis.
MIN_TURNS = 10
#: Line styles (and colours) of the turn indices in `per_turn_figure`: the first four turns.
TURN_STYLES = (("-", "#1f77b4"), ("--", "#ff7f0e"), ("-.", "#2ca02c"), (":", "#9467bd"))


def _panels(count: int, rows: int = 1, width: float = 3.6, height: float = 3.2) -> tuple[Figure, list[Any]]:
    """A grid of `rows` x `count` panels sharing the y axis, one column per line of `series`:
    small multiples instead of a dozen lines and bands over one another."""
    fig, axes = plt.subplots(rows, count, figsize=(max(6.0, width * count), height * rows), sharey=True,
                             squeeze=False)
    return fig, [list(r) for r in axes]


def per_turn_figure(per_turn: Frame, target: float | None = None) -> Figure:
    """Turns cut / turns against budget, one column of panels per model (and setting): top, by
    turn index (the first four, one style and colour each, a cell drawn only with at least
    `MIN_TURNS` turns); bottom, by turn kind. Bands are Wilson 95%, at most four in a panel."""
    lines = series(per_turn)
    fig, (top, bottom) = _panels(len(lines), rows=2)
    for i, (label, _colour, marker, rows) in enumerate(lines):
        indices = sorted(rows["turn_index"].dropna().unique())[:4]
        for index, (style, colour) in zip(indices, TURN_STYLES, strict=False):
            g = rows[(rows["turn_index"] == index) & (rows["turns"] >= MIN_TURNS)].sort_values("budget")
            if g.empty:
                continue
            top[i].plot(g["budget"], g["cut_rate"], style, marker=marker, color=colour,
                        label=f"turn {int(index)}")
            top[i].fill_between(g["budget"], g["cut_low"], g["cut_high"], color=colour, alpha=0.12)
        for kind, (style, colour) in (("call", TURN_STYLES[0]), ("answer", TURN_STYLES[1])):
            g = rows[rows["turn_kind"] == kind].sort_values("budget")
            bottom[i].plot(g["budget"], g["cut_rate"], style, marker=marker, color=colour, label=kind)
            bottom[i].fill_between(g["budget"], g["cut_low"], g["cut_high"], color=colour, alpha=0.12)
        top[i].set_title(label, fontsize=10)
        for ax in (top[i], bottom[i]):
            if target is not None:
                ax.axhline(target, color="grey", linestyle=":", linewidth=1)
            budget_axis(ax, per_turn["budget"])
            ax.set_ylim(0, 1)
        top[i].set_xlabel("")
    top[0].set_ylabel("share of turns cut\nby turn index")
    bottom[0].set_ylabel("share of turns cut\nby turn kind")
    top[-1].legend(fontsize=8, loc="upper right")
    bottom[-1].legend(fontsize=8, loc="upper right")
    fig.suptitle("Turns cut at each budget")
    fig.tight_layout()
    return fig


def stop_mix_figure(mix: Frame) -> Figure:
    """Stacked share of each stop reason per budget, one panel per model (and reasoning
    setting), in the fixed colours: a panel holds one bar per budget, labelled by its budget."""
    reasons = ordered_reasons(str(r) for r in mix["stop_reason"].unique())
    keys = [c for c in ("model", "reasoning") if c in mix]
    groups = list(mix.groupby(keys, observed=True, sort=True)) if keys else [((), mix)]
    fig, (axes,) = _panels(len(groups), width=2.6, height=3.4)
    for ax, (key, rows) in zip(axes, groups, strict=True):
        table = rows.pivot_table(index="budget", columns="stop_reason", values="share", fill_value=0.0,
                                 observed=True).reindex(columns=reasons, fill_value=0.0)
        table.plot(kind="bar", stacked=True, width=0.75, ax=ax, legend=False,
                   color=[stop_colour(r) for r in reasons])
        name = " ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("budget")
        ax.tick_params(axis="x", labelrotation=0)
    axes[0].set_ylabel("share of episodes")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, title="stop reason", loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=8)
    fig.suptitle("Stop-reason mix")
    fig.tight_layout()
    return fig


def turn_lengths(episodes: Any) -> Frame:
    """One row per turn of `episodes` (`load_analysis`'s table): model, budget, the turn's
    output tokens and whether the cap cut it (`finish_class` length)."""
    import pandas as pd  # type: ignore[import-untyped]  # pandas ships no stubs (module docstring)

    models, budgets = episodes.column("model").to_pylist(), episodes.column("budget").to_pylist()
    rows = [(m, b, t["output_tokens"], t["finish_class"] == "length")
            for m, b, turns in zip(models, budgets, episodes.column("turns").to_pylist(), strict=True)
            for t in turns]
    return pd.DataFrame(rows, columns=["model", "budget", "output_tokens", "cut"])


def output_length_figure(lengths: Frame) -> Figure:
    """The figure a budget is picked from: per model, the share of turns that wanted more than
    x output tokens (a survival curve, from the model's largest swept budget, where the fewest
    turns are cut), each swept budget marked with the share of turns it would cut. Turns cut
    even at the largest budget wanted more than it: the curve ends there, at that share."""
    models = sorted(lengths["model"].unique())
    colours = model_colours(models)
    budgets = sorted({int(b) for b in lengths["budget"]})
    fig, (axes,) = _panels(len(models), width=4.4, height=3.6)
    for ax, model in zip(axes, models, strict=True):
        rows = lengths[lengths["model"] == model]
        top = int(rows["budget"].max())
        turns = rows[rows["budget"] == top]
        counts = turns["output_tokens"].clip(lower=1).sort_values().to_numpy()
        shares = 1.0 - (np.arange(len(counts)) + 1) / len(counts)
        ax.step(counts, shares, where="post", color=colours[model])
        for b in budgets:
            above = float((turns["output_tokens"] >= b).mean()) if b < top else float(turns["cut"].mean())
            ax.axvline(b, color="grey", linestyle="--", linewidth=0.8)
            ax.annotate(f"{above:.0%}", (b, above), textcoords="offset points", xytext=(3, 4), fontsize=8)
            ax.plot([b], [above], "o", color=colours[model], markersize=4)
        budget_axis(ax, budgets)
        ax.set_xlim(budgets[0] / 4, budgets[-1] * 1.5)
        ax.tick_params(axis="x", labelrotation=60, labelsize=8)
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{model} (turns at budget {top})", fontsize=10)
    axes[0].set_ylabel("share of turns wanting more than x tokens")
    fig.suptitle("Output length per turn, the swept budgets marked (dashed)")
    fig.tight_layout()
    return fig


def wasted_figure(trunc: Frame) -> Figure:
    """Output tokens wasted on cut or discarded turns: per episode (left) and as a share of all
    output tokens (right), so cells of different sizes compare."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label, colour, marker, rows in series(trunc):
        g = rows.sort_values("budget")
        per_episode = g["wasted_output_tokens"] / g["episodes"]
        left.plot(g["budget"], per_episode, marker=marker, color=colour, label=label)
        right.plot(g["budget"], g["wasted_fraction"], marker=marker, color=colour, label=label)
    for ax, label in ((left, "wasted output tokens per episode"), (right, "share of output tokens wasted")):
        budget_axis(ax, trunc["budget"])
        ax.set_ylabel(label)
    left.legend()
    fig.suptitle("Output tokens wasted on cut or discarded turns")
    fig.tight_layout()
    return fig


def reward_figure(trunc: Frame) -> Figure:
    """Mean stored reward against budget per model (the stop_on reasons count 0, by policy)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, colour, marker, rows in series(trunc):
        g = rows.sort_values("budget")
        ax.plot(g["budget"], g["mean_reward"], marker=marker, color=colour, label=label)
    budget_axis(ax, trunc["budget"])
    ax.set_ylabel("mean reward per episode")
    ax.set_ylim(0, 1.05)
    ax.legend()
    ax.set_title("Reward against budget")
    return fig


def size_cdf_figure(curves: Frame) -> Figure:
    """Per model (one panel each), the cumulative distribution of output tokens per turn and of
    each tool's call size (`collector.analysis.callsizes.size_curve_table`), against tokens on a
    log2 axis with every swept budget ticked and ruled: where a tool's curve crosses 1 - x is
    the budget that keeps its cuts at x; a curve still below 1 at the last rule needs more."""
    models = sorted(curves["model"].unique())
    fig, axes = plt.subplots(1, max(len(models), 1), figsize=(6 * max(len(models), 1), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=False):
        rows = curves[curves["model"] == model]
        budgets = sorted({int(b) for bs in rows["budgets"] for b in bs})
        names = list(dict.fromkeys(rows["series"]))
        for i, name in enumerate(names):
            g = rows[rows["series"] == name].sort_values("tokens")
            style = "-" if i == 0 else ("--", "-.", ":")[(i - 1) % 3]
            ax.step(g["tokens"].clip(lower=1), g["cdf"], where="post", linestyle=style,
                    color=MODEL_COLOURS[i % len(MODEL_COLOURS)], label=name)
        for b in budgets:
            ax.axvline(b, color="grey", linestyle=":", linewidth=1)
        budget_axis(ax, budgets)
        ax.set_xlabel("output tokens (a cut one: more than its cap)")
        ax.set_ylim(0, 1.02)
        ax.set_title(model)
        ax.legend(fontsize=8, loc="lower right")
    axes[0][0].set_ylabel("share needing at most this many tokens")
    fig.suptitle("Output tokens per turn and per tool call, with the swept budgets")
    fig.tight_layout()
    return fig
