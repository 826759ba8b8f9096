"""Handles of the simulated communicator's non-blocking operations, and its error.

A handle answers ``wait()``, ``done()`` and, once the operation has finished, its record
(``harness.sim.comm.SimCommunicator.drain_records``); with values (``simulate --train``) it
delivers the operation's result into the caller's buffer when the caller first sees it
complete.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.sim.engine import SimEngine
from harness.sim.primitives import Collective, Mailboxes


class SimCommError(RuntimeError):
    """An operation used in a way the native layer would refuse (wrong peer, mismatched collective)."""


class Handle:
    """A non-blocking operation's handle: ``wait()``, ``done()``, and its record once finished.

    ``deliver`` (values only, :mod:`harness.sim.payload`): what puts the operation's result
    into the caller's buffer, run once, when the caller first sees the operation complete
    (``wait()`` returning, or ``done()`` returning True)."""

    __slots__ = ("bytes", "deliver", "engine", "iteration", "name", "post", "round")

    def __init__(self, engine: SimEngine, name: str, nbytes: int, round: int = -1) -> None:
        self.engine = engine
        self.name = name
        self.post = engine.env._now
        self.bytes = nbytes
        self.round = round
        self.iteration = -1
        self.deliver: Callable[[], None] | None = None

    def _delivered(self) -> None:
        deliver, self.deliver = self.deliver, None
        assert deliver is not None  # called only while it is set
        deliver()

    def end(self) -> float | None:  # when the operation completes for this rank; None: unknown yet
        raise NotImplementedError

    def start(self) -> float:
        return self.post

    def done(self) -> bool:
        end = self.end()
        finished = end is not None and end <= self.engine.env._now
        if finished and self.deliver is not None:
            self._delivered()
        return finished

    def wait(self, timeout: float | None = None) -> None:
        raise NotImplementedError

    def times(self) -> tuple[float, float, float | None]:
        return self.post, self.start(), self.end()


class CollectiveHandle(Handle):
    __slots__ = ("op", "rank")

    def __init__(self, engine, op: Collective, rank: int) -> None:
        super().__init__(engine, op.kind, op.sent_by(rank))
        self.op, self.rank = op, rank

    def end(self):
        return self.op.done_time(self.rank)

    def wait(self, timeout=None):
        self.op.wait(self.rank)


class TimedHandle(Handle):
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


class ExchangeHandle(Handle):
    __slots__ = ("_end", "arrivals", "mail", "me", "peer", "release", "seq")

    def __init__(self, engine, mail: Mailboxes, me: int, peer: int, seq: int, nbytes: int, release: float) -> None:
        # Handle.__init__ spelled out: thousands of ranks post exchanges every iteration.
        self.engine, self.name, self.post, self.bytes, self.round, self.iteration, self.deliver = (
            engine,
            "exchange",
            engine.env._now,
            nbytes,
            -1,
            -1,
            None,
        )
        self.mail, self.me, self.peer, self.seq, self.release = mail, me, peer, seq, release
        self.arrivals = mail.pair_arrivals(peer, me)  # the peer's messages to this rank, as they are sent
        self._end = None  # known once the peer's message is: it never changes after

    def end(self):
        end = self._end
        if end is None and self.seq < len(self.arrivals):  # the peer's message is sent: its arrival known
            arrival = self.arrivals[self.seq]
            end = self._end = arrival if arrival > self.release else self.release
        return end

    def wait(self, timeout=None):
        end = self.end()
        if end is None:
            arrival = self.mail.receive(self.peer, self.me, self.seq)  # not sent yet: wait for it to be
            end = self._end = arrival if arrival > self.release else self.release
        self.engine.sleep_until(end)
        if self.deliver is not None:
            self._delivered()


class ReceiveHandle(Handle):
    """A receive (:meth:`SimCommunicator.irecv`): done when the matching message has arrived."""

    __slots__ = ("mail", "me", "peer", "seq")

    def __init__(self, engine, mail: Mailboxes, me: int, peer: int, seq: int) -> None:
        super().__init__(engine, "recv", 0)
        self.mail, self.me, self.peer, self.seq = mail, me, peer, seq

    def end(self):
        return self.mail.arrival(self.peer, self.me, self.seq)

    def wait(self, timeout=None):
        self.engine.sleep_until(self.mail.receive(self.peer, self.me, self.seq))
