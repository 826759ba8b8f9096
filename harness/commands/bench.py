"""``python -m harness bench BENCHMARK``: benchmarks of the native collective layer and the simulator.

:data:`BENCHMARKS` lists them, each with its one-line help (what ``bench --help`` says) and
its module (``harness.bench.<name>``), which describes it.

Run from a plain shell, a benchmark launches its own job under the venv's mpiexec
(``--ranks``, default 4) and exits with the job's status; run inside an MPI job
(``mpiexec -n 4 python -m harness bench ...``), every rank runs the worker directly.
The launching parent never imports mpi4py.

Example::

    python -m harness bench collectives --ranks 4 --sizes 4K,64K,1M,16M --json bench.json
    python -m harness bench dist --ranks 4 --sizes 50k,1M,25M --wrappers ddp,fsdp2 --steps 20 --repeats 3
    python -m harness bench simulator --ranks 1024 --iterations 1000
    python -m harness bench simulator --shapes --only flat_ring_nics
    python -m harness bench stress --ranks 8 --rounds 10000
    python -m harness bench faults --only wagma,adpsgd --repeats 3 --load
    python -m harness bench agreement --only small_run,nic_messages --repeats 5
    python -m harness bench training --ranks 256 --iterations 1000
    python -m harness bench scripts --modes fsdp,zero --ranks 2,3,8 --simulate 64,1024
    python -m harness bench validation --json validation.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from harness.bench import (
    agreement,
    collectives,
    collectives_worker,
    dist,
    dist_worker,
    faults,
    scripts,
    simulator,
    stress,
    stress_worker,
    training,
    validation,
)
from harness.launch import inside_mpi_job, run_ranks

DEFAULT_RANKS = 4


@dataclass(frozen=True)
class Benchmark:
    """A benchmark of ``bench``: its module (``add_arguments``, its description) and what runs it."""

    module: ModuleType
    help: str
    run: Callable[[argparse.Namespace], int]
    epilog: str | None = None  # more than the module's first line, after the options


def run_collectives(args: argparse.Namespace) -> int:
    """Run the collectives worker here (inside a job) or in a job of ``--ranks`` ranks; its status.
    From a shell, MPI's baselines run first, each thread level in a job of its own (none with
    emulated nodes, which MPI would not see)."""
    if inside_mpi_job() is not None:
        return _here_or_in_a_job(args, collectives_worker, DEFAULT_RANKS)
    if args.json is not None and not args.json.absolute().parent.is_dir():
        return _error(f"--json {args.json}: directory {args.json.absolute().parent} does not exist")
    if args.ranks_per_node is not None:
        return _here_or_in_a_job(args, collectives_worker, DEFAULT_RANKS)
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp:
        baselines = []
        for mode in collectives.MPI_MODES:
            rows = Path(tmp) / f"mpi_{mode}.json"
            status = _here_or_in_a_job(
                argparse.Namespace(**{**vars(args), "mpi_baseline": mode, "rows": rows, "json": None}),
                collectives_worker,
                DEFAULT_RANKS,
            )
            if status != 0:
                return status
            baselines.append(rows)
        return _here_or_in_a_job(
            argparse.Namespace(**{**vars(args), "baselines": baselines}), collectives_worker, DEFAULT_RANKS
        )


def run_dist(args: argparse.Namespace) -> int:
    """Run the DDP/FSDP2 worker here (inside a job) or in a job of ``--ranks`` ranks (default 4)."""
    return _here_or_in_a_job(args, dist_worker, DEFAULT_RANKS)


def run_stress(args: argparse.Namespace) -> int:
    """Run the stress worker here (inside a job) or in a job of ``--ranks`` ranks (default 8)."""
    return _here_or_in_a_job(args, stress_worker, stress.DEFAULT_RANKS)


BENCHMARKS = {
    "collectives": Benchmark(
        collectives, "native allreduce/broadcast/all-gather/reduce-scatter vs MPI's, nccl-tests style", run_collectives
    ),
    "dist": Benchmark(
        dist,
        "DDP and FSDP2 on the harness torch.distributed backend vs on gloo: time per step, 3 model sizes",
        run_dist,
    ),
    "simulator": Benchmark(
        simulator, "speed of the SimPy model (1,024 ranks x 1,000 WAGMA-SGD iterations by default)", simulator.run
    ),
    "stress": Benchmark(
        stress, "wait-avoiding allreduce and push-sum under random delays, checked exactly (8 ranks)", run_stress
    ),
    "faults": Benchmark(
        faults, "injected kills and hangs in every algorithm: does the verdict name the faulted rank?", faults.run
    ),
    "training": Benchmark(
        training, "simulated training (simulate --train) against plain training steps: time and memory", training.run
    ),
    "scripts": Benchmark(
        scripts,
        "torch.distributed scripts (DDP, FSDP2, HSDP, ZeRO) recorded at 4 ranks, predicted at others",
        scripts.run,
    ),
    "agreement": Benchmark(
        agreement,
        "the simulator against real runs: real and simulated times per case, with the error",
        agreement.run,
        epilog="\n".join(
            f"  {name:16s}{case.about}{'' if case.default else ' (not by default)'}"
            for name, case in agreement.CASES.items()
        ),
    ),
    "validation": Benchmark(
        validation, "the simulator against published measurements of other clusters, with the error", validation.run
    ),
}
"""Every benchmark, in the order ``bench --help`` lists them."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` command and its benchmarks."""
    parser = subparsers.add_parser(
        "bench", help=f"benchmarks: {', '.join(BENCHMARKS)}", description=__doc__.splitlines()[0]
    )
    benchmarks = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, benchmark in BENCHMARKS.items():
        extra = (
            {"epilog": benchmark.epilog, "formatter_class": argparse.RawDescriptionHelpFormatter}
            if benchmark.epilog
            else {}
        )
        description = (benchmark.module.__doc__ or name).splitlines()[0]
        sub = benchmarks.add_parser(name, help=benchmark.help, description=description, **extra)
        benchmark.module.add_arguments(sub)
        sub.set_defaults(func=benchmark.run)


def _here_or_in_a_job(args: argparse.Namespace, worker, default_ranks: int) -> int:
    """``worker.run_worker(args)`` in this process when it is a rank of an MPI job (of the
    ``--ranks`` asked for, if any), else the same worker (``worker.worker_argv``) on a new
    job of ``--ranks`` ranks; the exit status."""
    job = inside_mpi_job()
    if job is not None:
        if args.ranks is not None and args.ranks != job:
            return _error(
                f"--ranks {args.ranks} but this process runs in an MPI job of {job} ranks: "
                f"drop --ranks, or run it without mpiexec to launch {args.ranks} ranks"
            )
        return worker.run_worker(args)
    ranks = default_ranks if args.ranks is None else args.ranks
    try:
        return run_ranks(ranks, worker.worker_argv(args, ranks)).returncode
    except KeyboardInterrupt:  # run_ranks has already stopped the job
        return 130


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2
