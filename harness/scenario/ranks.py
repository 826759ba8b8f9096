"""Rank fields of a scenario and the checks that need the rank count (which only ``Scenario``
knows: the field models' ``check(ranks)`` methods call these, and errors carry the field path)."""

from __future__ import annotations

from typing import Any

from harness.errors import ParamError
from harness.strict_model import NonNegativeInt

Rank = NonNegativeInt  # "< ranks" is checked by Scenario, which knows ranks
MAX_RANKS = 1 << 16  # far beyond any run here; stops a typo from allocating per-rank tables


def check_rank(path: str | tuple[str | int, ...], rank: int, ranks: int) -> None:
    """Raise ParamError at ``path`` unless ``rank`` exists."""
    if rank >= ranks:
        raise ParamError(path, f"rank must be < ranks ({ranks})", rank)


def check_ranks(field: str, values: list[int], ranks: int) -> None:
    """Raise ParamError at ``field[j]`` for a rank that does not exist or is listed twice."""
    for j, rank in enumerate(values):
        check_rank((field, j), rank, ranks)
        if rank in values[:j]:
            raise ParamError((field, j), "rank listed twice", rank)


def check_each(items: list[Any], ranks: int, *prefix: str) -> None:
    """Run ``check(ranks)`` on every item; an error's path gets ``prefix`` and the item index."""
    for i, item in enumerate(items):
        try:
            item.check(ranks)
        except ParamError as exc:
            raise exc.within(*prefix, i) from None
