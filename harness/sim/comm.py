"""The simulated communicator: ``harness.comm.Communicator``'s interface in simulated time.

An algorithm's hooks run unchanged in the simulator because each simulated rank gets a
:class:`SimCommunicator` with the same operations, handles and persistent operations as the
native layer's Python face (allreduce, broadcast, barrier, exchange, push channel, the
wait-avoiding round, pairwise averaging; blocking and non-blocking), with the native layer's
matching rules and the native op's wait-avoidance rules. By default operations move no data
(buffers are :class:`harness.sim.standin.StandIn`); with a :class:`harness.sim.payload.Payload`
on the fabric (``simulate --train``) buffers are real tensors and operations move and combine
their values as the native layer does (that module says when and how). Either way they take the
time the simulated network says, and their records (``drain_records``) carry the native layer's
names and byte counts, so the training loop derives ``bytes_sent`` from them exactly as in a
real run.

Matching, as in the native layer: collectives of one communicator are matched in the order each
rank posts them (a mismatch is an error naming both sides); exchanges between two ranks in the
order they are posted; persistent operations in the order they are created; wait-avoiding
rounds by round number.

The handles of its non-blocking operations are in :mod:`harness.sim.handles`, the
wait-avoiding group allreduce in :mod:`harness.sim.wait_avoiding`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from harness.comm.op_record import OpRecord
from harness.schedules import checked_quorum
from harness.sim.engine import SimEngine
from harness.sim.handles import (
    CollectiveHandle,
    ExchangeHandle,
    Handle,
    ReceiveHandle,
    SimCommError,
    TimedHandle,
)
from harness.sim.network import SimNetwork
from harness.sim.payload import Pairwise, Payload
from harness.sim.primitives import Collective, Mailboxes
from harness.sim.step_programs import FLOAT_BYTES
from harness.sim.wait_avoiding import SimWaitAvoidingAllreduce, WaitAvoidingState

_H = TypeVar("_H", bound=Handle)
_new_tuple = tuple.__new__


def _floats(buf: Any) -> int:
    return int(buf.numel())


class SimFabric:
    """What the simulated ranks' communicators share: the engine, the network, the mailboxes and
    every operation in flight."""

    def __init__(self, engine: SimEngine, network: SimNetwork, ranks: int, payload: Payload | None = None) -> None:
        self.engine = engine
        self.network = network
        self.ranks = ranks
        self.mail = Mailboxes(engine, network, ranks)
        self.payload = payload  # None: buffers are stand-ins and operations move no values
        self._collectives: dict[Any, Collective] = {}
        self._persistent: dict[int, Any] = {}

    def communicators(self) -> list[SimCommunicator]:
        return [SimCommunicator(self, r) for r in range(self.ranks)]

    def collective(
        self,
        key: Any,
        rank: int,
        kind: str,
        count: int,
        root: int = 0,
        members: Sequence[int] | None = None,
        buf: Any = None,
        reduce: str = "sum",
    ) -> Collective:
        """Rank ``rank`` joins collective ``key`` (created by its first member); ``buf``: its
        buffer when the simulation carries values (``reduce``: an allreduce's sum or mean)."""
        op = self._collectives.get(key)
        if op is None:
            op = self._collectives[key] = Collective(
                self.engine, self.network, kind, range(self.ranks) if members is None else members, count, root, reduce
            )
        elif (op.kind, op.count, op.root) != (kind, count, root):
            raise SimCommError(
                f"rank {rank}'s collective {key} is a {kind} of {count} floats (root {root}); another "
                f"rank posted a {op.kind} of {op.count} floats (root {op.root}) there"
            )
        op.join(rank, buf if self.payload is not None else None)
        if op.joined == len(op.members):
            del self._collectives[key]  # every member holds it; nobody looks it up again
        return op

    def persistent(self, seq: int, factory) -> Any:
        """The ``seq``-th persistent operation (created by the first rank to create it)."""
        op = self._persistent.get(seq)
        if op is None:
            op = self._persistent[seq] = factory()
        return op


# -- the communicator -----------------------------------------------------------------------------
class SimCommunicator:
    """One simulated rank's communicator (see the module docstring)."""

    def __init__(self, fabric: SimFabric, rank: int) -> None:
        self.fabric = fabric
        self.engine = fabric.engine
        self._rank = rank
        self._collective_seq = 0
        self._persistent_seq = 0
        self._exchanges: dict[int, int] = defaultdict(int)  # peer -> exchanges posted to it
        self._received: dict[int, int] = defaultdict(int)  # peer -> receives posted from it
        self._group_seqs: dict[tuple[int, ...], int] = defaultdict(int)  # members -> collectives posted over them
        self._unfinished: list[Handle] = []  # posted, record not drained yet
        self._iteration = -1  # the loop's current iteration (-1: none, e.g. construction, finish)
        self.closed = False

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self.fabric.ranks

    @property
    def world_ranks(self) -> list[int]:
        return list(range(self.fabric.ranks))

    def begin_iteration(self, t: int | None) -> None:
        """The loop starts iteration t (None: finish()). Records carry the posting iteration:
        on a simulated clock an operation posted in ``finish()`` can have the very time the last
        iteration ended, so time alone cannot say where it belongs."""
        self._iteration = -1 if t is None else t

    def _posted(self, handle: _H) -> _H:
        handle.iteration = self._iteration
        self._unfinished.append(handle)
        return handle

    def _check_peer(self, peer: int, what: str) -> int:
        peer = int(peer)
        if not 0 <= peer < self.size or peer == self._rank:
            raise SimCommError(f"{what} {peer} out of range: must be another rank in [0, {self.size - 1}]")
        return peer

    # -- collectives ----------------------------------------------------------------------------
    def _collective(
        self, kind: str, count: int, root: int = 0, buf: Any = None, reduce: str = "sum"
    ) -> CollectiveHandle:
        key = self._collective_seq
        self._collective_seq += 1
        op = self.fabric.collective(key, self._rank, kind, count, root, buf=buf, reduce=reduce)
        return self._posted(CollectiveHandle(self.engine, op, self._rank))

    def iallreduce(self, buf: Any, op: str = "sum") -> Handle:
        if op not in ("sum", "mean"):
            raise SimCommError(f"allreduce op must be 'sum' or 'mean' (got {op!r})")
        return self._collective("allreduce", _floats(buf), buf=buf, reduce=op)

    def allreduce(self, buf: Any, op: str = "sum") -> None:
        self.iallreduce(buf, op).wait()

    def ibroadcast(self, buf: Any, root: int = 0) -> Handle:
        if not 0 <= int(root) < self.size:
            raise SimCommError(f"broadcast root {root} out of range [0, {self.size - 1}]")
        return self._collective("broadcast", _floats(buf), int(root), buf=buf)

    def broadcast(self, buf: Any, root: int = 0) -> None:
        self.ibroadcast(buf, root).wait()

    def ibarrier(self) -> CollectiveHandle:
        return self._collective("barrier", 0)

    def barrier(self) -> None:
        self.ibarrier().wait()

    def igroup(self, kind: str, members: Sequence[int], count: int, root: int = 0) -> Handle:
        """A collective over ``members`` (world ranks, this rank among them; the torch.distributed
        backend's groups): ``kind`` an allreduce, broadcast, barrier or one of
        :data:`harness.sim.step_programs.GROUP_KINDS`, ``root`` a member index. Matched per member
        list, in the order each member posts (the native layer's groups are communicators of
        their own)."""
        members = tuple(members)
        if self._rank not in members:
            raise SimCommError(f"rank {self._rank} posted a {kind} over ranks {list(members)}, which it is not among")
        seq = self._group_seqs[members]
        self._group_seqs[members] = seq + 1
        op = self.fabric.collective(("group", members, seq), self._rank, kind, int(count), int(root), members)
        return self._posted(CollectiveHandle(self.engine, op, self._rank))

    # -- point to point -------------------------------------------------------------------------
    def isend(self, peer: int, nbytes: int) -> Handle:
        """A one-way message of ``nbytes`` to ``peer`` (torch.distributed's send): done once it
        has left (its release); matched with the peer's :meth:`irecv` in posting order."""
        peer = self._check_peer(peer, "send peer")
        release = self.fabric.mail.send(self._rank, peer, int(nbytes))
        return self._posted(TimedHandle(self.engine, "send", int(nbytes), release))

    def irecv(self, peer: int, nbytes: int) -> Handle:
        """The next message from ``peer`` (see :meth:`isend`): done when it has arrived."""
        peer = self._check_peer(peer, "receive peer")
        seq = self._received[peer]
        self._received[peer] = seq + 1
        return self._posted(ReceiveHandle(self.engine, self.fabric.mail, self._rank, peer, seq))

    def iexchange(self, send: Any, recv: Any, peer: int) -> Handle:
        fabric, me = self.fabric, self._rank
        if not 0 <= peer < fabric.ranks or peer == me:
            self._check_peer(peer, "exchange peer")  # raises
        n = send.numel()
        if recv.numel() != n:
            raise SimCommError(f"exchange buffers differ in length ({n} vs {_floats(recv)})")
        exchanges = self._exchanges
        seq = exchanges[peer]
        exchanges[peer] = seq + 1
        mail, nbytes = fabric.mail, n * FLOAT_BYTES
        handle = ExchangeHandle(self.engine, mail, me, peer, seq, nbytes, mail.send(me, peer, nbytes))
        payload = fabric.payload
        if payload is not None:
            payload.sent(me, peer, seq, send)
            handle.deliver = lambda: payload.delivered(peer, me, seq, recv)
        # _posted, inlined: the gossip methods' thousands of ranks exchange every iteration
        handle.iteration = self._iteration
        self._unfinished.append(handle)
        return handle

    def exchange(self, send: Any, recv: Any, peer: int) -> None:
        self.iexchange(send, recv, peer).wait()

    # -- persistent operations --------------------------------------------------------------------
    def _persistent(self, factory) -> Any:
        seq = self._persistent_seq
        self._persistent_seq += 1
        return self.fabric.persistent(seq, factory)

    def push_channel(self, count: int) -> SimPushChannel:
        shared = self._persistent(lambda: object())
        return SimPushChannel(self, int(count), shared)

    def wait_avoiding(
        self,
        initial: Any,
        *,
        phases: Sequence[Sequence[int]],
        sync_every: int,
        accumulate: bool = False,
        quorum: int = 1,
    ) -> SimWaitAvoidingAllreduce:
        q = checked_quorum(quorum, self.size)
        state = self._persistent(
            lambda: WaitAvoidingState(self.fabric, _floats(initial), int(sync_every), q, bool(accumulate))
        )
        if state.count != _floats(initial) or state.sync_every != int(sync_every):
            raise SimCommError("wait_avoiding: ranks created the op with different lengths or sync_every")
        if state.quorum != q:
            raise SimCommError(
                f"wait_avoiding: rank {self._rank} created the op with quorum {q}; another rank "
                f"with quorum {state.quorum}"
            )
        state.register(self._rank, phases, initial)
        return SimWaitAvoidingAllreduce(self, state)

    def pairwise_averager(self, initial: Any) -> SimPairwiseAverager:
        state = self._persistent(lambda: PairwiseState(self.fabric, _floats(initial)))
        if state.values is not None:
            state.values.create(self._rank, initial)
        return SimPairwiseAverager(self, state)

    # -- records and lifetime ------------------------------------------------------------------------
    def set_links(self, links: Iterable[Any]) -> None:
        raise SimCommError("a simulated communicator takes its links from the simulated network")

    def drain_records(self) -> list[OpRecord]:
        """Operations finished by now since the last call, in posting order (as the native
        layer's records, whose order is finishing order; only the set per call matters)."""
        unfinished = self._unfinished
        if not unfinished:
            return []
        now = self.engine.env._now
        out, keep = [], []
        for h in unfinished:
            end = h.end()
            if end is not None and end <= now:
                # OpRecord(...) without the named tuple's Python-level __new__: a record per
                # operation per rank
                out.append(_new_tuple(OpRecord, (h.name, h.post, h.start(), end, h.bytes, h.round, h.iteration)))
            else:
                keep.append(h)
        self._unfinished = keep
        return out

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> SimCommunicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- push channel ---------------------------------------------------------------------------------
class SimPushChannel:
    """``Communicator.push_channel`` in simulated time: synchronous sends, arrivals kept per round."""

    def __init__(self, comm: SimCommunicator, count: int, shared: object) -> None:
        self._comm = comm
        self._count = count
        self._shared = shared  # identifies the channel: its flush barriers are its own
        self._flushes = 0
        self._last_send = 0.0  # completion of this rank's newest send
        self.closed = False

    @property
    def count(self) -> int:
        return self._count

    def send(self, buf: Any, peers: Sequence[int], round: int = 0) -> Handle:
        comm = self._comm
        n = _floats(buf)
        if n > self._count:
            raise SimCommError(f"push of {n} floats on a channel of {self._count}")
        nbytes, round, me, fabric = n * FLOAT_BYTES, int(round), comm._rank, comm.fabric
        at = comm.engine.env._now
        arrivals = []
        push = fabric.mail.push
        for p in peers:  # every rank of the push-sum methods pushes every iteration: locals
            arrival = push(me, comm._check_peer(p, "push peer"), nbytes, round)
            arrivals.append(arrival)
            if arrival > at:
                at = arrival
        if fabric.payload is not None:
            fabric.payload.pushed(me, [int(p) for p in peers], arrivals, round, buf)
        if at > self._last_send:
            self._last_send = at
        return comm._posted(TimedHandle(comm.engine, "push", nbytes * len(peers), at, round))

    def drain(self, out: Any, min_messages: int = 0, timeout: float | None = None, round: int | None = None) -> int:
        mail, me = self._comm.fabric.mail, self._comm.rank
        if min_messages > 0:
            mail.wait_count(me, int(min_messages), round, timeout)
        payload = self._comm.fabric.payload
        if payload is not None:
            payload.drained(me, round, self._comm.engine.env.now, out)
        return mail.take(me, round)

    def pending(self, round: int | None = None) -> int:
        return self._comm.fabric.mail.pending(self._comm.rank, round)

    def flush(self) -> None:
        """Collective: once it returns, every message pushed before it has arrived."""
        comm = self._comm
        comm.engine.sleep_until(self._last_send)  # own sends complete on arrival
        key = ("push flush", id(self._shared), self._flushes)
        self._flushes += 1
        comm.fabric.collective(key, comm.rank, "barrier", 0).wait(comm.rank)

    def close(self) -> None:
        self.flush()
        self.closed = True


# -- pairwise averaging (AD-PSGD) -------------------------------------------------------------------
class PairwiseState:
    """Requests answered by passive ranks' progress threads, one at a time (as the native
    listener: a request is taken once the reply to the previous one has left), all ranks' sides.

    Approximation (documented): requests to one passive rank are served in the order the
    active ranks posted them in simulated time; the native listener takes them in the order
    they arrive, which differs only when a later-posted request crosses a faster link."""

    def __init__(self, fabric: SimFabric, count: int) -> None:
        self.fabric = fabric
        self.count = count
        self.answers: list[list[float]] = [[] for _ in range(fabric.ranks)]  # per passive rank: answer times
        self.free_at: list[float] = [0.0] * fabric.ranks  # per passive rank: when its last reply left
        self.values = fabric.payload.track(Pairwise(fabric.ranks)) if fabric.payload is not None else None  # agents


class SimPairwiseAverager:
    """``Communicator.pairwise_averager`` in simulated time."""

    def __init__(self, comm: SimCommunicator, state: PairwiseState) -> None:
        self._comm = comm
        self._state = state
        self._last_reply = 0.0

    def publish(self, buf: Any) -> None:
        """The agent's view of the model (values only)."""
        if self._state.values is not None:
            self._state.values.publish(self._comm.rank, buf)

    def irequest(self, buf: Any, out: Any, peer: int) -> Handle:
        comm = self._comm
        peer = comm._check_peer(peer, "pairwise averaging peer")
        nbytes = _floats(buf) * FLOAT_BYTES
        network, now = comm.fabric.network, comm.engine.env.now
        _, request = network.message(comm.rank, peer, nbytes, now)
        answered = max(request, self._state.free_at[peer])  # after the reply to the previous request left
        left, reply = network.message(peer, comm.rank, nbytes, answered)
        self._state.free_at[peer] = left
        self._state.answers[peer].append(answered)
        self._last_reply = max(self._last_reply, reply)
        handle = TimedHandle(comm.engine, "pair_request", nbytes, reply)
        values = self._state.values
        if values is not None:  # the agent answers at the simulated moment it serves the request
            request, answer = buf.detach().clone(), []
            comm.engine.env.timeout(answered - now).callbacks.append(
                lambda _event: answer.append(values.answer(peer, request))
            )
            handle.deliver = lambda: out.copy_(answer[0])
        return comm._posted(handle)

    def drain(self, out: Any) -> int:
        """Requests this rank's agent answered by now and not drained yet (with values: their
        averaging moves added to ``out``)."""
        answers = self._state.answers[self._comm.rank]
        values = self._state.values
        if not answers and values is None:
            return 0
        now = self._comm.engine.env.now
        later = [a for a in answers if a > now]
        self._state.answers[self._comm.rank] = later
        if values is not None:
            return values.drain(self._comm.rank, out)
        return len(answers) - len(later)

    def close(self) -> None:
        """Collective: once it returns every request has been answered."""
        comm = self._comm
        comm.engine.sleep_until(self._last_reply)
        comm.fabric.collective(("pair close", id(self._state)), comm.rank, "barrier", 0).wait(comm.rank)
        answers = self._state.answers[comm.rank]
        if answers:
            comm.engine.sleep_until(max(answers))
