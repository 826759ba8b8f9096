"""Native allreduce / broadcast / all-gather / reduce-scatter against mpi4py's, printed nccl-tests style.

Launched by ``python -m harness bench collectives``; this module is the worker every rank
runs. It can also be started directly under the venv's mpiexec::

    mpiexec -n 4 python -m harness.bench.collectives --sizes 4K,1M,16M --iters 20 --json bench.json

Per op and size (bytes; count = bytes / 4 float32 elements) the native op and MPI's
(``Allreduce`` with ``MPI.SUM`` / ``Bcast`` from rank 0 / ``Allgather`` / ``Reduce_scatter_block``
with ``MPI.SUM``) run on the same buffers: warm-up and
timed iterations of the native op, then the same for MPI's (each in its own loop, as
nccl-tests and the OSU benchmarks do; interleaving them lets one disturb the other's timing on
an oversubscribed machine). Each timed iteration is: refill the buffer, MPI barrier, t0, op, t1;
an iteration's time is the slowest rank's, and the reported time is the median over iterations. Iterations are cut for
sizes above 1 MiB (``iterations_for``) so a default run stays short on a small machine.

Correctness: every rank fills its input with seeded normal data; the native result of a check
run before warm-up and that of the last timed iteration are compared with MPI's result for the
same input (checking inside the timed loop would disturb the timings, see ``_timed``). An element is wrong when ``|native - mpi| > 1e-5 * ranks * scale``, where scale is
``sum over ranks of |x|`` for allreduce (the float error bound of a sum taken in another order,
which stays meaningful where the sum cancels to ~0) and ``|x_root|`` for broadcast. ``#wrong``
counts wrong elements over all ranks; the exit status is 1 when any is wrong.

JSON (``--json``, written by rank 0): the header fields (``ranks``, ``warmup``, ``iters``,
``sizes``, ``ops``, ``mpi_library``, ``comm_options``), ``rows`` with one entry per op and size
using ``ROW_FIELDS`` (times in microseconds, bandwidths in GB/s = 1e9 B/s) and
``min_allreduce_ratio_ge_1MiB``.

mpi4py and the native layer are imported inside ``run_worker`` only, so the parent command can
import this module (for its arguments and size parsing) without initializing MPI.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.arguments import argtype, int_at_least, split_list
from harness.bench.arguments import job_size_matches, say, worker_main
from harness.config import HarnessError
from harness.scenario.network_fields import TOPOLOGY_PRESETS, Topology

_PRESET_NAME = "ethernet_1g"  # the emulated nodes' defaults: a slow NIC, NVLink-class inside the node
_PRESET = TOPOLOGY_PRESETS[_PRESET_NAME]

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
DEFAULT_SIZES = "4K,64K,256K,1M,4M,16M"
DEFAULT_OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter")
DEFAULT_ITERS = 20
DEFAULT_WARMUP = 5
MAX_SIZE = GIB  # each rank holds several buffers of the size (input, result, MPI result, tolerance)
ITER_BUDGET_BYTES = 256 * MIB  # sizes above 1 MiB run about this many bytes of iterations...
MIN_LARGE_ITERS = 5  # ...but at least this many
RTOL = 1e-5
SEED = 1234
ROW_FIELDS = (
    "op", "size_bytes", "count", "iters", "warmup", "time_us", "algbw_gbs", "busbw_gbs", "wrong",
    "mpi_time_us", "mpi_busbw_gbs", "ratio",
)

_SUFFIX = {"": 1, "K": KIB, "M": MIB, "G": GIB}
_SIZE_RE = re.compile(r"(\d+)\s*(?:([KMG])I?)?B?", re.IGNORECASE)


class SizeError(HarnessError, ValueError):
    """A size argument that is not a positive whole number of float32 elements (a ValueError,
    which ``harness.arguments.argtype`` turns into the option's usage error)."""


def parse_bytes(text: str) -> int:
    """A byte count with an optional binary suffix: ``4096``, ``4K``, ``1M``, ``1G`` (``KB``, ``KiB`` too)."""
    match = _SIZE_RE.fullmatch(text.strip())
    if match is None:
        raise SizeError(f"bad size {text!r}: expected a byte count like 4096, 4K, 1M or 1G")
    return int(match.group(1)) * _SUFFIX[(match.group(2) or "").upper()]


def parse_size(text: str) -> int:
    """A benchmark buffer size in bytes: positive, a multiple of 4 (float32), at most 1G.

    >>> parse_size("64K")
    65536
    """
    size = parse_bytes(text)
    if size <= 0:
        raise SizeError(f"bad size {text!r}: must be positive")
    if size % 4:
        raise SizeError(f"bad size {text!r}: {size} bytes is not a whole number of float32 elements (4 bytes each)")
    if size > MAX_SIZE:
        raise SizeError(f"bad size {text!r}: at most 1G per buffer")
    return size


def parse_sizes(text: str) -> list[int]:
    """Comma-separated sizes (see ``parse_size``), ascending, duplicates dropped."""
    try:
        parts = split_list(text, "size", "4K,64K,1M")
    except ValueError as exc:
        raise SizeError(str(exc)) from None
    return sorted({parse_size(p) for p in parts})


def format_size(size: int) -> str:
    """The shortest exact spelling: 4K, 1M, 1536K, 100."""
    for suffix, unit in (("G", GIB), ("M", MIB), ("K", KIB)):
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def iterations_for(size: int, iters: int, warmup: int) -> tuple[int, int]:
    """(iters, warmup) for one size: as given up to 1 MiB, cut to ~ITER_BUDGET_BYTES above."""
    if size <= MIB:
        return iters, warmup
    return min(iters, max(MIN_LARGE_ITERS, ITER_BUDGET_BYTES // size)), min(warmup, 3)


# -- arguments (shared with harness.commands.bench) --------------------------------------------
def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise ValueError(f"must be >= 0 (got {text})")
    return value


def _positive_float(text: str) -> float:
    value = _nonnegative_float(text)
    if not value > 0:
        raise ValueError(f"must be > 0 (got {text})")
    return value


def parse_ops(text: str) -> list[str]:
    """Comma-separated op names out of ``OPS``, in the order given, duplicates dropped."""
    names = split_list(text, "op", "allreduce,broadcast,allgather,reduce_scatter")
    bad = [n for n in names if n not in OPS]
    if bad:
        raise ValueError(f"unknown op {bad[0]!r}: choose from {', '.join(OPS)}")
    return list(dict.fromkeys(names))


def add_arguments(parser: argparse.ArgumentParser, *, ranks_default: int | None = None) -> None:
    """The benchmark's options (the parent command and the worker take the same ones)."""
    parser.add_argument("--ranks", type=int_at_least(1), default=ranks_default,
                        help="number of ranks (default 4, or the size of the MPI job already running)")
    parser.add_argument("--sizes", type=argtype(parse_sizes), default=parse_sizes(DEFAULT_SIZES),
                        help=f"comma-separated buffer sizes in bytes, K/M/G = 2^10/2^20/2^30 (default {DEFAULT_SIZES})")
    parser.add_argument("--iters", type=int_at_least(1), default=DEFAULT_ITERS,
                        help=f"timed iterations per size (default {DEFAULT_ITERS}; fewer above 1M)")
    parser.add_argument("--warmup", type=int_at_least(0), default=DEFAULT_WARMUP,
                        help=f"untimed iterations before timing (default {DEFAULT_WARMUP}; at most 3 above 1M)")
    parser.add_argument("--ops", type=argtype(parse_ops), default=list(DEFAULT_OPS),
                        help=f"comma-separated ops: {', '.join(OPS)} (default {','.join(DEFAULT_OPS)})")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write all rows as JSON (rank 0)")
    nic, intra = _PRESET["nic"], _PRESET["intra"]
    topo = parser.add_argument_group(
        f"emulated nodes (flat and hierarchical side by side; no MPI baseline, which would not be emulated); "
        f"defaults: the {_PRESET_NAME} preset of network.topology")
    topo.add_argument("--ranks-per-node", type=int_at_least(1), metavar="K",
                      help="emulate nodes of K ranks (must divide the ranks) sharing one NIC each")
    topo.add_argument("--nic-gbps", type=argtype(_positive_float), default=nic["bandwidth_gbps"],
                      help=f"each node's NIC (default {nic['bandwidth_gbps']:g} Gb/s)")
    topo.add_argument("--nic-latency-us", type=argtype(_nonnegative_float), default=nic["latency_us"],
                      help=f"latency between nodes (default {nic['latency_us']:g} us)")
    topo.add_argument("--intra-gbps", type=argtype(_positive_float), default=intra["bandwidth_gbps"],
                      help=f"link between two ranks of a node (default {intra['bandwidth_gbps']:g} Gb/s)")
    comm = parser.add_argument_group("native communicator options (default: the Communicator's)")
    comm.add_argument("--spin-us", type=argtype(_nonnegative_float), help="progress thread spin before sleeping")
    comm.add_argument("--max-sleep-us", type=argtype(_nonnegative_float), help="longest progress thread sleep")
    comm.add_argument("--ring-threshold", type=argtype(parse_bytes), metavar="BYTES",
                      help="allreduces of at least this size use the ring algorithm")


def to_argv(args: argparse.Namespace, ranks: int) -> list[str]:
    """The worker's command-line arguments for parsed ``args``."""
    argv = ["--ranks", str(ranks), "--sizes", ",".join(map(str, args.sizes)), "--iters", str(args.iters),
            "--warmup", str(args.warmup), "--ops", ",".join(args.ops)]
    if args.json is not None:
        argv += ["--json", str(Path(args.json).absolute())]
    if args.ranks_per_node is not None:
        argv += ["--ranks-per-node", str(args.ranks_per_node), "--nic-gbps", str(args.nic_gbps),
                 "--nic-latency-us", str(args.nic_latency_us), "--intra-gbps", str(args.intra_gbps)]
    for flag, value in (("--spin-us", args.spin_us), ("--max-sleep-us", args.max_sleep_us),
                        ("--ring-threshold", args.ring_threshold)):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def comm_options(args: argparse.Namespace) -> dict[str, Any]:
    names = {"spin_us": args.spin_us, "max_sleep_us": args.max_sleep_us, "ring_threshold_bytes": args.ring_threshold}
    return {k: v for k, v in names.items() if v is not None}


# -- the ops ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    """One benchmarked collective.

    ``native(comm, buf)`` and ``mpi(world, inp, buf)`` leave the result in ``buf``; ``buf``
    holds a copy of ``inp`` on entry. ``bus_factor(n)`` turns algbw into busbw (nccl-tests).
    """

    native: Callable[[Any, np.ndarray], None]
    mpi: Callable[[Any, np.ndarray, np.ndarray], None]
    bus_factor: Callable[[int], float]
    scale: Callable[[Any, np.ndarray, np.ndarray], np.ndarray]  # (world, inp, expected) -> tolerance scale


def _mpi_allreduce(world: Any, inp: np.ndarray, buf: np.ndarray) -> None:
    from mpi4py import MPI  # noqa: PLC0415

    world.Allreduce(inp, buf, op=MPI.SUM)


def _abs_sum(world: Any, inp: np.ndarray, expected: np.ndarray) -> np.ndarray:
    from mpi4py import MPI  # noqa: PLC0415

    out = np.empty_like(inp)
    world.Allreduce(np.abs(inp), out, op=MPI.SUM)
    return out


OPS: dict[str, Op] = {
    "allreduce": Op(
        native=lambda comm, buf: comm.allreduce(buf, op="sum"),
        mpi=_mpi_allreduce,
        bus_factor=lambda n: 2 * (n - 1) / n,
        scale=_abs_sum,
    ),
    "broadcast": Op(
        native=lambda comm, buf: comm.broadcast(buf, root=0),
        mpi=lambda world, inp, buf: world.Bcast(buf, root=0),
        bus_factor=lambda n: 1.0,
        scale=lambda world, inp, expected: np.abs(expected),
    ),
    # The size is the whole buffer (nccl-tests' convention): all-gather's output, reduce-scatter's
    # input; each rank contributes / keeps one block of count // ranks elements (the buffer's
    # tail beyond ranks blocks is left alone). The native ops are those of a native group of
    # every rank (harness._core.Group, the torch.distributed backend's).
    "allgather": Op(
        native=lambda comm, buf: _native_allgather(comm, buf),
        mpi=lambda world, inp, buf: world.Allgather(_block(inp, world), buf[:_blocks(inp, world)]),
        bus_factor=lambda n: (n - 1) / n,
        scale=lambda world, inp, expected: np.abs(expected),
    ),
    "reduce_scatter": Op(
        native=lambda comm, buf: _native_reduce_scatter(comm, buf),
        mpi=lambda world, inp, buf: world.Reduce_scatter_block(inp[:_blocks(inp, world)],
                                                               buf[:_blocks(inp, world) // world.Get_size()]),
        bus_factor=lambda n: (n - 1) / n,
        scale=_abs_sum,
    ),
}

_F32 = 0  # harness._core's dtype code of float32 (kernels/dtype.hpp)
_SUM = 0  # and of SUM


def _blocks(buf: np.ndarray, world: Any) -> int:
    """Elements of ``buf`` in whole blocks, one per rank."""
    n = world.Get_size()
    return buf.size // n * n


def _block(buf: np.ndarray, world: Any) -> np.ndarray:
    """This rank's block of ``buf``."""
    k = buf.size // world.Get_size()
    return buf[world.Get_rank() * k:(world.Get_rank() + 1) * k]


def _group(comm: Any) -> Any:
    """The native group of every rank of ``comm`` (made, collectively, by ``run_worker``)."""
    return comm._bench_group


def _native_allgather(comm: Any, buf: np.ndarray) -> None:
    g = _group(comm)
    k = buf.size // g.size
    out = buf[:k * g.size]
    g.allgather(buf, out[g.rank * k:].ctypes.data, k, out.ctypes.data, out.size, _F32, 0).wait()


def _native_reduce_scatter(comm: Any, buf: np.ndarray) -> None:
    g = _group(comm)  # the input is copied when the op is posted, so the output may overlap it
    k = buf.size // g.size
    g.reduce_scatter(buf, buf.ctypes.data, k * g.size, buf.ctypes.data, k, _F32, _SUM, 0).wait()


_ABOUT = {"allreduce": ", sum", "broadcast": ", root 0", "allgather": ", size = the gathered buffer",
          "reduce_scatter": ", sum, size = the input"}


# -- measuring ----------------------------------------------------------------------------------
def _timed(world: Any, run: Callable[[], None], refill: Callable[[], None], iters: int, warmup: int) -> float:
    """Median over iterations of the slowest rank's time of ``run`` (seconds).

    Nothing but the refill runs between iterations: numpy work there (say, checking each
    result) was measured to slow the next op by up to 2-3x on a 2-core machine.
    """
    from mpi4py import MPI  # noqa: PLC0415

    times = np.zeros(iters)
    for i in range(-warmup, iters):
        refill()
        world.Barrier()
        t0 = time.perf_counter()
        run()
        t1 = time.perf_counter()
        if i >= 0:
            times[i] = t1 - t0
    world.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return statistics.median(times.tolist())


def measure(comm: Any, world: Any, name: str, size: int, iters: int, warmup: int,
            baseline: bool = True) -> dict[str, Any]:
    """One row: native and MPI timings of op ``name`` on ``size`` bytes, and the #wrong check
    (without ``baseline``, the MPI columns are NaN)."""
    from mpi4py import MPI  # noqa: PLC0415

    op, n, count = OPS[name], world.Get_size(), size // 4
    iters, warmup = iterations_for(size, iters, warmup)
    inp = np.random.default_rng([SEED, world.Get_rank(), size]).standard_normal(count, dtype=np.float32)
    buf, expected = np.empty_like(inp), np.empty_like(inp)

    np.copyto(expected, inp)
    op.mpi(world, inp, expected)
    tol = RTOL * n * op.scale(world, inp, expected)
    wrong = np.zeros(count, dtype=bool)

    def check() -> None:
        wrong[...] |= ~(np.abs(buf - expected) <= tol)  # NaN counts as wrong

    def refill() -> None:
        np.copyto(buf, inp)

    refill()
    op.native(comm, buf)
    check()
    native_s = _timed(world, lambda: op.native(comm, buf), refill, iters, warmup)
    check()  # the last timed iteration's result
    mpi_s = _timed(world, lambda: op.mpi(world, inp, buf), refill, iters, warmup) if baseline else None

    n_wrong = world.allreduce(int(np.count_nonzero(wrong)), op=MPI.SUM)
    algbw = size / native_s / 1e9
    row = {
        "op": name, "size_bytes": size, "count": count, "iters": iters, "warmup": warmup,
        "time_us": native_s * 1e6, "algbw_gbs": algbw, "busbw_gbs": algbw * op.bus_factor(n), "wrong": n_wrong,
        "mpi_time_us": None, "mpi_busbw_gbs": None, "ratio": None,
    }
    if mpi_s is not None:
        row.update(mpi_time_us=mpi_s * 1e6, mpi_busbw_gbs=size / mpi_s / 1e9 * op.bus_factor(n),
                   ratio=mpi_s / native_s)  # = native busbw / mpi busbw, defined at 1 rank too
    return row


# -- printing -----------------------------------------------------------------------------------
_COLUMNS = (  # (header, width, format of the row value)
    ("size(B)", 12, "{size_bytes:d}"), ("count(elems)", 13, "{count:d}"), ("time(us)", 10, "{time_us:.1f}"),
    ("algbw(GB/s)", 12, "{algbw_gbs:.2f}"), ("busbw(GB/s)", 12, "{busbw_gbs:.2f}"), ("#wrong", 7, "{wrong:d}"),
    ("mpi_time(us)", 14, "{mpi_time_us:.1f}"), ("mpi_busbw(GB/s)", 16, "{mpi_busbw_gbs:.2f}"),
    ("ratio", 7, "{ratio:.2f}"),
)


def table_header() -> str:
    return "#" + "".join(h.rjust(w) for h, w, _ in _COLUMNS)[1:]


def table_row(row: dict[str, Any]) -> str:
    """One printed row; a column without a value (no MPI baseline) shows '-'."""
    return "".join((f.format(**row) if row[f[1:f.index("}")].split(":")[0]] is not None else "-").rjust(w)
                   for _, w, f in _COLUMNS)


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
    from harness.scenario.network import NodeTopology  # noqa: PLC0415

    nodes = Topology(ranks_per_node=args.ranks_per_node,
                     nic={"latency_us": args.nic_latency_us, "bandwidth_gbps": args.nic_gbps},
                     intra={**_PRESET["intra"], "bandwidth_gbps": args.intra_gbps})
    return [(NodeTopology.of(nodes, ranks), kind) for kind in ("auto", "hierarchical")]


def describe(topology: Any, kind: str) -> str:
    if topology is None:
        return ""
    return (f", {kind} allreduce: {topology.nodes} nodes of {len(topology.node_of) // topology.nodes} ranks, NIC "
            f"{topology.nic_bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s {topology.nic_latency_s * 1e6:g} us, "
            f"intra-node {topology.intra_bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s")


# -- the worker ---------------------------------------------------------------------------------
def run_worker(args: argparse.Namespace) -> int:
    """Run the benchmark on this rank; rank 0 prints (and writes ``--json``). 0, or 1 if #wrong > 0."""
    from mpi4py import MPI  # noqa: PLC0415

    from harness.comm import Communicator  # noqa: PLC0415

    world = MPI.COMM_WORLD
    n, rank = world.Get_size(), world.Get_rank()
    if not job_size_matches(args, world):
        return 2
    library = " ".join(MPI.Get_library_version().splitlines()[0].split())
    header = {"benchmark": "collectives", "ranks": n, "warmup": args.warmup, "iters": args.iters,
              "sizes": args.sizes, "ops": args.ops, "mpi_library": library, "comm_options": comm_options(args),
              "emulated_nodes": None if args.ranks_per_node is None else {
                  "ranks_per_node": args.ranks_per_node, "nic_gbps": args.nic_gbps,
                  "nic_latency_us": args.nic_latency_us, "intra_gbps": args.intra_gbps}}
    cuts = {s: iterations_for(s, args.iters, args.warmup) for s in args.sizes}
    reduced = [f"{format_size(s)}: {i}+{w}" for s, (i, w) in cuts.items() if (i, w) != (args.iters, args.warmup)]
    if rank == 0:
        options = " ".join(f"{k}={v:g}" for k, v in header["comm_options"].items()) or "defaults"
        say(f"# collectives: {n} ranks, warmup {args.warmup}, iters {args.iters}"
             + (f" (iters+warmup cut for {', '.join(reduced)})" if reduced else "")
             + "; time = median over iters of the slowest rank")
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
                    say(f"# {name} (float32{_ABOUT[name]}){describe(topology, kind)}")
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
        say("# hierarchical / auto (flat) allreduce time, per size: " + ", ".join(
            f"{format_size(size)} {h['time_us'] / f['time_us']:.2f}"
            for size in args.sizes
            for f, h in [[next(r for r in rows if r["op"] == "allreduce" and r["size_bytes"] == size
                               and r.get("allreduce_kind") == kind) for kind in ("auto", "hierarchical")]]
            if "allreduce" in args.ops))

    total_wrong = sum(r["wrong"] for r in rows)
    worst = min_large_ratio(rows)
    if rank == 0:
        say("#")
        say(f"# #wrong total: {total_wrong}" + ("  OK" if total_wrong == 0 else "  FAILED"))
        if worst is not None:
            say(f"# allreduce busbw ratio native/mpi, min over sizes >= 1M: {worst['ratio']:.2f}"
                 f" (at {format_size(worst['size_bytes'])})")
        elif "allreduce" in args.ops:
            say("# allreduce busbw ratio native/mpi, min over sizes >= 1M: n/a (no such size)")
        if args.json is not None:
            from harness.results.atomic import write_json  # noqa: PLC0415  (pandas; rank 0 only)

            write_json(args.json, {**header, "rows": rows,
                                   "min_allreduce_ratio_ge_1MiB": None if worst is None else worst["ratio"]})
    return 1 if total_wrong else 0


def main(argv: list[str] | None = None) -> int:
    return worker_main("python -m harness.bench.collectives", __doc__, add_arguments, run_worker, argv)


if __name__ == "__main__":
    sys.exit(main())
