"""The one training loop. Real ranks and simulated ranks both run it; algorithms plug in through hooks.

Iteration t on rank r (times on the backend's clock, relative to the run's t0)::

    start -> before_forward -> injected sleep -> local work: the gradient (forward and backward,
    an emulated sleep, or the simulator's timing), with the injected compute factor
    -> after_backward -> optimizer step -> after_step -> end_iteration -> end
    -> [evaluation point | the gap until the next start]

and after the last iteration ``finish()`` (flush what is in flight), then the final evaluation.
What differs between a real rank and a simulated one (the clock, how local work is done or
timed, how an evaluation is run) is the ``work`` object: :class:`harness.runner.local_work.LocalWork`
for real ranks, ``harness.sim.simulate.SimulatedWork`` for simulated ones; the communicator is
the native layer's or the simulated one. Everything else, in particular the order of the hooks
and how the records are made, is written here once.

Records per iteration: ``compute_s`` is the local work (gradient and optimizer step, or the
emulated sleep); ``injected_delay_s`` the injected sleep; ``comm_blocked_s`` the time spent in
the algorithm's hooks; ``bytes_sent`` the bytes sent by the operations this rank posted during
the iteration (attributed to the iteration that posted them, whenever they finish; traffic the
native layer's progress threads send on their own, such as answers to pairwise requests, is in
no iteration); ``staleness`` the algorithm's own. Injected faults strike at ``start``; the
heartbeat tells the watchdog where the rank is.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Protocol

from harness.algorithms.base import Algorithm
from harness.faults import FaultPlan
from harness.results.columns import CommOpRecord, EvalRecord, StepRecord
from harness.runner.heartbeat import Heartbeat, Phase
from harness.scenario.schema import Scenario

_HOOKS = ("before_forward", "after_backward", "after_step", "end_iteration")


class Work(Protocol):
    """The backend of one rank: its clock, its local work and its evaluations."""

    def now(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...
    def injected(self, t: int) -> tuple[float, float]:
        """This rank's injected delay (s) and compute factor at iteration t."""
    def gradient(self, t: int, factor: float) -> tuple[float, float]:
        """Compute (or time) iteration t's gradient; returns (seconds, loss)."""
    def step(self, t: int, factor: float, gradient_s: float) -> float:
        """The local optimizer step (and the injected stretch of real compute); returns seconds."""
    def evaluate(self, iteration: int, time_s: float, params, final: bool) -> list[EvalRecord]:
        """An evaluation point after ``iteration`` iterations (collective)."""
    def between(self, t: int) -> None:
        """After iteration t when it is no evaluation point, before iteration t + 1."""


def train(
    scenario: Scenario,
    algorithm: Algorithm,
    comm,
    work: Work,
    t0: float,
    progress: Callable[[int], None] | None = None,
    heartbeat: Heartbeat | None = None,
    faults: FaultPlan | None = None,
    keep_ops: bool = True,
) -> tuple[list[StepRecord], list[EvalRecord], list[CommOpRecord]]:
    """Run ``scenario.workload.iterations`` iterations of ``algorithm`` on this rank.

    Returns its step records, evaluation records (rank 0 only) and, with ``keep_ops``, the
    records of every operation it posted (the simulator has no use for them).
    """
    w = scenario.workload
    iterations, eval_every = w.iterations, w.eval_every
    rank, name = comm.rank, algorithm.name
    beat = heartbeat if heartbeat is not None else Heartbeat(None, rank)
    now = work.now
    rows: list[tuple] = []  # per iteration: start, end, compute, delay, blocked, loss, staleness
    starts: list[float] = []  # per iteration: start (for attributing records by post time)
    sent: list[int] = []  # per iteration: bytes_sent
    evals: list[EvalRecord] = []
    ops = []  # the records, kept only with keep_ops

    def collect(records) -> None:
        """Count each finished operation in the iteration that posted it; keep it if asked."""
        for r in records:
            t = _posting_iteration(r, starts, rows)
            if t >= 0:
                sent[t] += r.bytes
        if keep_ops:
            ops.extend(records)
    comm.drain_records()
    # Hooks the algorithm does not override are skipped (thousands of simulated ranks run this).
    hooks = [getattr(algorithm, h) if getattr(type(algorithm), h) is not getattr(Algorithm, h) else None
             for h in _HOOKS]
    before_forward, after_backward, after_step, end_iteration = hooks

    def hook(fn, t: int) -> float:
        h0 = now()
        beat.phase(Phase.COMMUNICATING)
        fn(t)
        beat.phase(Phase.LOCAL)
        return now() - h0

    begin_iteration = getattr(comm, "begin_iteration", None)  # a call log (harness.comm.call_log) wants t
    for t in range(iterations):
        if begin_iteration is not None:
            begin_iteration(t)
        beat.iteration(t)
        if faults:
            faults.at_iteration(name, t)
        delay, factor = work.injected(t)
        start = now()
        blocked = hook(before_forward, t) if before_forward else 0.0
        if delay > 0:
            beat.expect(delay)
            work.sleep(delay)
        compute, loss = work.gradient(t, factor)
        if after_backward:
            blocked += hook(after_backward, t)
        compute += work.step(t, factor, compute)
        if after_step:
            blocked += hook(after_step, t)
        if end_iteration:
            blocked += hook(end_iteration, t)
        end = now()
        beat.iteration_done(end - start)
        rows.append((start, end, compute, delay, blocked, loss, int(algorithm.staleness)))
        starts.append(start)
        sent.append(0)
        collect(comm.drain_records())
        if progress is not None:
            progress(t)
        if (t + 1) % eval_every == 0 and t + 1 < iterations:
            beat.stage(Phase.EVALUATING)
            evals += work.evaluate(t + 1, now() - t0, algorithm.eval_params(), False)
        else:
            work.between(t)
    if begin_iteration is not None:
        begin_iteration(None)  # finish() belongs to no iteration
    beat.phase(Phase.COMMUNICATING)
    algorithm.finish()
    collect(comm.drain_records())
    beat.stage(Phase.EVALUATING)
    evals += work.evaluate(iterations, now() - t0, algorithm.eval_params(), True)
    kept = [CommOpRecord(name, rank, r.op, r.post_s - t0, r.start_s - t0, r.end_s - t0, r.bytes) for r in ops] \
        if keep_ops else []
    make = StepRecord._make  # the tuple's own constructor: thousands of simulated ranks make millions
    steps = [make((name, rank, t, start - t0, end - t0, compute, delay, blocked, loss, sent[t], staleness))
             for t, (start, end, compute, delay, blocked, loss, staleness) in enumerate(rows)]
    return steps, evals, kept


def _posting_iteration(record, starts: list[float], rows: list[tuple]) -> int:
    """The iteration that posted ``record`` (-1: none): the one it names (the simulator's), or
    (the native layer's) the one whose [start, end] holds its post time. Every iteration up to
    the one that posted it has ended when a record is drained, so this is known then."""
    t = record.iteration
    if t is None:
        t = bisect.bisect_right(starts, record.post_s) - 1
        if t >= 0 and record.post_s > rows[t][1]:
            t = -1  # between iterations or after the last
    return t
