"""Waiting for MPI without spinning: MPICH's blocking calls (Barrier, Recv, Wait) poll a core
until they return, and ranks usually outnumber cores, so a rank that waits long (for its turn,
for late peers) takes the CPU from the ranks it waits for. These wait by testing a non-blocking
request between short sleeps instead. Nothing here imports mpi4py: callers pass its objects."""

from __future__ import annotations

import time
from typing import Any

MAX_PAUSE_S = 5e-4  # the longest sleep between two tests of a request


def wait_asleep(request: Any, max_pause_s: float = MAX_PAUSE_S) -> None:
    """Wait for an mpi4py ``request``, sleeping between tests (from 10 us, doubling, up to
    ``max_pause_s``): a quick completion costs little delay, a long wait few wake-ups."""
    pause = 1e-5
    while not request.Test():
        time.sleep(pause)
        pause = min(pause * 2, max_pause_s)


def quiet_barrier(comm: Any) -> None:
    """A barrier over the mpi4py communicator ``comm`` that sleeps while it waits."""
    wait_asleep(comm.Ibarrier())
