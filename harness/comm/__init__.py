"""The native collective layer, seen from Python.

``Communicator`` wraps ``harness._core`` (C++ over MPI, one progress thread per process).
All its errors are ``CommError``.
"""

from mpi4py import MPI as _MPI  # noqa: F401  loads libmpi (with RTLD_GLOBAL) before _core needs it

from harness._core import CommError, Handle, RoundHandle, now
from harness.comm.communicator import (
    Communicator,
    Link,
    OpRecord,
    PairwiseAverager,
    PushChannel,
    WaitAvoidingAllreduce,
)

__all__ = [
    "CommError",
    "Communicator",
    "Handle",
    "Link",
    "OpRecord",
    "PairwiseAverager",
    "PushChannel",
    "RoundHandle",
    "WaitAvoidingAllreduce",
    "now",
]
