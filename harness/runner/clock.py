"""One clock for every rank of a run: each rank's offset from rank 0's, and a common origin.

Ranks on different hosts read different ``CLOCK_MONOTONIC`` clocks (``time.monotonic()`` in
Python, ``harness::now()`` in the native layer): each counts from its own host's boot. Taking
``t0`` after a barrier on every rank lines their timelines up only as well as the ranks leave
the barrier together, and says nothing about how far apart the clocks were. Here instead:

- :meth:`Clock.synchronize` (collective) estimates every rank's offset from rank 0's clock by
  Cristian's method: rank r sends rank 0 a ping at ``t_send`` (its own clock), rank 0 answers
  with its time ``t_ref``, and the answer arrives at ``t_recv``; if both legs took equally
  long, rank 0 read ``t_ref`` at rank r's ``(t_send + t_recv) / 2``, so
  ``offset = (t_send + t_recv) / 2 - t_ref``, wrong by at most half the round trip
  ``t_recv - t_send`` whatever the legs took. Of :data:`EXCHANGES` exchanges the one with the
  smallest round trip is kept (the least disturbed by scheduling). The ranks take turns with
  rank 0, over a duplicate of the world communicator, so no other traffic mixes in.
- :meth:`Clock.origin` (collective, right after the barrier that starts an algorithm): rank 0's
  time then, expressed on this rank's clock (``origin + offset``). Used as ``t0``, every rank's
  relative times ``t - t0`` are times on rank 0's clock since one common instant, native
  operation records included (they are on the same ``CLOCK_MONOTONIC``).
- :meth:`Clock.remeasure` (collective) estimates the offsets again; the change since the
  start is the clocks' drift, which run.json records (:meth:`Clock.run_json`). It is not
  applied to the records: they are written after each algorithm, before a later estimate
  exists. The start's offsets serve the whole run, which leaves an error of ``drift_per_s``
  times the time since the start (a clock 1 ppm fast of rank 0's: 60 us per minute).

Ranks of one host share its clock, so their offsets agree up to the estimates' error; each
rank still uses its own, and run.json has both (per rank, and per host name the median).

The arithmetic is in plain functions (:func:`exchange_offsets`, :func:`best_exchange`,
:func:`host_offsets`, :func:`drift`), testable without MPI.
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from harness.comm.asleep import wait_asleep

REFERENCE = "rank 0's CLOCK_MONOTONIC"
EXCHANGES = 32  # per rank and estimate: a few ms in all on one host, tens of ms across a network
_TURN, _PING, _PONG = 7101, 7102, 7103  # tags, on the clock's own communicator


class Estimate(NamedTuple):
    """One rank's estimated offset from rank 0's clock (its clock minus rank 0's) and how good it is."""

    offset_s: float
    round_trip_s: float  # of the exchange kept; the offset is wrong by at most half of it
    ref_s: float  # rank 0's time in that exchange (when the estimate holds, on rank 0's clock)
    exchanges: int


def exchange_offsets(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Offset and round trip of each exchange; ``samples`` rows are ``(t_send, t_ref, t_recv)``,
    ``t_send``/``t_recv`` on this rank's clock, ``t_ref`` on rank 0's."""
    samples = np.asarray(samples, dtype=np.float64).reshape(-1, 3)
    t_send, t_ref, t_recv = samples[:, 0], samples[:, 1], samples[:, 2]
    return (t_send + t_recv) / 2 - t_ref, t_recv - t_send


def best_exchange(samples: np.ndarray) -> Estimate:
    """The estimate of the exchange with the smallest round trip (Cristian's method)."""
    samples = np.asarray(samples, dtype=np.float64).reshape(-1, 3)
    if len(samples) == 0:
        raise ValueError("no clock exchanges to estimate an offset from")
    offsets, trips = exchange_offsets(samples)
    if not np.all(np.isfinite(offsets)) or np.any(trips < 0):
        raise ValueError(f"clock exchanges must be finite with t_recv >= t_send, got {samples.tolist()}")
    i = int(np.argmin(trips))
    return Estimate(float(offsets[i]), float(trips[i]), float(samples[i, 1]), len(samples))


def host_offsets(rank_hosts: Sequence[str], offsets_s: Sequence[float]) -> dict[str, float]:
    """Per host name (in order of first rank), the median offset of its ranks."""
    by_host: dict[str, list[float]] = {}
    for host, offset in zip(rank_hosts, offsets_s, strict=True):
        by_host.setdefault(host, []).append(float(offset))
    return {host: float(statistics.median(values)) for host, values in by_host.items()}


def drift(start: Sequence[Estimate], end: Sequence[Estimate]) -> tuple[list[float], list[float]]:
    """Per rank, the change of its offset from ``start`` to ``end`` (s) and that change per
    second of rank 0's clock between the two estimates (0 where no time passed)."""
    drift_s = [e.offset_s - s.offset_s for s, e in zip(start, end, strict=True)]
    per_s = [d / (e.ref_s - s.ref_s) if e.ref_s > s.ref_s else 0.0 for d, s, e in zip(drift_s, start, end)]
    return drift_s, per_s


def _estimate(comm, exchanges: int) -> list[Estimate]:
    """Collective on ``comm``: every rank's estimate, in rank order, on every rank."""
    rank, size = comm.Get_rank(), comm.Get_size()
    # Waits asleep: a rank spinning while it waits its turn would take the CPU from the two ranks
    # whose exchange is being timed.
    wait_asleep(comm.Ibarrier())  # ranks arrive at different times: not in rank 0's Recv
    buf = np.zeros(1)
    mine = np.zeros(4)  # offset, round trip, ref time, exchanges
    if rank == 0:
        for peer in range(1, size):
            comm.Send(buf, dest=peer, tag=_TURN)
            for _ in range(exchanges):
                comm.Recv(buf, source=peer, tag=_PING)
                buf[0] = time.monotonic()
                comm.Send(buf, dest=peer, tag=_PONG)
        mine[:] = (0.0, 0.0, time.monotonic(), 0)
    else:
        wait_asleep(comm.Irecv(buf, source=0, tag=_TURN))
        samples = np.empty((exchanges, 3))
        for k in range(exchanges):  # blocking here: both sides are busy only for this exchange
            t_send = time.monotonic()
            comm.Send(buf, dest=0, tag=_PING)
            comm.Recv(buf, source=0, tag=_PONG)
            t_recv = time.monotonic()
            samples[k] = (t_send, buf[0], t_recv)
        mine[:] = best_exchange(samples)
    everyone = np.empty((size, 4))
    wait_asleep(comm.Iallgather(mine, everyone))  # rank 0 may still be serving later ranks
    return [Estimate(float(o), float(r), float(t), int(n)) for o, r, t, n in everyone]


class Clock:
    """This rank's part of the run's common clock (see the module docstring).

    ``offset_s``: this rank's clock minus rank 0's; ``start`` and ``end``: every rank's estimate
    at the start and at the latest :meth:`remeasure` (None before one); ``rank_hosts``: every
    rank's host name. Free its communicator with :meth:`close` (collective).
    """

    def __init__(self, comm, rank_hosts: list[str], start: list[Estimate], exchanges: int) -> None:
        self._comm = comm
        self.rank = comm.Get_rank()
        self.rank_hosts = rank_hosts
        self.start = start
        self.end: list[Estimate] | None = None
        self.exchanges = exchanges
        self.offset_s = start[self.rank].offset_s

    @classmethod
    def synchronize(cls, world, exchanges: int = EXCHANGES) -> Clock:
        """Collective on ``world``: estimate every rank's offset from rank 0's clock."""
        if exchanges < 1:
            raise ValueError(f"exchanges must be >= 1 (got {exchanges})")
        comm, request = world.Idup()  # its own context: no other message can match the clock's
        wait_asleep(request)
        rank_hosts = comm.allgather(socket.gethostname())
        return cls(comm, rank_hosts, _estimate(comm, exchanges), exchanges)

    def origin(self) -> float:
        """Collective, right after the barrier that starts an algorithm: rank 0's time now, on
        this rank's clock; as ``t0`` it makes every rank's ``t - t0`` rank 0's clock since then."""
        buf = np.array([time.monotonic() if self.rank == 0 else 0.0])
        self._comm.Bcast(buf, root=0)
        return float(buf[0]) + self.offset_s

    def remeasure(self) -> None:
        """Collective: estimate the offsets again (the end estimate; see :meth:`run_json`)."""
        self.end = _estimate(self._comm, self.exchanges)

    def close(self) -> None:
        """Collective: free the clock's communicator."""
        if self._comm is not None:
            self._comm.Free()
            self._comm = None

    def run_json(self) -> dict[str, Any]:
        """run.json's ``rank_hosts`` and ``clock`` (results/README.md documents them)."""
        offsets = [e.offset_s for e in self.start]
        clock: dict[str, Any] = {
            "reference": REFERENCE,
            "method": f"Cristian: {self.exchanges} ping-pong exchanges of each rank with rank 0 over MPI, the one "
            "with the smallest round trip kept; offset = midpoint of the rank's send and receive times "
            "minus rank 0's time in between",
            "offsets_s": offsets,
            "host_offsets_s": host_offsets(self.rank_hosts, offsets),
            "error_bound_s": [e.round_trip_s / 2 for e in self.start],
            "drift_s": None,
            "drift_per_s": None,
            "drift_span_s": None,
            "drift_corrected": False,
        }
        if self.end is not None:
            clock["drift_s"], clock["drift_per_s"] = drift(self.start, self.end)
            clock["drift_span_s"] = self.end[0].ref_s - self.start[0].ref_s
            clock["end_error_bound_s"] = [e.round_trip_s / 2 for e in self.end]
        return {"rank_hosts": list(self.rank_hosts), "clock": clock}
