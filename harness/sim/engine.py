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
from functools import partial
from heapq import heappop, heappush
from typing import Any

import simpy
from greenlet import getcurrent, greenlet
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
        # now(): the simulated time, for the code inside a rank. Every rank reads it several times
        # an iteration: a C-level getattr of the clock, not a method with a Python frame.
        self.now: Callable[[], float] = partial(getattr, self.env, "_now")

    # -- time, for the code inside a rank ---------------------------------------------------------
    # sleep and sleep_until park the calling rank until a time: the hot path of every simulated
    # compute, sleep and wait whose end is known. The queue entry is the rank's greenlet itself
    # (wake_after), which _run_events switches to: no event object, no callback.
    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.wake_after(getcurrent(), seconds)
            self._hub.switch()

    def sleep_until(self, when: float) -> None:
        delay = when - self.env._now
        if delay > 0:  # when > now
            self.wake_after(getcurrent(), delay)
            self._hub.switch()

    # park, current and wake_after: a wait without an event object (the sequenced receive and the
    # push channel's wait for messages, every iteration of the gossip methods on thousands of
    # ranks): the rank leaves current() where its waker finds it, parks, and the waker queues
    # its wake-up.
    current = staticmethod(getcurrent)  # the calling rank (its greenlet), for wake_after

    def park(self, what: str | Callable[[], str]) -> None:
        """Block the calling rank until :meth:`wake_after` wakes it; ``what`` names the wait, as
        :meth:`wait`'s."""
        self._waiting_for[getcurrent()] = what
        self._hub.switch()

    def wake_after(self, rank: greenlet, delay: float) -> None:
        """Wake a parked rank ``delay`` from now: its greenlet queued as the entry a
        ``simpy.Timeout`` of that delay (or an event scheduled with it) would get, the same
        place in the queue (time, NORMAL priority, event id), so the simulation is the same
        event for event."""
        env = self.env
        env.events_scheduled += 1
        heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), rank))

    def wait(self, event: simpy.Event, what: str | Callable[[], str]) -> None:
        """Block the calling rank until ``event`` has been processed (at once if it has);
        ``what`` (or what it returns, formatted only if needed) names the wait if the simulation
        deadlocks there."""
        callbacks = event.callbacks
        if callbacks is not None:
            me = getcurrent()
            self._waiting_for[me] = what
            callbacks.append(me.switch)
            self._hub.switch()

    def _run_events(self) -> None:
        """``simpy.Environment.run()`` until no event is left, its ``step`` inlined (SimPy 4's
        queue entries): the simulator processes millions of events."""
        env = self.env
        queue: list[Any] = env._queue  # SimPy's events and parked ranks' greenlets (sleep, sleep_until)
        while queue:
            env._now, _, _, event = heappop(queue)
            if event.__class__ is greenlet:  # a parked rank's wake-up
                event.switch()
                continue
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
        self._hub = getcurrent()
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
