"""Simulated communication primitives on a SimPy environment, one per native-layer mechanism.

- :class:`Collective`: an allreduce over a member list; members join (blocking or not) and
  complete per :func:`harness.sim.network.run_schedule` once the last one has joined.
- :class:`Mailboxes`: point-to-point messages, counted per receiver (push-sum's channel: the
  progress thread adds arrivals whenever they come) and sequenced per (src, dst) pair
  (D-PSGD's exchanges, which MPI matches in posting order).
- :class:`WaitAvoiding`: the externally triggered group allreduce of WAGMA-SGD / eager-SGD,
  with the native op's rules (``kernels/wait_avoiding.hpp``): the first arrival at a round
  (that may activate) sends an activation to every rank; a rank's progress thread joins every
  not-yet-joined round up to the activated one on receipt, contributing a stale buffer;
  synchronous rounds are joined only by the caller itself.

Waiting is expressed as SimPy events; where a completion time is already known, a caller waits
with one timeout instead of an event chain, which keeps 1,024-rank runs fast.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Generator, Sequence

import simpy

from harness.schedules import is_sync_round
from harness.sim.network import SimNetwork, run_schedule

ACTIVATION_BYTES = 8  # one int64 round number


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules (the benchmark's events/s)."""

    def __init__(self) -> None:
        super().__init__()
        self.events_scheduled = 0

    def schedule(self, event, priority=1, delay=0):  # noqa: D401 - SimPy's signature
        self.events_scheduled += 1
        super().schedule(event, priority, delay)


def wait_until(env: simpy.Environment, when: float) -> Generator:
    """Wait until simulated time ``when`` (no event at all when it has passed)."""
    if when > env.now:
        yield env.timeout(when - env.now)


class Collective:
    """An allreduce of ``count`` floats over ``members`` (ranks, in the schedule's order)."""

    __slots__ = ("env", "network", "members", "index", "count", "join_at", "joined", "done_at", "complete",
                 "schedule")

    def __init__(self, env: simpy.Environment, network: SimNetwork, members: Sequence[int], count: int) -> None:
        self.env = env
        self.network = network
        self.members = tuple(members)
        self.index = dict(zip(self.members, range(len(self.members))))
        self.count = count
        self.join_at = [0.0] * len(self.members)
        self.joined = 0
        self.done_at: list[float] | None = None
        self.complete = env.event()
        self.schedule = network.allreduce_schedule(len(self.members), count)

    def join(self, rank: int) -> None:
        """``rank`` contributes now (its own call, or its progress thread on its behalf)."""
        self.join_at[self.index[rank]] = self.env.now
        self.joined += 1
        if self.joined == len(self.members):
            self.done_at = run_schedule(self.schedule, self.members, self.join_at, self.network)
            self.complete.succeed()

    def wait(self, rank: int) -> Generator:
        """Block ``rank`` until its part of the collective has completed."""
        if self.done_at is None:
            yield self.complete
        done = self.done_at[self.index[rank]]
        if done > self.env.now:
            yield self.env.timeout(done - self.env.now)

    def sent_by(self, rank: int) -> int:
        return int(self.schedule.bytes_sent[self.index[rank]])


class Mailboxes:
    """Point-to-point messages between ranks over the simulated network."""

    def __init__(self, env: simpy.Environment, network: SimNetwork, ranks: int) -> None:
        self.env = env
        self.network = network
        self.delivered = [0] * ranks  # messages arrived at each rank (push channel)
        self._round_delivered: dict[tuple[int, int], int] = defaultdict(int)  # (rank, round) -> arrived
        self._count_waiters: dict[tuple[int, int | None], list[tuple[int, simpy.Event]]] = defaultdict(list)
        self._pair_arrivals: dict[tuple[int, int], list[float]] = defaultdict(list)
        self._pair_waiters: dict[tuple[int, int, int], simpy.Event] = {}

    # -- counted, per round (push-sum) ---------------------------------------------------------
    def push(self, src: int, dst: int, nbytes: int, round: int | None = None) -> float:
        """Send a message (of gossip ``round``, when its receiver waits per round) now; returns
        when the send completes (it is matched on arrival: push-sum sends are synchronous, and the
        receiver's listener is always posted)."""
        _, arrival = self.network.message(src, dst, nbytes, self.env.now)
        self.env.timeout(arrival - self.env.now).callbacks.append(lambda _event: self._deliver(dst, round))
        return arrival

    def _deliver(self, dst: int, round: int | None) -> None:
        self.delivered[dst] += 1
        keys: tuple[tuple[int, int | None], ...] = ((dst, None),)
        if round is not None:
            self._round_delivered[(dst, round)] += 1
            keys += ((dst, round),)
        for key in keys:
            waiters = self._count_waiters.get(key)
            if not waiters:
                continue
            count = self.delivered[dst] if key[1] is None else self._round_delivered[key]
            still = []
            for threshold, event in waiters:
                if count >= threshold:
                    event.succeed()
                else:
                    still.append((threshold, event))
            self._count_waiters[key] = still

    def wait_count(self, rank: int, at_least: int, round: int | None = None) -> Generator:
        """Block until ``at_least`` messages (of ``round``, or of all rounds) have arrived at ``rank``."""
        count = self.delivered[rank] if round is None else self._round_delivered[(rank, round)]
        if count < at_least:
            event = self.env.event()
            self._count_waiters[(rank, round)].append((at_least, event))
            yield event
        if round is not None:  # a round is waited for once: forget it (thousands of ranks x rounds)
            self._round_delivered.pop((rank, round), None)

    # -- sequenced (exchange) -----------------------------------------------------------------
    def send(self, src: int, dst: int, nbytes: int) -> float:
        """Send the next message of pair (src, dst) now; returns its release time (send complete)."""
        release, arrival = self.network.message(src, dst, nbytes, self.env.now)
        arrivals = self._pair_arrivals[(src, dst)]
        seq = len(arrivals)
        arrivals.append(arrival)
        event = self._pair_waiters.pop((src, dst, seq), None)
        if event is not None:
            self.env.timeout(max(0.0, arrival - self.env.now)).callbacks.append(lambda _e: event.succeed())
        return release

    def receive(self, src: int, dst: int, seq: int) -> Generator:
        """Block ``dst`` until the ``seq``-th message (0-based) from ``src`` has arrived."""
        arrivals = self._pair_arrivals[(src, dst)]
        if seq < len(arrivals):
            yield from wait_until(self.env, arrivals[seq])
            return
        event = self._pair_waiters.setdefault((src, dst, seq), self.env.event())
        yield event


class _Round:
    """One wait-avoiding round: its collectives (one per group) and who joined which."""

    __slots__ = ("groups", "of_rank", "staleness")

    def __init__(self) -> None:
        self.groups: dict[tuple[int, ...], Collective] = {}
        self.of_rank: dict[int, Collective] = {}
        self.staleness: dict[int, int] = {}


class WaitAvoiding:
    """The native wait-avoiding group allreduce, for all ranks of one algorithm.

    ``group_of(rank, k)`` gives the sorted members of ``rank``'s group in a non-synchronous
    round k; ``may_activate(rank, k)`` whether ``rank``'s arrival may trigger round k.
    """

    def __init__(self, env: simpy.Environment, network: SimNetwork, ranks: int, count: int, sync_every: int,
                 group_of: Callable[[int, int], Sequence[int]], may_activate: Callable[[int, int], bool]) -> None:
        self.env = env
        self.network = network
        self.ranks = ranks
        self.count = count
        self.sync_every = sync_every
        self.group_of = group_of
        self.may_activate = may_activate
        self.next_join = [0] * ranks
        self.published = [-1] * ranks  # round of each rank's last published buffer
        self.rounds: dict[int, _Round] = defaultdict(_Round)
        self._joined: dict[tuple[int, int], simpy.Event] = {}  # (rank, k) -> joined, for waiting callers
        self.activation_bytes = [0] * ranks  # activation traffic, attributed by the caller's round

    def _join(self, rank: int, k: int) -> None:
        state = self.rounds[k]
        if is_sync_round(k, self.sync_every):
            members: Sequence[int] = range(self.ranks)
        else:
            members = self.group_of(rank, k)
        key = tuple(members)
        op = state.groups.get(key)
        if op is None:
            op = state.groups[key] = Collective(self.env, self.network, key, self.count)
        state.of_rank[rank] = op
        state.staleness[rank] = k - self.published[rank]
        self.next_join[rank] = k + 1
        op.join(rank)
        event = self._joined.pop((rank, k), None)
        if event is not None:
            event.succeed()

    def _on_activation(self, rank: int, k: int) -> None:
        while self.next_join[rank] <= k and not is_sync_round(self.next_join[rank], self.sync_every):
            self._join(rank, self.next_join[rank])

    def _activate(self, src: int, k: int) -> None:
        """``src`` sends the activation of round k to every other rank (direct sends, as the native op)."""
        by_time: dict[float, list[int]] = defaultdict(list)
        for dst in range(self.ranks):
            if dst != src:
                by_time[self.network.message(src, dst, ACTIVATION_BYTES, self.env.now)[1]].append(dst)
        self.activation_bytes[src] += ACTIVATION_BYTES * (self.ranks - 1)
        for when, dsts in by_time.items():
            def deliver(_event, dsts=dsts):
                for dst in dsts:
                    self._on_activation(dst, k)
            self.env.timeout(when - self.env.now).callbacks.append(deliver)

    def round(self, rank: int, k: int) -> Generator:
        """``rank``'s caller publishes for round k and takes its result; returns (staleness, bytes).

        Generator: run with ``yield from``; its return value is ``(staleness, bytes_sent)``.
        """
        self.published[rank] = k
        if k >= self.next_join[rank]:
            if is_sync_round(k, self.sync_every):
                if k != self.next_join[rank]:
                    raise RuntimeError(f"rank {rank}: round {k} reached before round {self.next_join[rank]}")
                self._join(rank, k)
            elif self.may_activate(rank, k):
                self._activate(rank, k)
                self._on_activation(rank, k)
        state = self.rounds[k]
        if rank not in state.of_rank:  # not activated yet: wait for someone else's activation
            event = self._joined.setdefault((rank, k), self.env.event())
            yield event
        op = state.of_rank[rank]
        yield from op.wait(rank)
        staleness = state.staleness.pop(rank)
        del state.of_rank[rank]
        if not state.of_rank:
            del self.rounds[k]
        sent = op.sent_by(rank) + self.activation_bytes[rank]
        self.activation_bytes[rank] = 0
        return staleness, sent

