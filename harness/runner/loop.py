"""The one training loop. Every algorithm runs through it; algorithms plug in through hooks.

Iteration t on rank r (times on ``time.monotonic()``, relative to the run's t0):
    start -> before_forward -> injected sleep -> forward/backward (or emulated sleep), with
    the injected compute factor -> after_backward -> optimizer step -> after_step ->
    end_iteration -> end.
``comm_blocked_s`` is the time spent inside the algorithm's hooks; ``compute_s`` the forward,
backward and optimizer step (or the emulated sleep); ``injected_delay_s`` the injected sleep.
Injected faults strike at ``start``; the heartbeat tells the watchdog where the rank is.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from harness.algorithms.base import Algorithm
from harness.compute_time import emulated_compute_s
from harness.faults import FaultPlan
from harness.injection import InjectionPlan
from harness.results.records import CommOpRecord, EvalRecord, StepRecord
from harness.runner.evaluate import evaluate
from harness.runner.heartbeat import Heartbeat, Phase
from harness.runner.workload_state import TrainState
from harness.scenario.schema import Scenario


def train(
    scenario: Scenario,
    algorithm: Algorithm,
    state: TrainState,
    comm,
    eval_comm,
    plan: InjectionPlan,
    t0: float,
    progress: Callable[[int], None] | None = None,
    heartbeat: Heartbeat | None = None,
    faults: FaultPlan | None = None,
) -> tuple[list[StepRecord], list[EvalRecord], list[CommOpRecord]]:
    """Run ``scenario.workload.iterations`` iterations of ``algorithm`` on this rank.

    ``eval_comm`` is a communicator of its own for evaluation, so evaluation traffic never
    shows up in the algorithm's records and never crosses emulated slow links.
    """
    w = scenario.workload
    rank, name = comm.rank, algorithm.name
    beat = heartbeat if heartbeat is not None else Heartbeat(None, rank)
    steps: list[StepRecord] = []
    evals: list[EvalRecord] = []
    ops: list[CommOpRecord] = []
    comm.drain_records()

    def collect_ops() -> int:
        sent = 0
        for r in comm.drain_records():
            sent += r.bytes
            ops.append(CommOpRecord(name, rank, r.op, r.post_s - t0, r.start_s - t0, r.end_s - t0, r.bytes))
        return sent

    def hook(fn, t: int) -> float:
        h0 = time.monotonic()
        beat.phase(Phase.COMMUNICATING)
        fn(t)
        beat.phase(Phase.LOCAL)
        return time.monotonic() - h0

    for t in range(w.iterations):
        beat.iteration(t)
        if faults:
            faults.at_iteration(name, t)
        delays, factors = plan.at(t)
        start = time.monotonic()
        blocked = hook(algorithm.before_forward, t)
        delay = float(delays[rank])
        if delay > 0:
            beat.expect(delay)
            time.sleep(delay)
        c0 = time.monotonic()
        loss = math.nan
        if state.model is None:
            sleeps = emulated_compute_s(w.compute.emulate_ms, w.compute.jitter, scenario.seed, t, scenario.ranks,
                                        factors)
            time.sleep(float(sleeps[rank]))
        else:
            state.staging.params_to_device()  # the algorithm may have changed them (no-op on the CPU)
            x, y = state.batch(t, w.batch_size, scenario.seed, rank)
            state.optimizer.zero_grad(set_to_none=False)  # keep .grad as views into the flat buffer
            out = torch.nn.functional.cross_entropy(state.model(x), y)
            out.backward()
            loss = float(out.detach())
            state.staging.grads_to_host()
        compute = time.monotonic() - c0
        blocked += hook(algorithm.after_backward, t)
        s0 = time.monotonic()
        if state.optimizer is not None:
            state.staging.params_to_device()
            state.staging.grads_to_device()
            state.optimizer.step()
            state.staging.params_to_host()
        compute += time.monotonic() - s0
        if factors[rank] != 1.0 and state.model is not None:
            # Injected slowdown / jitter: stretch this rank's compute by the factor.
            extra = compute * (float(factors[rank]) - 1.0)
            if extra > 0:
                time.sleep(extra)
                compute += extra
        blocked += hook(algorithm.after_step, t)
        blocked += hook(algorithm.end_iteration, t)
        end = time.monotonic()
        beat.iteration_done(end - start)
        steps.append(
            StepRecord(name, rank, t, start - t0, end - t0, compute, delay, blocked, loss, collect_ops(),
                       int(algorithm.staleness))
        )
        if progress is not None:
            progress(t)
        if (t + 1) % w.eval_every == 0 and t + 1 < w.iterations:
            beat.stage(Phase.EVALUATING)
            evals += evaluate(eval_comm, name, t + 1, time.monotonic() - t0, algorithm.eval_params(), state)
    beat.phase(Phase.COMMUNICATING)
    algorithm.finish()
    collect_ops()
    beat.stage(Phase.EVALUATING)
    evals += evaluate(eval_comm, name, w.iterations, time.monotonic() - t0, algorithm.eval_params(), state)
    return steps, evals, ops
