"""The native collective layer, seen from Python.

``Communicator`` wraps ``harness._core`` (C++ over MPI, one progress thread per process).
All its errors are ``CommError``, whose ``kind`` (an ``ErrorKind``) says what failed;
``PeerLostError``, the ``CommError`` of kind ``PEER_LOST``, says that another rank's process
died or its connection was lost (what a surviving rank sees of a peer's death). The names are
loaded on first use, so that the parts of this package that need neither MPI nor the native
layer (``op_record``, ``call_log``) can be imported by the simulator without starting MPI.
"""

from __future__ import annotations

import importlib
from typing import Any

_FROM = {
    "CommError": "harness._core",
    "PeerLostError": "harness._core",
    "ErrorKind": "harness._core",
    "Handle": "harness._core",
    "RoundHandle": "harness._core",
    "now": "harness._core",
    "Communicator": "harness.comm.communicator",
    "EmulatedLink": "harness.emulated_link",
    "PairwiseAverager": "harness.comm.communicator",
    "PushChannel": "harness.comm.communicator",
    "WaitAvoidingAllreduce": "harness.comm.communicator",
    "OpRecord": "harness.comm.op_record",
}

__all__ = sorted(_FROM)


def __getattr__(name: str) -> Any:
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module 'harness.comm' has no attribute {name!r}")
    if module == "harness._core":
        importlib.import_module("harness.comm.communicator")  # starts MPI, on the native layer's library
    return getattr(importlib.import_module(module), name)
