"""Native allreduce / broadcast / all-gather / reduce-scatter against mpi4py's, printed nccl-tests style.

``python -m harness bench collectives`` launches its worker (:mod:`harness.bench.collectives_worker`)
on ``--ranks`` ranks; this module is what the command and the worker share: the options, the
printed table and the emulated nodes. What is measured, and how, is :mod:`harness.bench.collective_ops`.

Per op and size the native op and MPI's run on the same buffers, each timed on its own, and
the native result is checked against MPI's (``#wrong``: wrong elements over all ranks); the exit
status is 1 when any is wrong.

**MPI at its best.** Run from a shell, the command first runs MPI's own collectives in two jobs
of their own, one at ``MPI_THREAD_SINGLE`` and one at ``MPI_THREAD_MULTIPLE`` (MPICH turns its
shared-memory collectives off under ``THREAD_MULTIPLE``, the level the native layer needs), each
warmed past MPICH's switch-over and with its buffers refilled between calls (its timed calls of
one op and size stop after about 5 s: oversubscribed, MPICH's ``THREAD_SINGLE`` waiters spin,
and a call can take milliseconds to seconds); then the native
job, which reads their times. ``ratio`` is MPI's faster mode over the native time (above 1: the
native layer is faster). Inside an MPI job already running (no jobs of its own to start), MPI
is measured in the native job's own processes, at ``THREAD_MULTIPLE`` only. ``floor`` is what a
``memcpy`` of the buffer costs on every rank at once, measured in the native job, and
``floor/time`` how close the native op comes to it.

JSON (``--json``, written by rank 0): the header fields (``ranks``, ``warmup``, ``iters``,
``sizes``, ``ops``, ``mpi_library``, ``mpi_modes``: the thread level each baseline job got,
``comm_options``), ``rows`` with one entry per op and size using ``ROW_FIELDS`` (times in
microseconds, bandwidths in GB/s = 1e9 B/s) and ``min_allreduce_ratio_ge_1MiB``.

Neither this module nor the worker imports mpi4py or the native layer before the worker runs,
so the parent command can import them without initializing MPI.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.arguments import argtype, choice_list, int_at_least, number_in
from harness.bench.collective_ops import OPS
from harness.bench.sizes import MIB, parse_bytes, parse_sizes
from harness.errors import HarnessError
from harness.scenario.network import NodeTopology
from harness.scenario.network_fields import TOPOLOGY_PRESETS, Topology

_PRESET_NAME = "ethernet_1g"  # the emulated nodes' defaults: a slow NIC, NVLink-class inside the node
_PRESET = TOPOLOGY_PRESETS[_PRESET_NAME]

DEFAULT_SIZES = "4K,64K,256K,1M,4M,16M"
DEFAULT_OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter")
DEFAULT_ITERS = 20
DEFAULT_WARMUP = 5
ROW_FIELDS = (
    "op",
    "size_bytes",
    "count",
    "iters",
    "warmup",
    "time_us",
    "algbw_gbs",
    "busbw_gbs",
    "wrong",
    "mpi_time_us",  # MPI at its best: the faster of the two modes below
    "mpi_busbw_gbs",
    "ratio",  # mpi_time_us / time_us: native against MPI at its best
    "mpi_single_time_us",  # MPI_THREAD_SINGLE, in a job of its own
    "mpi_multiple_time_us",  # MPI_THREAD_MULTIPLE, in a job of its own (or in the native job's processes)
    "floor_time_us",  # a memcpy of the buffer on every rank at once
    "floor_ratio",  # floor_time_us / time_us
)
MPI_MODES = ("single", "multiple")


# -- arguments (the command's and the worker's) ------------------------------------------------
_ops_list = choice_list("op", tuple(OPS), "allreduce,broadcast,allgather,reduce_scatter")


def add_arguments(parser: argparse.ArgumentParser, *, ranks_default: int | None = None) -> None:
    """The benchmark's options (the parent command and the worker take the same ones)."""
    parser.add_argument(
        "--ranks",
        type=int_at_least(1),
        default=ranks_default,
        help="number of ranks (default 4, or the size of the MPI job already running)",
    )
    parser.add_argument(
        "--sizes",
        type=argtype(parse_sizes),
        default=parse_sizes(DEFAULT_SIZES),
        help=f"comma-separated buffer sizes in bytes, K/M/G = 2^10/2^20/2^30 (default {DEFAULT_SIZES})",
    )
    parser.add_argument(
        "--iters",
        type=int_at_least(1),
        default=DEFAULT_ITERS,
        help=f"timed iterations per size (default {DEFAULT_ITERS}; fewer above 1M)",
    )
    parser.add_argument(
        "--warmup",
        type=int_at_least(0),
        default=DEFAULT_WARMUP,
        help=f"untimed iterations before timing (default {DEFAULT_WARMUP}; at most 3 above 1M)",
    )
    parser.add_argument(
        "--ops",
        type=_ops_list,
        default=list(DEFAULT_OPS),
        help=f"comma-separated ops: {', '.join(OPS)} (default {','.join(DEFAULT_OPS)})",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write all rows as JSON (rank 0)")
    # Between the command and its jobs: a job measuring MPI alone at one thread level writes
    # its times (--mpi-baseline MODE --rows FILE); the native job reads them (--baselines).
    parser.add_argument("--mpi-baseline", choices=MPI_MODES, help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--baselines", type=Path, nargs="*", default=[], help=argparse.SUPPRESS)
    nic, intra = _PRESET["nic"], _PRESET["intra"]
    topo = parser.add_argument_group(
        f"emulated nodes (flat and hierarchical side by side; no MPI baseline, which would not be emulated); "
        f"defaults: the {_PRESET_NAME} preset of network.topology"
    )
    topo.add_argument(
        "--ranks-per-node",
        type=int_at_least(1),
        metavar="K",
        help="emulate nodes of K ranks (must divide the ranks) sharing one NIC each",
    )
    topo.add_argument(
        "--nic-gbps",
        type=number_in(0, above=True),
        default=nic["bandwidth_gbps"],
        help=f"each node's NIC (default {nic['bandwidth_gbps']:g} Gb/s)",
    )
    topo.add_argument(
        "--nic-latency-us",
        type=number_in(0),
        default=nic["latency_us"],
        help=f"latency between nodes (default {nic['latency_us']:g} us)",
    )
    topo.add_argument(
        "--intra-gbps",
        type=number_in(0, above=True),
        default=intra["bandwidth_gbps"],
        help=f"link between two ranks of a node (default {intra['bandwidth_gbps']:g} Gb/s)",
    )
    comm = parser.add_argument_group("native communicator options (default: the Communicator's)")
    comm.add_argument("--spin-us", type=number_in(0), help="progress thread spin before sleeping")
    comm.add_argument("--max-sleep-us", type=number_in(0), help="longest progress thread sleep")
    comm.add_argument(
        "--ring-threshold",
        type=argtype(parse_bytes),
        metavar="BYTES",
        help="allreduces of at least this size use the ring algorithm",
    )


def to_argv(args: argparse.Namespace, ranks: int) -> list[str]:
    """The worker's command-line arguments for parsed ``args``."""
    argv = [
        "--ranks",
        str(ranks),
        "--sizes",
        ",".join(map(str, args.sizes)),
        "--iters",
        str(args.iters),
        "--warmup",
        str(args.warmup),
        "--ops",
        ",".join(args.ops),
    ]
    if args.json is not None:
        argv += ["--json", str(Path(args.json).absolute())]
    if args.mpi_baseline is not None:
        argv += ["--mpi-baseline", args.mpi_baseline, "--rows", str(Path(args.rows).absolute())]
    if args.baselines:
        argv += ["--baselines", *(str(Path(b).absolute()) for b in args.baselines)]
    if args.ranks_per_node is not None:
        argv += [
            "--ranks-per-node",
            str(args.ranks_per_node),
            "--nic-gbps",
            str(args.nic_gbps),
            "--nic-latency-us",
            str(args.nic_latency_us),
            "--intra-gbps",
            str(args.intra_gbps),
        ]
    for flag, value in (
        ("--spin-us", args.spin_us),
        ("--max-sleep-us", args.max_sleep_us),
        ("--ring-threshold", args.ring_threshold),
    ):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def comm_options(args: argparse.Namespace) -> dict[str, Any]:
    names = {"spin_us": args.spin_us, "max_sleep_us": args.max_sleep_us, "ring_threshold_bytes": args.ring_threshold}
    return {k: v for k, v in names.items() if v is not None}


# -- printing -----------------------------------------------------------------------------------
_COLUMNS = (  # (header, width, format of the row value)
    ("size(B)", 12, "{size_bytes:d}"),
    ("count(elems)", 13, "{count:d}"),
    ("time(us)", 10, "{time_us:.1f}"),
    ("algbw(GB/s)", 12, "{algbw_gbs:.2f}"),
    ("busbw(GB/s)", 12, "{busbw_gbs:.2f}"),
    ("#wrong", 7, "{wrong:d}"),
    ("mpi_single(us)", 15, "{mpi_single_time_us:.1f}"),
    ("mpi_multi(us)", 14, "{mpi_multiple_time_us:.1f}"),
    ("mpi_busbw(GB/s)", 16, "{mpi_busbw_gbs:.2f}"),
    ("ratio", 7, "{ratio:.2f}"),
    ("floor(us)", 10, "{floor_time_us:.1f}"),
    ("floor/time", 11, "{floor_ratio:.2f}"),
)


def table_header() -> str:
    return "#" + "".join(h.rjust(w) for h, w, _ in _COLUMNS)[1:]


def table_row(row: dict[str, Any]) -> str:
    """One printed row; a column without a value (no MPI baseline) shows '-'."""
    return "".join(
        (f.format(**row) if row[f[1 : f.index("}")].split(":")[0]] is not None else "-").rjust(w)
        for _, w, f in _COLUMNS
    )


def min_large_ratio(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The allreduce row with the smallest ratio among sizes >= 1 MiB (None: no such row)."""
    large = [r for r in rows if r["op"] == "allreduce" and r["size_bytes"] >= MIB and r["ratio"] is not None]
    return min(large, key=lambda r: r["ratio"]) if large else None


# -- emulated nodes ----------------------------------------------------------------------------
def topologies(args: argparse.Namespace, ranks: int) -> list[tuple[Any, str]]:
    """[(None, "auto")] (no emulation), or the nodes of ``--ranks-per-node`` with the ``auto``
    (flat: ring or recursive doubling) and the ``hierarchical`` allreduce."""
    if args.ranks_per_node is None:
        return [(None, "auto")]
    if ranks % args.ranks_per_node:
        raise HarnessError(f"--ranks-per-node {args.ranks_per_node} must divide the ranks ({ranks})")
    nodes = Topology.model_validate(
        {
            "ranks_per_node": args.ranks_per_node,
            "nic": {"latency_us": args.nic_latency_us, "bandwidth_gbps": args.nic_gbps},
            "intra": {**_PRESET["intra"], "bandwidth_gbps": args.intra_gbps},
        }
    )
    return [(NodeTopology.of(nodes, ranks), kind) for kind in ("auto", "hierarchical")]


def describe(topology: Any, kind: str) -> str:
    if topology is None:
        return ""
    return (
        f", {kind} allreduce: {topology.nodes} nodes of {len(topology.node_of) // topology.nodes} ranks, NIC "
        f"{topology.nic_bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s {topology.nic_latency_s * 1e6:g} us, "
        f"intra-node {topology.intra_bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s"
    )
