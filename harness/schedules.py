"""Who talks to whom at iteration t: pure schedule functions shared by the real run and the simulator.

Nothing here communicates or keeps state; every function is a pure function of its
arguments, so every rank (and the SimPy model) derives the same pattern independently.

>>> wagma_radices(64, 8)
[8, 8]
>>> wagma_group(9, 64, 8, phase=1)
[1, 9, 17, 25, 33, 41, 49, 57]
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=None)
def wagma_radices(ranks: int, group_size: int) -> list[int]:
    """Mixed-radix decomposition of ``ranks`` used to form WAGMA-SGD groups.

    With ``ranks == group_size ** L`` this is ``[group_size] * L`` (the paper's base-S digits).
    Otherwise (documented rule): repeatedly take the largest divisor of what is left that is at
    most ``group_size``; a prime factor larger than ``group_size`` becomes a digit of its own, so
    its groups are larger than asked (e.g. 5 ranks with group size 4 average all 5 each round).
    Each phase then has groups of equal size, and information reaches every rank in
    ``len(radices)`` consecutive phases.
    """
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1 (got {ranks})")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1 (got {group_size})")
    radices: list[int] = []
    left = ranks
    while left > 1:
        divisor = next((d for d in range(min(group_size, left), 1, -1) if left % d == 0), None)
        if divisor is None:  # smallest prime factor, which exceeds group_size
            divisor = next(d for d in range(2, left + 1) if left % d == 0)
        radices.append(divisor)
        left //= divisor
    return radices or [1]


def wagma_group(rank: int, ranks: int, group_size: int, phase: int) -> list[int]:
    """Sorted members of ``rank``'s WAGMA group in ``phase``: the ranks that differ from ``rank``
    only in mixed-radix digit ``phase % L``."""
    if not 0 <= rank < ranks:
        raise ValueError(f"rank {rank} out of range [0, {ranks})")
    radices = wagma_radices(ranks, group_size)
    digit = phase % len(radices)
    weight = 1
    for r in radices[:digit]:
        weight *= r
    radix = radices[digit]
    own = (rank // weight) % radix
    base = rank - own * weight
    return [base + d * weight for d in range(radix)]


def wagma_phases(rank: int, ranks: int, group_size: int) -> list[list[int]]:
    """``rank``'s group in each of the L phases (round t uses phase ``t % L``)."""
    return [wagma_group(rank, ranks, group_size, j) for j in range(len(wagma_radices(ranks, group_size)))]


def is_sync_round(t: int, sync_every: int) -> bool:
    """Whether round ``t`` is a synchronous round over all ranks (every ``sync_every``-th round,
    ending each period: ``t % sync_every == sync_every - 1``). ``sync_every == 0``: never.

    WAGMA-SGD with sync period tau uses ``sync_every = tau + 1``; eager-SGD uses its period.
    The native layer applies the same rule (``harness._core.is_sync_round``); a test pins them.
    """
    return sync_every > 0 and t % sync_every == sync_every - 1
