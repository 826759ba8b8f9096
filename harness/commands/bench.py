"""``python -m harness bench BENCHMARK``: benchmarks of the native collective layer and the simulator.

``collectives``, ``dist``, ``simulator``, ``stress``, ``faults``, ``training``, ``agreement``,
``scripts`` and ``validation`` are described in their modules.

Run from a plain shell, a benchmark launches its own job under the venv's mpiexec
(``--ranks``, default 4) and exits with the job's status; run inside an MPI job
(``mpiexec -n 4 python -m harness bench ...``), every rank runs the worker directly.
The launching parent never imports mpi4py.

Example::

    python -m harness bench collectives --ranks 4 --sizes 4K,64K,1M,16M --json bench.json
    python -m harness bench dist --ranks 4 --sizes 50k,1M,25M --steps 20 --repeats 3
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

from harness.bench import collectives, dist, faults, simulator, stress, training
from harness.launch import inside_mpi_job, run_ranks

DEFAULT_RANKS = 4


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` command and its benchmarks."""
    parser = subparsers.add_parser("bench", help="benchmarks: native collectives, simulator speed",
                                   description=__doc__.splitlines()[0])
    benchmarks = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    coll = benchmarks.add_parser(
        "collectives", help="native allreduce/broadcast/all-gather/reduce-scatter vs MPI's, nccl-tests style",
        description=collectives.__doc__.splitlines()[0],
    )
    collectives.add_arguments(coll)
    coll.set_defaults(func=run_collectives)
    dd = benchmarks.add_parser(
        "dist", help="DDP on the harness torch.distributed backend vs on gloo: time per step, 3 model sizes",
        description=dist.__doc__.splitlines()[0],
    )
    dist.add_arguments(dd)
    dd.set_defaults(func=run_dist)
    sim = benchmarks.add_parser(
        "simulator", help="speed of the SimPy model (1,024 ranks x 1,000 WAGMA-SGD iterations by default)",
        description=simulator.__doc__.splitlines()[0],
    )
    simulator.add_arguments(sim)
    sim.set_defaults(func=simulator.run)
    st = benchmarks.add_parser(
        "stress", help="wait-avoiding allreduce and push-sum under random delays, checked exactly (8 ranks)",
        description=stress.__doc__.splitlines()[0],
    )
    stress.add_arguments(st)
    st.set_defaults(func=run_stress)
    fl = benchmarks.add_parser(
        "faults", help="injected kills and hangs in every algorithm: does the verdict name the faulted rank?",
        description=faults.__doc__.splitlines()[0],
    )
    faults.add_arguments(fl)
    fl.set_defaults(func=faults.run)
    tr = benchmarks.add_parser(
        "training", help="simulated training (simulate --train) against plain training steps: time and memory",
        description=training.__doc__.splitlines()[0],
    )
    training.add_arguments(tr)
    tr.set_defaults(func=training.run)
    from harness.bench import scripts  # noqa: PLC0415  launches its runs as subprocesses

    sc = benchmarks.add_parser(
        "scripts", help="torch.distributed scripts (DDP, FSDP2, HSDP, ZeRO) recorded at 4 ranks, predicted at others",
        description=scripts.__doc__.splitlines()[0],
    )
    scripts.add_arguments(sc)
    sc.set_defaults(func=scripts.run)
    from harness.bench import agreement  # noqa: PLC0415  real vs simulated; imports no MPI

    agree = benchmarks.add_parser(
        "agreement", help="the simulator against real runs: real and simulated times per case, with the error",
        description=agreement.__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(f"  {name:16s}{case.about}{'' if case.default else ' (not by default)'}"
                         for name, case in agreement.CASES.items()),
    )
    agreement.add_arguments(agree)
    agree.set_defaults(func=agreement.run)
    from harness.bench import validation  # noqa: PLC0415  simulations of published clusters

    valid = benchmarks.add_parser(
        "validation", help="the simulator against published measurements of other clusters, with the error",
        description=validation.__doc__.splitlines()[0],
    )
    validation.add_arguments(valid)
    valid.set_defaults(func=validation.run)


def run_collectives(args: argparse.Namespace) -> int:
    """Run the collectives worker here (inside a job) or in a job of ``--ranks`` ranks; its status."""
    if inside_mpi_job() is None and args.json is not None and not args.json.absolute().parent.is_dir():
        return _error(f"--json {args.json}: directory {args.json.absolute().parent} does not exist")
    return _here_or_in_a_job(args, collectives, DEFAULT_RANKS)


def run_dist(args: argparse.Namespace) -> int:
    """Run the DDP worker here (inside a job) or in a job of ``--ranks`` ranks (default 4)."""
    return _here_or_in_a_job(args, dist, DEFAULT_RANKS)


def run_stress(args: argparse.Namespace) -> int:
    """Run the stress worker here (inside a job) or in a job of ``--ranks`` ranks (default 8)."""
    return _here_or_in_a_job(args, stress, stress.DEFAULT_RANKS)


def _here_or_in_a_job(args: argparse.Namespace, benchmark, default_ranks: int) -> int:
    """``benchmark.run_worker(args)`` in this process when it is a rank of an MPI job (of the
    ``--ranks`` asked for, if any), else the same worker (``python -m <its module>``) on a new
    job of ``--ranks`` ranks; the exit status."""
    job = inside_mpi_job()
    if job is not None:
        if args.ranks is not None and args.ranks != job:
            return _error(f"--ranks {args.ranks} but this process runs in an MPI job of {job} ranks: "
                          f"drop --ranks, or run it without mpiexec to launch {args.ranks} ranks")
        return benchmark.run_worker(args)
    ranks = default_ranks if args.ranks is None else args.ranks
    argv = [sys.executable, "-m", benchmark.__name__, *benchmark.to_argv(args, ranks)]
    try:
        return run_ranks(ranks, argv).returncode
    except KeyboardInterrupt:  # run_ranks has already stopped the job
        return 130


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2
