"""After one algorithm: gather every rank's records on rank 0 and write them into the run directory.

The harness's own ranks (``harness.runner.worker``) and a user's training script
(``harness.api``) both end an algorithm this way, so their results directories are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def gather(world, records: list) -> list | None:
    """Every rank's ``records`` concatenated in rank order on rank 0 (None elsewhere). Collective."""
    parts = world.gather(records, root=0)
    return None if parts is None else [r for part in parts for r in part]


def publish(
    run,
    scenario,
    name: str,
    steps: list,
    evals: list,
    ops: list,
    calls: list | None,
    finished: Sequence[str],
    *,
    hosts: int,
    extra: dict[str, Any],
) -> None:
    """On rank 0: add algorithm ``name``'s records (already gathered), then rewrite the summary,
    the trace and run.json (``finished``: every algorithm finished so far, ``name`` included)."""
    run.append_algorithm(name, steps, evals, ops)
    if calls is not None:
        run.append_comm_calls(name, calls)
    write_summary(run, scenario)
    run.write_trace()
    done = len(finished) == len(scenario.algorithms)
    run.write_run_json(
        "complete" if done else "incomplete", list(finished), ranks=scenario.ranks, hosts=hosts, extra=extra
    )


def write_summary(run, scenario):
    """summary.csv and summary.txt of everything the run directory holds; returns the frame."""
    w = scenario.workload
    return run.write_summary(
        w.batch_size,
        w.iterations,
        ranks=scenario.ranks,
        target_accuracy=scenario.results.target_accuracy,
        target_loss=scenario.results.target_loss,
    )
