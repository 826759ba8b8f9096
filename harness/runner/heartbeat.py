"""Heartbeats: where each rank is, written into a small shared file the watchdog reads.

The file is a ``ranks x FIELDS`` float64 array. Each rank owns one row and updates it with
plain memory writes through ``numpy.memmap`` (no system call, no communication), so beating
at every iteration and around every communication hook costs nothing measurable. The launching
parent creates the file and passes its path in ``HARNESS_HEARTBEAT``; without it (ranks
launched by the user) every beat is a no-op. Times are ``time.monotonic()``, which on Linux is
one clock for every process of the host.
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
    """Columns of a row."""

    PID = 0
    PHASE = 1
    ALGORITHM = 2  # index into the scenario's algorithms; -1 before the first
    ITERATION = 3  # -1 outside training iterations
    PROGRESS_AT = 4  # monotonic time of the last progress: a new iteration or a new phase
    SLOWEST_ITERATION_S = 5  # longest finished iteration of this rank so far
    ITERATIONS_DONE = 6


FIELDS = len(Field)


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


class Heartbeat:
    """A rank's side: its row of the table, or nothing when no watchdog listens."""

    def __init__(self, path: str | Path | None, rank: int) -> None:
        self._row = None
        if path:
            table = np.memmap(path, dtype=np.float64, mode="r+")
            self._row = table.reshape(-1, FIELDS)[rank]
        self._slowest = 0.0
        self._done = 0

    @classmethod
    def from_env(cls, rank: int) -> Heartbeat:
        return cls(os.environ.get(ENV_VAR), rank)

    def report_in(self) -> None:
        """The rank has started: record its pid (the watchdog watches the process from now on)."""
        if self._row is not None:
            self._row[Field.PID] = os.getpid()
            self._row[Field.ALGORITHM] = -1
            self._set(Phase.SETUP, iteration=-1)

    def algorithm(self, index: int) -> None:
        """Set-up of the scenario's algorithm ``index`` begins."""
        if self._row is not None:
            self._row[Field.ALGORITHM] = index
            self._set(Phase.SETUP, iteration=-1)

    def iteration(self, t: int) -> None:
        """Training iteration ``t`` begins: progress."""
        if self._row is not None:
            self._set(Phase.LOCAL, iteration=t)

    def expect(self, seconds: float) -> None:
        """The rank will sleep ``seconds`` on purpose (an injected delay): count it as progress,
        so a long delay starting mid-run is not taken for a hang."""
        if self._row is not None:
            self._row[Field.PROGRESS_AT] = time.monotonic() + seconds

    def phase(self, phase: Phase) -> None:
        """Switch phase within an iteration (LOCAL <-> COMMUNICATING): not progress."""
        if self._row is not None:
            self._row[Field.PHASE] = phase

    def iteration_done(self, seconds: float) -> None:
        if self._row is not None:
            self._done += 1
            self._slowest = max(self._slowest, seconds)
            self._row[Field.SLOWEST_ITERATION_S] = self._slowest
            self._row[Field.ITERATIONS_DONE] = self._done

    def stage(self, phase: Phase) -> None:
        """Enter a phase outside iterations (EVALUATING, RESULTS, DONE, FAILED): progress."""
        if self._row is not None:
            self._set(phase, iteration=int(self._row[Field.ITERATION]) if phase == Phase.EVALUATING else -1)

    def _set(self, phase: Phase, iteration: int) -> None:
        row = self._row
        row[Field.ITERATION] = iteration
        row[Field.PHASE] = phase
        row[Field.PROGRESS_AT] = time.monotonic()  # last: a reader never sees new time, old place
