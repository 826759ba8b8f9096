"""A peer dies while this rank's message to it is held back by an emulated slow link.

Run on 2 ranks by tests/test_native_errors.py, under ``mpiexec -disable-auto-cleanup`` (so the
launcher leaves the survivor running) and a network module that notices a dead peer when a
message is posted to it (see the test). Rank 0 emulates a 1 s link to rank 1; both post an
exchange; rank 1's message arrives at once, rank 0's waits in the link emulator. Rank 1 then
dies (``os._exit``: no MPI_Finalize, its connections closed by the kernel; a death by a signal
would make the launcher end the survivor too), and when the link releases rank 0's message, MPI
refuses it. Rank 0 writes what its
wait raised to the JSON file given on the command line, closes its communicator and exits; the
file's ``closed`` entry says it got that far. Rank 1 never writes.
"""

from __future__ import annotations

import json
import os
import sys
import time

import mpi4py

# A dead peer would keep MPI_Finalize waiting for it: the survivor ends without it.
mpi4py.rc.finalize = False

import numpy as np  # noqa: E402  (after mpi4py's settings)
from mpi4py import MPI  # noqa: E402

from harness.comm import CommError, Communicator, EmulatedLink  # noqa: E402

LINK_LATENCY_S = 1.0
DIES_AFTER_S = 0.2  # well before the link releases rank 0's message


def main(out_path: str) -> int:
    world = MPI.COMM_WORLD
    comm = Communicator(world)
    if world.rank == 0:
        comm.set_links([EmulatedLink(0, 1, LINK_LATENCY_S, None)])
    world.Barrier()
    send = np.full(10, world.rank, dtype=np.float32)
    recv = np.zeros_like(send)
    posted = time.monotonic()
    handle = comm.iexchange(send, recv, 1 - world.rank)
    if world.rank == 1:
        time.sleep(DIES_AFTER_S)
        os._exit(1)
    report: dict = {"raised": None}
    try:
        handle.wait(timeout=30)
    except CommError as exc:
        report = {"raised": type(exc).__name__, "kind": exc.kind.name, "message": str(exc),
                  "after_s": time.monotonic() - posted}
    with open(out_path, "w") as fh:
        json.dump(report, fh)
    comm.close()
    report["closed"] = True
    with open(out_path, "w") as fh:
        json.dump(report, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
