"""Test accuracy and loss of the averaged model against wall time, one line per algorithm."""

from __future__ import annotations

import pandas as pd

from harness.report import look
from harness.report.data import RunData

KEY = "accuracy"
TITLE = "Test accuracy against time"


def figure(evals: pd.DataFrame, algorithms: list[str], palette: look.Palette, target: float | None = None):
    """Two panels, test accuracy (%) and test loss of the ``average`` model against ``time_s``
    (seconds since the algorithm's t0); the target accuracy as a dotted line."""
    average = evals[evals["model"] == "average"]
    fig = look.new_figure(11, 3.6)
    acc_ax, loss_ax = fig.subplots(1, 2)
    for algorithm in algorithms:
        rows = average[average["algorithm"] == algorithm].sort_values(["time_s", "iteration"])
        if rows.empty:
            continue
        look_of = {"color": palette.colour(algorithm), "marker": "o", "markersize": 3.5, "linewidth": 1.6}
        acc_ax.plot(rows["time_s"], rows["test_accuracy"] * 100, label=palette.label(algorithm), **look_of)
        loss_ax.plot(rows["time_s"], rows["test_loss"], **look_of)
    if target is not None:
        acc_ax.axhline(target * 100, color="black", linestyle=":", linewidth=1, label=f"target {target * 100:g}%")
    acc_ax.set(xlabel="wall time since the algorithm's start (s)", ylabel="test accuracy (%)",
               title="averaged model: test accuracy")
    loss_ax.set(xlabel="wall time since the algorithm's start (s)", ylabel="test loss",
                title="averaged model: test loss")
    fig.legend(*acc_ax.get_legend_handles_labels(), loc="outside right upper", frameon=False)
    return fig


def section(run: RunData, palette: look.Palette) -> look.Section:
    evals = run.evals[run.evals["model"] == "average"]
    if evals.empty:
        return look.Section(KEY, TITLE, absent=_why_none(run))
    missing = [a for a in run.algorithms if a not in set(evals["algorithm"])]
    caption = ("Each point is an evaluation of the average of all ranks' models on the test split (evals.csv, "
               "model = average), at the time its models were taken (time_s: seconds since that algorithm's "
               "start).")
    if missing:
        caption += f" No evaluations for: {', '.join(missing)}."
    return look.Section(KEY, TITLE, figure(evals, run.algorithms, palette, run.target_accuracy), caption)


def _why_none(run: RunData) -> str:
    if run.simulated:
        return ("No accuracy: this is a simulation, and the model predicts time, not accuracy (its evals.csv has no "
                "rows). The real run of the scenario has it.")
    workload = run.scenario.get("workload") or {}
    if workload.get("compute") == "emulated":
        return "No accuracy: the workload's compute is emulated, so there is no model to test (evals.csv has no rows)."
    if not len(run.steps):
        return "No accuracy: no algorithm finished (run.json says which), so there are no evaluations yet."
    return "No accuracy: evals.csv has no evaluation of the averaged model."
