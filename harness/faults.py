"""Injected faults at run time (the scenario's ``faults:``): what this rank does, and when.

A fault is part of the experiment, like a straggler: ``kill`` ends the process with SIGKILL
(nothing is flushed or cleaned up, as after an out-of-memory kill or a node failure),
``hang`` stops the training loop while the process and its progress thread stay alive, and
``slow_start`` makes the rank report in late. A ``kill`` or ``hang`` strikes where its
``during`` says (``harness.scenario.fault_fields.IterationFault``): at the start of an iteration, just
after the rank posted a communication operation (through :meth:`FaultPlan.striking`, a
communicator that strikes there), at an evaluation, or in ``finish()``.

Before it strikes, the rank announces the fault to the watchdog (``Heartbeat.announce``, handed
to the kernel before the SIGKILL): that announcement is the watchdog's evidence that this rank is
the root cause of what follows, whatever order the other ranks then end in. What the user then
sees is the watchdog's and the launcher's business (``harness.watchdog``), not this
module's.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from harness.scenario.fault_fields import HangFault, KillFault, SlowStartFault
from harness.scenario.schema import Scenario
from harness.watchdog.heartbeat import Heartbeat
from harness.watchdog.heartbeat_row import Cause

Strike = KillFault | HangFault


class FaultPlan:
    """The faults of one rank. ``enabled=False`` (a resumed run) injects none.

    The training loop tells it where the rank is (:meth:`at_iteration`, :meth:`at_evaluation`,
    :meth:`at_finish`), and the communicator from :meth:`striking` tells it when the rank posted
    an operation; a fault due there strikes. ``beat``: the heartbeat the announcement goes to
    (:meth:`watched_by`)."""

    def __init__(self, scenario: Scenario, rank: int, enabled: bool = True) -> None:
        mine = [f for f in scenario.faults if f.rank == rank] if enabled else []
        first = scenario.algorithms[0].name
        self.start_delay_s = sum(f.delay_s for f in mine if isinstance(f, SlowStartFault))
        # (algorithm, during) -> the faults striking there, in the scenario's order (the first due wins).
        self._strikes: dict[tuple[str, str], list[Strike]] = {}
        for f in mine:
            if isinstance(f, (KillFault, HangFault)):
                self._strikes.setdefault((f.algorithm or first, f.during), []).append(f)
        self._algorithm: str | None = None
        self._iteration = -1
        self.beat = Heartbeat(None, rank)

    def __bool__(self) -> bool:
        return bool(self.start_delay_s or self._strikes)

    def watched_by(self, beat: Heartbeat) -> None:
        """Announce faults to ``beat``'s watchdog before they strike."""
        self.beat = beat

    def delay_start(self) -> None:
        """``slow_start``: sleep before the rank reports in."""
        if self.start_delay_s > 0:
            time.sleep(self.start_delay_s)

    # -- where the loop is ----------------------------------------------------------------------
    def at_iteration(self, algorithm: str, iteration: int) -> None:
        """Called at the start of every iteration: strike if a fault is due here."""
        self._algorithm, self._iteration = algorithm, iteration
        self._strike_first(algorithm, "iteration", lambda f: f.at_iteration == iteration)

    def at_evaluation(self, algorithm: str, iterations_done: int) -> None:
        """Called at the start of an evaluation after ``iterations_done`` iterations."""
        self._strike_first(algorithm, "evaluation", lambda f: iterations_done - 1 >= f.at_iteration)

    def at_finish(self, algorithm: str) -> None:
        """Called at the start of the algorithm's ``finish()``."""
        self._strike_first(algorithm, "finish", lambda f: True)

    def posted(self) -> None:
        """The rank just posted a communication operation (:meth:`striking` calls it)."""
        if self._algorithm is not None:
            self._strike_first(self._algorithm, "communication", lambda f: self._iteration >= f.at_iteration)

    def striking(self, comm: Any, algorithm: str) -> Any:
        """``comm``, or, when a ``during: communication`` fault of ``algorithm`` is due on this
        rank, a communicator that strikes just after each operation is posted."""
        if (algorithm, "communication") not in self._strikes:
            return comm
        return _Striking(comm, self)

    # -- striking -------------------------------------------------------------------------------
    def _strike_first(self, algorithm: str, during: str, due) -> None:
        for fault in self._strikes.get((algorithm, during), ()):
            if due(fault):
                self._strike(fault)

    def _strike(self, fault: Strike) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        if isinstance(fault, KillFault):
            self.beat.announce(Cause.INJECTED_KILL)  # in the kernel's hands before the SIGKILL
            os.kill(os.getpid(), signal.SIGKILL)
        self.beat.announce(Cause.INJECTED_HANG)
        while True:  # hang: sleep (never spin) until the watchdog or Ctrl+C stops the job
            time.sleep(3600)


# -- a communicator that strikes after posting ------------------------------------------------------
# Non-blocking calls strike once posted; blocking ones are posted as their non-blocking form, so
# that the fault strikes while the operation is in flight, then waited for. The persistent
# operations a communicator creates strike the same way.


class _Striking:
    """``comm`` (a ``harness.comm.Communicator``, or a call log over one) with :meth:`FaultPlan.posted`
    after every operation it posts."""

    def __init__(self, comm: Any, plan: FaultPlan) -> None:
        self._comm, self._plan = comm, plan

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def _posted(self, handle: Any) -> Any:
        self._plan.posted()
        return handle

    def iallreduce(self, buf: Any, op: str = "sum") -> Any:
        return self._posted(self._comm.iallreduce(buf, op))

    def allreduce(self, buf: Any, op: str = "sum") -> None:
        self.iallreduce(buf, op).wait()

    def ibroadcast(self, buf: Any, root: int = 0) -> Any:
        return self._posted(self._comm.ibroadcast(buf, root))

    def broadcast(self, buf: Any, root: int = 0) -> None:
        self.ibroadcast(buf, root).wait()

    def ibarrier(self) -> Any:
        return self._posted(self._comm.ibarrier())

    def barrier(self) -> None:
        self.ibarrier().wait()

    def iexchange(self, send: Any, recv: Any, peer: int) -> Any:
        return self._posted(self._comm.iexchange(send, recv, peer))

    def exchange(self, send: Any, recv: Any, peer: int) -> None:
        self.iexchange(send, recv, peer).wait()

    def push_channel(self, count: int) -> Any:
        return _StrikingPush(self._comm.push_channel(count), self._plan)

    def wait_avoiding(self, initial: Any, **kwargs: Any) -> Any:
        return _StrikingWaitAvoiding(self._comm.wait_avoiding(initial, **kwargs), self._plan)

    def pairwise_averager(self, initial: Any) -> Any:
        return _StrikingAverager(self._comm.pairwise_averager(initial), self._plan)


class _StrikingPart:
    def __init__(self, inner: Any, plan: FaultPlan) -> None:
        self._inner, self._plan = inner, plan

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _StrikingPush(_StrikingPart):
    def send(self, buf: Any, peers: Any, round: int = 0) -> Any:
        handle = self._inner.send(buf, peers, round)
        self._plan.posted()
        return handle


class _StrikingWaitAvoiding(_StrikingPart):
    def iround(self, buf: Any, out: Any, may_activate: bool = True) -> Any:
        handle = self._inner.iround(buf, out, may_activate)
        self._plan.posted()
        return handle

    def round(self, buf: Any, out: Any, may_activate: bool = True) -> dict:
        handle = self.iround(buf, out, may_activate)
        handle.wait()
        return handle.info()


class _StrikingAverager(_StrikingPart):
    # A passive AD-PSGD rank posts no request: its progress thread answers the active ranks'. Its
    # own calls, publishing its model and draining the corrections, are where it strikes, while
    # the active ranks' requests to it are in flight.
    def irequest(self, buf: Any, out: Any, peer: int) -> Any:
        handle = self._inner.irequest(buf, out, peer)
        self._plan.posted()
        return handle

    def publish(self, buf: Any) -> None:
        self._inner.publish(buf)
        self._plan.posted()

    def drain(self, out: Any) -> int:
        got = self._inner.drain(out)
        self._plan.posted()
        return got
