"""Per-algorithm summary of a run (summary.csv) and its readable fixed-width table.

Definitions (also in ``results/README.md``), over one algorithm's step rows:

- ``wall_s`` = max end_s - min start_s;
- ``samples_per_s`` = steps_recorded * batch_size / wall_s, which equals
  ranks * batch_size * iterations / wall_s for a complete run and counts only the samples
  actually processed for an incomplete one;
- ``throughput_vs_baseline`` = samples_per_s / the ``baseline`` algorithm's samples_per_s, the
  baseline being ``allreduce_sgd`` when it is in the summary, else the first algorithm;
- ``iter_time_median_s``, ``iter_time_p95_s``: median and 95th percentile (numpy's linear
  interpolation) of end_s - start_s over all ranks' rows;
- ``compute_fraction``, ``wait_fraction``, ``injected_fraction``: sum of compute_s,
  comm_blocked_s, injected_delay_s over the sum of end_s - start_s;
- ``final_accuracy``, ``final_test_loss``: from the last "average" eval (highest iteration,
  then time_s); ``final_accuracy_rank0``: from the last "rank0" eval;
  ``final_consensus_distance``: from the last eval of any model with a value;
- ``final_train_loss``: the mean ``loss`` of the step rows of the last iteration that has one;
- ``time_to_target_s``: see :func:`time_to_target`; ``time_to_target_loss_s`` the same count
  until an evaluation's test loss first reached ``target_loss`` (at or below it).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping

import numpy as np
import pandas as pd
from tabulate import tabulate

from harness.results.columns import EVAL_COLUMNS, STEP_COLUMNS, SUMMARY_COLUMNS, to_frame

# Throughput is compared with this algorithm when the run has it: the synchronous method every
# other one claims to beat.
BASELINE_ALGORITHM = "allreduce_sgd"


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


def evaluation_ready_s(steps: pd.DataFrame, average: pd.DataFrame) -> pd.Series:
    """Per evaluation of ``average`` (the algorithm's evals of the "average" model; same index):
    the training seconds at which its averaged model existed. That is when the last rank had
    finished the iteration before it (the latest ``end_s`` of that iteration; rank 0 enters the
    evaluation at ``time_s``, earlier when a straggler is behind it, as a rank of an asynchronous
    method can be by many iterations), counted from the algorithm's first step (min start_s over
    ranks), less the time every earlier evaluation took: from the moment its model existed to
    rank 0's start of the next iteration (nothing for an evaluation without that step row), so
    that how often a scenario evaluates does not change it. An evaluation before the first step
    (a torch.distributed script's of its initial model, ``iteration`` 0) counts as 0 s and takes
    nothing from the later ones."""
    finished = steps.groupby("iteration")["end_s"].max()  # every rank done with the iteration
    ready = np.maximum(average["time_s"], (average["iteration"] - 1).map(finished).fillna(average["time_s"]))
    resumed = average["iteration"].map(steps[steps["rank"] == 0].groupby("iteration")["start_s"].min())
    # An evaluation before the first step (a script's, of its initial model) takes nothing: the count starts later.
    took = (resumed - ready).clip(lower=0.0).fillna(0.0).where(average["iteration"] > 0, 0.0)
    earlier = average["iteration"].map(lambda k: float(took[average["iteration"] < k].sum()))
    return (ready - float(steps["start_s"].min()) - earlier).clip(lower=0.0)  # one before the first step: 0 s


def time_to_target(steps: pd.DataFrame, average: pd.DataFrame, target: float | None) -> float:
    """Training seconds until the averaged model first reached ``target`` test accuracy: the
    :func:`evaluation_ready_s` of the first evaluation (by iteration, then time_s) of ``average``
    (the algorithm's evals of the "average" model) with ``test_accuracy >= target``. NaN when
    the target is None, never reached, or the algorithm has no steps.
    """
    if target is None:
        return math.nan
    return _time_to(steps, average, average["test_accuracy"] >= target)


def time_to_target_loss(steps: pd.DataFrame, average: pd.DataFrame, target: float | None) -> float:
    """As :func:`time_to_target`, until the first evaluation of ``average`` whose ``test_loss``
    is at or below ``target``; NaN when the target is None or never reached."""
    if target is None:
        return math.nan
    return _time_to(steps, average, average["test_loss"] <= target)


def _time_to(steps: pd.DataFrame, average: pd.DataFrame, reached: pd.Series) -> float:
    """The :func:`evaluation_ready_s` of the first evaluation of ``average`` (by iteration, then
    time_s) where ``reached``; NaN when none or when the algorithm has no steps."""
    if steps.empty or not reached.any():
        return math.nan
    hit = average[reached].sort_values(["iteration", "time_s"], kind="stable").iloc[0]
    return float(evaluation_ready_s(steps, average)[hit.name])


def final_train_loss(steps: pd.DataFrame) -> float:
    """The mean ``loss`` over the step rows of the last iteration that has one (the ranks'
    minibatch losses of that step); NaN when no row has a loss."""
    losses = steps[steps["loss"].notna()]
    if losses.empty:
        return math.nan
    return float(losses.loc[losses["iteration"] == losses["iteration"].max(), "loss"].mean())


def _summary_row(
    algorithm: str,
    steps: pd.DataFrame,
    evals: pd.DataFrame,
    batch_size: int,
    iterations: int,
    ranks: int | None,
    target_accuracy: float | None,
    target_loss: float | None = None,
) -> dict:
    if ranks is None:
        ranks = int(steps["rank"].nunique())
    durations = steps["end_s"] - steps["start_s"]
    busy = float(durations.sum())
    wall = float(steps["end_s"].max() - steps["start_s"].min()) if len(steps) else math.nan
    has_steps = len(steps) > 0
    average = evals[evals["model"] == "average"]
    rank0 = evals[evals["model"] == "rank0"]
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
        "final_accuracy_rank0": _last(rank0, "test_accuracy"),
        "final_test_loss": _last(average, "test_loss"),
        "final_train_loss": final_train_loss(steps),
        "final_consensus_distance": _last(evals, "consensus_distance"),
        "target_accuracy": math.nan if target_accuracy is None else float(target_accuracy),
        "time_to_target_s": time_to_target(steps, average, target_accuracy),
        "target_loss": math.nan if target_loss is None else float(target_loss),
        "time_to_target_loss_s": time_to_target_loss(steps, average, target_loss),
        "complete": _complete(steps, ranks, iterations),
    }


def summarize(
    steps_df: pd.DataFrame,
    evals_df: pd.DataFrame | None,
    batch_size: int | Mapping[str, int],
    iterations: int | Mapping[str, int],
    ranks: int | Mapping[str, int] | None = None,
    *,
    target_accuracy: float | None = None,
    target_loss: float | None = None,
) -> pd.DataFrame:
    """One row per algorithm (order of first appearance) with :data:`SUMMARY_COLUMNS`.

    ``batch_size``, ``iterations`` and ``ranks`` are per-rank values, given once or per
    algorithm; ``ranks`` defaults to the number of distinct ranks in that algorithm's steps
    (pass it explicitly so that a rank that recorded nothing makes the run incomplete).
    ``target_accuracy`` (fraction) is what ``time_to_target_s`` measures; None leaves it and
    ``target_accuracy`` NaN (callers that only want throughput). ``target_loss`` (a test loss)
    is what ``time_to_target_loss_s`` measures; None (the default) leaves both NaN.
    """
    if target_accuracy is not None and not 0.0 < target_accuracy <= 1.0:
        raise ValueError(f"target_accuracy must be a fraction in (0, 1], got {target_accuracy!r}")
    if target_loss is not None and not math.isfinite(target_loss):
        raise ValueError(f"target_loss must be a finite number, got {target_loss!r}")
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
                target_accuracy,
                target_loss,
            )
        )
    baseline = BASELINE_ALGORITHM if BASELINE_ALGORITHM in algorithms else next(iter(algorithms), "")
    base_rate = next((r["samples_per_s"] for r in rows if r["algorithm"] == baseline), math.nan)
    for row in rows:
        row["baseline"] = baseline
        row["throughput_vs_baseline"] = _ratio(row["samples_per_s"], base_rate)
    frame = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    return frame.astype(
        {
            "algorithm": str,
            "baseline": str,
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


def _percent(fraction: float) -> str:
    return f"{100.0 * fraction:g}%"


def _table_labels(summary_df: pd.DataFrame) -> tuple[str, str, str]:
    """The headers of the relative-throughput and time-to-target columns and the target in
    words: they name the baseline and the target, which are the same on every row."""
    baseline = str(summary_df["baseline"].iloc[0]) if len(summary_df) else BASELINE_ALGORITHM
    targets = summary_df["target_accuracy"].dropna()
    if targets.empty:
        return f"vs {baseline}", "to target s", "the target"
    target = _percent(float(targets.iloc[0]))
    return f"vs {baseline}", f"to {target} s", target


def loss_columns(summary_df: pd.DataFrame) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """The loss columns a table of ``summary_df`` shows, as (header, column, format): those
    before the accuracy columns (the final training and test loss) and those after the time to
    the target accuracy (the time to the target loss). Shown when the summary has a target loss
    (``results.target_loss``), or has a loss but no accuracy (a script that records only its
    loss); other tables stay as they were."""
    def has(column: str) -> bool:
        return column in summary_df and bool(summary_df[column].notna().any())

    target = has("target_loss")
    if not (target or ((has("final_train_loss") or has("final_test_loss")) and not has("final_accuracy"))):
        return [], []
    losses = [("train loss", "final_train_loss", ".4g"), ("test loss", "final_test_loss", ".4g")]
    if not target:
        return losses, []
    target_loss = float(summary_df["target_loss"].dropna().iloc[0])
    return losses, [(f"to loss {target_loss:g} s", "time_to_target_loss_s", ".3f")]


def loss_footnotes(summary_df: pd.DataFrame) -> list[str]:
    """Footnotes for the columns of :func:`loss_columns` that a table shows."""
    before, after = loss_columns(summary_df)
    notes = []
    if before:
        notes.append("train loss: mean over the ranks of the training loss of the last step that recorded one; test "
                     "loss: of the last evaluation of the averaged model (a torch.distributed script's: the mean over "
                     "the ranks that recorded it).")
    for header, _, _ in after:
        target = header.removeprefix("to loss ").removesuffix(" s")
        notes.append(f"{header}: training time from the first step until an evaluation of the averaged model first had"
                     f" a test loss of {target} or less, evaluation time excluded; '-': never (or not evaluated).")
    return notes


FOOTNOTE_WIDTH = 100  # characters: the footnotes wrap, the (wider) table does not


def _footnotes(vs: str, to_target: str, target: str) -> list[str]:
    # The table is read without results/README.md at hand: say what the less obvious columns mean.
    return [
        f"{vs}: samples/s over that algorithm's (1.00 = as fast, 2.00 = twice the throughput).",
        "acc avg %: final test accuracy of the average of all ranks' models, which no rank holds"
        " for gossip methods and EASGD; acc r0 %: of rank 0's own model.",
        f"{to_target}: training time from the first step until the averaged model (all ranks"
        f" done with the iteration) first reached {target} test accuracy, evaluation time excluded;"
        " '-': never (or no accuracy: a simulation without values).",
        "consensus: mean over ranks of ||x_i - x_mean||^2 at the last evaluation, the squared L2"
        " distance of each rank's parameters to their average (about 0, rounding only, when all ranks"
        " hold the same model; methods that let ranks drift apart keep it well above 0).",
    ]


def format_table(summary_df: pd.DataFrame) -> str:
    """A fixed-width text table of a summary frame for terminals and logs, then footnotes
    that define the relative, accuracy and consensus columns."""
    vs, to_target, target = _table_labels(summary_df)
    before, after = loss_columns(summary_df)
    headers = (
        "algorithm",
        "ranks",
        "samples/s",
        vs,
        "iter median ms",
        "iter p95 ms",
        "waiting %",
        "injected %",
        *(h for h, _, _ in before),
        "acc avg %",
        "acc r0 %",
        to_target,
        *(h for h, _, _ in after),
        "consensus",
        "complete",
    )
    rows = [
        (
            row.algorithm,
            str(row.ranks),
            _fmt(row.samples_per_s, ",.1f"),
            _fmt(row.throughput_vs_baseline, ".2f"),
            _fmt(row.iter_time_median_s, ".2f", 1e3),
            _fmt(row.iter_time_p95_s, ".2f", 1e3),
            _fmt(row.wait_fraction, ".1f", 100.0),
            _fmt(row.injected_fraction, ".1f", 100.0),
            *(_fmt(getattr(row, column), spec) for _, column, spec in before),
            _fmt(row.final_accuracy, ".2f", 100.0),
            _fmt(row.final_accuracy_rank0, ".2f", 100.0),
            _fmt(row.time_to_target_s, ".3f"),
            *(_fmt(getattr(row, column), spec) for _, column, spec in after),
            _fmt(row.final_consensus_distance, ".3g"),
            "yes" if row.complete else "no",
        )
        for row in summary_df.itertuples(index=False)
    ]
    table = tabulate(
        rows,
        headers=headers,
        tablefmt="simple",
        disable_numparse=True,
        colalign=("left",) + ("right",) * (len(headers) - 2) + ("left",),
    )
    notes = [textwrap.fill(note, FOOTNOTE_WIDTH, subsequent_indent="  ")
             for note in [*_footnotes(vs, to_target, target), *loss_footnotes(summary_df)]]
    return "\n".join([table, "", *notes])
