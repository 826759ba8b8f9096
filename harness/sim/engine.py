"""Simulated ranks as greenlets on one SimPy clock.

Every simulated rank runs ordinary blocking code (the training loop and the algorithm's hooks,
the very code real ranks run) in a greenlet of its own. Whenever that code would block (a
sleep, a ``wait()`` on a communication handle) it parks: it hangs a "switch back to me"
callback on a SimPy event and switches to the hub, the greenlet running SimPy's event loop.
When SimPy processes the event, the callback switches into the rank, which runs until it parks
again. So simulated time advances only through SimPy events, the ranks' code stays straight-line,
and nothing runs concurrently: results are deterministic.

Example::

    engine = SimEngine()
    engine.spawn(0, lambda: engine.sleep(1.5))
    engine.run()            # engine.now() == 1.5
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

import simpy
from greenlet import greenlet
from simpy.core import NORMAL


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules (the benchmark's events/s)."""

    def __init__(self) -> None:
        super().__init__()
        self.events_scheduled = 0

    def schedule(self, event, priority=1, delay=0):
        # simpy.Environment.schedule inlined (its queue entries, as SimPy 4 keeps them): this runs
        # for every event of thousands of simulated ranks.
        self.events_scheduled += 1
        heappush(self._queue, (self._now + delay, priority, next(self._eid), event))


class _Wake:
    """A bare SimPy-queue entry that wakes one parked rank: what ``sleep`` schedules instead of a
    ``simpy.Timeout`` (no value, no checks; the queue's order, NORMAL priority and event ids,
    are the Timeout's, so the simulation is the same event for event)."""

    __slots__ = ("_ok", "callbacks")

    def __init__(self, callback: Callable) -> None:
        self.callbacks = [callback]
        self._ok = True


class SimDeadlock(RuntimeError):
    """Simulated ranks still waiting when no event is left: they can never continue."""


class SimEngine:
    """The SimPy environment plus the greenlets of the simulated ranks."""

    def __init__(self) -> None:
        self.env = CountingEnvironment()
        self._hub: greenlet  # the greenlet running the event loop: set by run(), before any rank runs
        self._ranks: dict[int, greenlet] = {}
        self._finished: set[int] = set()
        # what a rank last blocked on (deadlock reports), or what says it
        self._waiting_for: dict[greenlet, str | Callable[[], str]] = {}

    # -- time, for the code inside a rank ---------------------------------------------------------
    def now(self) -> float:
        return self.env.now

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._wake_after(seconds)

    def sleep_until(self, when: float) -> None:
        now = self.env._now
        if when > now:
            self._wake_after(when - now)

    def _wake_after(self, delay: float) -> None:
        """Park the calling rank until ``delay`` from now: the hot path of every simulated
        compute, sleep and wait whose end is known."""
        env = self.env
        env.events_scheduled += 1
        queue: list[Any] = env._queue  # SimPy's events and the _Wake entries that stand in for Timeouts
        heappush(queue, (env._now + delay, NORMAL, next(env._eid), _Wake(greenlet.getcurrent().switch)))
        self._hub.switch()

    def wait(self, event: simpy.Event, what: str | Callable[[], str]) -> None:
        """Block the calling rank until ``event`` has been processed (at once if it has);
        ``what`` (or what it returns, formatted only if needed) names the wait if the simulation
        deadlocks there."""
        if event.callbacks is not None:
            self._waiting_for[greenlet.getcurrent()] = what
            self._park(event)

    def _park(self, event: simpy.Event) -> None:
        event.callbacks.append(greenlet.getcurrent().switch)
        self._hub.switch()

    def _run_events(self) -> None:
        """``simpy.Environment.run()`` until no event is left, its ``step`` inlined (SimPy 4's
        queue entries): the simulator processes millions of events."""
        env = self.env
        queue: list[Any] = env._queue  # SimPy's events and _Wake entries (whose callbacks are cleared too)
        while queue:
            env._now, _, _, event = heappop(queue)
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):
                raise event._value

    # -- ranks ----------------------------------------------------------------------------------
    def spawn(self, rank: int, body: Callable[[], None], at: float = 0.0) -> None:
        """Run ``body()`` as simulated rank ``rank``, starting at simulated time ``at``."""

        def run(_event: object) -> None:  # first switched to by SimPy's callback, with the event
            body()
            self._finished.add(rank)

        g = greenlet(run)
        self._ranks[rank] = g
        self.env.timeout(max(0.0, at)).callbacks.append(g.switch)

    def run(self) -> None:
        """Process events until none is left; raise :class:`SimDeadlock` if a rank is still blocked.

        An exception inside a rank propagates out of here (through SimPy's event loop).
        """
        self._hub = greenlet.getcurrent()
        for g in self._ranks.values():
            g.parent = self._hub
        self._run_events()
        stuck = sorted(set(self._ranks) - self._finished)
        if stuck:

            def what(r: int) -> str:
                label = self._waiting_for.get(self._ranks[r], "time")
                return label() if callable(label) else label

            shown = ", ".join(f"rank {r} waits for {what(r)}" for r in stuck[:8])
            more = f" and {len(stuck) - 8} more" if len(stuck) > 8 else ""
            raise SimDeadlock(
                f"simulation deadlocked at t={self.env.now:.6f} s: {len(stuck)} ranks wait forever: {shown}{more}"
            )
