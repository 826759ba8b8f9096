"""What a calibration job measures of training, on every rank: the training loop's compute,
evaluation and overhead (steps 3-5 of ``harness.calibrate.worker``), and the reference trainings
the loaded network is fitted on (step 6). The job that runs them in order is the worker's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.algorithms import algorithm_class
from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.params import AlgorithmParams
from harness.calibrate import measure
from harness.calibrate.measure import TimedWorkload
from harness.comm.asleep import quiet_barrier
from harness.injection import InjectionPlan
from harness.mpi_library import import_mpi
from harness.results.columns import STEP_COLUMNS, to_frame
from harness.runner.evaluate import test_metrics
from harness.runner.local_work import LocalWork
from harness.runner.loop import train
from harness.runner.workload_state import build_state
from harness.scenario import scenario_from_dict
from harness.sim.calibration import ComputePoint, EvalPoint
from harness.workload import load_dataset


# -- 3-5. the training loop -----------------------------------------------------------------------
def _scenario(
    ranks: int,
    seed: int,
    workload: dict[str, Any],
    iterations: int,
    optimizer: dict[str, Any],
    algorithm: str | dict[str, Any] = "allreduce_sgd",
    python_path: Sequence[str] = (),
) -> Any:
    return scenario_from_dict(
        {
            "name": "calibrate",
            "ranks": ranks,
            "seed": seed,
            "python_path": list(python_path),
            "workload": {**workload, "iterations": iterations, "eval_every": iterations},
            "optimizer": optimizer,
            "algorithms": [algorithm],
        },
        source="<calibration>",
    )


def workload_scenario(
    ranks: int, workload: TimedWorkload, iterations: int = 1, algorithm: str | dict[str, Any] = "allreduce_sgd"
) -> Any:
    """A scenario training ``workload`` (with its seed, optimizer and python_path)."""
    return _scenario(
        ranks,
        workload.seed,
        workload.scenario_fields(),
        iterations,
        workload.optimizer,
        algorithm,
        workload.python_path,
    )


def data_key(workload: TimedWorkload) -> tuple[Any, ...]:
    """Workloads that train on the same data share one loaded dataset."""
    return workload.labels[1], workload.seed, workload.num_classes, workload.python_path


def _run_loop(comm: Any, scenario: Any, state: Any) -> list[float]:
    """Run ``train`` on every rank at once with no-op hooks; this rank's iteration start times."""

    class Idle(Algorithm):
        name = "calibrate"

    ctx = AlgorithmContext(comm, state.params, state.grads, scenario.optimizer.lr, scenario.seed)
    comm.barrier()
    work = LocalWork(scenario, state, comm.rank, InjectionPlan.from_scenario(scenario), comm, Idle.name)
    steps, _, _ = train(scenario, Idle(AlgorithmParams(name=Idle.name), ctx), comm, work, time.monotonic())
    comm.drain_records()
    return [s.start_s for s in steps]


def measure_compute(comm: Any, world: Any, effort: measure.Effort, workload: TimedWorkload, dataset: Any) -> Any:
    """Per-iteration time of ``workload`` with all ranks training at once; (ComputePoint, state) on rank 0."""
    MPI = import_mpi()  # lazy: importing mpi4py initializes MPI

    n = comm.size
    warm = workload_scenario(n, workload, effort.compute_warmup + 1)
    state = build_state(warm, comm.rank, dataset)
    starts = _run_loop(comm, warm, state)
    per_iter = max(measure.iteration_times(starts) or [float("nan")])
    per_iter = world.allreduce(per_iter, op=MPI.MAX)
    iters = measure.timed_iterations(per_iter, effort) + 1  # +1: n iterations give n-1 differences
    timed = workload_scenario(n, workload, iters)
    samples = measure.iteration_times(_run_loop(comm, timed, state))
    gathered = world.gather(samples, root=0)
    alone = measure_compute_alone(comm, timed, state, iters)  # collective
    if comm.rank != 0:
        return None, state
    windows = measure.window_means(gathered)
    model, data = workload.labels
    return ComputePoint(
        model=model,
        dataset=data,
        batch_size=workload.batch_size,
        median_s=measure.median(windows),
        p95_s=measure.p95(windows),
        samples=sum(len(g) for g in gathered),
        alone_s=alone,
    ), state


def measure_compute_alone(comm: Any, scenario: Any, state: Any, iterations: int) -> float | None:
    """Rank 0's local work per iteration (batch, forward, backward, optimizer step) while the
    other ranks wait in a native barrier, which sleeps: what a rank with cores of its own takes
    (the cluster reading's compute). The median over ``iterations`` after two warm-up ones;
    rank 0 returns it, the others None."""
    took = []
    if comm.rank == 0:
        work = LocalWork(scenario, state, 0, InjectionPlan.from_scenario(scenario), comm, "calibrate")
        for t in range(iterations + 2):
            t0 = time.perf_counter()
            work.injected(t)
            gradient_s, _ = work.gradient(t, 1.0)
            work.step(t, 1.0, gradient_s)
            took.append(time.perf_counter() - t0)
    comm.ibarrier().wait()  # the others wait here without taking a core
    return measure.median(took[2:]) if took else None


def measure_evaluation(comm: Any, world: Any, effort: measure.Effort, workload: TimedWorkload, state: Any) -> Any:
    """Rank 0's time of one evaluation point's test metrics (average and rank0 models)."""
    point = None
    if comm.rank == 0:
        avg = state.params.detach().clone()
        local = state.params
        times = []
        for i in range(-1, effort.eval_reps):
            t0 = time.perf_counter()
            for flat in (avg, local):
                test_metrics(state.model, flat, state.params, state.data)
            if i >= 0:
                times.append(time.perf_counter() - t0)
        model, data = workload.labels
        point = EvalPoint(model=model, dataset=data, median_s=measure.median(times))
    quiet_barrier(world)
    return point


def measure_loop_overhead(comm: Any, world: Any, effort: measure.Effort) -> float:
    """Mean excess of an emulated-compute iteration over its nominal sleep (rank 0 returns it)."""
    spec = {
        "model": "logreg",
        "dataset": "synthetic",
        "batch_size": 1,
        "params": 1,
        "compute": {"emulate_ms": measure.OVERHEAD_SLEEP_S * 1e3},
    }
    scenario = _scenario(comm.size, 0, spec, effort.overhead_iters, {})
    state = build_state(scenario, comm.rank, load_dataset("synthetic", 0))
    starts = _run_loop(comm, scenario, state)
    excess = (starts[-1] - starts[0]) / (len(starts) - 1) - measure.OVERHEAD_SLEEP_S
    gathered = world.gather(excess, root=0)
    return max(0.0, float(np.mean(gathered))) if comm.rank == 0 else 0.0


# -- 6. the network under training load ----------------------------------------------------------
def reference_algorithms(ranks: int) -> list[str | dict[str, Any]]:
    """The reference trainings' algorithms: a collective per iteration, whole-model exchanges,
    push-sum gossip and wait-avoiding group rounds (groups of up to 4, as in the scenarios)."""
    return ["allreduce_sgd", "dpsgd", "sgp", {"name": "wagma", "group_size": min(4, ranks), "period": 11}]


def measure_reference_runs(
    comm: Any, world: Any, effort: measure.Effort, workload: TimedWorkload, dataset: Any, compute_s: float
) -> list[tuple[Any, Any]]:
    """Short real trainings of ``workload`` with each reference algorithm on all ranks.

    Each lasts about ``effort.reference_budget_s`` of compute (``compute_s`` per iteration,
    the same on every rank), at least ``effort.reference_min_iters`` iterations.

    Returns, on rank 0, (scenario, steps frame) pairs for ``harness.sim.fit``; [] elsewhere.
    """
    iterations = max(effort.reference_min_iters, min(200, int(effort.reference_budget_s / max(compute_s, 1e-4))))
    references = []
    for entry in reference_algorithms(comm.size):
        scenario = workload_scenario(comm.size, workload, iterations, entry)
        state = build_state(scenario, comm.rank, dataset)
        params = scenario.algorithms[0]
        name = params.name
        ctx = AlgorithmContext(comm, state.params, state.grads, scenario.optimizer.lr, scenario.seed)
        algorithm = algorithm_class(name)(params, ctx)
        comm.barrier()
        work = LocalWork(scenario, state, comm.rank, InjectionPlan.from_scenario(scenario), comm, name)
        steps, _, _ = train(scenario, algorithm, comm, work, time.monotonic())  # finish() included
        comm.drain_records()
        gathered = world.gather(steps, root=0)
        if comm.rank == 0:
            references.append((scenario, to_frame([s for part in gathered for s in part], STEP_COLUMNS)))
    return references
