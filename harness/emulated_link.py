"""One directed link whose delay the native layer emulates at the sender: the one definition the
scenario's link table (``harness.scenario.network``), the communicator (``harness.comm``) and the
simulator's network (``harness.sim.network``) share.

A module of its own, depending on nothing, so that the communicator can take links without
loading the scenario's models.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EmulatedLink:
    """Link ``src -> dst``: one-way latency in seconds, bandwidth in bytes/s (None: no emulated limit)."""

    src: int
    dst: int
    latency_s: float = 0.0
    bandwidth_bytes_per_s: float | None = None
