"""Samples/s per algorithm as a stacked bar: the share of iteration time spent computing, waiting
in communication, sleeping an injected delay, and the rest (the loop's own bookkeeping)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

from harness.report import look
from harness.report.data import RunData

KEY = "throughput"
TITLE = "Throughput and where the time went"
PARTS = (*look.PART_COLUMNS, "other")


def breakdown(steps: pd.DataFrame, batch_size: int | dict[str, int]) -> pd.DataFrame:
    """Per algorithm (run order): ``samples_per_s`` (step rows x batch size / wall time, as
    summary.csv) and the fraction of the summed iteration durations in each of :data:`PARTS`."""
    rows = []
    for algorithm, group in steps.groupby("algorithm", sort=False):
        durations = float((group["end_s"] - group["start_s"]).sum())
        wall = float(group["end_s"].max() - group["start_s"].min())
        bs = batch_size[algorithm] if isinstance(batch_size, dict) else batch_size
        row = {"algorithm": algorithm, "samples_per_s": len(group) * bs / wall if wall > 0 else np.nan}
        for part, column in look.PART_COLUMNS.items():
            row[part] = float(group[column].sum()) / durations if durations > 0 else np.nan
        row["other"] = max(0.0, 1.0 - sum(row[p] for p in look.PART_COLUMNS))
        rows.append(row)
    return pd.DataFrame(rows, columns=["algorithm", "samples_per_s", *PARTS])


def figure(table: pd.DataFrame, palette: look.Palette):
    """Horizontal stacked bars of ``breakdown``'s table, first algorithm on top, each bar's
    algorithm marked by a square of its colour."""
    n = len(table)
    fig = look.new_figure(11, 0.9 + 0.36 * n)
    ax = fig.subplots()
    y = np.arange(n)[::-1]
    left = np.zeros(n)
    for part in PARTS:
        width = (table[part].fillna(0.0) * table["samples_per_s"].fillna(0.0)).to_numpy()
        ax.barh(y, width, left=left, height=0.7, color=look.PART_COLOURS[part], edgecolor="white", linewidth=0.5)
        left += width
    for yi, rate in zip(y, table["samples_per_s"]):
        if np.isfinite(rate):
            ax.annotate(f"{rate:,.0f}", (rate, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(y, [palette.label(a) for a in table["algorithm"]])
    ax.tick_params(axis="y", pad=14, length=0)
    marks = blended_transform_factory(ax.transAxes, ax.transData)
    ax.scatter(
        np.full(n, -0.012),
        y,
        marker="s",
        s=60,
        c=[palette.colour(a) for a in table["algorithm"]],
        transform=marks,
        clip_on=False,
        edgecolors="#555555",
        linewidths=0.5,
    )
    ax.set_xlim(0, float(np.nanmax(left, initial=1.0)) * 1.12 or 1.0)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlabel("samples/s (all ranks); each bar split by the share of iteration time in each part")
    ax.grid(axis="y", visible=False)
    handles = [
        Patch(facecolor=look.PART_COLOURS[p], label=p if p != "other" else "other (loop bookkeeping)") for p in PARTS
    ]
    fig.legend(handles=handles, loc="outside upper center", ncols=len(PARTS), frameon=False)
    return fig


def section(run: RunData, palette: look.Palette) -> look.Section:
    if run.steps.empty:
        return look.Section(KEY, TITLE, absent="No step records: no algorithm finished (run.json says which).")
    table = breakdown(run.steps, batch_sizes(run))
    caption = (
        "Bar length: samples/s of all ranks together (step rows x batch size / wall time, as summary.csv). "
        "It is split in proportion to the summed time of every rank's iterations (steps.csv): computing "
        "(compute_s), blocked in communication (comm_blocked_s), sleeping an injected delay "
        "(injected_delay_s), and the remainder."
    )
    if run.simulated:
        caption += " Simulated: compute is the local work the model used, waiting the simulated time in the hooks."
    return look.Section(KEY, TITLE, figure(table, palette), caption)


def batch_sizes(run: RunData) -> int | dict[str, int]:
    """The per-rank batch size of each algorithm: summary.csv's, else the scenario's."""
    if len(run.summary):
        return {str(r.algorithm): int(r.batch_size) for r in run.summary.itertuples(index=False)} | {
            a: _scenario_batch(run) for a in run.algorithms if a not in set(run.summary["algorithm"])
        }
    return _scenario_batch(run)


def _scenario_batch(run: RunData) -> int:
    return int((run.scenario.get("workload") or {}).get("batch_size") or 1)
