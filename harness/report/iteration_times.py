"""How iteration times spread across ranks: a box per rank, a panel per algorithm."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, NullLocator

from harness.report import look
from harness.report.data import RunData

KEY = "iteration_times"
TITLE = "Iteration times per rank"
MAX_RANKS = 32  # boxes per panel; more ranks are sampled evenly (the first and the last kept)
COLUMNS = 3
LOG_SPAN = 30  # a log scale when the longest iteration is this many times the shortest


def shown_ranks(ranks) -> list[int]:
    """At most :data:`MAX_RANKS` of ``ranks`` (sorted), evenly spaced, the first and last included."""
    ranks = sorted(int(r) for r in ranks)
    if len(ranks) <= MAX_RANKS:
        return ranks
    return [ranks[i] for i in sorted(set(np.linspace(0, len(ranks) - 1, MAX_RANKS).round().astype(int)))]


def figure(steps: pd.DataFrame, algorithms: list[str], palette: look.Palette):
    """Per algorithm a panel of boxes of ``end_s - start_s`` (ms) for each rank :func:`shown_ranks`
    keeps: box from the 25th to the 75th percentile, median line, whiskers at the 5th and 95th,
    the rest as dots. One y scale for all panels, logarithmic when the longest iteration is more
    than :data:`LOG_SPAN` times the shortest."""
    fig, axes, columns = look.panel_grid(11, 1.85, len(algorithms), COLUMNS, gap_x=0.3, sharey=True)
    durations = steps.assign(ms=(steps["end_s"] - steps["start_s"]) * 1e3)
    positive = durations["ms"][durations["ms"] > 0]
    log = len(positive) > 0 and positive.max() > LOG_SPAN * positive.min()
    for ax, algorithm in zip(axes, algorithms):
        rows_of = durations[durations["algorithm"] == algorithm]
        ranks = shown_ranks(rows_of["rank"].unique())
        by_rank = dict(tuple(rows_of.groupby("rank")["ms"]))
        data = [by_rank[r].clip(lower=positive.min() if len(positive) else 1e-3).to_numpy() for r in ranks]
        colour = palette.colour(algorithm)
        ax.boxplot(
            data,
            positions=range(len(ranks)),
            widths=0.65,
            whis=(5, 95),
            patch_artist=True,
            boxprops={"facecolor": colour, "alpha": 0.75, "edgecolor": "#333333", "linewidth": 0.6},
            medianprops={"color": "#111111", "linewidth": 1.2},
            whiskerprops={"color": "#555555", "linewidth": 0.6},
            capprops={"color": "#555555", "linewidth": 0.6},
            flierprops={
                "marker": ".",
                "markersize": 2,
                "markerfacecolor": "#555555",
                "markeredgecolor": "none",
                "alpha": 0.5,
            },
        )
        step = max(1, math.ceil(len(ranks) / (16 if len(str(ranks[-1])) < 3 else 8)))  # labels that fit
        ax.set_xticks(range(0, len(ranks), step), [str(r) for r in ranks[::step]])
        total = rows_of["rank"].nunique()
        shown = "" if len(ranks) == total else f", {len(ranks)} of {total} ranks"
        ax.set_title(f"{palette.label(algorithm)}{shown}", loc="left")
        if log:
            ax.set_yscale("log")
            ax.yaxis.set_minor_locator(NullLocator())  # minor ticks of a dozen log axes cost most of the drawing
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        else:
            ax.set_ylim(bottom=0)
        look.mark_panel(ax, colour)
        ax.grid(axis="x", visible=False)
    for ax in axes[::columns]:
        ax.set_ylabel("iteration time (ms)")
    for ax in axes[max(0, len(axes) - columns) :]:  # the lowest panel of each column
        ax.set_xlabel("rank")
    return fig


def section(run: RunData, palette: look.Palette) -> look.Section:
    if run.steps.empty:
        return look.Section(KEY, TITLE, absent="No step records: no algorithm finished (run.json says which).")
    caption = (
        "Iteration time (end_s - start_s of each step, injected delay included) per rank, on a scale shared "
        f"by every panel (logarithmic when the longest is over {LOG_SPAN} times the shortest): box from the "
        "25th to the 75th percentile, line at the median, whiskers at the 5th "
        "and 95th percentiles, the iterations beyond them as dots."
    )
    if run.steps["rank"].nunique() > MAX_RANKS:
        caption += f" With more than {MAX_RANKS} ranks, {MAX_RANKS} evenly spaced ranks are shown."
    return look.Section(KEY, TITLE, figure(run.steps, run.algorithms, palette), caption)
