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

RING_THRESHOLD_BYTES = 64 * 1024
"""Allreduces of at least this many bytes per rank use the ring algorithm, smaller ones recursive
doubling (with more than 2 ranks and at least one float per rank; ``kernels/schedule.cpp``).
The communicator's default and the simulator's decomposition both take it from here."""


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


def exponential_levels(ranks: int) -> int:
    """Number of distinct hops 1, 2, 4, ... of the exponential graph: floor(log2(P - 1)) + 1."""
    return (ranks - 1).bit_length() if ranks > 1 else 0


def exponential_out_peers(rank: int, ranks: int, t: int, peers: int = 1) -> list[int]:
    """SGP's directed time-varying exponential graph: where ``rank`` pushes at iteration ``t``.

    Peer j is ``rank + 2^((t + j) mod L)`` (mod P) with ``L = floor(log2(P - 1)) + 1``. Every
    rank uses the same hops, so for each j the round is a permutation (one in-message each).
    """
    levels = exponential_levels(ranks)
    if levels == 0:
        return []
    if not 1 <= peers <= levels:
        raise ValueError(f"peers must be in [1, {levels}] for {ranks} ranks (got {peers})")
    return [(rank + 2 ** ((t + j) % levels)) % ranks for j in range(peers)]


def exponential_in_peers(rank: int, ranks: int, t: int, peers: int = 1) -> list[int]:
    """Who pushes to ``rank`` at iteration ``t`` (the inverse of ``exponential_out_peers``)."""
    levels = exponential_levels(ranks)
    if levels == 0:
        return []
    return [(rank - 2 ** ((t + j) % levels)) % ranks for j in range(peers)]


def ring_neighbors(rank: int, ranks: int) -> list[int]:
    """D-PSGD ring: the distinct neighbours of ``rank`` (one for P = 2, none for P = 1)."""
    return sorted({(rank - 1) % ranks, (rank + 1) % ranks} - {rank})


def bipartite_peer(rank: int, ranks: int, t: int) -> int:
    """Partner of ``rank`` at iteration ``t`` in the bipartite exponential graph (even P).

    Even ranks are active, odd ranks passive; the offset ``2^(rho+1) - 1`` with
    ``rho = t mod max(1, floor(log2 P))`` is odd, so every round is a perfect matching of the
    even ranks onto the odd ones and the graph stays bipartite (AD-PSGD, bipartite D-PSGD).
    """
    if ranks % 2:
        raise ValueError(f"the bipartite graph needs an even rank count (got {ranks})")
    rho = t % max(1, ranks.bit_length() - 1)
    offset = (2 ** (rho + 1) - 1) % ranks
    return (rank + offset) % ranks if rank % 2 == 0 else (rank - offset) % ranks


def majority_initiator(seed: int, t: int, ranks: int) -> int:
    """eager-SGD majority mode: the rank that initiates round ``t`` (same draw on every rank)."""
    import numpy as np  # local: keep this module import-light for the simulator

    return int(np.random.default_rng(np.random.SeedSequence([seed, 0xEA6E, t])).integers(ranks))


def periodic_sync(t: int, period: int) -> bool:
    """Whether iteration ``t`` (0-based) ends with a synchronization: ``(t + 1) % period == 0``.

    The sync rule of Local SGD and the whole periodic family (Overlap Local SGD, EASGD,
    CoCoD-SGD, BMUF); see ``harness/algorithms/local_sgd.py`` for why it deviates from the
    reference code's ``t != 0 and t % period == 0``.

    The periodic family synchronizes after the optimizer step of such iterations, so the first
    synchronization follows exactly ``period`` local steps.

    >>> [t for t in range(8) if periodic_sync(t, 3)]
    [2, 5]
    """
    return (t + 1) % period == 0


def mixing_row(rank: int, ranks: int, t: int, graph: str) -> dict[int, float]:
    """Row ``rank`` of D-PSGD's mixing matrix at iteration ``t``: {rank j: W_rank,j}, self included.

    >>> mixing_row(0, 4, 0, "ring")
    {0: 0.3333333333333333, 1: 0.3333333333333333, 3: 0.3333333333333333}
    >>> mixing_row(1, 2, 5, "ring")
    {1: 0.5, 0: 0.5}
    """
    if graph == "ring":
        neighbours = ring_neighbors(rank, ranks)
    elif graph == "bipartite_exponential":
        neighbours = [bipartite_peer(rank, ranks, t)] if ranks > 1 else []
    else:
        raise ValueError(f"unknown D-PSGD graph {graph!r} (valid: ring, bipartite_exponential)")
    weight = 1.0 / (len(neighbours) + 1)
    return {rank: weight, **{j: weight for j in neighbours}}


def osgp_rounds_due(t: int, synch_freq: int) -> int:
    """Gossip rounds an OSGP rank must have pushed by the end of iteration ``t`` (pure schedule)."""
    return t // (synch_freq + 1) + 1
