"""The per-rank program of one calibration job: ``python -m harness.calibrate.worker SPEC OUT``.

Launched by ``python -m harness calibrate`` under the venv's mpiexec, one job per rank count.
``SPEC`` is a JSON ``harness.calibrate.measure.Plan``; rank 0 writes the measured
``CalibrationEntry`` as JSON to ``OUT`` (atomically) and every rank exits 0. All measured
communication goes through the native layer (``harness.comm.Communicator``); mpi4py only
gathers the timings to rank 0 and keeps idle ranks waiting without spinning (a non-blocking
barrier polled every millisecond).

What is measured, in this order (times on ``time.perf_counter`` / ``time.monotonic``; steps 3-6,
which train, in ``harness.calibrate.training_measures``):

0. where the ranks run: every rank's ``socket.gethostname()``, gathered (``rank_hosts``,
   ``hosts``, ``ranks_per_host``); they choose the point-to-point pairs
   (``measure.p2p_pairs``).
1. ``p2p``: two ranks on one host (ranks 0 and 1 on one host; see ``measure.p2p_pairs``
   across hosts, recorded as ``p2p_pair``) run back-to-back blocking ``exchange``s of float32
   buffers of each size (``P2PPoint.bytes`` = bytes sent one way) while the other ranks wait; both post at
   about the same time and an exchange completes when the peer's message has arrived, so
   the time of one exchange in the chain is one one-way message time: post -> hand-off to
   the progress thread -> MPI transfer -> arrival -> the caller woken (a ping-pong's half
   round trip, with both directions in flight at once). ``one_way_s`` = median over
   repetitions (in interleaved rounds over all sizes) of the mean of the two ranks' times.
   No emulated links. ``p2p_network`` is ``fit_alpha_beta`` of these points. When the ranks
   span several hosts, a pair on two hosts (``inter_host_pair``) is timed the same way right
   after (``inter_host_p2p``, fitted as ``inter_host_network``). (When no two ranks share a
   host, ``p2p`` is that pair's and there is no separate inter-host measurement.)
2. ``ops``: all ranks time native ``barrier`` and ``allreduce`` (sum, float32) of each size
   (``bytes`` = buffer bytes per rank), each repetition started right after a native
   barrier, i.e. from an (almost) synchronized start, in interleaved rounds over all
   cases; ``median_s`` = median over repetitions of the mean over ranks of the op's time
   (post -> completion). On a common clock that mean matched "last rank posts -> last rank
   completes" within a few percent. (Back-to-back ops without the barrier, every core busy
   with callers and progress threads, ran 3-5x slower at 8 ranks on 2 cores.)
3. ``compute``: per workload, every rank runs the real training loop
   (``harness.runner.loop.train``) at once with an algorithm whose hooks do nothing, so an
   iteration is exactly the loop's local work: batch, zero_grad, forward, cross-entropy,
   backward, optimizer step and the loop's bookkeeping. An iteration's time is the
   difference of consecutive iteration start times (``samples`` = how many, all ranks,
   after untimed warm-up iterations). ``median_s`` / ``p95_s`` are the median / 95th
   percentile over windows of consecutive iterations (``measure.WINDOW_S``, 25 ms or one
   iteration) of the window's mean iteration time: with more ranks than cores single
   iterations are either uncontended or hold a whole wait for the core (their median is the
   uncontended time, 4x too fast at 8 ranks on 2 cores), windows show the shared core.
   ``alone_s``: then rank 0 alone runs the same local work while the others wait in a native
   barrier (which sleeps): the median time of an iteration of a rank with cores of its own,
   what the cluster reading of ``simulate`` uses.
4. ``evaluation``: rank 0 times one evaluation point's local work, ``test_metrics`` of the
   averaged model and of its own (two calls, as ``evaluate`` makes), while the other ranks
   wait; median over repetitions. The two allreduces ``evaluate`` adds are not included.
5. ``loop_overhead_s``: every rank runs the training loop at once with emulated compute
   (sleep ``OVERHEAD_SLEEP_S`` per iteration, no-op hooks); the mean excess of an iteration
   over the nominal sleep (sleep overshoot included), averaged over ranks, floored at 0.
6. ``network``, what ``simulate`` uses: see :func:`network_fields`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.calibrate import measure
from harness.calibrate.measure import Plan
from harness.calibrate.training_measures import (
    data_key,
    measure_compute,
    measure_evaluation,
    measure_loop_overhead,
    measure_reference_runs,
    workload_scenario,
)
from harness.comm.asleep import quiet_barrier
from harness.mpi_library import import_mpi
from harness.rank_exit import abort_job_after_error
from harness.results.atomic import write_text
from harness.runner.workload_state import warm_up_torch
from harness.sim.calibration import CalibrationEntry, OpPoint, P2PPoint, fit_alpha_beta
from harness.sim.collective_timing import fit_to_allreduce
from harness.sim.fit import fit_allreduce_on_hosts, fit_loaded_network
from harness.sim.hosts import hosts_topology, nic_link
from harness.workload import communicated_floats, configure_torch_threads, scenario_dataset


def _say(rank: int, text: str) -> None:
    if rank == 0:
        print(text, file=sys.stderr, flush=True)


# -- 1. point to point ----------------------------------------------------------------------------
def measure_p2p(comm: Any, world: Any, effort: measure.Effort, pair: tuple[int, int] = (0, 1)) -> list[Any]:
    """One-way times of exchanges between the two ranks of ``pair`` (rank 0 returns the points).

    The sizes are measured in ``effort.rounds`` interleaved rounds (a block of repetitions of
    every size per round): how the scheduler happens to place the two ranks' threads on the
    cores changes the time several-fold and persists for a while, so rounds spread each
    size over several placements; the median is then taken over all repetitions.
    """
    rank = comm.rank
    times: dict[int, list[float]] = {size: [] for size in measure.P2P_SIZES}
    if rank in pair:
        peer = pair[1] if rank == pair[0] else pair[0]
        buffers = {}
        for size in measure.P2P_SIZES:
            send = np.full(size // 4, rank + 1, dtype=np.float32)
            buffers[size] = (send, np.zeros_like(send))
        for rnd in range(effort.rounds):
            for size in measure.P2P_SIZES:
                reps, warmup = effort.reps_for(size, effort.p2p_reps)
                per_round = -(-reps // effort.rounds)
                send, recv = buffers[size]
                t = np.empty(per_round)
                for i in range(-(warmup if rnd == 0 else 1), per_round):
                    t0 = time.perf_counter()
                    comm.exchange(send, recv, peer)
                    t1 = time.perf_counter()
                    if i >= 0:
                        t[i] = t1 - t0
                times[size] += t.tolist()
        for size, (_, recv) in buffers.items():
            if not np.all(recv == peer + 1):
                raise RuntimeError(f"exchange of {size} bytes delivered wrong data")
    quiet_barrier(world)
    gathered = world.gather(times, root=0)
    comm.drain_records()
    if rank != 0:
        return []
    a, b = pair
    return [
        P2PPoint(bytes=size, one_way_s=measure.per_rep_mean_median([gathered[a][size], gathered[b][size]]))
        for size in measure.P2P_SIZES
    ]


# -- 2. collectives -------------------------------------------------------------------------------
def measure_ops(comm: Any, world: Any, effort: measure.Effort, sizes: list[int]) -> list[Any]:
    """Time of native barrier and allreduce from a synchronized start (rank 0 returns the points).

    Like the point-to-point sizes, the cases run in ``effort.rounds`` interleaved rounds, so
    a passing disturbance (another process, a scheduler hiccup) spreads over all of them.
    """
    cases = [("barrier", 0), *(("allreduce", s) for s in sizes)]
    buffers = [np.zeros(max(size // 4, 1), dtype=np.float32) for _, size in cases]  # zeros: sums stay finite
    times: list[list[float]] = [[] for _ in cases]
    for rnd in range(effort.rounds):
        for j, (op, size) in enumerate(cases):
            reps, warmup = effort.reps_for(size, effort.op_reps)
            per_round = -(-reps // effort.rounds)
            buf = buffers[j]
            t = np.empty(per_round)
            for i in range(-(warmup if rnd == 0 else 1), per_round):
                comm.barrier()
                t0 = time.perf_counter()
                if op == "barrier":
                    comm.barrier()
                else:
                    comm.allreduce(buf, op="sum")
                t1 = time.perf_counter()
                if i >= 0:
                    t[i] = t1 - t0
            times[j] += t.tolist()
        comm.drain_records()
    gathered = world.gather(times, root=0)
    if comm.rank != 0:
        return []
    return [
        OpPoint(op=op, bytes=size, median_s=measure.per_rep_mean_median([g[j] for g in gathered]))
        for j, (op, size) in enumerate(cases)
    ]


# -- the job --------------------------------------------------------------------------------------
def run_worker(plan: Plan) -> Any:
    """Measure everything of ``plan`` on this rank; rank 0 returns the CalibrationEntry, others None."""
    MPI = import_mpi()  # lazy: importing mpi4py initializes MPI

    from harness.comm import Communicator  # noqa: PLC0415  (the native module and MPI: only inside the job)

    world = MPI.COMM_WORLD
    n, rank = world.Get_size(), world.Get_rank()
    if n != plan.ranks:
        raise RuntimeError(f"the plan is for {plan.ranks} ranks but this MPI job has {n}")
    if n < measure.MIN_RANKS:
        raise RuntimeError(f"calibration needs at least {measure.MIN_RANKS} ranks (got {n})")
    effort = plan.effort
    configure_torch_threads(1)  # as the runner: ranks outnumber cores, one compute thread each
    warm_up_torch()
    # Rank 0 loads the datasets and counts the models' parameters while the others sleep, then
    # sends them: parsing MNIST on every rank at once took most of a job's start-up.
    datasets: dict[tuple[Any, ...], Any] = {}
    model_bytes: list[int] = []
    if rank == 0:
        for w in plan.workloads:
            if data_key(w) not in datasets:
                datasets[data_key(w)] = scenario_dataset(workload_scenario(n, w))
        model_bytes = [4 * communicated_floats(workload_scenario(n, w)) for w in plan.op_models]
    quiet_barrier(world)
    datasets, model_bytes = world.bcast((datasets, model_bytes), root=0)
    sizes = measure.allreduce_sizes([*model_bytes, *plan.op_bytes])

    rank_hosts = world.allgather(socket.gethostname())  # every rank needs them to pick the pairs
    pairs = measure.p2p_pairs(rank_hosts)
    hosts = list(dict.fromkeys(rank_hosts))
    if len(hosts) > 1:
        _say(rank, f"[{n} ranks] on {len(hosts)} hosts: " + ", ".join(f"{h} ({rank_hosts.count(h)})" for h in hosts))
    comm = Communicator(world)
    try:
        t = time.monotonic()
        p2p_pair = pairs.same_host or pairs.cross_host
        assert p2p_pair is not None  # p2p_pairs: a pair on one host, or else one across hosts
        p2p = measure_p2p(comm, world, effort, p2p_pair)
        inter_pair = pairs.cross_host if pairs.same_host is not None else None
        inter = measure_p2p(comm, world, effort, inter_pair) if inter_pair is not None else []
        _say(rank, f"[{n} ranks] point-to-point: {time.monotonic() - t:.1f} s")
        t = time.monotonic()
        ops = measure_ops(comm, world, effort, sizes)
        _say(rank, f"[{n} ranks] collectives: {time.monotonic() - t:.1f} s")
        compute, evaluation, evaluated = [], [], set()
        for w in plan.workloads:
            t = time.monotonic()
            point, state = measure_compute(comm, world, effort, w, datasets[data_key(w)])
            compute.append(point)
            if w.labels not in evaluated:
                evaluated.add(w.labels)
                evaluation.append(measure_evaluation(comm, world, effort, w, state))
            _say(rank, f"[{n} ranks] compute {'/'.join(w.labels)}/b{w.batch_size}: {time.monotonic() - t:.1f} s")
        t = time.monotonic()
        overhead = measure_loop_overhead(comm, world, effort)
        _say(rank, f"[{n} ranks] loop overhead: {time.monotonic() - t:.1f} s")
        references = []
        if plan.workloads:
            t = time.monotonic()
            w = plan.workloads[0]
            compute_s = world.bcast(compute[0].median_s if rank == 0 else None, root=0)
            references = measure_reference_runs(comm, world, effort, w, datasets[data_key(w)], compute_s)
            _say(rank, f"[{n} ranks] reference trainings: {time.monotonic() - t:.1f} s")
    finally:
        comm.close()
    if rank != 0:
        return None
    places = host_fields(rank_hosts, p2p_pair, inter_pair, inter)
    return CalibrationEntry(
        ranks=n,
        p2p=p2p,
        ops=ops,
        compute=compute,
        evaluation=evaluation,
        loop_overhead_s=overhead,
        **places,
        **network_fields(n, p2p, ops, references, places),
    )


def host_fields(
    rank_hosts: list[str], p2p_pair: tuple[int, int], inter_pair: tuple[int, int] | None, inter: list[Any]
) -> dict[str, Any]:
    """The entry's fields saying where the ranks ran and what was measured between hosts."""
    hosts = list(dict.fromkeys(rank_hosts))
    return {
        "rank_hosts": list(rank_hosts),
        "hosts": hosts,
        "ranks_per_host": [rank_hosts.count(h) for h in hosts],
        "p2p_pair": p2p_pair,
        "inter_host_pair": inter_pair,
        "inter_host_p2p": inter,
        "inter_host_network": fit_alpha_beta(inter) if inter else None,
    }


def network_fields(
    ranks: int, p2p: list[Any], ops: list[Any], references: list[tuple[Any, Any]], places: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The entry's ``network`` (what ``simulate`` uses) and how it was obtained.

    Preferred: fitted to the reference trainings under load (``harness.sim.fit``), with the
    cores shared when ranks outnumber them. Without a real-compute workload to train: fitted to
    the quiet allreduce times (``fit_to_allreduce``). ``places``: :func:`host_fields`; when it
    has an inter-host link, both fits simulate the ranks' hosts as nodes whose NICs add that
    link's excess (``harness.sim.hosts``), so ``network`` is the cost of a message inside a host.
    """
    cpus = os.cpu_count() or 1
    shared = cpus if ranks > cpus else None
    fields: dict[str, Any] = {"p2p_network": fit_alpha_beta(p2p)}
    hosts = None
    if places and places.get("inter_host_network") is not None:
        nic = nic_link(fields["p2p_network"], places["inter_host_network"])
        assert nic is not None  # both links are there
        hosts = hosts_topology(places["rank_hosts"], nic)
    if references:
        t = time.monotonic()
        network, error = fit_loaded_network(references, shared, hosts=hosts)
        _say(0, f"[{ranks} ranks] network fit to the reference trainings: {time.monotonic() - t:.1f} s")
        fields.update(network=network, network_source="reference trainings", network_fit_error=error)
    else:
        points = [(ranks, o.bytes, o.median_s) for o in ops if o.op == "allreduce"]
        if hosts is None:
            network, error = fit_to_allreduce(points), None
        else:
            network, error = fit_allreduce_on_hosts(points, hosts)
        fields.update(
            network=network.model_copy(update={"shared_cores": shared}),
            network_source="quiet allreduce times",
            network_fit_error=error,
        )
    return fields


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m harness.calibrate.worker SPEC.json OUT.json", file=sys.stderr)
        return 2
    try:
        plan = Plan.from_json(json.loads(Path(argv[0]).read_text()))
        entry = run_worker(plan)
        if entry is not None:
            write_text(Path(argv[1]), entry.model_dump_json(indent=2) + "\n")
        return 0
    except BaseException:  # noqa: BLE001  (any failure, Ctrl-C included, must abort the whole job)
        return abort_job_after_error()


if __name__ == "__main__":
    sys.exit(main())
