"""Per-rank entry point of a run: ``python -m harness.runner.worker RUN_DIR`` under mpiexec.

Reads ``RUN_DIR/scenario.resolved.yaml`` (written by ``python -m harness run``), trains every
algorithm in turn under the same injections and emulated links, and has rank 0 gather the
records and write the results after each algorithm, so an interrupted run keeps what it
finished. Algorithms that ``run.json`` already lists as finished are skipped: that is how
``python -m harness run --resume RUN_DIR`` finishes an interrupted run (without injecting the
scenario's faults again).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.algorithms import algorithm_class, scenario_facts
from harness.algorithms.base import AlgorithmContext
from harness.comm.asleep import quiet_barrier
from harness.comm.call_log import CallLog
from harness.device import dataset_on, local_rank, mpi_cuda_aware, torch_device
from harness.faults import FaultPlan
from harness.injection import InjectionPlan
from harness.launch import launcher_rank
from harness.mpi_library import MpiLibraryError, import_mpi
from harness.mpi_library import run_record as mpi_run_record
from harness.results.columns import CommCallRecord
from harness.results.layout import PROVENANCE_DIR, SCENARIO_FILE, finished_algorithms
from harness.results.provenance import ProvenanceWriter
from harness.results.provenance import level as provenance_level
from harness.runner.clock import Clock
from harness.runner.loop import train
from harness.runner.report import gather, publish, write_summary
from harness.scenario import load_scenario
from harness.watchdog.heartbeat_row import Phase
from harness.watchdog.in_job import join_watchdog, report_in_before_mpi
from harness.watchdog.verdict import Verdict

# Imported where used: mpi4py (importing it starts MPI), torch (seconds of CPU: after this rank has
# reported in to the watchdog), pandas (rank 0 alone writes results).


def main(run_dir: str, resume: bool = False) -> int:
    scenario = load_scenario(Path(run_dir) / SCENARIO_FILE)
    # Before MPI starts (it waits for every rank on every host): a slow_start strikes, then the
    # rank reports in, so the watchdog can tell a host that never starts from ranks that wait.
    early_rank = launcher_rank()
    if early_rank is not None:
        FaultPlan(scenario, early_rank, enabled=not resume).delay_start()
    early = report_in_before_mpi()
    try:
        MPI = import_mpi()  # starts MPI: after the early report-in
    except MpiLibraryError as exc:  # two MPI libraries: this rank's own error, said before it goes
        if early is not None:
            early.failed(exc)
            early.close()
        raise

    world = MPI.COMM_WORLD
    rank = world.rank
    run = None
    if rank == 0:  # only rank 0 writes results: the others never load the records (nor pandas)
        from harness.results.records import RunDirectory  # noqa: PLC0415  (pandas: rank 0 only)

        run = RunDirectory.open(run_dir)
    if world.size != scenario.ranks:
        raise SystemExit(f"error: scenario needs {scenario.ranks} ranks, this job has {world.size}")
    faults = FaultPlan(scenario, rank, enabled=not resume)
    if early_rank is None:
        faults.delay_start()
    # The launcher's watchdog, or (ranks the user started) one rank 0 runs: it records its
    # verdict in run.json before it aborts the job.

    def record_verdict(v: Verdict) -> None:  # called on rank 0, which holds the run directory
        assert run is not None
        run.update_run_json("failed", {"error": v.message, "fault": v.as_json()})

    beat = join_watchdog(world, scenario, faults_enabled=not resume, on_verdict=record_verdict, early=early)
    beat.report_in()
    try:
        _train_all(world, Path(run_dir), run, scenario, faults, beat)
    except BaseException as exc:
        beat.failed(exc)
        raise
    beat.stage(Phase.DONE)
    beat.close()
    return 0


def _train_all(world, run_dir: Path, run, scenario, faults, beat) -> None:
    """Every algorithm not finished yet, in the scenario's order; rank 0 writes (into ``run``,
    None on the other ranks) after each."""
    import torch  # noqa: PLC0415  (seconds of CPU: after the rank reported in, see main)

    from harness.comm import Communicator  # noqa: PLC0415  (loads mpi4py.MPI)
    from harness.runner.local_work import LocalWork  # noqa: PLC0415  (torch)
    from harness.runner.workload_state import build_state, warm_up_torch  # noqa: PLC0415  (torch)
    from harness.workload import configure_torch_threads, scenario_dataset, shard_indices  # noqa: PLC0415  (torch)

    rank = world.rank
    # The ranks arrive here as their imports finish (torch alone takes seconds of CPU, and ranks
    # often outnumber cores): the first collective would have the early ones poll a core that
    # the late ones are importing on. They sleep instead.
    quiet_barrier(world)
    on_host = local_rank(world)
    hosts = world.allreduce(int(on_host == 0))  # one local rank 0 per host
    device = torch_device(scenario.workload.device, on_host)
    # Where rank 0 trained and whether MPI could have taken device memory (it is staged anyway).
    placement = {
        "device": str(device),
        "mpi": mpi_run_record(import_mpi()),
        "mpi_cuda_aware": mpi_cuda_aware(),
        # The native layer reduces on the host: device buffers are staged through pinned host
        # memory even where MPI could take them (docs/guides/clusters.md, "GPUs").
        "device_buffers": "host" if device.type == "cpu" else "staged",
    }
    configure_torch_threads(1)  # ranks outnumber cores: one compute thread each
    warm_up_torch()
    comm = Communicator(world)
    eval_comm = Communicator(world)
    comm.emulate_network(scenario)
    plan = InjectionPlan.from_scenario(scenario)
    dataset = dataset_on(scenario_dataset(scenario), device)

    provenance = ProvenanceWriter(run_dir / PROVENANCE_DIR, provenance_level(scenario))
    if provenance.keeps_anything:
        shards = world.gather(shard_indices(dataset.num_train, scenario.ranks, rank, scenario.seed), root=0)
        if rank == 0:
            provenance.write_start(shards, build_state(scenario, 0, dataset, device).params.clone())

    # Every rank's offset from rank 0's clock, so that all records are on one clock across hosts.
    clock = Clock.synchronize(world)
    done_before = finished_algorithms(run_dir)  # what a resumed run has already
    finished = [a.name for a in scenario.algorithms if a.name in done_before]
    for index, params in enumerate(scenario.algorithms):
        if params.name in finished:
            continue
        beat.algorithm(index)
        optimizer = scenario.optimizer_of(params)
        state = build_state(scenario, rank, dataset, device, optimizer)
        striking = faults.striking(comm, params.name)  # strikes after posting (a during: communication fault)
        log = CallLog(striking) if scenario.results.comm_calls else None  # the algorithm's calls, for comm_calls.csv
        algo_comm = striking if log is None else log
        ctx = AlgorithmContext(algo_comm, state.params, state.grads, optimizer.lr, scenario.seed)
        algorithm = algorithm_class(params.name)(params, ctx)
        bar = _progress_bar(params.name, scenario.workload.iterations) if rank == 0 else None
        comm.barrier()
        t0 = clock.origin()  # one instant on every rank: times - t0 are on rank 0's clock (harness.runner.clock)
        work = LocalWork(scenario, state, rank, plan, eval_comm, params.name)
        steps, evals, ops = train(
            scenario,
            algorithm,
            algo_comm,
            work,
            t0,
            progress=_ticks(bar) if bar else None,
            heartbeat=beat,
            faults=faults,
        )
        if bar:
            bar.close()
        beat.stage(Phase.RESULTS)
        clock.remeasure()  # after every algorithm, so run.json's drift covers the run so far
        all_steps, all_evals, all_ops = (gather(world, x) for x in (steps, evals, ops))
        calls = None
        if log is not None:  # every rank has the same scenario: all gather, or none
            calls = gather(world, [CommCallRecord(params.name, rank, *c) for c in log.calls])
        average = finals = None
        if provenance.keeps_anything:
            final = algorithm.eval_params().detach().clone()
            if provenance.keeps_rank_models:
                finals = world.gather(final, root=0)
            # Averaged as the last evaluation averaged it: bit for bit the model final_accuracy tested.
            average = final.clone()
            eval_comm.allreduce(average, op="mean")
        if rank == 0:
            assert all_steps is not None and all_evals is not None and all_ops is not None  # gathered on rank 0
            provenance.write_final(params.name, average, torch.stack(finals) if finals is not None else None)
            finished.append(params.name)
            publish(
                run,
                scenario,
                params.name,
                all_steps,
                all_evals,
                all_ops,
                calls,
                finished,
                hosts=hosts,
                extra={**placement, "provenance": provenance.keep, **scenario_facts(scenario), **clock.run_json()},
            )
    if rank == 0:
        from harness.results.summary import format_table  # noqa: PLC0415  (pandas: rank 0 only)

        print(format_table(write_summary(run, scenario)))
        print(provenance.report())
        print(f"results: {run.path}")
    clock.close()
    eval_comm.close()
    comm.close()


def _ticks(bar: Any) -> Callable[[int], None]:
    """The loop's progress callback: one tick of ``bar`` per iteration."""
    return lambda t: bar.update(1)


def _progress_bar(name: str, total: int):
    from tqdm import tqdm  # noqa: PLC0415  (rank 0 only)

    return tqdm(total=total, desc=f"{name:>16}", unit="it", file=sys.stderr, dynamic_ncols=True, mininterval=0.5)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--resume"]):
        raise SystemExit("usage: python -m harness.runner.worker RUN_DIR [--resume]")
    from harness.rank_exit import exit_promptly_when_interrupted

    exit_promptly_when_interrupted()  # an interrupt ends this rank with a status, never hangs it
    try:
        sys.exit(main(sys.argv[1], resume=sys.argv[2:] == ["--resume"]))
    except KeyboardInterrupt:  # Ctrl+C, forwarded by the launcher: the parent says what happened
        sys.exit(130)
    except Exception:  # noqa: BLE001  any error: print it and take the whole job down
        from harness.rank_exit import abort_job_after_error

        sys.exit(abort_job_after_error())
