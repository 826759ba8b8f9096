"""Heartbeats: where each rank is, shipped to the watchdog wherever it runs.

Each rank owns one row of ``FIELDS`` float64 in its own memory and updates it with plain memory
writes (no system call, no communication), so beating at every iteration and around every
communication hook costs a few microseconds per iteration. A daemon thread of the rank ships
the row to the watchdog over TCP when it changed, at most every 0.2 s, and DONE and FAILED at
once (``harness.watchdog.heartbeat_net``). The watchdog's address comes from the launcher in
``HARNESS_HEARTBEAT``, or from rank 0 in a job the user started
(``harness.watchdog.in_job.join_watchdog``); without one every beat is a no-op. Times are
``time.monotonic()`` of the rank's host; what travels is their age, never the time itself.

The row's layout, the causes a rank reports, and the consistent copy live in
``harness.watchdog.heartbeat_row`` (a seqlock: see there).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from harness.watchdog.heartbeat_net import Sender
from harness.watchdog.heartbeat_row import FIELDS, Cause, Field, Phase

ENV_VAR = "HARNESS_HEARTBEAT"

# Plain ints for the writer's hot path (an IntEnum index costs a conversion on every store).
_SEQ, _PID, _PHASE, _ALGORITHM, _ITERATION, _PROGRESS_AT, _SLOWEST, _DONE, _CAUSE = (int(f) for f in Field)
_LOCAL = float(Phase.LOCAL)


class Heartbeat:
    """A rank's side: its row, shipped to the watchdog at ``url`` (``tcp://ADDRESS:PORT/KEY``), or
    nothing when ``url`` is None or the watchdog cannot be reached (a warning says so).

    One writer per row: only one thread of this rank's process may beat. :meth:`close` ships
    the last row and ends the connection.
    """

    def __init__(self, url: str | None, rank: int) -> None:
        # The row as a memoryview of doubles (None: unwatched): each item store is one 8-byte store.
        self._cells: memoryview[float] | None = None
        self._sender: Sender | None = None
        self._seq = 0
        if url:
            row = np.zeros((1, FIELDS), dtype=np.float64)
            self._sender = Sender(url, rank, row)
            if self._sender.connected:
                self._cells = memoryview(row[0]).cast("B").cast("d")  # the same cells, typed as floats
        self._iteration = -1
        self._slowest = 0.0
        self._done = 0

    @property
    def watched(self) -> bool:
        """Whether a watchdog receives this rank's beats."""
        return self._cells is not None

    def close(self) -> None:
        """Ship the last row and close the connection (the watchdog sees the rank's end)."""
        if self._sender is not None:
            self._sender.close()

    # The sequenced write: _begin, the cells, _end (inlined where it runs every iteration).
    def _begin(self, c: memoryview[float]) -> None:
        self._seq += 1
        c[_SEQ] = self._seq  # odd: being written

    def _end(self, c: memoryview[float]) -> None:
        self._seq += 1
        c[_SEQ] = self._seq  # even: consistent

    def _ship(self) -> None:
        """Hand the row to the kernel now, from this thread (only called while watched)."""
        if self._sender is not None:
            self._sender.ship()

    def report_in(self, phase: Phase = Phase.SETUP) -> None:
        """The rank has started: record its pid (the watchdog watches the process from now on),
        together with its phase (STARTING: before MPI's start-up) and the time, in one
        consistent write."""
        c = self._cells
        if c is not None:
            self._begin(c)
            c[_PID] = float(os.getpid())
            c[_ALGORITHM] = -1.0
            self._iteration = -1
            c[_ITERATION] = -1.0
            c[_PHASE] = float(phase)
            c[_PROGRESS_AT] = time.monotonic()
            self._end(c)
            if phase == Phase.STARTING:
                self._ship()  # now: MPI's start-up may hold the interpreter lock for long

    def reset(self) -> None:
        """Back to a fresh row (not started, no pid), in one consistent write; lets a test
        replay a rank's whole life on one row."""
        c = self._cells
        if c is not None:
            self._begin(c)
            for cell in (_PID, _PHASE, _ALGORITHM, _ITERATION, _PROGRESS_AT, _SLOWEST, _DONE, _CAUSE):
                c[cell] = 0.0
            self._end(c)
        self._iteration, self._slowest, self._done = -1, 0.0, 0

    def algorithm(self, index: int) -> None:
        """Set-up of the scenario's algorithm ``index`` begins."""
        c = self._cells
        if c is not None:
            self._begin(c)
            c[_ALGORITHM] = float(index)
            self._iteration = -1
            c[_ITERATION] = -1.0
            c[_PHASE] = float(Phase.SETUP)
            c[_PROGRESS_AT] = time.monotonic()
            self._end(c)

    def iteration(self, t: int) -> None:
        """Training iteration ``t`` begins: progress."""
        c = self._cells
        if c is not None:
            self._iteration = t
            seq = self._seq
            c[_SEQ] = seq + 1
            c[_ITERATION] = float(t)
            c[_PHASE] = _LOCAL
            c[_PROGRESS_AT] = time.monotonic()
            c[_SEQ] = seq + 2
            self._seq = seq + 2

    def expect(self, seconds: float) -> None:
        """The rank will sleep ``seconds`` on purpose (an injected delay): count it as progress,
        so a long delay starting mid-run is not taken for a hang."""
        c = self._cells
        if c is not None:
            self._begin(c)
            c[_PROGRESS_AT] = time.monotonic() + seconds
            self._end(c)

    def phase(self, phase: Phase) -> None:
        """Switch phase within an iteration (LOCAL <-> COMMUNICATING): not progress. One cell,
        one store: no sequence needed (see the module's doc)."""
        c = self._cells
        if c is not None:
            c[_PHASE] = float(phase)

    def iteration_done(self, seconds: float) -> None:
        c = self._cells
        if c is not None:
            self._done += 1
            if seconds > self._slowest:
                self._slowest = seconds
            seq = self._seq
            c[_SEQ] = seq + 1
            c[_SLOWEST] = self._slowest
            c[_DONE] = float(self._done)
            c[_SEQ] = seq + 2
            self._seq = seq + 2

    def stage(self, phase: Phase, cause: Cause | None = None) -> None:
        """Enter a phase outside iterations (EVALUATING, RESULTS, DONE, FAILED): progress.
        Evaluation keeps the iteration it follows, a failure the one it struck in (if any); the
        others have none. ``cause``: what the rank says about why it stops (with FAILED; see
        :meth:`failed`)."""
        c = self._cells
        if c is not None:
            if phase not in (Phase.EVALUATING, Phase.FAILED):
                self._iteration = -1
            self._begin(c)
            c[_ITERATION] = float(self._iteration)
            c[_PHASE] = float(phase)
            c[_PROGRESS_AT] = time.monotonic()
            if cause is not None:
                c[_CAUSE] = float(cause)
            self._end(c)
            if phase in (Phase.DONE, Phase.FAILED):
                # At once, and handed to the kernel before the rank goes on: it may exit right
                # after, and the row must arrive before its connection's end does.
                self._ship()

    def failed(self, exc: BaseException) -> None:
        """The rank fails with ``exc``: FAILED, with the cause the watchdog weighs (a lost peer or
        an interrupt is a consequence of something else; any other error is the rank's own)."""
        self.stage(Phase.FAILED, failure_cause(exc))

    def announce(self, cause: Cause) -> None:
        """An injected fault strikes now (INJECTED_KILL, INJECTED_HANG): said to the watchdog, and
        handed to the kernel, before it strikes, so that the verdict names this rank as its cause
        however the others then end."""
        c = self._cells
        if c is not None:
            self._begin(c)
            c[_CAUSE] = float(cause)
            c[_PROGRESS_AT] = time.monotonic()
            self._end(c)
            self._ship()


def failure_cause(exc: BaseException) -> Cause:
    """What an exception that ends a rank says about the cause: PEER_LOST for the native layer's
    ``PeerLostError`` (another rank died), INTERRUPTED for an interrupt, OWN_ERROR otherwise."""
    if isinstance(exc, KeyboardInterrupt):
        return Cause.INTERRUPTED
    core = sys.modules.get("harness._core")  # not loaded: the error cannot be the native layer's
    if core is not None and isinstance(exc, core.PeerLostError):
        return Cause.PEER_LOST
    return Cause.OWN_ERROR
