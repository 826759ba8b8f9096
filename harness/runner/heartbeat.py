"""Heartbeats: where each rank is, shipped to the watchdog wherever it runs.

Each rank owns one row of ``FIELDS`` float64 in its own memory and updates it with plain memory
writes (no system call, no communication), so beating at every iteration and around every
communication hook costs a few microseconds per iteration. A daemon thread of the rank ships
the row to the watchdog over TCP when it changed, at most every 0.2 s, and DONE and FAILED at
once (``harness.runner.heartbeat_net``). The watchdog's address comes from the launcher in
``HARNESS_HEARTBEAT``, or from rank 0 in a job the user started
(``harness.runner.watchdog.join_watchdog``); without one every beat is a no-op. Times are
``time.monotonic()`` of the rank's host; what travels is their age, never the time itself.

Consistent reads. A beat changes several cells of a row while the sender thread may be copying
it (the interpreter switches threads between any two bytecodes), and a copy mixing two beats
once showed a rank with its pid set but no progress time yet (a time of 0, read as "no progress
since boot"). So each row carries a sequence number, a seqlock with one writer per row: the
rank makes the number odd, writes its cells, and makes it even again; :class:`TableReader`
keeps a row only when the numbers read before and after copying it are the same even number,
retries a few times otherwise (sleeping, which lets the writer finish its beat), and falls back
to the row's last consistent copy. A phase switch within an iteration (:meth:`Heartbeat.phase`)
writes one cell and skips the sequence: it is the only cell that ever changes outside a
sequenced write, so a copy taken between two sequence changes is still a state the rank was in.

What this relies on: every cell is written by one aligned 8-byte store, and the writer's stores
are seen in program order by the copying thread (true of threads of one CPython process on any
CPU, since they hand over the interpreter lock, and of x86-64 in general); Python runs each
store as a separate call, in order.
"""

from __future__ import annotations

import enum
import os
import time

import numpy as np

ENV_VAR = "HARNESS_HEARTBEAT"

READ_ATTEMPTS = 10  # copies of a row being written before its last consistent copy is used
READ_RETRY_S = 0.001  # between them: sleeping lets a writer descheduled mid-beat finish


class Phase(enum.IntEnum):
    """What a rank is doing; 0 (NOT_STARTED) is what a fresh row holds."""

    NOT_STARTED = 0
    SETUP = 1  # loading, building the model, waiting at the barrier before an algorithm
    LOCAL = 2  # an iteration's local work: injected delay, compute, optimizer step
    COMMUNICATING = 3  # inside an algorithm hook (communication, or waiting for it)
    EVALUATING = 4
    RESULTS = 5  # gathering records and writing results
    DONE = 6
    FAILED = 7  # raised an error (its traceback is on stderr)
    STARTING = 8  # the process runs, in MPI's start-up, which waits for every rank on every host


class Field(enum.IntEnum):
    """Columns of a row: 8 float64, 64 bytes (one message on the wire)."""

    SEQUENCE = 0  # odd while the rank writes the row, even when it is consistent
    PID = 1
    PHASE = 2
    ALGORITHM = 3  # index into the scenario's algorithms; -1 before the first
    ITERATION = 4  # -1 outside training iterations
    PROGRESS_AT = 5  # monotonic time of the last progress: a new iteration or a new phase
    SLOWEST_ITERATION_S = 6  # longest finished iteration of this rank so far
    ITERATIONS_DONE = 7


FIELDS = len(Field)

# Plain ints for the writer's hot path (an IntEnum index costs a conversion on every store).
_SEQ, _PID, _PHASE, _ALGORITHM, _ITERATION, _PROGRESS_AT, _SLOWEST, _DONE = (int(f) for f in Field)
_LOCAL = float(Phase.LOCAL)


class TableReader:
    """Consistent copies of the rows of ``table`` (a ``rows x FIELDS`` array that other threads
    write, one writer per row; see the module's doc). The sender thread reads its rank's row so."""

    def __init__(self, table: np.ndarray) -> None:
        self._table = table
        self._last = np.zeros(table.shape, dtype=np.float64)  # a fresh table: nobody started

    def read(self) -> np.ndarray:
        """Every row as its rank last wrote it completely (a ``ranks x FIELDS`` copy)."""
        pending = np.ones(len(self._table), dtype=bool)
        for attempt in range(READ_ATTEMPTS):
            if attempt:
                time.sleep(READ_RETRY_S)
            before = np.array(self._table[:, _SEQ])
            rows = np.array(self._table)
            after = np.array(self._table[:, _SEQ])
            whole = pending & (before == after) & (before % 2 == 0)
            self._last[whole] = rows[whole]
            pending &= ~whole
            if not pending.any():
                break
        return self._last.copy()


class Heartbeat:
    """A rank's side: its row, shipped to the watchdog at ``url`` (``tcp://ADDRESS:PORT/KEY``), or
    nothing when ``url`` is None or the watchdog cannot be reached (a warning says so).

    One writer per row: only one thread of this rank's process may beat. :meth:`close` ships
    the last row and ends the connection.
    """

    def __init__(self, url: str | None, rank: int) -> None:
        self._cells = None  # the row as a memoryview: each item store is one 8-byte store
        self._sender = None
        self._seq = 0
        if url:
            from harness.runner.heartbeat_net import Sender  # here: it imports this module

            row = np.zeros((1, FIELDS), dtype=np.float64)
            self._sender = Sender(url, rank, row)
            if self._sender.connected:
                self._cells = memoryview(row[0])
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
    def _begin(self) -> memoryview:
        self._seq += 1
        self._cells[_SEQ] = self._seq  # odd: being written
        return self._cells

    def _end(self) -> None:
        self._seq += 1
        self._cells[_SEQ] = self._seq  # even: consistent

    def report_in(self, phase: Phase = Phase.SETUP) -> None:
        """The rank has started: record its pid (the watchdog watches the process from now on),
        together with its phase (STARTING: before MPI's start-up) and the time, in one
        consistent write."""
        if self._cells is not None:
            c = self._begin()
            c[_PID] = float(os.getpid())
            c[_ALGORITHM] = -1.0
            self._iteration = -1
            c[_ITERATION] = -1.0
            c[_PHASE] = float(phase)
            c[_PROGRESS_AT] = time.monotonic()
            self._end()
            if phase == Phase.STARTING:
                self._sender.ship()  # now: MPI's start-up may hold the interpreter lock for long

    def reset(self) -> None:
        """Back to a fresh row (not started, no pid), in one consistent write; lets a test
        replay a rank's whole life on one row."""
        if self._cells is not None:
            c = self._begin()
            for cell in (_PID, _PHASE, _ALGORITHM, _ITERATION, _PROGRESS_AT, _SLOWEST, _DONE):
                c[cell] = 0.0
            self._end()
        self._iteration, self._slowest, self._done = -1, 0.0, 0

    def algorithm(self, index: int) -> None:
        """Set-up of the scenario's algorithm ``index`` begins."""
        if self._cells is not None:
            c = self._begin()
            c[_ALGORITHM] = float(index)
            self._iteration = -1
            c[_ITERATION] = -1.0
            c[_PHASE] = float(Phase.SETUP)
            c[_PROGRESS_AT] = time.monotonic()
            self._end()

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
        if self._cells is not None:
            c = self._begin()
            c[_PROGRESS_AT] = time.monotonic() + seconds
            self._end()

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

    def stage(self, phase: Phase) -> None:
        """Enter a phase outside iterations (EVALUATING, RESULTS, DONE, FAILED): progress.
        Evaluation keeps the iteration it follows, a failure the one it struck in (if any); the
        others have none."""
        if self._cells is not None:
            if phase not in (Phase.EVALUATING, Phase.FAILED):
                self._iteration = -1
            c = self._begin()
            c[_ITERATION] = float(self._iteration)
            c[_PHASE] = float(phase)
            c[_PROGRESS_AT] = time.monotonic()
            self._end()
            if phase in (Phase.DONE, Phase.FAILED):
                # At once, and handed to the kernel before the rank goes on: it may exit right
                # after, and the row must arrive before its connection's end does.
                self._sender.ship()
