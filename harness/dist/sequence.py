"""The per-step collective sequence of a torch.distributed script run: what the simulator replays.

Under ``launch --scenario`` every rank keeps, for each operation of the ``harness`` backend, what
the simulator needs to replay it (the process group notes it as it posts: the native operation,
its payload and its root or peer) and where in its step the rank posted it. Rank 0 writes them
all as ``collectives.csv`` (``harness.results.columns.COLLECTIVE_COLUMNS``), one row per
operation, and ``compare``/``simulate`` of the run replay it (:mod:`harness.sim.script_replay`).

Where an operation sits in its step (``phase``), as the session's hooks split a step:

- ``before``: posted before the step's first forward pass (between two steps, e.g. a model
  average after the previous step, or a broadcast of the batch) and waited for where posted;
- ``overlap``: posted during the forward and backward passes (DDP's bucket allreduces, the
  communication hooks' collectives, FSDP's all-gathers and reduce-scatters), ``at`` the fraction
  of that window (0 = its start) at which it was posted; the step waits for all of them before
  the optimizer step;
- ``after``: posted from the optimizer step on (``ZeroRedundancyOptimizer``'s broadcasts,
  ``PostLocalSGDOptimizer``'s averaging).

``waited``: the operation had ended before this rank posted its next one (the script waited for
it; the replay waits too before posting the next). Operations before the first step (DDP's
initial broadcast) and after the last one are set-up and tear-down, and are left out.

``payload_bytes`` per operation (what the native layer moves per rank, by which the simulator
sizes the collective): allreduce, broadcast, reduce: the buffer; allgather, gather, scatter: one
rank's piece; reduce_scatter: the whole input; alltoall: everything this rank sends (with
itself); send, recv: the message; barrier: 0.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

PHASES = ("before", "overlap", "after")


class Shape(NamedTuple):
    """What the process group noted about one native operation (see the module doc)."""

    op: str
    payload_bytes: int
    peer: int  # world rank of the root or peer; -1: none
    group_ranks: str  # the group's world ranks, space-separated


class StepMarks(NamedTuple):
    """One step of a rank on its own clock: start, first forward pass (after the injected
    delay), the optimizer step's pre-hook, end."""

    start: float
    forward: float
    pre: float
    end: float


def sequence_rows(rank: int, marks: Sequence[StepMarks], records: Sequence[Any],
                  shapes: Mapping[float, Shape]) -> list[tuple]:
    """Rows of collectives.csv (COLLECTIVE_COLUMNS) for one rank: ``records`` are the native
    layer's records (``post_s``, ``end_s``) of its operations, ``shapes`` the notes by post time."""
    ops = sorted((r for r in records if r.post_s in shapes), key=lambda r: r.post_s)
    starts = [m.start for m in marks]
    rows: list[tuple] = []
    seq: dict[int, int] = {}
    for i, r in enumerate(ops):
        t = bisect.bisect_right(starts, r.post_s) - 1
        if t < 0 or r.post_s > marks[t].end:
            continue  # set-up before the first step, tear-down after the last
        m = marks[t]
        if r.post_s < m.forward:
            phase, at = "before", 0.0
        elif r.post_s < m.pre:
            window = m.pre - m.forward
            phase, at = "overlap", min(max((r.post_s - m.forward) / window, 0.0), 0.999) if window > 0 else 0.0
        else:
            phase, at = "after", 0.0
        waited = i + 1 < len(ops) and r.end_s <= ops[i + 1].post_s
        s = shapes[r.post_s]
        n = seq.get(t, 0)
        seq[t] = n + 1
        rows.append((rank, t, n, s.op, s.group_ranks, s.payload_bytes, s.peer, phase, at, waited))
    return rows
