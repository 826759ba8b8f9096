"""The wait-avoiding group allreduce of WAGMA-SGD and eager-SGD in simulated time: every
rank's side of one op (``kernels/wait_avoiding.hpp``'s rules), its round handles and the face
``harness.sim.comm.SimCommunicator.wait_avoiding`` returns.

The communicator and its fabric are passed in (``harness.sim.comm`` imports this module, never
the other way round): what is used of them is ``ranks``, ``engine``, ``network``, ``payload`` and
``collective()`` of the fabric, and ``rank``, ``engine``, ``fabric`` and ``_posted()`` of the
communicator."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from harness.schedules import is_sync_round
from harness.sim.handles import Handle, SimCommError
from harness.sim.payload import Published
from harness.sim.primitives import Collective

ACTIVATION_BYTES = 8  # one int64 round number (the native op does not count them in its bytes)


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

    def __init__(self, fabric: Any, count: int, sync_every: int, quorum: int = 1, accumulate: bool = False) -> None:
        self.fabric = fabric
        # Values: every rank's published buffer (None: the simulation carries no values).
        self.published_values = (
            fabric.payload.track(Published(fabric.ranks, accumulate, fabric.payload.recorded_staleness))
            if fabric.payload is not None
            else None
        )
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
        assert phases is not None  # the rank's op exists: it registered its groups
        return phases[k % len(phases)]

    def _join(self, rank: int, k: int) -> None:
        members = self._members(rank, k)
        key = (k, members[0])  # a round's groups are disjoint: the lowest member names the group
        op = self._groups.get(key)
        if op is None:
            op = self._groups[key] = Collective(
                self.engine, self.fabric.network, "allreduce", members, self.count, in_place=False
            )
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
                    raise SimCommError(
                        f"wait-avoiding allreduce: round {k} reached before round {self.next_join[rank]}"
                    )
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


class RoundHandle(Handle):
    __slots__ = ("info_", "joined_early", "k", "op", "rank", "state", "t_join")

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
            op = self.op
            assert op is not None  # delivered once the rank waited for its round
            op.wait_values()
            out.copy_(op.result)

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
            "round": self.k,
            "sync": is_sync_round(self.k, self.state.sync_every),
            "group_size": len(op.members),
            "staleness": staleness,
            "joined_early": self.joined_early,
            "t_join": op.join_at[op.index[self.rank]],
            "t_done": op.done_time(self.rank),
        }
        self.state.finished_rounds[self.rank] += 1
        if self.deliver is not None:
            self._delivered()

    def info(self) -> dict:
        self.wait()
        info = self.info_
        assert info is not None  # wait() recorded it
        return dict(info)


class SimWaitAvoidingAllreduce:
    """``Communicator.wait_avoiding`` in simulated time (see :class:`WaitAvoidingState`)."""

    def __init__(self, comm: Any, state: WaitAvoidingState) -> None:
        self._comm = comm
        self._state = state
        self._next = 0  # this rank's caller's next round

    def iround(self, buf: Any, out: Any, may_activate: bool = True) -> RoundHandle:
        k = self._next
        self._next += 1
        comm = self._comm
        joined_early = self._state.arrive(comm.rank, k, bool(may_activate), buf)
        return comm._posted(RoundHandle(comm.engine, self._state, comm.rank, k, joined_early, out))

    def round(self, buf: Any, out: Any, may_activate: bool = True) -> dict:
        handle = self.iround(buf, out, may_activate)
        handle.wait()
        return handle.info()

    def close(self) -> None:
        """Collective: returns once every rank has run all its rounds."""
        comm = self._comm
        key = ("wa close", id(self._state))
        comm.fabric.collective(key, comm.rank, "barrier", 0).wait(comm.rank)
