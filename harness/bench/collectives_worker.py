"""The MPI worker of ``bench collectives``, which every rank of its job runs.

``python -m harness bench collectives`` launches it; it can also be started directly under the
venv's mpiexec::

    mpiexec -n 4 python -m harness.bench.collectives_worker --sizes 4K,1M,16M --iters 20 --json bench.json

Rank 0 prints the tables (and writes ``--json``); the exit status is 1 when any element was
wrong. mpi4py and the native layer are imported inside ``run_worker`` only.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from harness.bench.arguments import say, worker_main
from harness.bench.collective_ops import ABOUT, iterations_for, measure
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
from harness.results.atomic import write_json


def worker_argv(args: argparse.Namespace, ranks: int) -> list[str]:
    """The whole command each rank runs: ``run_ranks(ranks, worker_argv(args, ranks))``."""
    return worker_command("harness.bench.collectives_worker", to_argv(args, ranks))


@on_world
def run_worker(args: argparse.Namespace, world: Any) -> int:
    """Run the benchmark on this rank; rank 0 prints (and writes ``--json``). 0, or 1 if #wrong > 0."""
    from mpi4py import MPI  # noqa: PLC0415  (initializes MPI: on the ranks only)

    from harness.comm import Communicator  # noqa: PLC0415  (loads MPI and the native layer: ranks only)

    n, rank = world.Get_size(), world.Get_rank()
    library = " ".join(MPI.Get_library_version().splitlines()[0].split())
    header = {
        "benchmark": "collectives",
        "ranks": n,
        "warmup": args.warmup,
        "iters": args.iters,
        "sizes": args.sizes,
        "ops": args.ops,
        "mpi_library": library,
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
        say(f"# native: harness.comm.Communicator ({options}); baseline: mpi4py {library}")

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
                    row = measure(comm, world, name, size, args.iters, args.warmup, baseline=topology is None)
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
