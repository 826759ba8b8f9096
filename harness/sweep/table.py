"""A sweep's results side by side: ``sweep.csv`` and ``sweep.png``.

``sweep.csv``: every finished point's ``summary.csv`` rows (one per algorithm label), after a
``point`` column and one column per swept key holding the point's value. ``sweep.png``:
throughput (samples/s), time to the target accuracy and time to the target loss (with a
``results.target_loss``) against the first swept key, a line per algorithm label, a column of
panels per combination of the other keys' values.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from harness.report.look import palette
from harness.results import atomic
from harness.results.records import SUMMARY_FILE
from harness.sweep.store import SweepDirectory

TABLE_FILE = "sweep.csv"
PLOT_FILE = "sweep.png"
METRICS = (
    ("samples_per_s", "samples/s"),
    ("time_to_target_s", "time to target accuracy (s)"),
    ("time_to_target_loss_s", "time to target loss (s)"),
)
ABSENT = {
    "samples_per_s": "no throughput recorded",
    "time_to_target_s": "no time to target accuracy: not reached, or not evaluated (simulations evaluate none "
    "unless they train: --train)",
    "time_to_target_loss_s": "no time to target loss: not reached, or not evaluated",
}


def sweep_table(sweep: SweepDirectory) -> pd.DataFrame:
    """The rows of every finished point (empty frame when none finished)."""
    frames = []
    for point in sweep.points:
        index = point["index"]
        summary = sweep.point_dir(index) / SUMMARY_FILE
        if sweep.status(index).status != "done" or not summary.is_file():
            continue
        frame = pd.read_csv(summary)
        columns = {"point": index, **{key: _cell(point["values"][key]) for key in sweep.keys}}
        frame = frame.drop(columns=[c for c in columns if c in frame])  # e.g. ranks: the swept value leads
        for i, (name, value) in enumerate(columns.items()):
            frame.insert(i, name, [value] * len(frame))
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["point", *sweep.keys])


def _cell(value):
    """A swept value as one CSV cell: lists and mappings as JSON."""
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def _missed(table: pd.DataFrame, metric: str, shown: list[tuple[str, str]]) -> bool:
    """Whether the plot says that ``metric`` has no value: the time to a target loss only when
    the points set one; the time to the target accuracy not when the time to a target loss is
    drawn (a script that records its loss, not its accuracy)."""
    if metric == "time_to_target_loss_s":
        return "target_loss" in table and bool(table["target_loss"].notna().any())
    if metric == "time_to_target_s":
        return not any(m == "time_to_target_loss_s" for m, _ in shown)
    return True


def write_table_and_plot(sweep: SweepDirectory) -> list[Path]:
    """Write sweep.csv, and sweep.png when a point finished; the paths written."""
    table = sweep_table(sweep)
    written = [sweep.path / TABLE_FILE]
    atomic.write_text(written[0], table.to_csv(index=False))
    if len(table):
        figure = sweep_figure(table, sweep.keys)
        path = sweep.path / PLOT_FILE
        figure.savefig(path, dpi=110)
        written.append(path)
    return written


def sweep_figure(table: pd.DataFrame, keys: list[str]):
    """Throughput and time to target against ``keys[0]``; a line per algorithm label; a column of
    panels per combination of the other keys. A metric no point has (time to target in a
    simulation, which evaluates nothing) is left out and said in the title; a metric spanning
    more than a factor of 20 is drawn on a log scale."""
    x_key, others = keys[0], keys[1:]
    metrics = [(m, label) for m, label in METRICS if m in table and table[m].notna().any()]
    absent = [ABSENT[m] for m, _ in METRICS if (m, dict(METRICS)[m]) not in metrics and _missed(table, m, metrics)]
    groups = list(table.groupby(others, sort=False)) if others else [((), table)]
    algorithms = list(dict.fromkeys(table["algorithm"]))
    colours = palette(algorithms)
    numeric = pd.api.types.is_numeric_dtype(table[x_key])
    order = list(dict.fromkeys(table[x_key]))  # categorical x: the sweep's order
    fig = Figure(figsize=(4.2 * len(groups) + 1.8, 0.6 + 3.0 * max(1, len(metrics))), layout="constrained")
    axes = fig.subplots(max(1, len(metrics)), len(groups), squeeze=False, sharex="col")
    for column, (values, group) in enumerate(groups):
        values = values if isinstance(values, tuple) else (values,)
        title = ", ".join(f"{k}={v}" for k, v in zip(others, values))
        for row, (metric, label) in enumerate(metrics):
            ax = axes[row][column]
            for algorithm in algorithms:
                rows = group[group["algorithm"] == algorithm]
                if rows.empty:
                    continue
                xs = rows[x_key] if numeric else [order.index(v) for v in rows[x_key]]
                ax.plot(xs, rows[metric], marker="o", color=colours.colour(algorithm), label=colours.label(algorithm))
            shown = table[metric][table[metric] > 0]
            if len(shown) and shown.max() > 20 * shown.min():
                ax.set_yscale("log")
            if not numeric:
                ax.set_xticks(range(len(order)), [str(v) for v in order], rotation=20)
            if row == 0 and title:
                ax.set_title(title, fontsize=9)
            if column == 0:
                ax.set_ylabel(label)
            if row == len(metrics) - 1:
                ax.set_xlabel(x_key)
            ax.grid(alpha=0.3)
    if absent:
        fig.suptitle("; ".join(a.replace("\n", " ") for a in absent), fontsize=8, color="#666666")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right center", fontsize=8)
    return fig
