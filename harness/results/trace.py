"""Chrome/Perfetto trace (trace event format) of a run's step and comm op records.

Layout: one process per algorithm (pid 1, 2, ... in order of appearance), named after the
algorithm; per rank r a thread ``tid = r`` ("rank r") with the iteration spans and, when comm
ops are given, a thread ``tid = COMM_TID_BASE + r`` ("rank r comm") with one span per op.

Within an iteration the step record only gives durations (their meaning: the training loop's
docstring, ``harness.runner.loop``), so each part is drawn as one span, laid out from
``start_s`` in this fixed order:

    start_s | injected_delay_s | compute_s | comm_blocked_s | (rest: loop bookkeeping) | end_s

which is a drawing convention: in the loop, blocked time comes in several pieces around the
local work.

An enclosing "iteration" span covers [start_s, end_s]. Child spans are clipped to end at
end_s (only if the record's parts add up to more than its duration) so they always nest.
Times are microseconds since the run's t0; zero-length parts are omitted.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from harness.results.columns import COMM_OP_COLUMNS, STEP_COLUMNS, to_frame

COMM_TID_BASE = 1_000_000

# Span names on the rank threads, in the order they are laid out within an iteration.
ITERATION_SPAN = "iteration"
STEP_PARTS = (
    ("injected_delay", "injected_delay_s"),
    ("compute", "compute_s"),
    ("comm_blocked", "comm_blocked_s"),
)

_US = 1e6


def _us(seconds: float) -> float:
    # Round to 1 ns: keeps the JSON short without losing anything a viewer can show.
    return round(seconds * _US, 3)


def _json_value(value: Any) -> Any:
    """JSON-safe scalar: NaN becomes null, numpy scalars become Python scalars."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _metadata(name: str, pid: int, tid: int | None, args: dict) -> dict:
    event = {"ph": "M", "name": name, "pid": pid, "args": args}
    if tid is not None:
        event["tid"] = tid
    return event


def _step_events(row: Any, pid: int) -> list[dict]:
    tid = int(row.rank)
    start, end = float(row.start_s), float(row.end_s)
    events = [
        {
            "ph": "X",
            "name": ITERATION_SPAN,
            "cat": "step",
            "pid": pid,
            "tid": tid,
            "ts": _us(start),
            "dur": _us(max(end - start, 0.0)),
            "args": {
                "iteration": int(row.iteration),
                "loss": _json_value(row.loss),
                "bytes_sent": int(row.bytes_sent),
                "staleness": int(row.staleness),
            },
        }
    ]
    cursor = start
    for name, column in STEP_PARTS:
        length = float(getattr(row, column))
        span_end = min(cursor + length, end)
        if length > 0 and span_end > cursor:
            events.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": "step",
                    "pid": pid,
                    "tid": tid,
                    "ts": _us(cursor),
                    "dur": _us(span_end - cursor),
                    "args": {"iteration": int(row.iteration)},
                }
            )
        cursor = min(cursor + max(length, 0.0), end)
    return events


def _comm_event(row: Any, pid: int) -> dict:
    start, end = float(row.start_s), float(row.end_s)
    return {
        "ph": "X",
        "name": str(row.op),
        "cat": "comm",
        "pid": pid,
        "tid": COMM_TID_BASE + int(row.rank),
        "ts": _us(start),
        "dur": _us(max(end - start, 0.0)),
        "args": {
            "bytes": int(row.bytes),
            "post_s": float(row.post_s),
            "queued_us": _us(start - float(row.post_s)),
        },
    }


def chrome_trace(steps_df: pd.DataFrame, comm_ops_df: pd.DataFrame | None = None) -> dict:
    """Build the trace as a dict ready for ``json.dump`` (strict JSON: no NaN)."""
    steps = to_frame(steps_df, STEP_COLUMNS)
    comm_ops = to_frame(comm_ops_df if comm_ops_df is not None else [], COMM_OP_COLUMNS)
    algorithms = list(dict.fromkeys([*steps["algorithm"], *comm_ops["algorithm"]]))
    events: list[dict] = []
    for pid, algorithm in enumerate(algorithms, start=1):
        events.append(_metadata("process_name", pid, None, {"name": algorithm}))
        events.append(_metadata("process_sort_index", pid, None, {"sort_index": pid}))
        own_steps = steps[steps["algorithm"] == algorithm]
        own_ops = comm_ops[comm_ops["algorithm"] == algorithm]
        op_ranks = {int(r) for r in own_ops["rank"]}
        for rank in sorted({int(r) for r in own_steps["rank"]} | op_ranks):
            # Sort index keeps "rank r" and "rank r comm" adjacent, ordered by rank.
            events.append(_metadata("thread_name", pid, rank, {"name": f"rank {rank}"}))
            events.append(_metadata("thread_sort_index", pid, rank, {"sort_index": 2 * rank}))
            if rank in op_ranks:
                tid = COMM_TID_BASE + rank
                events.append(_metadata("thread_name", pid, tid, {"name": f"rank {rank} comm"}))
                sort = {"sort_index": 2 * rank + 1}
                events.append(_metadata("thread_sort_index", pid, tid, sort))
        for row in own_steps.itertuples(index=False):
            events.extend(_step_events(row, pid))
        for row in own_ops.itertuples(index=False):
            events.append(_comm_event(row, pid))
    return {"traceEvents": events, "displayTimeUnit": "ms"}
