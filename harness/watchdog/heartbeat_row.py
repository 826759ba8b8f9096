"""The heartbeat row: one rank's state as the watchdog reads it, and how to copy it consistently.

Both ends use it: the rank writes its row (``harness.watchdog.heartbeat``), the network carries it
(``harness.watchdog.heartbeat_net``) and the watchdog reads it (``harness.watchdog.verdict``). It
lives apart from both so that each depends on it, and neither on the other's internals.

Consistent reads. A beat changes several cells of a row while the sender thread may be copying
it (the interpreter switches threads between any two bytecodes), and a copy mixing two beats
once showed a rank with its pid set but no progress time yet (a time of 0, read as "no progress
since boot"). So each row carries a sequence number, a seqlock with one writer per row: the
rank makes the number odd, writes its cells, and makes it even again; :class:`TableReader`
keeps a row only when the numbers read before and after copying it are the same even number,
retries a few times otherwise (sleeping, which lets the writer finish its beat), and falls back
to the row's last consistent copy. A phase switch within an iteration (``Heartbeat.phase``)
writes one cell and skips the sequence: it is the only cell that ever changes outside a
sequenced write, so a copy taken between two sequence changes is still a state the rank was in.

What this relies on: every cell is written by one aligned 8-byte store, and the writer's stores
are seen in program order by the copying thread (true of threads of one CPython process on any
CPU, since they hand over the interpreter lock, and of x86-64 in general); Python runs each
store as a separate call, in order.
"""

from __future__ import annotations

import enum
import time

import numpy as np

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
    """Columns of a row: 9 float64, 72 bytes (one message on the wire)."""

    SEQUENCE = 0  # odd while the rank writes the row, even when it is consistent
    PID = 1
    PHASE = 2
    ALGORITHM = 3  # index into the scenario's algorithms; -1 before the first
    ITERATION = 4  # -1 outside training iterations
    PROGRESS_AT = 5  # monotonic time of the last progress: a new iteration or a new phase
    SLOWEST_ITERATION_S = 6  # longest finished iteration of this rank so far
    ITERATIONS_DONE = 7
    CAUSE = 8  # a Cause: what the rank said about why it stops (evidence for the watchdog's verdict)


FIELDS = len(Field)


class Cause(enum.IntEnum):
    """Why a rank stops, as the rank itself said before it went: the watchdog's evidence for which
    rank is the root cause of a failed job and which ranks only followed it."""

    NONE = 0  # said nothing: running, finished, or killed before it could say anything
    INJECTED_KILL = 1  # an injected ``kill`` strikes now (shipped just before the SIGKILL)
    INJECTED_HANG = 2  # an injected ``hang`` strikes now: the rank stops making progress on purpose
    OWN_ERROR = 3  # raised an error of its own (FAILED)
    PEER_LOST = 4  # raised because another rank's process died or its connection was lost (FAILED)
    INTERRUPTED = 5  # stopped by an interrupt (Ctrl+C, SIGTERM, the watchdog stopping the job)


# Plain ints for the reader (an IntEnum index costs a conversion).
_SEQ = int(Field.SEQUENCE)


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
