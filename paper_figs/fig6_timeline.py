"""Per-rank timeline (Gantt chart) of a few iterations under stragglers: Allreduce-SGD (panel 0)
beside WAGMA-SGD (panel 1), as in the WAGMA-SGD paper's timeline figure.

Input ``straggler``: a real run of ``scenarios/straggler.yaml``; it must hold step rows of both
``allreduce_sgd`` and ``wagma`` (a :class:`ValueError` names the one missing).

Window: :data:`WINDOW` (5) consecutive iterations starting at iteration :data:`FIRST` (10), i.e.
iterations 10-14. If the run is shorter, the window is moved back so that it ends at the last
iteration both algorithms have on every rank, and shrinks to all of them if there are fewer than 5.
The same iterations are drawn in both panels.

Each iteration of each rank is drawn in its rank's row as the trace (results/README.md,
trace.json) lays it out: from ``start_s``, the injected delay (``injected_delay_s``), then
compute (``compute_s``), then the blocked communication (``comm_blocked_s``, drawn as "waiting",
clipped at ``end_s``). Zero-length parts are not drawn; the gap up to ``end_s`` is the remainder
(optimizer step, averaging arithmetic). Time axis: ms since the earliest ``start_s`` of the window
in that panel (each algorithm ran at a different time of the run).

Bars are not lines, so :func:`harness.report.style.plotted` sees nothing labelled in this figure
(iteration boundaries are drawn as ``_``-labelled reference lines); :func:`bars` reads the drawn
bars back. The table has one row per bar: ``panel``, ``series`` (the kind: "injected delay",
"compute", "waiting"), ``x`` (bar start, ms), ``y`` (rank), ``width`` (ms), ``algorithm``,
``iteration``.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.container import BarContainer
from matplotlib.patches import Patch

from harness.report import style
from harness.results.records import RunDirectory

NAME = "fig6_timeline"
INPUT = "straggler"
ALGORITHMS = ("allreduce_sgd", "wagma")
FIRST, WINDOW = 10, 5
KINDS = ("injected delay", "compute", "waiting")
KIND_COLORS = {"injected delay": "#9467bd", "compute": "#2ca02c", "waiting": "#d62728"}
BAR_HEIGHT = 0.6
COLUMNS = ["panel", "series", "x", "y", "width", "algorithm", "iteration"]


def window(steps: pd.DataFrame) -> list[int]:
    """The iterations drawn: FIRST..FIRST+WINDOW-1, moved back / shrunk to fit the run."""
    complete = None
    for algorithm in ALGORITHMS:
        rows = steps[steps["algorithm"] == algorithm]
        ranks = rows["rank"].nunique()
        counts = rows.groupby("iteration")["rank"].nunique()
        done = set(counts[counts == ranks].index.astype(int))
        complete = done if complete is None else complete & done
    # The longest prefix 0..n-1 of iterations that every rank of both algorithms recorded.
    n = 0
    while n in complete:
        n += 1
    if n == 0:
        raise ValueError(f"{NAME}: no iteration is recorded on every rank of both {', '.join(ALGORITHMS)}")
    length = min(WINDOW, n)
    first = min(FIRST, n - length)
    return list(range(first, first + length))


def table(path: Path) -> pd.DataFrame:
    """One row per drawn bar of the run at ``path`` (see the module docstring)."""
    steps = RunDirectory.open(path).steps
    for algorithm in ALGORITHMS:
        if not (steps["algorithm"] == algorithm).any():
            found = ", ".join(dict.fromkeys(steps["algorithm"])) or "none"
            raise ValueError(
                f"{NAME}: run {path} has no steps of '{algorithm}' (algorithms in the run: {found}); "
                f"the timeline needs {' and '.join(ALGORITHMS)}"
            )
    iterations = window(steps)
    rows = []
    for panel, algorithm in enumerate(ALGORITHMS):
        part = steps[(steps["algorithm"] == algorithm) & steps["iteration"].isin(iterations)]
        t0 = float(part["start_s"].min())
        for rec in part.sort_values(["rank", "iteration"]).itertuples(index=False):
            cursor, end = float(rec.start_s), float(rec.end_s)
            for kind, duration in zip(KINDS, (rec.injected_delay_s, rec.compute_s, rec.comm_blocked_s)):
                stop = min(cursor + float(duration), end)
                if stop > cursor:
                    rows.append(
                        {
                            "panel": panel,
                            "series": kind,
                            "x": 1000.0 * (cursor - t0),
                            "y": int(rec.rank),
                            "width": 1000.0 * (stop - cursor),
                            "algorithm": algorithm,
                            "iteration": int(rec.iteration),
                        }
                    )
                cursor = max(cursor, stop)
    return pd.DataFrame(rows, columns=COLUMNS)


def bars(fig) -> pd.DataFrame:
    """The bars drawn in ``fig`` as (panel, series, x, y, width): read back from its bar containers
    (``series`` the container's label, ``y`` the bar's centre, ``x``/``width`` its left edge/width)."""
    rows = []
    for panel, ax in enumerate(fig.axes):
        for container in ax.containers:
            if not isinstance(container, BarContainer) or container.get_label().startswith("_"):
                continue
            for rect in container.patches:
                rows.append(
                    (
                        panel,
                        container.get_label(),
                        float(rect.get_x()),
                        float(rect.get_y() + rect.get_height() / 2),
                        float(rect.get_width()),
                    )
                )
    return pd.DataFrame(rows, columns=["panel", "series", "x", "y", "width"])


def draw(inputs: dict[str, Path]) -> tuple[plt.Figure, pd.DataFrame]:
    path = Path(inputs[INPUT])
    data = table(path)
    steps = RunDirectory.open(path).steps
    iterations = sorted(set(data["iteration"]))
    ranks = int(steps[steps["algorithm"].isin(ALGORITHMS)]["rank"].max()) + 1
    style.setup()
    fig, axes = plt.subplots(1, 2, figsize=(12, 1.2 + 0.45 * ranks + 1.0), sharey=True)
    for panel, (ax, algorithm) in enumerate(zip(axes, ALGORITHMS)):
        part = data[data["panel"] == panel]
        for kind in KINDS:
            rows = part[part["series"] == kind]
            if len(rows):
                ax.barh(
                    rows["y"].to_numpy(),
                    rows["width"].to_numpy(),
                    left=rows["x"].to_numpy(),
                    height=BAR_HEIGHT,
                    color=KIND_COLORS[kind],
                    edgecolor="none",
                    label=kind,
                )
        # Iteration ends, as thin unlabelled ticks over each rank's row (reference marks).
        window_steps = steps[(steps["algorithm"] == algorithm) & steps["iteration"].isin(iterations)]
        t0 = float(window_steps["start_s"].min())
        for rec in window_steps.itertuples(index=False):
            x = 1000.0 * (float(rec.end_s) - t0)
            ax.plot(
                [x, x],
                [rec.rank - BAR_HEIGHT / 2, rec.rank + BAR_HEIGHT / 2],
                color="0.2",
                linewidth=0.8,
                label="_iteration end",
            )
        ax.set_title(f"{style.label(algorithm)}: iterations {iterations[0]}-{iterations[-1]}")
        ax.set_xlabel("time since the window's first step (ms)")
        ax.set_xlim(left=0)
        ax.grid(axis="y", visible=False)
    axes[0].set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    axes[0].set_ylim(ranks - 0.5, -0.5)  # rank 0 on top
    axes[0].set_ylabel("rank")
    handles = [Patch(color=KIND_COLORS[k], label=k) for k in KINDS]
    handles.append(plt.Line2D([], [], color="0.2", linewidth=0.8, label="iteration end"))
    axes[1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle(f"Per-rank timeline under stragglers ('{path.parent.name}', run {path.name})", fontsize=12)
    return fig, data
