"""The native layer's shared-memory path, as Python sees it: the one warning when it is missing.

Ranks that share a host run their collectives through a shared segment (``kernels/shm_*``).
When the segment cannot be made (no space in ``/dev/shm``, a missing ``HARNESS_SHM_DIR``), the
collectives take the message path instead, and each communicator or group says so once.
``HARNESS_SHM=0`` turns the path off on purpose (no warning).
"""

from __future__ import annotations

import warnings


class SharedMemoryFallback(RuntimeWarning):
    """The shared-memory path could not be set up; collectives use MPI messages instead."""


def warn_shm_fallback(reason: str) -> None:
    """Warn (once per communicator or group) that the ranks on this host have no shared segment."""
    if reason:
        warnings.warn(
            f"no shared-memory segment for the ranks on this host ({reason}); "
            "their collectives use MPI messages instead",
            SharedMemoryFallback,
            stacklevel=3,
        )
