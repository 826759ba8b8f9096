"""Figure 8 (the papers' question): which method reaches the target accuracy first on N workers
with stragglers, simulated with values at 16 to 1,024 workers.

Input: ``time_to_accuracy`` (the simulated sweep's CSV, ``experiments.time_to_accuracy``:
``scenarios/at_scale.yaml``'s methods training an MLP on ``teacher``, 256 samples per worker,
the same 2,000 test samples at every worker count, two random workers sleeping 150 ms per
iteration; evaluations of the averaged model every 25 iterations).

- Panel 0: test accuracy (%) of the averaged model against simulated time (``ready_s``: when the
  last worker reached the evaluation, so the averaged model exists; log x) at one worker count:
  :data:`SHOWN_RANKS` when the sweep has it, else its largest. The target is a dashed line.
- Panel 1: simulated time to the target accuracy (the first evaluation at or above it) against
  workers (log x and y), one line per method through the worker counts where it got there. A
  method that did not reach it within its run is a hollow triangle at the run's length (a lower
  bound on its time to the target), in its colour, in the series :data:`NOT_REACHED`.

The table has one row per drawn point (``panel``, ``series`` = the legend label, ``x``, ``y``)
plus the context columns ``algorithm``, ``ranks``, ``iteration`` (the evaluation's; in panel 1
the first at or above the target, or the run's last when not reached), ``reached``, ``source``,
``x_unit`` and ``y_unit``.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from harness.report import style

NAME = "fig8_time_to_accuracy"
SWEEP = "time_to_accuracy"
SHOWN_RANKS = 256  # panel 0's worker count when the sweep has it (the full sweep does)
NOT_REACHED = "not reached (drawn at the run's length)"
COLUMNS = ["panel", "series", "x", "y", "algorithm", "ranks", "iteration", "reached", "source", "x_unit", "y_unit"]
SOURCE = "simulated with values"


def _plain_log(axis) -> None:
    """Ticks at 1, 2, 3 and 5 times the powers of ten of a log axis, written plainly (0.5, not 5 x 10^-1)."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def shown_ranks(sweep: pd.DataFrame) -> int:
    """Panel 0's worker count: :data:`SHOWN_RANKS` if the sweep has it, else its largest."""
    ranks = set(int(r) for r in sweep["ranks"].unique())
    return SHOWN_RANKS if SHOWN_RANKS in ranks else max(ranks)


def table(sweep: pd.DataFrame) -> pd.DataFrame:
    """The plotted data of the sweep (module docstring)."""
    if sweep.empty:
        raise ValueError(f"{NAME}: the time_to_accuracy sweep has no evaluations")
    rows = []
    at = shown_ranks(sweep)
    curves = sweep[sweep["ranks"] == at].dropna(subset=["ready_s", "test_accuracy"])
    for algorithm in style.ordered(curves["algorithm"].unique()):
        part = curves[curves["algorithm"] == algorithm].sort_values("iteration")
        rows += [
            {
                "panel": 0,
                "series": style.label(algorithm),
                "x": float(rec.ready_s),
                "y": 100.0 * float(rec.test_accuracy),
                "algorithm": algorithm,
                "ranks": at,
                "iteration": int(rec.iteration),
                "reached": bool(rec.test_accuracy >= rec.target_accuracy),
                "source": SOURCE,
                "x_unit": "simulated s",
                "y_unit": "test accuracy of the averaged model (%)",
            }
            for rec in part.itertuples(index=False)
        ]
    missed = []
    for algorithm in style.ordered(sweep["algorithm"].unique()):
        for ranks, part in sorted(sweep[sweep["algorithm"] == algorithm].groupby("ranks")):
            first = part.iloc[0]
            row = {
                "algorithm": algorithm,
                "ranks": int(ranks),
                "source": SOURCE,
                "x_unit": "workers",
                "y_unit": f"simulated s to {first['target_accuracy']:.0%} test accuracy",
            }
            if int(first["iteration_to_target"]) >= 0:
                rows.append(
                    {
                        "panel": 1,
                        "series": style.label(algorithm),
                        "x": float(ranks),
                        "y": float(first["time_to_target_s"]),
                        "iteration": int(first["iteration_to_target"]),
                        "reached": True,
                        **row,
                    }
                )
            else:
                last = part.sort_values("iteration").iloc[-1]
                missed.append(
                    {
                        "panel": 1,
                        "series": NOT_REACHED,
                        "x": float(ranks),
                        "y": float(last["ready_s"]),
                        "iteration": int(last["iteration"]),
                        "reached": False,
                        **row,
                    }
                )
    return pd.DataFrame(rows + missed, columns=COLUMNS)


def _iterations(sweep: pd.DataFrame) -> str:
    """The runs' lengths in words: ``"400 iterations at 16 and 64 workers, 200 at 256"``."""
    by_count: dict[int, list[int]] = {}
    for ranks, count in sorted(sweep.groupby("ranks")["iterations"].max().items()):
        by_count.setdefault(int(count), []).append(int(ranks))
    parts = [f"{count} at {' and '.join(f'{r:,}' for r in ranks)}" for count, ranks in by_count.items()]
    return "iterations: " + ", ".join(parts) + " workers"


def draw(inputs: dict[str, Path]) -> tuple[plt.Figure, pd.DataFrame]:
    sweep = pd.read_csv(inputs[SWEEP])
    data = table(sweep)
    target = float(sweep["target_accuracy"].iloc[0])
    style.setup()
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.2))

    ax = axes[0]
    curves = data[data["panel"] == 0]
    for algorithm in dict.fromkeys(curves["algorithm"]):
        rows = curves[curves["algorithm"] == algorithm]
        style.line(ax, algorithm, rows["x"].to_numpy(), rows["y"].to_numpy(), linewidth=1.8, markersize=6)
    ax.axhline(100.0 * target, color="black", linestyle="--", linewidth=1.0, label="_target")
    ax.set_xscale("log")
    ax.set_xlabel("simulated time until the averaged model exists (s, log scale)")
    ax.set_ylabel("test accuracy of the averaged model (%)")
    at = int(curves["ranks"].iloc[0])
    _plain_log(ax.xaxis)
    ax.set_title(
        f"Accuracy vs time at {at:,} workers (dashed: the {target:.0%} target)\n"
        f"MLP on teacher, 256 samples per worker; 2 random workers\nsleep 150 ms per iteration",
        fontsize=10,
    )

    ax = axes[1]
    times = data[data["panel"] == 1]
    for algorithm in dict.fromkeys(times.loc[times["reached"], "algorithm"]):
        rows = times[(times["algorithm"] == algorithm) & times["reached"]].sort_values("x")
        style.line(ax, algorithm, rows["x"].to_numpy(), rows["y"].to_numpy(), linewidth=1.8, markersize=6)
    missed = times[~times["reached"].astype(bool)]
    if len(missed):
        ax.scatter(
            missed["x"],
            missed["y"],
            marker="^",
            s=90,
            facecolors="none",
            edgecolors=[style.color(a) for a in missed["algorithm"]],
            linewidths=2.0,
            zorder=5,
            label=NOT_REACHED,
        )
        final = sweep.groupby(["algorithm", "ranks"])["final_accuracy"].first()
        for rec in missed.itertuples(index=False):  # what it got to instead
            ax.annotate(
                f"{100 * final[(rec.algorithm, rec.ranks)]:.1f}%",
                (rec.x, rec.y),
                xytext=(7, -3),
                textcoords="offset points",
                fontsize=8,
                color=style.color(rec.algorithm),
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted(set(int(x) for x in times["x"]))
    ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    _plain_log(ax.yaxis)
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * 1.15)  # room above the highest point
    ax.set_xlabel(f"workers (weak scaling: 256 samples each; {_iterations(sweep)})", fontsize=9)
    ax.set_ylabel(f"simulated time to {target:.0%} test accuracy (s, log scale)")
    ax.set_title(
        f"Time to {target:.0%} vs workers, simulated with values\n(the first evaluation, every "
        f"{int(sweep['eval_every'].iloc[0])} iterations, at or above the target"
        + (";\nnot reached: the accuracy it ended at)" if len(missed) else ")"),
        fontsize=10,
    )

    handles = {}
    for axis in axes:
        for artist in [*axis.get_lines(), *axis.collections]:
            if not artist.get_label().startswith("_"):
                handles.setdefault(artist.get_label(), artist)
    if NOT_REACHED in handles:  # one grey triangle for the series drawn in every method's colour
        handles[NOT_REACHED] = Line2D(
            [],
            [],
            marker="^",
            markersize=9,
            markerfacecolor="none",
            markeredgecolor="dimgray",
            markeredgewidth=2.0,
            linestyle="none",
        )
    axes[1].legend(handles.values(), handles.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle(
        f"Time to accuracy at scale: the at_scale scenario's methods under stragglers, {min(ticks):,} to "
        f"{max(ticks):,} workers (simulated, every worker training for real)",
        fontsize=12,
    )
    return fig, data
