"""Communicator: the thin Python face of the native collective layer (``harness._core``).

Every operation exists blocking (``allreduce``) and non-blocking (``iallreduce`` returning a
handle with ``wait()`` / ``done()``). All traffic is carried by one progress thread per
process, owned by the native layer; blocked callers release the GIL and sleep.

Example (run under ``mpiexec -n 4``)::

    from mpi4py import MPI
    import numpy as np
    from harness.comm import Communicator

    with Communicator(MPI.COMM_WORLD) as comm:
        x = np.ones(1000, dtype=np.float32)
        comm.allreduce(x, op="mean")
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from harness import _core
from harness._core import CommError
from harness.comm.buffers import as_float32_buffer
from harness.comm.op_record import OpRecord
from harness.comm.shm import warn_shm_fallback
from harness.emulated_link import EmulatedLink
from harness.mpi_library import import_mpi
from harness.schedules import RING_THRESHOLD_BYTES, TREE_CHUNK_BYTES, checked_quorum

import_mpi()  # mpi4py on the native layer's own MPI library, checked; MPI starts here, as it always has

if TYPE_CHECKING:
    from harness.scenario.network import NodeTopology
    from harness.scenario.schema import Scenario

_live: weakref.WeakSet[Communicator] = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    # Runs before mpi4py finalizes MPI (atexit is LIFO and mpi4py registered first), so no
    # progress thread is left inside MPI at interpreter exit.
    for comm in list(_live):
        comm.close()


class Communicator:
    """Collectives, gossip and the wait-avoiding allreduce over an mpi4py communicator.

    Args:
        mpi_comm: an ``mpi4py.MPI.Comm`` (default ``COMM_WORLD``); it is duplicated, so the
            layer's messages never mix with the caller's.
        spin_us: how long the progress thread keeps polling (yielding the core) after
            progress before it sleeps. 500 us keeps a ring allreduce's steps back to back:
            with 50 us, 1 MiB allreduces on 4 oversubscribed ranks ran at 0.5-1.1x MPI's
            bandwidth, with 500 us at 1.1-1.2x (``python -m harness bench collectives``).
        max_sleep_us: longest sleep between polls while an operation waits for remote data.
        ring_threshold_bytes: allreduces of at least this many bytes use the ring algorithm,
            smaller ones recursive doubling.
        tree_chunk_bytes: the ``tree`` allreduce (``network.allreduce: tree``) pipelines its
            buffer in chunks of about this many bytes.
    """

    def __init__(
        self,
        mpi_comm: Any = None,
        *,
        spin_us: float = 500.0,
        max_sleep_us: float = 200.0,
        ring_threshold_bytes: int = RING_THRESHOLD_BYTES,
        tree_chunk_bytes: int = TREE_CHUNK_BYTES,
    ) -> None:
        MPI = import_mpi()  # keeps import of this module cheap

        mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        if mpi_comm == MPI.COMM_NULL:
            raise CommError("cannot build a Communicator on MPI.COMM_NULL")
        self._native = _core.Comm(
            MPI._handleof(mpi_comm),
            spin_us=spin_us,
            max_sleep_us=max_sleep_us,
            ring_threshold_bytes=ring_threshold_bytes,
            tree_chunk_bytes=tree_chunk_bytes,
        )
        warn_shm_fallback(self._native.shm_fallback_reason)
        # The blocking allreduce and broadcast are the native methods themselves: no Python frame
        # on the way (the cheap op: at one rank a call costs what an mpi4py call does). They take
        # numpy arrays and CPU torch tensors alike (harness.comm.buffers); the methods below
        # document them and do the same for a caller that goes through the class.
        self.allreduce = self._native.allreduce  # type: ignore[method-assign]
        self.broadcast = self._native.broadcast  # type: ignore[method-assign]
        _live.add(self)

    # -- identity ---------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._native.rank

    @property
    def size(self) -> int:
        return self._native.size

    @property
    def closed(self) -> bool:
        return self._native.closed

    # -- collectives ------------------------------------------------------------------------
    def iallreduce(self, buf: Any, op: str = "sum") -> _core.Handle:
        """Start an in-place allreduce (``op``: ``"sum"`` or ``"mean"``) of a float32 buffer."""
        return self._native.iallreduce(as_float32_buffer(buf, "allreduce buffer"), op)

    def allreduce(self, buf: Any, op: str = "sum") -> None:
        """The blocking allreduce: in this thread where the ranks share a host and nothing between
        them is emulated (the shared-memory path), else posted and waited for."""
        self._native.allreduce(buf, op)  # the instance's own attribute: see __init__

    def ibroadcast(self, buf: Any, root: int = 0) -> _core.Handle:
        """Start an in-place broadcast of ``buf`` from member ``root``."""
        return self._native.ibroadcast(as_float32_buffer(buf, "broadcast buffer"), root)

    def broadcast(self, buf: Any, root: int = 0) -> None:
        self._native.broadcast(buf, root)  # the instance's own attribute: see __init__

    def ibarrier(self) -> _core.Handle:
        return self._native.ibarrier()

    def barrier(self) -> None:
        self._native.barrier()

    # -- point to point ---------------------------------------------------------------------
    def iexchange(self, send: Any, recv: Any, peer: int) -> _core.Handle:
        """Start a symmetric exchange: ``send`` goes to ``peer``, ``peer``'s buffer lands in ``recv``.

        Both sides must call it (pairwise gossip); exchanges between the same two ranks are
        matched in the order they are posted.
        """
        return self._native.iexchange(
            as_float32_buffer(send, "exchange send buffer"), as_float32_buffer(recv, "exchange receive buffer"), peer
        )

    def exchange(self, send: Any, recv: Any, peer: int) -> None:
        self.iexchange(send, recv, peer).wait()

    # -- persistent operations ----------------------------------------------------------------
    def push_channel(self, count: int) -> PushChannel:
        """A push-sum gossip channel for buffers of ``count`` floats (collective)."""
        return PushChannel(self._native.push_channel(int(count)))

    def wait_avoiding(
        self,
        initial: Any,
        *,
        phases: Sequence[Sequence[int]],
        sync_every: int,
        accumulate: bool = False,
        quorum: int = 1,
    ) -> WaitAvoidingAllreduce:
        """The externally triggerable group allreduce of WAGMA-SGD / eager-SGD (collective).

        Args:
            initial: the buffer published before round 0 (its length fixes the op's length).
            phases: this rank's group (world ranks, itself included) per phase; round t uses
                ``phases[t % len(phases)]`` (see ``harness.schedules.wagma_phases``).
            sync_every: round t is a synchronous allreduce over all ranks when
                ``t % sync_every == sync_every - 1`` (0: never).
            accumulate: eager-SGD semantics: publishing adds to the send buffer and a
                contribution takes the buffer and zeroes it. Default (WAGMA): publishing
                overwrites and contributions leave the buffer as it is.
            quorum: how many callers must arrive at a (non-synchronous) round to activate it,
                in ``[1, size]``, the same on every rank. 1 (default): the first caller that
                ``may_activate`` activates it. More: every caller that arrives at a round its
                rank has not joined yet sends an "arrived" notice to every rank; each rank's
                progress thread joins the round (and every earlier one) once it has counted
                ``quorum`` arrivals, so the first ``quorum`` arrivals contribute fresh buffers
                and the others what their buffer holds; ``may_activate`` is then ignored.
                ``quorum=size`` waits for every rank (a plain allreduce per round).

        Raises:
            ValueError: ``quorum`` is not an int in ``[1, size]``.
        """
        q = checked_quorum(quorum, self.size)
        return WaitAvoidingAllreduce(
            self._native.wait_avoiding(
                as_float32_buffer(initial, "initial buffer"),
                int(sync_every),
                bool(accumulate),
                [[int(r) for r in g] for g in phases],
                q,
            )
        )

    def pairwise_averager(self, initial: Any) -> PairwiseAverager:
        """AD-PSGD's asynchronous pairwise averaging, answered by passive ranks' progress threads
        (collective)."""
        return PairwiseAverager(self._native.pairwise_averager(as_float32_buffer(initial, "initial model")))

    # -- emulation and records ---------------------------------------------------------------
    def set_links(self, links: Iterable[EmulatedLink]) -> None:
        """Emulate slow links: messages this rank sends to ``dst`` obey ``links`` with ``src == rank``.

        A message of b bytes is handed to MPI no earlier than latency + b / bandwidth after its
        link is free; a link carries one message after another. Replaces earlier settings.
        Every rank passes the same ``links`` (the whole job's): collectives among ranks that an
        emulated link joins leave the shared-memory path for the messages the links delay.
        """
        table, pairs = [], []
        for link in links:
            bw = float("inf") if link.bandwidth_bytes_per_s is None else float(link.bandwidth_bytes_per_s)
            if link.latency_s > 0 or bw < float("inf"):
                pairs.append((int(link.src), int(link.dst)))  # every rank knows every emulated link
            if link.src == self.rank:
                table.append((int(link.dst), float(link.latency_s), bw))
        self._native.set_links(table, pairs)

    def set_topology(self, topology: NodeTopology | None) -> None:
        """Emulate nodes that share NICs (collective: every rank calls it with the same topology).

        Messages between nodes queue on the source node's NIC, the fabric and the destination
        node's NIC, shared by all ranks; pairs inside a node use the intra-node link. None leaves
        the flat network. The queues live in
        shared memory, so all ranks must be on one host (CommError otherwise).
        """
        if topology is None:
            return
        inf = float("inf")

        def link(latency: float, bandwidth: float | None) -> tuple[float, float]:
            return float(latency), inf if bandwidth is None else float(bandwidth)

        fabric = topology.fabric_bandwidth_bytes_per_s
        self._native.set_topology(
            [int(n) for n in topology.node_of],
            link(topology.intra_latency_s, topology.intra_bandwidth_bytes_per_s),
            link(topology.nic_latency_s, topology.nic_bandwidth_bytes_per_s),
            inf if fabric is None else float(fabric),
        )

    def set_allreduce(self, algorithm: str) -> None:
        """The allreduce algorithm of every later allreduce, wait-avoiding group rounds included
        (``harness.scenario.network_fields.AllreduceAlgorithm``; ``hierarchical`` needs
        :meth:`set_topology` first, ``tree`` goes through its nodes when there is one). Every rank
        sets the same."""
        self._native.set_allreduce(str(algorithm))

    def emulate_network(self, scenario: Scenario) -> None:
        """Emulate the scenario's ``network``: its link rules, its topology and its allreduce
        algorithm (collective)."""
        # The scenario's models (pydantic) load only for a communicator emulating a scenario: a
        # torch.distributed script's backend never needs them.
        from harness.scenario.network import link_table, node_topology  # noqa: PLC0415

        self.set_links(link_table(scenario))
        self.set_topology(node_topology(scenario))
        self.set_allreduce(scenario.network.allreduce)

    def drain_records(self) -> list[OpRecord]:
        """Finished operations since the last call (post, start, end times; bytes sent)."""
        return [OpRecord(*r) for r in self._native.drain_records()]

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the progress thread (world communicator) and fail any operation still running."""
        if not self._native.closed:
            self._native.shutdown()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PushChannel:
    """Push-sum gossip: send to out-peers; arrivals are kept by themselves, per round.

    ``send(buf, peers, round)`` snapshots the buffer (the caller may keep changing it) and
    pushes it to each listed peer (a peer listed twice gets two messages), tagged with its
    gossip ``round``. ``drain(out)`` adds every arrival so far into ``out`` and forgets them;
    ``drain(out, round=t)`` only round t's, so early arrivals of later rounds wait for their
    round. Additions happen in a fixed order (round, source rank, arrival from that source),
    so the same messages give bit-equal sums whatever order they arrived in. Rounds in flight
    at once must span fewer than 16,384 (the MPI tag carries the round modulo 32,768).
    ``flush()`` (collective, after waiting for one's own sends) guarantees every message
    pushed before it has arrived, so the total mass can be checked; ``close()`` does the same
    and ends the channel.
    """

    def __init__(self, native: Any) -> None:
        self._native = native
        self._sends: list[_core.Handle] = []

    @property
    def count(self) -> int:
        return self._native.count

    def send(self, buf: Any, peers: Sequence[int], round: int = 0) -> _core.Handle:
        handle = self._native.send(as_float32_buffer(buf, "push buffer"), [int(p) for p in peers], int(round))
        self._sends = [h for h in self._sends if not h.done()]
        self._sends.append(handle)
        return handle

    def drain(self, out: Any, min_messages: int = 0, timeout: float | None = None, round: int | None = None) -> int:
        """Add arrivals (of ``round``, or of every round) into ``out``; wait for at least
        ``min_messages`` of them first. Returns how many were added."""
        return self._native.drain(
            as_float32_buffer(out, "drain target"), int(min_messages), timeout, None if round is None else int(round)
        )

    def pending(self, round: int | None = None) -> int:
        """Messages arrived and not drained yet (of ``round``, or of every round)."""
        return self._native.pending(None if round is None else int(round))

    def _quiesce(self, close: bool) -> None:
        for h in self._sends:
            h.wait()
        self._sends.clear()
        self._native.flush(close)

    def flush(self) -> None:
        self._quiesce(close=False)

    def close(self) -> None:
        self._quiesce(close=True)


class WaitAvoidingAllreduce:
    """Rounds of the wait-avoiding group allreduce; each returns the group SUM and what happened.

    ``round(buf, out)`` publishes ``buf``, arrives at the next round and writes the sum of the
    round's contributions into ``out``; the returned dict says ``round``, ``sync``,
    ``group_size``, ``staleness`` (rounds between the round and the buffer this rank
    contributed) and ``joined_early`` (the progress thread contributed before the caller came).
    """

    def __init__(self, native: Any) -> None:
        self._native = native

    def iround(self, buf: Any, out: Any, may_activate: bool = True) -> _core.RoundHandle:
        """Non-blocking ``round``; ``may_activate`` is ignored when the op's quorum is > 1."""
        published, result = as_float32_buffer(buf, "published buffer"), as_float32_buffer(out, "result buffer")
        return self._native.iround(published, result, may_activate)

    def round(self, buf: Any, out: Any, may_activate: bool = True) -> dict:
        handle = self.iround(buf, out, may_activate)
        handle.wait()
        return handle.info()

    def close(self) -> None:
        """Collective: ends the op once every rank finished its rounds.

        Raises ``CommError`` with the op's error if it failed (a peer's error, a shutdown).
        """
        self._native.close()


class PairwiseAverager:
    """Asynchronous pairwise model averaging (AD-PSGD, Lian et al. 2018).

    Active side: ``irequest(x, out, peer)`` sends ``x`` to a passive ``peer`` and receives the
    peer's model into ``out``; the caller then moves half-way, ``x += (out - x_sent) / 2``.
    Passive side: its progress thread answers at once, without its caller, with its view of
    the passive model (the last ``publish``-ed model plus corrections not drained yet), moves
    that view to the pairwise average and records the move; ``drain(x)`` adds the recorded
    corrections to the caller's current model and returns how many requests they hold, so
    several requests compose like sequential averagings. ``close()`` is
    collective and leaves nothing in flight.
    """

    def __init__(self, native: Any) -> None:
        self._native = native

    def publish(self, buf: Any) -> None:
        self._native.publish(as_float32_buffer(buf, "published model"))

    def irequest(self, buf: Any, out: Any, peer: int) -> _core.Handle:
        model, reply = as_float32_buffer(buf, "request model"), as_float32_buffer(out, "reply buffer")
        return self._native.request(model, reply, int(peer))

    def drain(self, out: Any) -> int:
        return self._native.drain(as_float32_buffer(out, "drain target"))

    def close(self) -> None:
        """Collective: ends the averager once every request has been answered.

        Raises ``CommError`` with the op's error if it failed (a peer's error, a shutdown).
        """
        self._native.close()
