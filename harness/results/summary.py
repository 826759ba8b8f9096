"""Per-algorithm summary of a run (summary.csv) and its readable fixed-width table.

Definitions (also in ``results/README.md``), over one algorithm's step rows:

- ``wall_s`` = max end_s - min start_s;
- ``samples_per_s`` = steps_recorded * batch_size / wall_s, which equals
  ranks * batch_size * iterations / wall_s for a complete run and counts only the samples
  actually processed for an incomplete one;
- ``iter_time_median_s``, ``iter_time_p95_s``: median and 95th percentile (numpy's linear
  interpolation) of end_s - start_s over all ranks' rows;
- ``compute_fraction``, ``wait_fraction``, ``injected_fraction``: sum of compute_s,
  comm_blocked_s, injected_delay_s over the sum of end_s - start_s;
- ``final_accuracy``, ``final_test_loss``: from the last "average" eval (highest iteration,
  then time_s); ``final_consensus_distance``: from the last eval of any model with a value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
from tabulate import tabulate

from harness.results.records import EVAL_COLUMNS, STEP_COLUMNS, SUMMARY_COLUMNS, to_frame


def _per_algorithm(value: int | Mapping[str, int] | None, algorithm: str) -> int | None:
    if isinstance(value, Mapping):
        return value.get(algorithm)
    return value


def _last(frame: pd.DataFrame, column: str) -> float:
    """``column`` of the last row by (iteration, time_s) with a value; NaN if none."""
    frame = frame[frame[column].notna()]
    if frame.empty:
        return math.nan
    frame = frame.sort_values(["iteration", "time_s"], kind="stable")
    return float(frame[column].iloc[-1])


def _complete(steps: pd.DataFrame, ranks: int, iterations: int) -> bool:
    """Whether every (rank, iteration) in range(ranks) x range(iterations) has a row."""
    if ranks <= 0 or iterations <= 0:
        return False
    inside = steps[
        steps["rank"].between(0, ranks - 1) & steps["iteration"].between(0, iterations - 1)
    ]
    pairs = inside[["rank", "iteration"]].drop_duplicates()
    return len(pairs) == ranks * iterations


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.nan


def _summary_row(
    algorithm: str,
    steps: pd.DataFrame,
    evals: pd.DataFrame,
    batch_size: int,
    iterations: int,
    ranks: int | None,
) -> dict:
    if ranks is None:
        ranks = int(steps["rank"].nunique())
    durations = steps["end_s"] - steps["start_s"]
    busy = float(durations.sum())
    wall = float(steps["end_s"].max() - steps["start_s"].min()) if len(steps) else math.nan
    has_steps = len(steps) > 0
    average = evals[evals["model"] == "average"]
    return {
        "algorithm": algorithm,
        "ranks": ranks,
        "iterations": iterations,
        "batch_size": batch_size,
        "steps_recorded": len(steps),
        "wall_s": wall,
        "samples_per_s": _ratio(len(steps) * batch_size, wall) if has_steps else math.nan,
        "iter_time_median_s": float(np.median(durations)) if has_steps else math.nan,
        "iter_time_p95_s": float(np.percentile(durations, 95)) if has_steps else math.nan,
        "compute_fraction": _ratio(float(steps["compute_s"].sum()), busy),
        "wait_fraction": _ratio(float(steps["comm_blocked_s"].sum()), busy),
        "injected_fraction": _ratio(float(steps["injected_delay_s"].sum()), busy),
        "bytes_sent_per_step": float(steps["bytes_sent"].mean()) if has_steps else math.nan,
        "final_accuracy": _last(average, "test_accuracy"),
        "final_test_loss": _last(average, "test_loss"),
        "final_consensus_distance": _last(evals, "consensus_distance"),
        "complete": _complete(steps, ranks, iterations),
    }


def summarize(
    steps_df: pd.DataFrame,
    evals_df: pd.DataFrame | None,
    batch_size: int | Mapping[str, int],
    iterations: int | Mapping[str, int],
    ranks: int | Mapping[str, int] | None = None,
) -> pd.DataFrame:
    """One row per algorithm (order of first appearance) with :data:`SUMMARY_COLUMNS`.

    ``batch_size``, ``iterations`` and ``ranks`` are per-rank values, given once or per
    algorithm; ``ranks`` defaults to the number of distinct ranks in that algorithm's steps
    (pass it explicitly so that a rank that recorded nothing makes the run incomplete).
    """
    steps = to_frame(steps_df, STEP_COLUMNS)
    evals = to_frame(evals_df if evals_df is not None else [], EVAL_COLUMNS)
    algorithms = list(dict.fromkeys([*steps["algorithm"], *evals["algorithm"]]))
    rows = []
    for algorithm in algorithms:
        bs = _per_algorithm(batch_size, algorithm)
        iters = _per_algorithm(iterations, algorithm)
        if bs is None or iters is None:
            raise KeyError(f"no batch_size/iterations given for algorithm {algorithm!r}")
        rows.append(
            _summary_row(
                algorithm,
                steps[steps["algorithm"] == algorithm],
                evals[evals["algorithm"] == algorithm],
                int(bs),
                int(iters),
                _per_algorithm(ranks, algorithm),
            )
        )
    frame = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    return frame.astype(
        {
            "algorithm": str,
            "ranks": "int64",
            "iterations": "int64",
            "batch_size": "int64",
            "steps_recorded": "int64",
            "complete": bool,
        }
    )


def _fmt(value: float, spec: str, scale: float = 1.0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value * scale, spec)


TABLE_HEADERS = (
    "algorithm",
    "ranks",
    "samples/s",
    "iter median ms",
    "iter p95 ms",
    "waiting %",
    "injected %",
    "accuracy %",
    "consensus",
    "complete",
)


def format_table(summary_df: pd.DataFrame) -> str:
    """A fixed-width text table of a summary frame for terminals and logs."""
    rows = [
        (
            row.algorithm,
            str(row.ranks),
            _fmt(row.samples_per_s, ",.1f"),
            _fmt(row.iter_time_median_s, ".2f", 1e3),
            _fmt(row.iter_time_p95_s, ".2f", 1e3),
            _fmt(row.wait_fraction, ".1f", 100.0),
            _fmt(row.injected_fraction, ".1f", 100.0),
            _fmt(row.final_accuracy, ".2f", 100.0),
            _fmt(row.final_consensus_distance, ".3g"),
            "yes" if row.complete else "no",
        )
        for row in summary_df.itertuples(index=False)
    ]
    return tabulate(
        rows,
        headers=TABLE_HEADERS,
        tablefmt="simple",
        disable_numparse=True,
        colalign=("left",) + ("right",) * (len(TABLE_HEADERS) - 2) + ("left",),
    )
