"""A few iterations of every rank as horizontal bars: injected delay, compute, waiting.

The parts of an iteration are laid out as trace.json lays them (results/README.md, trace.json):
injected delay from ``start_s``, then compute, then blocked communication; the rest of the
iteration (the loop's bookkeeping) is left blank.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.patches import Patch

from harness.report import look
from harness.report.data import RunData

KEY = "timeline"
TITLE = "Timeline of the first iterations"
ITERATIONS = 6  # iterations per rank shown
MAX_RANKS = 16  # rows per panel (the first ranks)
COLUMNS = 2
ORDER = ("injected delay", "compute", "waiting")  # the order the training loop runs them


def window(steps: pd.DataFrame, iterations: int = ITERATIONS) -> pd.DataFrame:
    """The step rows the timeline shows: ranks below :data:`MAX_RANKS`, ``iterations`` of each,
    after the first (it includes warm-up) when there are enough."""
    last = int(steps["iteration"].max()) if len(steps) else 0
    first = 1 if last >= iterations else 0
    keep = (steps["rank"] < MAX_RANKS) & (steps["iteration"] >= first) & (steps["iteration"] < first + iterations)
    return steps[keep]


def figure(steps: pd.DataFrame, algorithms: list[str], palette: look.Palette):
    """A panel per algorithm of :func:`window`'s rows: rank on the y axis (rank 0 on top), time
    since the algorithm's start on the x axis, a thin tick where each iteration starts."""
    ranks = int(steps["rank"].max()) + 1 if len(steps) else 1
    fig, axes, columns = look.panel_grid(11, 0.25 + 0.17 * ranks, len(algorithms), COLUMNS, top=0.45, left=0.6)
    for ax, algorithm in zip(axes, algorithms):
        rows_of = steps[steps["algorithm"] == algorithm]
        rank = rows_of["rank"].to_numpy(dtype=float)
        left = rows_of["start_s"].to_numpy()
        for part in ORDER:  # one collection per part: a rectangle per step
            width = rows_of[look.PART_COLUMNS[part]].to_numpy()
            keep = width > 0
            # The stubs want a Sequence of vertex arrays; an [n, 4, 2] array is one.
            ax.add_collection(
                PolyCollection(
                    _rectangles(left[keep], width[keep], rank[keep]),  # type: ignore[arg-type]
                    linewidths=0,
                    facecolors=look.PART_COLOURS[part],
                )
            )
            left = left + width
        ticks = np.stack(
            [np.column_stack([rows_of["start_s"], rank - 0.45]), np.column_stack([rows_of["start_s"], rank + 0.45])],
            axis=1,
        )
        # The stubs want a Sequence of lines; an [n, 2, 2] array is one.
        ax.add_collection(LineCollection(ticks, colors="#222222", linewidths=0.6))  # type: ignore[arg-type]
        shown = sorted(int(r) for r in rows_of["rank"].unique())
        ax.set_ylim(max(shown, default=0) + 0.6, -0.6)
        ax.set_yticks(shown[:: max(1, math.ceil(len(shown) / 8))])
        ax.set_title(palette.label(algorithm), loc="left")
        ax.grid(axis="y", visible=False)
        look.mark_panel(ax, palette.colour(algorithm))
        if len(rows_of):
            ax.set_xlim(float(rows_of["start_s"].min()), float(rows_of["end_s"].max()))
    for ax in axes[::columns]:
        ax.set_ylabel("rank")
    for ax in axes[max(0, len(axes) - columns) :]:  # the lowest panel of each column
        ax.set_xlabel("time since the algorithm's start (s)")
    handles = [Patch(facecolor=look.PART_COLOURS[p], label=p) for p in ORDER]
    handles.append(Patch(facecolor="white", edgecolor="#999999", label="other (loop bookkeeping)"))
    fig.legend(handles=handles, loc="upper center", ncols=len(handles), frameon=False)
    return fig


def _rectangles(left: np.ndarray, width: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Vertices ``[n, 4, 2]`` of the bars [left, left + width] x [rank - 0.4, rank + 0.4]."""
    low, high = rank - 0.4, rank + 0.4
    return np.stack(
        [
            np.column_stack([left, low]),
            np.column_stack([left + width, low]),
            np.column_stack([left + width, high]),
            np.column_stack([left, high]),
        ],
        axis=1,
    )


def section(run: RunData, palette: look.Palette) -> look.Section:
    if run.steps.empty:
        return look.Section(KEY, TITLE, absent="No step records: no algorithm finished (run.json says which).")
    steps = window(run.steps)
    first, last = int(steps["iteration"].min()), int(steps["iteration"].max())
    ranks = run.steps["rank"].nunique()
    caption = (
        f"Iterations {first} to {last} of every rank{f' below {MAX_RANKS}' if ranks > MAX_RANKS else ''} "
        f"(steps.csv), each algorithm on its own time axis. A black tick marks the start of each iteration; "
        "its parts are drawn in the order the training loop runs them: injected delay, compute, then the "
        "time blocked in communication (pieces of it that happened earlier are drawn as one span at the end). "
        "Blank: the loop's bookkeeping within an iteration; between iterations, pauses outside any iteration "
        "(evaluation points, where the ranks meet)."
    )
    if first == 1:
        caption += " Iteration 0 is left out: it includes warm-up."
    return look.Section(KEY, TITLE, figure(steps, run.algorithms, palette), caption)
