"""The points of a sweep: every combination of the values of the ``--sweep KEY=V1,V2,...`` given.

Each ``--sweep`` is one Hydra sweep override (``harness.scenario.overrides.parse_sweep``):
``KEY=0,160,320``, ``KEY=range(0,641,160)``, ``KEY=choice(a,b)``. The grid is their product,
the first key varying slowest: ``--sweep a=1,2 --sweep b=x,y`` gives a=1 b=x, a=1 b=y, a=2 b=x,
a=2 b=y.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.scenario.overrides import Override, OverrideError, parse_sweep

MAX_POINTS = 10_000
"""More points than this is almost certainly a typo in a range (and a directory per point)."""


@dataclass(frozen=True)
class Point:
    """One point of the grid: its index and one override per swept key, in the keys' order."""

    index: int
    overrides: tuple[Override, ...]

    @property
    def texts(self) -> list[str]:
        """Its overrides as ``KEY=VALUE`` (they parse back to the same values)."""
        return [o.text for o in self.overrides]

    @property
    def values(self) -> dict[str, Any]:
        return {o.key: o.value for o in self.overrides}

    @property
    def label(self) -> str:
        return " ".join(self.texts)


def sweep_grid(texts: Sequence[str]) -> tuple[list[str], list[Point]]:
    """(the swept keys, every point) of the ``--sweep`` arguments ``texts``; OverrideError when
    one does not parse, a key is swept twice, or the grid is larger than :data:`MAX_POINTS`."""
    keys: list[str] = []
    values: list[list[Override]] = []
    for text in texts:
        key, overrides = parse_sweep(text)
        if key in keys:
            raise OverrideError(f"--sweep {text!r}: {key} is swept twice (give its values in one --sweep)")
        keys.append(key)
        values.append(overrides)
    size = 1
    for overrides in values:
        size *= len(overrides)
    if size > MAX_POINTS:
        raise OverrideError(f"--sweep: {size:,} points (at most {MAX_POINTS:,}): check the ranges")
    return keys, [Point(i, combo) for i, combo in enumerate(itertools.product(*values))]
