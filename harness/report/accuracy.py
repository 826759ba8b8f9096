"""Test accuracy and loss of the averaged model against (wall or simulated) time, one line per algorithm;
with the run's simulations with values (``compare --train``) beside it. A run without evaluations
whose steps have a loss (a torch.distributed script that records only its training loss,
``harness.dist.record``) gets its training loss against time instead."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from matplotlib.lines import Line2D

from harness.report import look
from harness.report.data import RunData
from harness.results.summary import evaluation_ready_s

if TYPE_CHECKING:
    from matplotlib.typing import LineStyleType

KEY = "accuracy"
TITLE = "Test accuracy against time"


# Line style per simulation in the directory.
_SIMULATED_STYLE: dict[str, LineStyleType] = {"sim-trace": "--", "sim-predictive": ":"}


def _on_training_time(average: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """``average`` with ``time_s`` replaced, per algorithm, by the training time at which each
    evaluated average existed (``harness.results.summary.evaluation_ready_s``: the count of
    summary.csv's time to target), where the steps are there to say it."""
    if steps is None or steps.empty or average.empty:
        return average
    out = average.copy()
    for algorithm, rows in average.groupby("algorithm"):
        mine = steps[steps["algorithm"] == algorithm]
        if not mine.empty:
            out.loc[rows.index, "time_s"] = evaluation_ready_s(mine, rows)
    return out


def figure(
    evals: pd.DataFrame,
    algorithms: list[str],
    palette: look.Palette,
    target: float | None = None,
    simulations: dict[str, tuple[pd.DataFrame, pd.DataFrame]] | None = None,
    simulated_time: bool = False,
    steps: pd.DataFrame | None = None,
    target_loss: float | None = None,
):
    """Two panels, test accuracy (%) and test loss of the ``average`` model against training time
    (with ``steps``, the run's steps.csv: when each evaluated average existed, evaluation time
    excluded, as summary.csv's time to target counts; without, ``time_s``); the target accuracy
    as a dotted line. ``simulations``: (evaluations, steps) of simulations with values of the
    same run (``compare --train``: sim-trace, sim-predictive), drawn in the algorithm's colour,
    dashed or dotted. ``simulated_time``: the run itself is a simulation (its times are simulated).
    ``target_loss``: the scenario's target test loss, a dotted line on the loss panel."""
    average = _on_training_time(evals[evals["model"] == "average"], steps)
    fig = look.new_figure(11, 3.6)
    acc_ax, loss_ax = fig.subplots(1, 2)
    for algorithm in algorithms:
        rows = average[average["algorithm"] == algorithm].sort_values(["time_s", "iteration"])
        if rows.empty:
            continue
        look_of = {"color": palette.colour(algorithm), "marker": "o", "markersize": 3.5, "linewidth": 1.6}
        acc_ax.plot(rows["time_s"], rows["test_accuracy"] * 100, label=palette.label(algorithm), **look_of)
        loss_ax.plot(rows["time_s"], rows["test_loss"], **look_of)
        for name, (frame, sim_steps) in (simulations or {}).items():
            sim = _on_training_time(frame[(frame["model"] == "average") & (frame["algorithm"] == algorithm)], sim_steps)
            sim = sim.sort_values("time_s")
            style = {
                "color": palette.colour(algorithm),
                "linestyle": _SIMULATED_STYLE.get(name, "--"),
                "linewidth": 1.2,
            }
            acc_ax.plot(sim["time_s"], sim["test_accuracy"] * 100, **style)
            loss_ax.plot(sim["time_s"], sim["test_loss"], **style)
    if target is not None:
        acc_ax.axhline(target * 100, color="black", linestyle=":", linewidth=1, label=f"target {target * 100:g}%")
    if target_loss is not None:
        loss_ax.axhline(target_loss, color="black", linestyle=":", linewidth=1)
        loss_ax.annotate(
            f"target loss {target_loss:g}",
            (0.99, target_loss),
            xycoords=("axes fraction", "data"),
            ha="right",
            va="bottom",
            fontsize=8,
        )
    handles, labels = acc_ax.get_legend_handles_labels()
    for name in simulations or {}:
        handles.append(Line2D([], [], color="dimgrey", linestyle=_SIMULATED_STYLE.get(name, "--")))
        labels.append(f"simulated ({name.removeprefix('sim-')})")
    when = "simulated time" if simulated_time else "wall time"
    what = "training " + when if steps is not None else when
    acc_ax.set(
        xlabel=f"{what} since the algorithm's start (s)",
        ylabel="test accuracy (%)",
        title="averaged model: test accuracy",
    )
    loss_ax.set(xlabel=f"{what} since the algorithm's start (s)", ylabel="test loss", title="averaged model: test loss")
    fig.legend(handles, labels, loc="outside right upper", frameon=False)
    return fig


def training_loss_figure(steps: pd.DataFrame, algorithms: list[str], palette: look.Palette):
    """The training loss (steps.csv's ``loss``, the mean over the ranks of each iteration) against
    the training time at which the iteration ended on every rank, since the algorithm's first step."""
    fig = look.new_figure(7, 3.6)
    ax = fig.subplots()
    for algorithm in algorithms:
        mine = steps[(steps["algorithm"] == algorithm)]
        rows = mine[mine["loss"].notna()]
        if rows.empty:
            continue
        per = rows.groupby("iteration").agg(loss=("loss", "mean"))
        ended = mine.groupby("iteration")["end_s"].max().reindex(per.index) - float(mine["start_s"].min())
        ax.plot(
            ended,
            per["loss"],
            color=palette.colour(algorithm),
            marker="o",
            markersize=2.5,
            linewidth=1.4,
            label=palette.label(algorithm),
        )
    ax.set(
        xlabel="wall time since the algorithm's start (s)",
        ylabel="training loss (mean over ranks)",
        title="training loss",
    )
    fig.legend(loc="outside right upper", frameon=False)
    return fig


def section(run: RunData, palette: look.Palette) -> look.Section:
    evals = run.evals[run.evals["model"] == "average"]
    if evals.empty and len(run.steps) and run.steps["loss"].notna().any():
        caption = (
            "No evaluations (evals.csv has no rows), so the training loss instead: each point is the mean over "
            "the ranks of the loss their step recorded (steps.csv's loss), at the time the last rank ended that "
            "step, since the algorithm's first step. A torch.distributed script adds evaluations with "
            "harness.dist.record(..., evaluation=True)."
        )
        return look.Section(
            KEY, "Training loss against time", training_loss_figure(run.steps, run.algorithms, palette), caption
        )
    if evals.empty:
        return look.Section(KEY, TITLE, absent=_why_none(run))
    missing = [a for a in run.algorithms if a not in set(evals["algorithm"])]
    caption = (
        "Each point is an evaluation of the average of all ranks' models on the test split (evals.csv, "
        "model = average), at the training time its average existed: when the last rank had finished the "
        "iteration, since that algorithm's start, earlier evaluations' time excluded (the count of the "
        f"summary's time to target{'; simulated time' if run.simulated else ''})."
    )
    simulations = {
        name: (sim.evals, sim.steps)
        for name, sim in run.simulations.items()
        if not sim.evals[sim.evals["model"] == "average"].empty
    }
    if simulations:
        caption += (
            " Dashed (trace-driven) and dotted (predictive): the same run simulated with values "
            "(`compare --train`), against simulated time."
        )
    if missing:
        caption += f" No evaluations for: {', '.join(missing)}."
    if run.target_loss is not None:
        caption += f" Dotted: the target accuracy and the target loss ({run.target_loss:g})."
    return look.Section(
        KEY,
        TITLE,
        figure(
            evals,
            run.algorithms,
            palette,
            run.target_accuracy,
            simulations,
            simulated_time=run.simulated,
            steps=run.steps,
            target_loss=run.target_loss,
        ),
        caption,
    )


def _why_none(run: RunData) -> str:
    if run.simulated:
        return (
            "No accuracy: this simulation carried no values, so it predicts time, not accuracy (its evals.csv has "
            "no rows); `python -m harness simulate FILE --train` makes the simulated ranks train."
        )
    workload = run.scenario.get("workload") or {}
    if workload.get("compute") == "emulated":
        return "No accuracy: the workload's compute is emulated, so there is no model to test (evals.csv has no rows)."
    if not len(run.steps):
        return "No accuracy: no algorithm finished (run.json says which), so there are no evaluations yet."
    return "No accuracy: evals.csv has no evaluation of the averaged model."
