"""The one training loop. Real ranks and simulated ranks both run it; algorithms plug in through hooks.

Iteration t on rank r (times on the backend's clock, relative to ``t0``; on real ranks ``t0`` is
the common origin of ``harness.runner.clock``, which puts every rank's times on rank 0's clock)::

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
no iteration); ``staleness`` the algorithm's own. Injected faults strike at ``start``, at an
evaluation or at ``finish()`` (and, posting an operation, in the communicator
``FaultPlan.striking`` gives the algorithm); the heartbeat tells the watchdog where the rank is.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Protocol

from harness.algorithms.base import Algorithm
from harness.faults import FaultPlan
from harness.results.columns import CommOpRecord, EvalRecord, StepRecord
from harness.scenario.schema import Scenario
from harness.watchdog.heartbeat import Heartbeat
from harness.watchdog.heartbeat_row import Phase

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


class Iterations:
    """The loop's order and records on one rank, one call per step of an iteration.

    :func:`train` drives it for the harness's own loop (real and simulated ranks);
    ``harness.api`` drives it from a user's training script (the forward pass begins an
    iteration, ``optimizer.step()`` ends it). Either way the hooks run in the order the module
    docstring shows and the records are made here.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        comm,
        now: Callable[[], float],
        heartbeat: Heartbeat | None = None,
        faults: FaultPlan | None = None,
        keep_ops: bool = True,
    ) -> None:
        self.algorithm, self.comm, self.now = algorithm, comm, now
        self.beat = heartbeat if heartbeat is not None else Heartbeat(None, comm.rank)
        # Without a watchdog every beat is a no-op: the calls made every iteration are skipped
        # (thousands of simulated ranks would make them several times an iteration).
        self._watched = getattr(self.beat, "watched", True)
        self.faults, self.keep_ops = faults, keep_ops
        if faults:
            faults.watched_by(self.beat)  # an injected fault is announced to the watchdog before it strikes
        self.rows: list[tuple] = []  # per iteration: start, end, compute, delay, blocked, loss, staleness
        self.starts: list[float] = []  # per iteration: start (for attributing records by post time)
        self.sent: list[int] = []  # per iteration: bytes_sent
        self.ops: list = []  # the records, kept only with keep_ops
        # Hooks the algorithm does not override are skipped (thousands of simulated ranks run this).
        self._hooks = [
            getattr(algorithm, h) if getattr(type(algorithm), h) is not getattr(Algorithm, h) else None for h in _HOOKS
        ]
        self._begin = getattr(comm, "begin_iteration", None)  # a call log (harness.comm.call_log) wants t
        self._start = 0.0
        self._blocked = 0.0
        comm.drain_records()

    def _hook(self, fn, t: int) -> float:
        now = self.now
        h0 = now()
        if self._watched:
            beat = self.beat
            beat.phase(Phase.COMMUNICATING)
            fn(t)
            beat.phase(Phase.LOCAL)
        else:
            fn(t)
        return now() - h0

    def begin(self, t: int) -> None:
        """Start iteration t: strike an injected fault, then ``before_forward``."""
        if self._begin is not None:
            self._begin(t)
        if self._watched:
            self.beat.iteration(t)
        if self.faults:
            self.faults.at_iteration(self.algorithm.name, t)
        self._start = self.now()
        before_forward = self._hooks[0]
        self._blocked = self._hook(before_forward, t) if before_forward else 0.0

    def after_backward(self, t: int) -> None:
        """The gradient of iteration t is in the algorithm's ``grads``."""
        if self._hooks[1]:
            self._blocked += self._hook(self._hooks[1], t)

    def after_step(self, t: int) -> None:
        """After the local optimizer step: ``after_step``, then ``end_iteration``."""
        after_step, end_iteration = self._hooks[2], self._hooks[3]
        if after_step:
            self._blocked += self._hook(after_step, t)
        if end_iteration:
            self._blocked += self._hook(end_iteration, t)

    def end(self, t: int, compute: float, delay: float, loss: float) -> None:
        """Record iteration t and count the bytes of the operations that finished meanwhile."""
        end = self.now()
        if self._watched:
            self.beat.iteration_done(end - self._start)
        self.rows.append((self._start, end, compute, delay, self._blocked, loss, int(self.algorithm.staleness)))
        self.starts.append(self._start)
        self.sent.append(0)
        self._collect(self.comm.drain_records())

    def evaluation(self, iterations_done: int) -> None:
        """An evaluation after ``iterations_done`` iterations begins (an injected fault may strike)."""
        self.beat.stage(Phase.EVALUATING)
        if self.faults:
            self.faults.at_evaluation(self.algorithm.name, iterations_done)

    def finish(self) -> None:
        """After the last iteration: the algorithm's ``finish()`` (in no iteration)."""
        if self._begin is not None:
            self._begin(None)
        self.beat.phase(Phase.COMMUNICATING)
        if self.faults:
            self.faults.at_finish(self.algorithm.name)
        self.algorithm.finish()
        self._collect(self.comm.drain_records())

    def _collect(self, records) -> None:
        """Count each finished operation in the iteration that posted it; keep it if asked."""
        sent = self.sent
        for r in records:
            t = r.iteration  # the simulator's records name the iteration that posted them
            if t is None:  # the native layer's do not
                t = _iteration_at(r.post_s, self.starts, self.rows)
            if t >= 0:
                sent[t] += r.bytes
        if self.keep_ops:
            self.ops.extend(records)

    def records(self, t0: float) -> tuple[list[StepRecord], list[CommOpRecord]]:
        """Step records and (with ``keep_ops``) operation records, times relative to ``t0``."""
        name, rank = self.algorithm.name, self.comm.rank
        kept = (
            [CommOpRecord(name, rank, r.op, r.post_s - t0, r.start_s - t0, r.end_s - t0, r.bytes) for r in self.ops]
            if self.keep_ops
            else []
        )
        make = StepRecord._make  # the tuple's own constructor: thousands of simulated ranks make millions
        sent, accuracy = self.sent, float("nan")  # no training accuracy: only a script records one (harness.dist)
        steps = [
            make((name, rank, t, start - t0, end - t0, compute, delay, blocked, loss, sent[t], staleness, accuracy))
            for t, (start, end, compute, delay, blocked, loss, staleness) in enumerate(self.rows)
        ]
        return steps, kept


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
    loop = Iterations(algorithm, comm, work.now, heartbeat, faults, keep_ops)
    beat, now = loop.beat, work.now
    evals: list[EvalRecord] = []
    for t in range(iterations):
        delay, factor = work.injected(t)
        loop.begin(t)
        if delay > 0:
            beat.expect(delay)
            work.sleep(delay)
        compute, loss = work.gradient(t, factor)
        loop.after_backward(t)
        compute += work.step(t, factor, compute)
        loop.after_step(t)
        loop.end(t, compute, delay, loss)
        if progress is not None:
            progress(t)
        if (t + 1) % eval_every == 0 and t + 1 < iterations:
            loop.evaluation(t + 1)
            evals += work.evaluate(t + 1, now() - t0, algorithm.eval_params(), False)
        else:
            work.between(t)
    loop.finish()
    loop.evaluation(iterations)
    evals += work.evaluate(iterations, now() - t0, algorithm.eval_params(), True)
    steps, kept = loop.records(t0)
    return steps, evals, kept


def _iteration_at(post_s: float, starts: list[float], rows: list[tuple]) -> int:
    """The iteration that posted a native record, posted at ``post_s`` (-1: none): the one whose
    [start, end] holds it. Every iteration up to the one that posted it has ended when a record
    is drained, so this is known then."""
    t = bisect.bisect_right(starts, post_s) - 1
    if t >= 0 and post_s > rows[t][1]:
        t = -1  # between iterations or after the last
    return t
