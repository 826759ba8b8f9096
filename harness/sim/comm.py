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
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from harness.comm.op_record import OpRecord
from harness.schedules import checked_quorum, is_sync_round
from harness.sim.engine import SimEngine
from harness.sim.network import FLOAT_BYTES, SimNetwork
from harness.sim.payload import Pairwise, Payload, Published
from harness.sim.primitives import Collective, Mailboxes

ACTIVATION_BYTES = 8  # one int64 round number (the native op does not count them in its bytes)


class SimCommError(RuntimeError):
    """An operation used in a way the native layer would refuse (wrong peer, mismatched collective)."""


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

    def communicators(self) -> list["SimCommunicator"]:
        return [SimCommunicator(self, r) for r in range(self.ranks)]

    def collective(self, key: Any, rank: int, kind: str, count: int, root: int = 0,
                   members: Sequence[int] | None = None, buf: Any = None, reduce: str = "sum") -> Collective:
        """Rank ``rank`` joins collective ``key`` (created by its first member); ``buf``: its
        buffer when the simulation carries values (``reduce``: an allreduce's sum or mean)."""
        op = self._collectives.get(key)
        if op is None:
            op = self._collectives[key] = Collective(self.engine, self.network, kind,
                                                     range(self.ranks) if members is None else members, count, root,
                                                     reduce)
        elif (op.kind, op.count, op.root) != (kind, count, root):
            raise SimCommError(f"rank {rank}'s collective {key} is a {kind} of {count} floats (root {root}); another "
                               f"rank posted a {op.kind} of {op.count} floats (root {op.root}) there")
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


# -- handles ------------------------------------------------------------------------------------
class _Handle:
    """A non-blocking operation's handle: ``wait()``, ``done()``, and its record once finished.

    ``deliver`` (values only, :mod:`harness.sim.payload`): what puts the operation's result
    into the caller's buffer, run once, when the caller first sees the operation complete
    (``wait()`` returning, or ``done()`` returning True)."""

    __slots__ = ("engine", "name", "post", "bytes", "round", "iteration", "deliver")

    def __init__(self, engine: SimEngine, name: str, nbytes: int, round: int = -1) -> None:
        self.engine = engine
        self.name = name
        self.post = engine.env.now
        self.bytes = nbytes
        self.round = round
        self.iteration = -1
        self.deliver = None

    def _delivered(self) -> None:
        deliver, self.deliver = self.deliver, None
        deliver()

    def end(self) -> float | None:  # when the operation completes for this rank; None: unknown yet
        raise NotImplementedError

    def start(self) -> float:
        return self.post

    def done(self) -> bool:
        end = self.end()
        finished = end is not None and end <= self.engine.env.now
        if finished and self.deliver is not None:
            self._delivered()
        return finished

    def wait(self, timeout: float | None = None) -> None:
        raise NotImplementedError

    def times(self) -> tuple[float, float, float | None]:
        return self.post, self.start(), self.end()


class _CollectiveHandle(_Handle):
    __slots__ = ("op", "rank")

    def __init__(self, engine, op: Collective, rank: int) -> None:
        super().__init__(engine, op.kind, op.sent_by(rank))
        self.op, self.rank = op, rank

    def end(self):
        return self.op.done_time(self.rank)

    def wait(self, timeout=None):
        self.op.wait(self.rank)


class _TimedHandle(_Handle):
    """An operation whose completion time is known when it is posted (push sends, requests)."""

    __slots__ = ("at",)

    def __init__(self, engine, name: str, nbytes: int, at: float, round: int = -1) -> None:
        super().__init__(engine, name, nbytes, round)
        self.at = at

    def end(self):
        return self.at

    def wait(self, timeout=None):
        self.engine.sleep_until(self.at)
        if self.deliver is not None:
            self._delivered()


class _ExchangeHandle(_Handle):
    __slots__ = ("mail", "peer", "me", "seq", "release", "_end")

    def __init__(self, engine, mail: Mailboxes, me: int, peer: int, seq: int, nbytes: int, release: float) -> None:
        # _Handle.__init__ spelled out: thousands of ranks post exchanges every iteration.
        self.engine, self.name, self.post, self.bytes, self.round, self.iteration, self.deliver = (
            engine, "exchange", engine.env.now, nbytes, -1, -1, None)
        self.mail, self.me, self.peer, self.seq, self.release = mail, me, peer, seq, release
        self._end = None  # known once the peer's message is: it never changes after

    def end(self):
        if self._end is None:
            arrival = self.mail.arrival(self.peer, self.me, self.seq)
            if arrival is not None:
                self._end = arrival if arrival > self.release else self.release
        return self._end

    def wait(self, timeout=None):
        end = self.end()
        if end is None:
            arrival = self.mail.receive(self.peer, self.me, self.seq)  # not sent yet: wait for it to be
            end = self._end = arrival if arrival > self.release else self.release
        self.engine.sleep_until(end)
        if self.deliver is not None:
            self._delivered()


class _ReceiveHandle(_Handle):
    """A receive (:meth:`SimCommunicator.irecv`): done when the matching message has arrived."""

    __slots__ = ("mail", "peer", "me", "seq")

    def __init__(self, engine, mail: Mailboxes, me: int, peer: int, seq: int) -> None:
        super().__init__(engine, "recv", 0)
        self.mail, self.me, self.peer, self.seq = mail, me, peer, seq

    def end(self):
        return self.mail.arrival(self.peer, self.me, self.seq)

    def wait(self, timeout=None):
        self.engine.sleep_until(self.mail.receive(self.peer, self.me, self.seq))


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
        self._unfinished: list[_Handle] = []  # posted, record not drained yet
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

    def _posted(self, handle: _Handle) -> _Handle:
        handle.iteration = self._iteration
        self._unfinished.append(handle)
        return handle

    def _check_peer(self, peer: int, what: str) -> int:
        peer = int(peer)
        if not 0 <= peer < self.size or peer == self._rank:
            raise SimCommError(f"{what} {peer} out of range: must be another rank in [0, {self.size - 1}]")
        return peer

    # -- collectives ----------------------------------------------------------------------------
    def _collective(self, kind: str, count: int, root: int = 0, buf: Any = None, reduce: str = "sum") -> _Handle:
        key = self._collective_seq
        self._collective_seq += 1
        op = self.fabric.collective(key, self._rank, kind, count, root, buf=buf, reduce=reduce)
        return self._posted(_CollectiveHandle(self.engine, op, self._rank))

    def iallreduce(self, buf: Any, op: str = "sum") -> _Handle:
        if op not in ("sum", "mean"):
            raise SimCommError(f"allreduce op must be 'sum' or 'mean' (got {op!r})")
        return self._collective("allreduce", _floats(buf), buf=buf, reduce=op)

    def allreduce(self, buf: Any, op: str = "sum") -> None:
        self.iallreduce(buf, op).wait()

    def ibroadcast(self, buf: Any, root: int = 0) -> _Handle:
        if not 0 <= int(root) < self.size:
            raise SimCommError(f"broadcast root {root} out of range [0, {self.size - 1}]")
        return self._collective("broadcast", _floats(buf), int(root), buf=buf)

    def broadcast(self, buf: Any, root: int = 0) -> None:
        self.ibroadcast(buf, root).wait()

    def ibarrier(self) -> _Handle:
        return self._collective("barrier", 0)

    def barrier(self) -> None:
        self.ibarrier().wait()

    def igroup(self, kind: str, members: Sequence[int], count: int, root: int = 0) -> _Handle:
        """A collective over ``members`` (world ranks, this rank among them; the torch.distributed
        backend's groups): ``kind`` an allreduce, broadcast, barrier or one of
        :data:`harness.sim.network.GROUP_KINDS`, ``root`` a member index. Matched per member
        list, in the order each member posts (the native layer's groups are communicators of
        their own)."""
        members = tuple(members)
        if self._rank not in members:
            raise SimCommError(f"rank {self._rank} posted a {kind} over ranks {list(members)}, which it is not among")
        seq = self._group_seqs[members]
        self._group_seqs[members] = seq + 1
        op = self.fabric.collective(("group", members, seq), self._rank, kind, int(count), int(root), members)
        return self._posted(_CollectiveHandle(self.engine, op, self._rank))

    # -- point to point -------------------------------------------------------------------------
    def isend(self, peer: int, nbytes: int) -> _Handle:
        """A one-way message of ``nbytes`` to ``peer`` (torch.distributed's send): done once it
        has left (its release); matched with the peer's :meth:`irecv` in posting order."""
        peer = self._check_peer(peer, "send peer")
        release = self.fabric.mail.send(self._rank, peer, int(nbytes))
        return self._posted(_TimedHandle(self.engine, "send", int(nbytes), release))

    def irecv(self, peer: int, nbytes: int) -> _Handle:
        """The next message from ``peer`` (see :meth:`isend`): done when it has arrived."""
        peer = self._check_peer(peer, "receive peer")
        seq = self._received[peer]
        self._received[peer] = seq + 1
        return self._posted(_ReceiveHandle(self.engine, self.fabric.mail, self._rank, peer, seq))

    def iexchange(self, send: Any, recv: Any, peer: int) -> _Handle:
        if not 0 <= peer < self.fabric.ranks or peer == self._rank:
            self._check_peer(peer, "exchange peer")  # raises
        n = send.numel()
        if recv.numel() != n:
            raise SimCommError(f"exchange buffers differ in length ({n} vs {_floats(recv)})")
        seq = self._exchanges[peer]
        self._exchanges[peer] = seq + 1
        release = self.fabric.mail.send(self._rank, peer, n * FLOAT_BYTES)
        handle = _ExchangeHandle(self.engine, self.fabric.mail, self._rank, peer, seq, n * FLOAT_BYTES, release)
        payload = self.fabric.payload
        if payload is not None:
            payload.sent(self._rank, peer, seq, send)
            handle.deliver = lambda: payload.delivered(peer, self._rank, seq, recv)
        return self._posted(handle)

    def exchange(self, send: Any, recv: Any, peer: int) -> None:
        self.iexchange(send, recv, peer).wait()

    # -- persistent operations --------------------------------------------------------------------
    def _persistent(self, factory) -> Any:
        seq = self._persistent_seq
        self._persistent_seq += 1
        return self.fabric.persistent(seq, factory)

    def push_channel(self, count: int) -> "SimPushChannel":
        shared = self._persistent(lambda: object())
        return SimPushChannel(self, int(count), shared)

    def wait_avoiding(self, initial: Any, *, phases: Sequence[Sequence[int]], sync_every: int,
                      accumulate: bool = False, quorum: int = 1) -> "SimWaitAvoidingAllreduce":
        q = checked_quorum(quorum, self.size)
        state = self._persistent(lambda: WaitAvoidingState(self.fabric, _floats(initial), int(sync_every), q,
                                                           bool(accumulate)))
        if state.count != _floats(initial) or state.sync_every != int(sync_every):
            raise SimCommError("wait_avoiding: ranks created the op with different lengths or sync_every")
        if state.quorum != q:
            raise SimCommError(f"wait_avoiding: rank {self._rank} created the op with quorum {q}; another rank "
                               f"with quorum {state.quorum}")
        state.register(self._rank, phases, initial)
        return SimWaitAvoidingAllreduce(self, state)

    def pairwise_averager(self, initial: Any) -> "SimPairwiseAverager":
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
        now = self.engine.env.now
        out, keep = [], []
        for h in self._unfinished:
            end = h.end()
            if end is not None and end <= now:
                out.append(OpRecord(h.name, h.post, h.start(), end, h.bytes, h.round, h.iteration))
            else:
                keep.append(h)
        self._unfinished = keep
        return out

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> "SimCommunicator":
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

    def send(self, buf: Any, peers: Sequence[int], round: int = 0) -> _Handle:
        comm = self._comm
        n = _floats(buf)
        if n > self._count:
            raise SimCommError(f"push of {n} floats on a channel of {self._count}")
        nbytes = n * FLOAT_BYTES
        at = comm.engine.env.now
        arrivals = []
        for p in peers:
            arrivals.append(comm.fabric.mail.push(comm.rank, comm._check_peer(p, "push peer"), nbytes, int(round)))
            at = max(at, arrivals[-1])
        if comm.fabric.payload is not None:
            comm.fabric.payload.pushed(comm.rank, [int(p) for p in peers], arrivals, int(round), buf)
        self._last_send = max(self._last_send, at)
        return comm._posted(_TimedHandle(comm.engine, "push", nbytes * len(peers), at, int(round)))

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


# -- the wait-avoiding group allreduce -----------------------------------------------------------
class _Round:
    __slots__ = ("of_rank", "staleness")

    def __init__(self) -> None:
        self.of_rank: dict[int, Collective] = {}
        self.staleness: dict[int, int] = {}


class WaitAvoidingState:
    """One wait-avoiding op, all ranks' sides (``kernels/wait_avoiding.hpp``'s rules).

    The first caller to arrive at round k that may activate it sends an activation to every
    other rank and joins; a rank's progress thread joins every round it has not joined up to
    an activated one on receipt, contributing the buffer published last (staleness: rounds
    between the round and that buffer's round); synchronous rounds (every ``sync_every``-th)
    are joined by each caller itself, over all ranks.

    With ``quorum`` > 1 (``may_activate`` ignored), round k is activated once ``quorum``
    callers arrived at it. Natively every rank counts the "arrived at k" notices (sent by each
    caller arriving at a round its rank has not joined yet) itself and joins when its own count
    reaches the quorum. The simulator approximates this with one count per round for all ranks
    (of arrivals at rounds the rank has not joined, and not activated by a quorum yet): the
    quorum-th arrival at round k is an activation by its rank, which joins at once; the others
    learn of it one message later. That is exact when all notices take the same time, the
    quorum-th arriver's own knowledge aside: natively it joins only once the earlier arrivers'
    notices have reached it too (later than its arrival if one of them arrived less than a
    message time before it).
    """

    def __init__(self, fabric: SimFabric, count: int, sync_every: int, quorum: int = 1,
                 accumulate: bool = False) -> None:
        self.fabric = fabric
        # Values: every rank's published buffer (None: the simulation carries no values).
        self.published_values = fabric.payload.track(Published(fabric.ranks, accumulate,
                                                               fabric.payload.recorded_staleness)) \
            if fabric.payload is not None else None
        self.engine = fabric.engine
        self.count = count
        self.sync_every = sync_every
        ranks = fabric.ranks
        self.phases: list[list[tuple[int, ...]] | None] = [None] * ranks
        self.next_join = [0] * ranks
        self.published = [-1] * ranks  # round of each rank's last published buffer
        self.rounds: dict[int, _Round] = defaultdict(_Round)
        self._groups: dict[tuple[int, int], Collective] = {}  # (round, lowest member) -> its allreduce
        self._interned: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._everyone = tuple(range(ranks))
        self._early: dict[int, int] = {}  # rank -> highest round activated before it created the op
        self._joined: dict[tuple[int, int], Any] = {}  # (rank, k) -> event, for callers waiting to be joined
        self.finished_rounds = [0] * ranks
        self.quorum = quorum
        self._arrived: dict[int, int] = {}  # quorum > 1: round -> arrivals counted so far
        self._quorum_round = -1  # quorum > 1: the latest round a quorum activated
        self._pending: dict[int, int] = {}  # quorum > 1: rank -> activated round held up by a sync round
        # The latest activation sent to every rank at one cost (round, arrival): a later one of no
        # later round arriving no sooner changes nothing (its deliveries would find every rank
        # joined already), so it is not scheduled. Ranks that arrive together all activate:
        # 1,023 activations of 1,023 messages each per round at 1,024 ranks otherwise.
        self._covered = (-1, float("inf"))

    def register(self, rank: int, phases: Sequence[Sequence[int]], initial: Any = None) -> None:
        """Rank ``rank``'s groups per phase. Equal groups are stored once: eager-SGD's one group
        of every rank, given by each of 16,384 ranks, must not be kept 16,384 times.
        ``initial``: the buffer published before round 0 (values only)."""
        if self.published_values is not None:
            self.published_values.create(rank, initial)
        own = []
        for g in phases:
            given = tuple(g)
            group = self._interned.get(given)
            if group is None:
                group = tuple(sorted(given))
                group = self._interned.setdefault(group, group)
                self._interned[given] = group
            i = bisect.bisect_left(group, rank)
            if i == len(group) or group[i] != rank:
                raise SimCommError(f"wait_avoiding: rank {rank}'s group {list(group)} does not contain it")
            own.append(group)
        self.phases[rank] = own
        early = self._early.pop(rank, None)
        if early is not None:  # activations that reached it before it created the op (MPI keeps them)
            self._on_activation(rank, early)

    def _members(self, rank: int, k: int) -> tuple[int, ...]:
        if is_sync_round(k, self.sync_every):
            return self._everyone
        phases = self.phases[rank]
        return phases[k % len(phases)]

    def _join(self, rank: int, k: int) -> None:
        members = self._members(rank, k)
        key = (k, members[0])  # a round's groups are disjoint: the lowest member names the group
        op = self._groups.get(key)
        if op is None:
            op = self._groups[key] = Collective(self.engine, self.fabric.network, "allreduce", members, self.count,
                                                in_place=False)
        state = self.rounds[k]
        state.of_rank[rank] = op
        state.staleness[rank] = k - self.published[rank]
        self.next_join[rank] = k + 1
        values = self.published_values
        op.join(rank, values.contribution(rank, k) if values is not None else None)
        if op.joined == len(op.members):
            del self._groups[key]
        event = self._joined.pop((rank, k), None)
        if event is not None:
            event.succeed()

    def _on_activation(self, rank: int, k: int) -> None:
        if self.phases[rank] is None:  # its op does not exist yet: handled when it is created
            self._early[rank] = max(k, self._early.get(rank, k))
            return
        while self.next_join[rank] <= k and not is_sync_round(self.next_join[rank], self.sync_every):
            self._join(rank, self.next_join[rank])
        if self.quorum > 1 and self.next_join[rank] <= k:
            # Held up by a synchronous round: the native op keeps the count and applies it once
            # the caller joined that round.
            self._pending[rank] = max(k, self._pending.get(rank, k))

    def _activate(self, src: int, k: int) -> None:
        """``src`` sends round k's activation to every other rank (direct sends, as the native op)."""
        network, env = self.fabric.network, self.engine.env
        now = env.now
        by_time: dict[float, list[int]] = defaultdict(list)
        if network.links_from(src):
            for dst in range(self.fabric.ranks):
                if dst != src:
                    by_time[network.message(src, dst, ACTIVATION_BYTES, now)[1]].append(dst)
        else:  # every activation of src takes the same time: one event for all
            if self.fabric.ranks < 2:
                return
            arrival = network.message(src, 1 if src == 0 else 0, ACTIVATION_BYTES, now)[1]
            covered_round, covered_at = self._covered
            if k <= covered_round and arrival >= covered_at:
                return  # every other rank has been reached by then with this round or a later one
            if k > covered_round or arrival < covered_at:
                self._covered = (k, arrival)
            by_time[arrival] = [d for d in range(self.fabric.ranks) if d != src]
        for when, dsts in by_time.items():
            def deliver(_event, dsts=dsts):
                for dst in dsts:
                    self._on_activation(dst, k)
            env.timeout(when - now).callbacks.append(deliver)

    def arrive(self, rank: int, k: int, may_activate: bool, buf: Any = None) -> bool:
        """Rank ``rank``'s caller publishes ``buf`` for round k; returns whether it had been joined already."""
        self.published[rank] = k
        if self.published_values is not None:
            self.published_values.publish(rank, buf, k)
        joined_early = k < self.next_join[rank]
        if not joined_early:
            if is_sync_round(k, self.sync_every):
                if k != self.next_join[rank]:
                    raise SimCommError(f"wait-avoiding allreduce: round {k} reached before round {self.next_join[rank]}")
                self._join(rank, k)
                if self.quorum > 1 and rank in self._pending:
                    self._on_activation(rank, self._pending.pop(rank))
            elif self.quorum > 1:
                self._count_arrival(rank, k)
            elif may_activate:
                self._activate(rank, k)
                self._on_activation(rank, k)
        return joined_early

    def _count_arrival(self, rank: int, k: int) -> None:
        """quorum > 1: rank's caller arrived at round k, which it has not joined yet."""
        if k <= self._quorum_round:
            return  # activated already: the activation is on its way to this rank
        count = self._arrived.get(k, 0) + 1
        if count < self.quorum:
            self._arrived[k] = count
            return
        self._quorum_round = k
        for j in [j for j in self._arrived if j <= k]:
            del self._arrived[j]
        self._activate(rank, k)
        self._on_activation(rank, k)

    def result(self, rank: int, k: int) -> tuple[Collective, int]:
        """Block until ``rank`` has joined round k and the round's group allreduce completed for
        it; returns the group collective and the staleness of its contribution."""
        state = self.rounds[k]
        if rank not in state.of_rank:  # not activated yet: wait for someone's activation
            event = self._joined.setdefault((rank, k), self.engine.env.event())
            self.engine.wait(event, f"round {k} of the wait-avoiding allreduce to be activated")
            state = self.rounds[k]  # the one it was joined in (the old one was dropped once empty)
        op = state.of_rank.pop(rank)
        staleness = state.staleness.pop(rank)
        if not state.of_rank:
            del self.rounds[k]
        op.wait(rank)
        return op, staleness


class _RoundHandle(_Handle):
    __slots__ = ("state", "rank", "k", "joined_early", "op", "info_", "t_join")

    def __init__(self, engine, state: WaitAvoidingState, rank: int, k: int, joined_early: bool, out: Any) -> None:
        sync = is_sync_round(k, state.sync_every)
        super().__init__(engine, "wa_sync_round" if sync else "wa_group_round", 0, k)
        self.state, self.rank, self.k, self.joined_early = state, rank, k, joined_early
        self.op: Collective | None = None
        self.info_: dict | None = None
        if state.published_values is not None:  # the round's sum lands in ``out`` (values only)
            self.deliver = self._deliver_into(out)

    def _deliver_into(self, out: Any):
        def deliver() -> None:
            self.op.wait_values()
            out.copy_(self.op.result)
        return deliver

    def _joined_op(self) -> Collective | None:
        if self.op is None:
            state = self.state.rounds.get(self.k)
            if state is not None:
                self.op = state.of_rank.get(self.rank)
                if self.op is not None:
                    self.bytes = self.op.sent_by(self.rank)
        return self.op

    def end(self):
        if self.info_ is not None:
            return self.info_["t_done"]
        op = self._joined_op()
        return None if op is None else op.done_time(self.rank)

    def start(self) -> float:
        op = self._joined_op()
        return self.post if op is None else op.join_at[op.index[self.rank]]

    def wait(self, timeout=None):
        if self.info_ is not None:
            return
        op, staleness = self.state.result(self.rank, self.k)
        self.op = op
        self.bytes = op.sent_by(self.rank)
        self.info_ = {
            "round": self.k, "sync": is_sync_round(self.k, self.state.sync_every), "group_size": len(op.members),
            "staleness": staleness, "joined_early": self.joined_early,
            "t_join": op.join_at[op.index[self.rank]], "t_done": op.done_time(self.rank),
        }
        self.state.finished_rounds[self.rank] += 1
        if self.deliver is not None:
            self._delivered()

    def info(self) -> dict:
        self.wait()
        return dict(self.info_)


class SimWaitAvoidingAllreduce:
    """``Communicator.wait_avoiding`` in simulated time (see :class:`WaitAvoidingState`)."""

    def __init__(self, comm: SimCommunicator, state: WaitAvoidingState) -> None:
        self._comm = comm
        self._state = state
        self._next = 0  # this rank's caller's next round

    def iround(self, buf: Any, out: Any, may_activate: bool = True) -> _RoundHandle:
        k = self._next
        self._next += 1
        comm = self._comm
        joined_early = self._state.arrive(comm.rank, k, bool(may_activate), buf)
        return comm._posted(_RoundHandle(comm.engine, self._state, comm.rank, k, joined_early, out))

    def round(self, buf: Any, out: Any, may_activate: bool = True) -> dict:
        handle = self.iround(buf, out, may_activate)
        handle.wait()
        return handle.info()

    def close(self) -> None:
        """Collective: returns once every rank has run all its rounds."""
        comm = self._comm
        key = ("wa close", id(self._state))
        comm.fabric.collective(key, comm.rank, "barrier", 0).wait(comm.rank)


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

    def irequest(self, buf: Any, out: Any, peer: int) -> _Handle:
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
        handle = _TimedHandle(comm.engine, "pair_request", nbytes, reply)
        values = self._state.values
        if values is not None:  # the agent answers at the simulated moment it serves the request
            request, answer = buf.detach().clone(), []
            comm.engine.env.timeout(answered - now).callbacks.append(
                lambda _event: answer.append(values.answer(peer, request)))
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
