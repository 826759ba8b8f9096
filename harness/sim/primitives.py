"""Simulated transport: collectives and point-to-point messages in simulated time.

- :class:`Collective`: an allreduce, barrier or broadcast over a member list. Members join
  (their own call, or a progress thread on their behalf); once the last one has joined, every
  member's completion time follows from the join times by the native layer's step program
  (:func:`harness.sim.collective_timing.run_program`), computed at once, so a waiting rank needs one
  timeout instead of an event per step.
- :class:`Mailboxes`: point-to-point messages, counted per receiver and round (the push
  channel keeps arrivals by itself, per round) and sequenced per (src, dst) pair (exchanges,
  which MPI matches in posting order).

Nothing here knows an algorithm: :mod:`harness.sim.comm` builds the communicator's operations
on these.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import simpy

from harness.sim.collective_timing import broadcast_times, run_program
from harness.sim.engine import SimEngine
from harness.sim.network import SimNetwork
from harness.sim.payload import Deferred, Payload
from harness.sim.step_programs import (
    FLOAT_BYTES,
    GROUP_KINDS,
    RingProgram,
    StepProgram,
    barrier_program,
    group_program,
)

if TYPE_CHECKING:
    import torch
    from greenlet import greenlet


class Collective:
    """One collective over ``members`` (ranks, in the program's member order).

    ``kind``: ``"allreduce"`` of ``count`` floats, ``"barrier"``, ``"broadcast"`` of
    ``count`` floats from member index ``root``, or one of the torch.distributed backend's group
    operations (:data:`harness.sim.step_programs.GROUP_KINDS`, sized as :func:`group_program` says).
    """

    __slots__ = (
        "_sent",
        "buffers",
        "complete",
        "count",
        "done_at",
        "engine",
        "in_place",
        "index",
        "join_at",
        "joined",
        "kind",
        "members",
        "network",
        "program",
        "reduce",
        "result",
        "root",
        "values_ready",
    )

    def __init__(
        self,
        engine: SimEngine,
        network: SimNetwork,
        kind: str,
        members: Sequence[int],
        count: int,
        root: int = 0,
        reduce: str = "sum",
        in_place: bool = True,
    ) -> None:
        self.engine = engine
        self.network = network
        self.kind = kind
        self.members = tuple(members)
        self.index = dict(zip(self.members, range(len(self.members))))
        self.count = count
        self.root = root
        self.join_at = [0.0] * len(self.members)
        self._sent: list[int] | None = None
        self.joined = 0
        self.done_at: list[float] | None = None
        self.complete = engine.env.event()
        # Values (simulate --train, harness.sim.payload): each member's buffer, combined once
        # the last member joins; ``result`` holds the combination (written into every buffer
        # when ``in_place``).
        self.buffers: list | None = None
        self.reduce, self.in_place = reduce, in_place
        self.result: torch.Tensor | None = None
        self.values_ready: simpy.Event | None = None  # made by a rank waiting for deferred values
        self.program: StepProgram | RingProgram | None
        if kind == "allreduce":
            self.program = network.allreduce_program(self.members, count)
        elif kind == "barrier":
            self.program = barrier_program(len(self.members))
        elif kind in GROUP_KINDS:
            self.program = group_program(kind, len(self.members), count, root)
        else:
            self.program = None

    def join(self, rank: int, buf=None) -> None:
        """``rank`` contributes now (its own call, or its progress thread on its behalf);
        ``buf``: its buffer, when the simulation carries values."""
        i = self.index[rank]
        self.join_at[i] = self.engine.env._now
        self.joined += 1
        if buf is not None:
            if self.buffers is None:
                self.buffers = [None] * len(self.members)
            self.buffers[i] = buf
        if self.joined == len(self.members):
            if self.buffers is not None:
                self._combine_when_filled()
            if self.program is None:
                self.done_at = broadcast_times(
                    len(self.members), self.root, self.members, self.join_at, self.count * FLOAT_BYTES, self.network
                )
            else:
                self.done_at = run_program(self.program, self.members, self.join_at, self.network)
            self.complete.succeed()

    def _combine_when_filled(self) -> None:
        """Combine the members' values, once every contribution has them (a contribution a
        replay defers, ``harness.sim.payload.Deferred``, fills in later)."""
        held = self.buffers
        assert held is not None  # called while the members' buffers are held
        open_ = [b for b in held if isinstance(b, Deferred) and b.values is None]
        if open_:
            open_[0].when_filled(self._combine_when_filled)
            return
        buffers = [b.values if isinstance(b, Deferred) else b for b in held]
        self.result = Payload.combine(self.kind, buffers, self.reduce, self.root, self.in_place, self.program)
        self.buffers = None
        if self.values_ready is not None:
            self.values_ready.succeed()

    def wait_values(self) -> None:
        """Block the calling rank until the collective's values are combined (at once unless a
        replay deferred a contribution)."""
        if self.result is None and self.buffers is not None:
            if self.values_ready is None:
                self.values_ready = self.engine.env.event()
            self.engine.wait(
                self.values_ready,
                lambda: (
                    f"the values of a {self.kind} over {len(self.members)} "
                    "ranks (a contribution the replay recorded as fresher)"
                ),
            )

    def done_time(self, rank: int) -> float | None:
        """When ``rank``'s part completes; None while members are missing."""
        return None if self.done_at is None else self.done_at[self.index[rank]]

    def wait(self, rank: int) -> None:
        """Block ``rank`` until its part of the collective has completed."""
        done_at = self.done_at
        if done_at is None:
            self.engine.wait(
                self.complete,
                lambda: (
                    f"a {self.kind} over {len(self.members)} ranks ({len(self.members) - self.joined} have not joined)"
                ),
            )
            done_at = self.done_at
            assert done_at is not None  # the last member's join set it
        self.engine.sleep_until(done_at[self.index[rank]])

    def sent_by(self, rank: int) -> int:
        """Bytes ``rank`` sends in this collective (the native layer's count)."""
        if self.program is not None:
            if self._sent is None:
                self._sent = self.program.bytes_sent.astype(np.int64).tolist()  # int() of each, at C speed
            return self._sent[self.index[rank]]
        return broadcast_bytes_sent(len(self.members), self.root, self.index[rank], self.count * FLOAT_BYTES)


def broadcast_bytes_sent(p: int, root: int, me: int, nbytes: int) -> int:
    """Bytes member ``me`` sends in the native binomial broadcast: one message per child."""
    v = (me - root) % p
    mask = 1
    while mask < p and not v & mask:
        mask <<= 1
    children = 0
    mask >>= 1
    while mask > 0:
        if v + mask < p:
            children += 1
        mask >>= 1
    return children * nbytes


class Mailboxes:
    """Point-to-point messages between ranks over the simulated network."""

    def __init__(self, engine: SimEngine, network: SimNetwork, ranks: int) -> None:
        self.engine = engine
        self.env = engine.env
        self.network = network
        self._inbox: list[dict[int, list[float]]] = [{} for _ in range(ranks)]  # rank -> round -> arrivals not taken
        # a rank blocked in wait_count: (its round, its event with a deadline, else the parked rank)
        self._waiter: list[tuple[int | None, simpy.Event | greenlet] | None] = [None] * ranks
        self._ranks = ranks
        # src * ranks + dst -> arrival of each message (a pair's list made when first used)
        self._pair_arrivals: defaultdict[int, list[float]] = defaultdict(list)
        self._pair_waiters: dict[tuple[int, int], greenlet] = {}  # (pair, seq) -> receiver waiting (parked)

    # -- counted, per round (the push channel) ------------------------------------------------------
    # Arrival times are known when a message is pushed, so nothing is scheduled per message: a
    # rank counts the arrivals at or before "now" when it looks, and a rank that waits for k of
    # them sleeps until the k-th arrival (woken early only when a message it needs is pushed).

    def push(self, src: int, dst: int, nbytes: int, round: int) -> float:
        """Send a push message of gossip ``round`` now; returns when the send completes (the
        native channel's sends are synchronous and the receiver always listens: on arrival)."""
        _, arrival = self.network.message(src, dst, nbytes, self.env._now)
        box = self._inbox[dst]
        times = box.get(round)
        if times is None:
            box[round] = [arrival]
        else:
            times.append(arrival)
        waiter = self._waiter[dst]
        if waiter is not None and (waiter[0] is None or waiter[0] == round):  # it recomputes: wake it now
            self._waiter[dst] = None
            waker = waiter[1]
            if isinstance(waker, simpy.Event):  # a wait with a deadline
                waker.succeed()
            else:  # a parked rank (what succeed() would schedule, without the event)
                self.engine.wake_after(waker, 0.0)
        return arrival

    def _arrivals(self, rank: int, round: int | None) -> list[float]:
        box = self._inbox[rank]
        if round is not None:
            return box.get(round, [])
        return [a for times in box.values() for a in times]

    def pending(self, rank: int, round: int | None) -> int:
        """Messages (of ``round``, or of every round) arrived at ``rank`` by now and not taken yet."""
        now = self.env.now
        return sum(1 for a in self._arrivals(rank, round) if a <= now)

    def wait_count(self, rank: int, at_least: int, round: int | None, timeout: float | None) -> bool:
        """Block until ``at_least`` messages (of ``round``, or of every round) are pending at
        ``rank``, or ``timeout`` seconds passed; returns whether they are."""
        env = self.env
        deadline = None if timeout is None else env.now + timeout
        while True:
            times = self._arrivals(rank, round)
            if len(times) >= at_least:
                ready = sorted(times)[at_least - 1] if at_least > 0 else env.now
                if deadline is not None and ready > deadline:
                    self.engine.sleep_until(deadline)
                    return False
                self.engine.sleep_until(ready)
                return True
            what = lambda: f"{at_least} push messages" + ("" if round is None else f" of round {round}")  # noqa: E731
            if deadline is None:  # parked until a push of its round wakes it
                self._waiter[rank] = (round, self.engine.current())
                self.engine.park(what)
            else:
                event = env.event()
                self._waiter[rank] = (round, event)
                self.engine.wait(env.any_of([event, env.timeout(max(0.0, deadline - env.now))]), what)
                if not event.triggered:
                    self._waiter[rank] = None
                    return False

    def take(self, rank: int, round: int | None) -> int:
        """Take every message (of ``round``, or of every round) arrived at ``rank`` by now; how many."""
        now = self.env._now
        box = self._inbox[rank]
        taken = 0
        for r in [round] if round is not None else list(box):
            times = box.get(r)
            if not times:
                continue
            later = [a for a in times if a > now]
            taken += len(times) - len(later)
            if later:
                box[r] = later
            else:
                del box[r]
        return taken

    # -- sequenced (exchange) -------------------------------------------------------------------
    def send(self, src: int, dst: int, nbytes: int) -> float:
        """Send the next message of pair (src, dst) now; returns its release time (send complete)."""
        now = self.env._now
        release, arrival = self.network.message(src, dst, nbytes, now)
        pair = src * self._ranks + dst
        arrivals = self._pair_arrivals[pair]
        seq = len(arrivals)
        arrivals.append(arrival)
        if self._pair_waiters:
            receiver = self._pair_waiters.pop((pair, seq), None)
            if receiver is not None:  # the receiver waits: wake it when the message arrives
                self.engine.wake_after(receiver, max(0.0, arrival - now))
        return release

    def pair_arrivals(self, src: int, dst: int) -> list[float]:
        """The arrivals of the messages from ``src`` to ``dst``, in sequence: the list itself,
        which grows as they are sent."""
        return self._pair_arrivals[src * self._ranks + dst]

    def arrival(self, src: int, dst: int, seq: int) -> float | None:
        """When the ``seq``-th message (0-based) from ``src`` reaches ``dst``; None: not sent yet."""
        arrivals = self._pair_arrivals.get(src * self._ranks + dst)
        return arrivals[seq] if arrivals is not None and seq < len(arrivals) else None

    def receive(self, src: int, dst: int, seq: int) -> float:
        """Block ``dst`` until the ``seq``-th message (0-based) from ``src`` has arrived; its arrival."""
        when = self.arrival(src, dst, seq)
        if when is None:  # not sent yet: the sender wakes this rank at the arrival
            self._pair_waiters[(src * self._ranks + dst, seq)] = self.engine.current()
            self.engine.park(lambda: f"message {seq} from rank {src}")
            when = self.arrival(src, dst, seq)
            assert when is not None  # the event fires when the message is sent
        self.engine.sleep_until(when)
        return when
