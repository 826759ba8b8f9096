"""Heartbeats: where each rank is, written into a small shared file the watchdog reads.

The file is a ``ranks x FIELDS`` float64 array. Each rank owns one row and updates it with
plain memory writes through a memory map (no system call, no communication), so beating at
every iteration and around every communication hook costs a few microseconds per iteration.
The launching parent creates the file and passes its path in ``HARNESS_HEARTBEAT``; without
it (ranks launched by the user) every beat is a no-op. Times are ``time.monotonic()``, which
on Linux is one clock for every process of the host.

Consistent reads. A beat changes several cells of a row while the watchdog may be copying
it, and a copy mixing two beats once showed a rank with its pid set but no progress time
yet (a time of 0, read as "no progress since boot"). So each row carries a sequence number,
a seqlock with one writer per row: the rank makes the number odd, writes its cells, and makes
it even again; :class:`TableReader` keeps a row only when the numbers read before and after
copying it are the same even number, retries a few times otherwise, and falls back to the
row's last consistent copy (a rank descheduled in the middle of a beat). A phase switch
within an iteration (:meth:`Heartbeat.phase`) writes one cell and skips the sequence: it is
the only cell that ever changes outside a sequenced write, so a copy taken between two
sequence changes is still a state the rank was in.

What this relies on: every cell is written by one aligned 8-byte store, which is atomic on
every 64-bit CPU, and one process's stores (and another's loads) are seen in program order,
which x86-64 guarantees (TSO); Python runs each store as a separate call, in order. CPUs
with weaker ordering (ARM) could, rarely, let a reader accept a row that mixes two
consecutive beats; every cell would still be a value the rank wrote, and the watchdog never
counts progress from before the launch, so that mix cannot make it stop a healthy job.
"""

from __future__ import annotations

import contextlib
import enum
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ENV_VAR = "HARNESS_HEARTBEAT"

READ_ATTEMPTS = 10  # copies of a row being written before its last consistent copy is used
READ_RETRY_S = 0.001  # between them: sleeping lets a writer descheduled mid-beat finish


class Phase(enum.IntEnum):
    """What a rank is doing; 0 (NOT_STARTED) is what a fresh file holds."""

    NOT_STARTED = 0
    SETUP = 1  # loading, building the model, waiting at the barrier before an algorithm
    LOCAL = 2  # an iteration's local work: injected delay, compute, optimizer step
    COMMUNICATING = 3  # inside an algorithm hook (communication, or waiting for it)
    EVALUATING = 4
    RESULTS = 5  # gathering records and writing results
    DONE = 6
    FAILED = 7  # raised an error (its traceback is on stderr)


class Field(enum.IntEnum):
    """Columns of a row: 8 float64, one 64-byte cache line (the file is mapped page-aligned)."""

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


def create_table(path: str | Path, ranks: int) -> np.memmap:
    """The parent's side: a zeroed table for ``ranks`` ranks at ``path``."""
    table = np.memmap(path, dtype=np.float64, mode="w+", shape=(ranks, FIELDS))
    table[:] = 0.0
    table.flush()
    return table


@contextlib.contextmanager
def temporary_table(ranks: int) -> Iterator[tuple[str, np.memmap]]:
    """A fresh table in a temporary file for one launch: (path for ``ENV_VAR``, the table);
    the file is removed afterwards."""
    fd, path = tempfile.mkstemp(prefix="harness-heartbeat-")
    os.close(fd)
    try:
        yield path, create_table(path, ranks)
    finally:
        Path(path).unlink(missing_ok=True)


class TableReader:
    """The watchdog's side: consistent copies of the table's rows (see the module's doc)."""

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
    """A rank's side: its row of the table, or nothing when no watchdog listens.

    One writer per row: only this rank's process may write it, from one thread.
    """

    def __init__(self, path: str | Path | None, rank: int) -> None:
        self._cells = None  # the row as a memoryview: each item store is one 8-byte store
        self._seq = 0
        if path:
            rows = np.memmap(path, dtype=np.float64, mode="r+").reshape(-1, FIELDS)
            if not 0 <= rank < len(rows):
                raise ValueError(f"heartbeat table {path} has {len(rows)} rows, no row for rank {rank}")
            self._cells = memoryview(rows[rank])
            self._seq = int(self._cells[_SEQ]) + int(self._cells[_SEQ]) % 2  # continue after what is there
        self._iteration = -1
        self._slowest = 0.0
        self._done = 0

    @classmethod
    def from_env(cls, rank: int) -> Heartbeat:
        return cls(os.environ.get(ENV_VAR), rank)

    # The sequenced write: _begin, the cells, _end (inlined where it runs every iteration).
    def _begin(self) -> memoryview:
        self._seq += 1
        self._cells[_SEQ] = self._seq  # odd: being written
        return self._cells

    def _end(self) -> None:
        self._seq += 1
        self._cells[_SEQ] = self._seq  # even: consistent

    def report_in(self) -> None:
        """The rank has started: record its pid (the watchdog watches the process from now on),
        together with its phase and the time, in one consistent write."""
        if self._cells is not None:
            c = self._begin()
            c[_PID] = float(os.getpid())
            c[_ALGORITHM] = -1.0
            self._iteration = -1
            c[_ITERATION] = -1.0
            c[_PHASE] = float(Phase.SETUP)
            c[_PROGRESS_AT] = time.monotonic()
            self._end()

    def reset(self) -> None:
        """Back to a fresh table's row (not started, no pid), in one consistent write; lets a
        test replay a rank's whole life on one row."""
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
        Evaluation keeps the iteration it follows; the others have none."""
        if self._cells is not None:
            if phase != Phase.EVALUATING:
                self._iteration = -1
            c = self._begin()
            c[_ITERATION] = float(self._iteration)
            c[_PHASE] = float(phase)
            c[_PROGRESS_AT] = time.monotonic()
            self._end()
