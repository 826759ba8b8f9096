"""The record of one finished communication operation, the same for the native layer and the simulator.

Its own module so that the simulator (``harness.sim.comm``) can make records without loading
MPI or the native layer.
"""

from __future__ import annotations

from typing import NamedTuple


class OpRecord(NamedTuple):
    """One finished native operation: times on the ``time.monotonic()`` clock, bytes sent."""

    op: str
    post_s: float
    start_s: float
    end_s: float
    bytes: int
    round: int
    # The iteration that posted it, where the communicator knows (the simulator: -1 for none,
    # e.g. in finish()); None: unknown (the native layer), the loop then goes by post_s.
    iteration: int | None = None
