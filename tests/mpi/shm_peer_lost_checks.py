"""A peer dies while the survivors wait for it in a shared-memory collective.

Run on 3 ranks by tests/test_native_errors.py under ``mpiexec -disable-auto-cleanup`` (so the
launcher leaves the survivors running). All ranks share this host, so their allreduces take the
shared-memory path. After one allreduce together, rank 1 dies (``os._exit``) and the others
allreduce again: blocking (in the caller's thread) or, with ``posted`` on the command line,
nonblocking (on the progress thread). Each survivor writes what its call raised to
``OUT.<rank>.json``, closes its communicator and exits; the ``closed`` entry says it got that far.
"""

from __future__ import annotations

import json
import os
import sys
import time

import mpi4py

# A dead peer would keep MPI_Finalize waiting for it: the survivors end without it.
mpi4py.rc.finalize = False

import numpy as np  # noqa: E402  (after mpi4py's settings)
from mpi4py import MPI  # noqa: E402

from harness.comm import CommError, Communicator  # noqa: E402


def main(out_prefix: str, posted: bool) -> int:
    world = MPI.COMM_WORLD
    comm = Communicator(world)
    x = np.ones(1000, dtype=np.float32)
    comm.allreduce(x)
    assert x[0] == world.size, x[:3]
    if world.rank == 1:
        os._exit(1)
    started = time.monotonic()
    report: dict = {"raised": None}
    try:
        if posted:
            comm.iallreduce(x).wait()  # the launch's own deadline guards a hang
        else:
            comm.allreduce(x)
    except CommError as exc:
        report = {"raised": type(exc).__name__, "kind": exc.kind.name, "message": str(exc),
                  "after_s": time.monotonic() - started}
    path = f"{out_prefix}.{world.rank}.json"
    with open(path, "w") as fh:
        json.dump(report, fh)
    comm.close()
    report["closed"] = True
    with open(path, "w") as fh:
        json.dump(report, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], "posted" in sys.argv[2:]))
