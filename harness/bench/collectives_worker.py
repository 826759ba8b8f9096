"""The MPI worker of ``bench collectives``, which every rank of its job runs.

``python -m harness bench collectives`` launches it; it can also be started directly under the
venv's mpiexec::

    mpiexec -n 4 python -m harness.bench.collectives_worker --sizes 4K,1M,16M --iters 20 --json bench.json

Rank 0 prints the tables (and writes ``--json``); the exit status is 1 when any element was
wrong. mpi4py and the native layer are imported inside ``run_worker`` only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.bench.arguments import say, worker_main
from harness.bench.collective_ops import ABOUT, iterations_for, measure, measure_mpi, set_best_mpi
from harness.bench.collectives import (
    add_arguments,
    comm_options,
    describe,
    min_large_ratio,
    table_header,
    table_row,
    to_argv,
    topologies,
)
from harness.bench.mpi_worker import on_world, worker_command
from harness.bench.sizes import format_size
from harness.mpi_library import import_mpi
from harness.results.atomic import write_json


def worker_argv(args: argparse.Namespace, ranks: int) -> list[str]:
    """The whole command each rank runs: ``run_ranks(ranks, worker_argv(args, ranks))``."""
    return worker_command("harness.bench.collectives_worker", to_argv(args, ranks))


def run_worker(args: argparse.Namespace) -> int:
    """Run the benchmark on this rank; rank 0 prints (and writes ``--json``). 0, or 1 if #wrong > 0.
    With ``--mpi-baseline MODE``: MPI's collectives alone, at that thread level, their times
    written to ``--rows`` (rank 0)."""
    if args.mpi_baseline == "single":
        import mpi4py  # noqa: PLC0415  (the thread level is set before MPI initializes, on the ranks only)

        mpi4py.rc.thread_level = "single"
    return _run_baseline(args) if args.mpi_baseline is not None else _run_native(args)


@on_world
def _run_baseline(args: argparse.Namespace, world: Any) -> int:
    MPI = import_mpi()  # initializes MPI: on the ranks only

    times = {
        f"{name}:{size}": measure_mpi(world, name, size, args.iters, args.warmup) * 1e6
        for name in args.ops
        for size in args.sizes
    }
    if world.Get_rank() == 0:
        levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled", MPI.THREAD_SERIALIZED: "serialized"}
        level = levels.get(MPI.Query_thread(), "multiple")
        write_json(args.rows, {"mode": args.mpi_baseline, "thread_level": level, "times_us": times})
    return 0


def _baseline_times(paths: list) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """{mode: {"op:size": us}} and {mode: the thread level MPI gave} of the baseline jobs' files."""
    times, levels = {}, {}
    for path in paths:
        doc = json.loads(Path(path).read_text())
        times[doc["mode"]] = doc["times_us"]
        levels[doc["mode"]] = doc["thread_level"]
    return times, levels


@on_world
def _run_native(args: argparse.Namespace, world: Any) -> int:
    MPI = import_mpi()  # initializes MPI: on the ranks only

    from harness.comm import Communicator  # noqa: PLC0415  (loads MPI and the native layer: ranks only)

    n, rank = world.Get_size(), world.Get_rank()
    library = " ".join(MPI.Get_library_version().splitlines()[0].split())
    baselines, levels = _baseline_times(args.baselines)
    header = {
        "benchmark": "collectives",
        "ranks": n,
        "warmup": args.warmup,
        "iters": args.iters,
        "sizes": args.sizes,
        "ops": args.ops,
        "mpi_library": library,
        "mpi_modes": levels or {"multiple": "multiple (in the native job's processes)"},
        "comm_options": comm_options(args),
        "emulated_nodes": None
        if args.ranks_per_node is None
        else {
            "ranks_per_node": args.ranks_per_node,
            "nic_gbps": args.nic_gbps,
            "nic_latency_us": args.nic_latency_us,
            "intra_gbps": args.intra_gbps,
        },
    }
    cuts = {s: iterations_for(s, args.iters, args.warmup) for s in args.sizes}
    reduced = [f"{format_size(s)}: {i}+{w}" for s, (i, w) in cuts.items() if (i, w) != (args.iters, args.warmup)]
    if rank == 0:
        options = " ".join(f"{k}={v:g}" for k, v in header["comm_options"].items()) or "defaults"
        say(
            f"# collectives: {n} ranks, warmup {args.warmup}, iters {args.iters}"
            + (f" (iters+warmup cut for {', '.join(reduced)})" if reduced else "")
            + "; time = median over iters of the slowest rank"
        )
        where = (
            "; ".join(f"{mode}: a job of its own (thread level {level})" for mode, level in levels.items())
            if levels
            else "multiple: in these processes"
        )
        say(f"# native: harness.comm.Communicator ({options}); baseline: mpi4py {library}, MPI {where}")

    rows: list[dict[str, Any]] = []
    for topology, kind in topologies(args, n):
        comm = Communicator(world, **comm_options(args))
        try:
            if {"allgather", "reduce_scatter"} & set(args.ops):
                comm._bench_group = comm._native.group(list(range(n)))  # collective
            comm.set_topology(topology)
            comm.set_allreduce(kind)
            for name in args.ops:
                if rank == 0:
                    say("#")
                    say(f"# {name} (float32{ABOUT[name]}){describe(topology, kind)}")
                    say(table_header())
                for size in args.sizes:
                    in_process = topology is None and not baselines
                    row = measure(comm, world, name, size, args.iters, args.warmup, baseline=in_process)
                    for mode, times in baselines.items():
                        row[f"mpi_{mode}_time_us"] = times.get(f"{name}:{size}")
                    set_best_mpi(row, n)
                    if topology is not None:
                        row["allreduce_kind"] = kind
                    rows.append(row)
                    if rank == 0:
                        say(table_row(row))
        finally:
            comm.close()
    if rank == 0 and args.ranks_per_node is not None:
        say("#")
        say(
            "# hierarchical / auto (flat) allreduce time, per size: "
            + ", ".join(
                f"{format_size(size)} {h['time_us'] / f['time_us']:.2f}"
                for size in args.sizes
                for f, h in [
                    [
                        next(
                            r
                            for r in rows
                            if r["op"] == "allreduce" and r["size_bytes"] == size and r.get("allreduce_kind") == kind
                        )
                        for kind in ("auto", "hierarchical")
                    ]
                ]
                if "allreduce" in args.ops
            )
        )

    total_wrong = sum(r["wrong"] for r in rows)
    worst = min_large_ratio(rows)
    if rank == 0:
        say("#")
        say(f"# #wrong total: {total_wrong}" + ("  OK" if total_wrong == 0 else "  FAILED"))
        if worst is not None:
            say(
                f"# allreduce busbw ratio native/mpi, min over sizes >= 1M: {worst['ratio']:.2f}"
                f" (at {format_size(worst['size_bytes'])})"
            )
        elif "allreduce" in args.ops:
            say("# allreduce busbw ratio native/mpi, min over sizes >= 1M: n/a (no such size)")
        if args.json is not None:
            write_json(
                args.json,
                {**header, "rows": rows, "min_allreduce_ratio_ge_1MiB": None if worst is None else worst["ratio"]},
            )
    return 1 if total_wrong else 0


def main(argv: list[str] | None = None) -> int:
    return worker_main("python -m harness.bench.collectives_worker", __doc__, add_arguments, run_worker, argv)


if __name__ == "__main__":
    sys.exit(main())
