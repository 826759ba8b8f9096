"""The collectives ``bench collectives`` measures, and how it measures one of them on one size.

Per op and size (bytes; count = bytes / 4 float32 elements) the native op and MPI's
(``Allreduce`` with ``MPI.SUM`` / ``Bcast`` from rank 0 / ``Allgather`` / ``Reduce_scatter_block``
with ``MPI.SUM``) run on the same buffers: warm-up and timed iterations of the native op, then
the same for MPI's (each in its own loop, as nccl-tests and the OSU benchmarks do; interleaving
them lets one disturb the other's timing on an oversubscribed machine). Each timed iteration
is: refill the buffer, MPI barrier, t0, op, t1; an iteration's time is the slowest rank's, and
the reported time is the median over iterations. Iterations are cut for sizes above 1 MiB
(``iterations_for``) so a default run stays short on a small machine.

Correctness: every rank fills its input with seeded normal data; the native result of a check
run before warm-up and that of the last timed iteration are compared with MPI's result for the
same input (checking inside the timed loop would disturb the timings, see ``_timed``). An
element is wrong when ``|native - mpi| > 1e-5 * ranks * scale``, where scale is ``sum over
ranks of |x|`` for allreduce (the float error bound of a sum taken in another order, which
stays meaningful where the sum cancels to ~0) and ``|x_root|`` for broadcast. ``#wrong`` counts
wrong elements over all ranks.

mpi4py is imported inside the functions that run on the ranks only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.bench.sizes import MIB
from harness.mpi_library import import_mpi

ITER_BUDGET_BYTES = 256 * MIB  # sizes above 1 MiB run about this many bytes of iterations...
MIN_LARGE_ITERS = 5  # ...but at least this many
RTOL = 1e-5
SEED = 1234
MPI_WARMUP = 10  # untimed MPI calls at least (MPICH's shared-memory collectives start after a few)
BASELINE_BUDGET_S = 5.0  # a baseline job's timed iterations of one op and size stop after about this long...
MIN_BUDGET_ITERS = 3  # ...once at least this many are done


def iterations_for(size: int, iters: int, warmup: int) -> tuple[int, int]:
    """(iters, warmup) for one size: as given up to 1 MiB, cut to ~ITER_BUDGET_BYTES above."""
    if size <= MIB:
        return iters, warmup
    return min(iters, max(MIN_LARGE_ITERS, ITER_BUDGET_BYTES // size)), min(warmup, 3)


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
    MPI = import_mpi()  # initializes MPI: on the ranks only

    world.Allreduce(inp, buf, op=MPI.SUM)


def _abs_sum(world: Any, inp: np.ndarray, expected: np.ndarray) -> np.ndarray:
    MPI = import_mpi()  # initializes MPI: on the ranks only

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
        mpi=lambda world, inp, buf: world.Allgather(_block(inp, world), buf[: _blocks(inp, world)]),
        bus_factor=lambda n: (n - 1) / n,
        scale=lambda world, inp, expected: np.abs(expected),
    ),
    "reduce_scatter": Op(
        native=lambda comm, buf: _native_reduce_scatter(comm, buf),
        mpi=lambda world, inp, buf: world.Reduce_scatter_block(
            inp[: _blocks(inp, world)], buf[: _blocks(inp, world) // world.Get_size()]
        ),
        bus_factor=lambda n: (n - 1) / n,
        scale=_abs_sum,
    ),
}


def _blocks(buf: np.ndarray, world: Any) -> int:
    """Elements of ``buf`` in whole blocks, one per rank."""
    n = world.Get_size()
    return buf.size // n * n


def _block(buf: np.ndarray, world: Any) -> np.ndarray:
    """This rank's block of ``buf``."""
    k = buf.size // world.Get_size()
    return buf[world.Get_rank() * k : (world.Get_rank() + 1) * k]


def _group(comm: Any) -> Any:
    """The native group of every rank of ``comm`` (made, collectively, by ``run_worker``)."""
    return comm._bench_group


def _native_allgather(comm: Any, buf: np.ndarray) -> None:
    _prepared(comm, buf, "allgather")()


def _native_reduce_scatter(comm: Any, buf: np.ndarray) -> None:
    _prepared(comm, buf, "reduce_scatter")()


# The group calls' arguments per buffer, made once: numpy's ``.ctypes.data`` costs about a
# microsecond each time, which a 4 KiB call's timing would charge to the native layer. Keyed by
# the buffer's id and held with it (an id is not reused while the buffer lives).
_CALLS: dict[tuple[str, int], tuple[np.ndarray, Any]] = {}


def _prepared(comm: Any, buf: np.ndarray, name: str) -> Any:
    key = (name, id(buf))
    held = _CALLS.get(key)
    if held is None or held[0] is not buf:
        _CALLS.clear()  # one buffer per size at a time: keep nothing of the last size
        held = _CALLS[key] = (buf, _group_call(comm, buf, name))
    return held[1]


def _group_call(comm: Any, buf: np.ndarray, name: str) -> Any:
    """The blocking group call of op ``name`` on ``buf``, its arguments made."""
    from harness._core import DType, ReduceOp  # noqa: PLC0415  (the native layer: on the ranks only)

    g = _group(comm)
    k = buf.size // g.size
    base = buf.ctypes.data
    f32, total = DType.float32, ReduceOp.SUM
    # Every argument positional: pybind11 takes about 0.4 us more per call to match a keyword
    # (block=True). wait(): done at once on the shared-memory path, posted on the message path.
    if name == "allgather":
        mine = base + g.rank * k * buf.itemsize
        return lambda: g.allgather(buf, mine, k, base, k * g.size, f32, -1, True).wait()
    # the output may overlap the input: each part of it is written after the input it covers was read
    return lambda: g.reduce_scatter(buf, base, k * g.size, base, k, f32, total, -1, True).wait()


ABOUT = {  # what the worker's table headers add to an op's name
    "allreduce": ", sum",
    "broadcast": ", root 0",
    "allgather": ", size = the gathered buffer",
    "reduce_scatter": ", sum, size = the input",
}


# -- measuring ----------------------------------------------------------------------------------
def _timed(
    world: Any,
    run: Callable[[], None],
    refill: Callable[[], None],
    iters: int,
    warmup: int,
    budget_s: float | None = None,
) -> float:
    """Median over iterations of the slowest rank's time of ``run`` (seconds).

    Nothing but the refill runs between iterations: numpy work there (say, checking each
    result) was measured to slow the next op by up to 2-3x on a 2-core machine. With
    ``budget_s``, the timed iterations stop (all ranks alike: rank 0 decides) once they have
    taken that long and at least ``MIN_BUDGET_ITERS`` are done: a baseline whose waiters spin on
    an oversubscribed machine takes milliseconds to seconds a call.
    """
    MPI = import_mpi()  # initializes MPI: on the ranks only

    times = np.zeros(iters)
    done, started = iters, time.perf_counter()
    for i in range(-warmup, iters):
        if budget_s is not None and i >= MIN_BUDGET_ITERS:
            over = world.rank == 0 and time.perf_counter() - started > budget_s
            if world.bcast(over, root=0):
                done = i
                break
        refill()
        world.Barrier()
        t0 = time.perf_counter()
        run()
        t1 = time.perf_counter()
        if i >= 0:
            times[i] = t1 - t0
    times = times[:done]
    world.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return statistics.median(times.tolist())


def _input(world: Any, size: int) -> np.ndarray:
    """This rank's seeded input of ``size`` bytes (float32)."""
    return np.random.default_rng([SEED, world.Get_rank(), size]).standard_normal(size // 4, dtype=np.float32)


def measure_mpi(world: Any, name: str, size: int, iters: int, warmup: int) -> float:
    """MPI's own time of op ``name`` on ``size`` bytes (seconds, median of the slowest rank), in
    this process at whatever thread level MPI was initialized with. At least ``MPI_WARMUP``
    untimed calls first: MPICH switches its shared-memory collectives on after a few calls of
    a collective on a communicator, and the baseline is MPI at its best. Its timed iterations
    stop after ``BASELINE_BUDGET_S`` (at least ``MIN_BUDGET_ITERS`` of them)."""
    op = OPS[name]
    iters, warmup = iterations_for(size, iters, warmup)
    inp = _input(world, size)
    buf = np.empty_like(inp)
    return _timed(
        world,
        lambda: op.mpi(world, inp, buf),
        lambda: np.copyto(buf, inp),
        iters,
        max(warmup, MPI_WARMUP),
        BASELINE_BUDGET_S,
    )


def measure_floor(world: Any, size: int, iters: int, warmup: int) -> float:
    """What a ``memcpy`` of ``size`` bytes costs on every rank at once (seconds, timed as the
    ops are): the floor under a collective that leaves ``size`` bytes in each rank's buffer."""
    iters, warmup = iterations_for(size, iters, warmup)
    src = _input(world, size)
    dst = np.empty_like(src)
    return _timed(world, lambda: np.copyto(dst, src), lambda: None, iters, warmup)


def measure(
    comm: Any, world: Any, name: str, size: int, iters: int, warmup: int, baseline: bool = True
) -> dict[str, Any]:
    """One row: native and MPI timings of op ``name`` on ``size`` bytes, and the #wrong check
    (without ``baseline``, the MPI columns are NaN). MPI runs in this process, at the native
    layer's ``MPI_THREAD_MULTIPLE``; the command adds MPI at its best from jobs of its own
    (``merge_baselines``)."""
    MPI = import_mpi()  # initializes MPI: on the ranks only

    op, n, count = OPS[name], world.Get_size(), size // 4
    iters, warmup = iterations_for(size, iters, warmup)
    inp = _input(world, size)
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
    mpi_s = _timed(world, lambda: op.mpi(world, inp, buf), refill, iters, max(warmup, MPI_WARMUP)) if baseline else None
    floor_s = measure_floor(world, size, iters, warmup)

    n_wrong = world.allreduce(int(np.count_nonzero(wrong)), op=MPI.SUM)
    algbw = size / native_s / 1e9
    row = {
        "op": name,
        "size_bytes": size,
        "count": count,
        "iters": iters,
        "warmup": warmup,
        "time_us": native_s * 1e6,
        "algbw_gbs": algbw,
        "busbw_gbs": algbw * op.bus_factor(n),
        "wrong": n_wrong,
        "mpi_time_us": None,
        "mpi_busbw_gbs": None,
        "ratio": None,
        "mpi_single_time_us": None,
        "mpi_multiple_time_us": None if mpi_s is None else mpi_s * 1e6,
        "floor_time_us": floor_s * 1e6,
        "floor_ratio": floor_s / native_s,
    }
    set_best_mpi(row, n)
    return row


def set_best_mpi(row: dict[str, Any], ranks: int) -> None:
    """``mpi_time_us``, ``mpi_busbw_gbs`` and ``ratio`` of ``row`` from the faster MPI mode
    measured (None where neither was)."""
    times = [t for t in (row["mpi_single_time_us"], row["mpi_multiple_time_us"]) if t is not None]
    if not times:
        return
    best = min(times)
    row.update(
        mpi_time_us=best,
        mpi_busbw_gbs=row["size_bytes"] / (best * 1e-6) / 1e9 * OPS[row["op"]].bus_factor(ranks),
        ratio=best / row["time_us"],  # = native busbw / mpi busbw, defined at 1 rank too
    )
