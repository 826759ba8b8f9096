"""The errors of the torch.distributed backend."""

from __future__ import annotations


class UnsupportedError(RuntimeError):
    """An operation, dtype or option the harness backend does not support; the message names
    the operation."""


class BackendInitError(RuntimeError):
    """The harness backend cannot start: ranks not started by an MPI launcher, or torch's rank and
    world size disagree with MPI's."""
