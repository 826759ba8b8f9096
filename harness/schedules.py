"""Who talks to whom at iteration t: pure schedule functions shared by the real run and the simulator.

Nothing here communicates or keeps state; every function is a pure function of its
arguments, so every rank (and the SimPy model) derives the same pattern independently.

>>> wagma_radices(64, 8)
[8, 8]
>>> wagma_group(9, 64, 8, phase=1)
[1, 9, 17, 25, 33, 41, 49, 57]
"""

from __future__ import annotations

import operator
from functools import cache, lru_cache
from typing import SupportsIndex, cast

import numpy as np

RING_THRESHOLD_BYTES = 64 * 1024
"""Allreduces of at least this many bytes per rank use the ring algorithm, smaller ones recursive
doubling (with more than 2 ranks and at least one float per rank; ``kernels/step_program.cpp``).
The communicator's default and the simulator's decomposition both take it from here."""

TREE_CHUNK_BYTES = 1024 * 1024
"""The ``tree`` allreduce pipelines its buffer in ``max(1, ceil(bytes / TREE_CHUNK_BYTES))`` chunks
(at most one per element; ``kernels/step_program.cpp``). The communicator hands it to the native layer
(as ``RING_THRESHOLD_BYTES``) and the simulator's decomposition takes it from here.

A round moves one chunk per edge and direction and pays the slowest link's latency, so larger
chunks help large buffers (fewer rounds) and hurt small ones (a slower pipeline fill): on two nodes
of 8 behind 7 GB/s NICs (15 us), 1 MiB is within 8% of the best size from 4 MB to 1 GB, where
2 MiB gains 4% at 1 GB and loses 24% at 4 MB (``docs/guides/topology.md``)."""


@cache
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

    WAGMA-SGD and eager-SGD use ``sync_every = period`` (their ``period`` parameter).
    The native layer applies the same rule (``harness._core.is_sync_round``); a test pins them.
    """
    return sync_every > 0 and t % sync_every == sync_every - 1


def checked_quorum(quorum: object, ranks: int) -> int:
    """A wait-avoiding op's ``quorum`` (arrivals that activate a round) as an int in [1, ranks];
    ValueError naming it otherwise. The native and the simulated communicator both check with it."""
    try:
        q = operator.index(cast("SupportsIndex", quorum))  # any object: TypeError when it is no integer
    except TypeError:
        raise ValueError(f"quorum must be an int in [1, {ranks}] (got {quorum!r})") from None
    if not 1 <= q <= ranks:
        raise ValueError(f"quorum must be in [1, {ranks}] (the number of ranks; got {q})")
    return q


@lru_cache(maxsize=1024)  # pure; the simulator asks for it once per rank and iteration
def exponential_levels(ranks: int, peers: int = 1) -> int:
    """Levels of SGP's k-peer exponential graph: ``floor(log_{k+1}(P - 1)) + 1`` (0 for P <= 1).

    Computed in integers: the largest i with ``(k+1)^i <= P - 1``, plus one. (The reference code
    takes ``int(math.log(P - 1, k + 1))``, which agrees except where floating point rounds an
    exact power down, e.g. ``math.log(243, 3) < 5``: there the reference has one level less.)
    """
    if ranks <= 1:
        return 0
    if peers < 1:
        raise ValueError(f"peers must be >= 1 (got {peers})")
    levels, hop = 1, peers + 1
    while hop <= ranks - 1:
        levels += 1
        hop *= peers + 1
    return levels


@lru_cache(maxsize=1024)  # pure and the same on every rank: the simulator's ranks ask for it every iteration
def _exponential_hop(ranks: int, t: int, peers: int) -> int:
    """(k+1)^(t mod L): the hop of iteration ``t``'s level."""
    levels = exponential_levels(ranks, peers)
    if not 1 <= peers <= ranks - 1:
        raise ValueError(f"peers must be in [1, {ranks - 1}] for {ranks} ranks (got {peers})")
    return (peers + 1) ** (t % levels)


def exponential_out_peers(rank: int, ranks: int, t: int, peers: int = 1) -> list[int]:
    """SGP's directed time-varying exponential graph: where ``rank`` pushes at iteration ``t``.

    The reference code's default graph (``NPeerDynamicDirectedExponentialGraph`` with k peers
    per iteration): with ``L = exponential_levels(P, k)`` and hop ``h = (k+1)^(t mod L)``, peer
    j = 1..k is ``rank + j*h`` (mod P). Each j shifts every rank alike, so each round is k
    permutations. For k = 1 this is ``rank + 2^(t mod L)``. Where ``j*h`` is a multiple of P the
    peer is ``rank`` itself, and two j can name the same rank (e.g. P = 8, k = 3, level 1: hops
    4, 8, 12 name rank+4, rank, rank+4): push-sum then keeps that share, or sends two shares,
    so mass stays exact (the reference would open a process group with itself there).

    >>> [exponential_out_peers(0, 4, t, peers=2) for t in range(3)]
    [[1, 2], [3, 2], [1, 2]]
    """
    if ranks <= 1:
        return []
    hop = _exponential_hop(ranks, t, peers)
    return [(rank + j * hop) % ranks for j in range(1, peers + 1)]


def exponential_in_peers(rank: int, ranks: int, t: int, peers: int = 1) -> list[int]:
    """Who pushes to ``rank`` at iteration ``t`` (the inverse of ``exponential_out_peers``)."""
    if ranks <= 1:
        return []
    hop = _exponential_hop(ranks, t, peers)
    return [(rank - j * hop) % ranks for j in range(1, peers + 1)]


def ring_neighbors(rank: int, ranks: int) -> list[int]:
    """D-PSGD ring: the distinct neighbours of ``rank`` (one for P = 2, none for P = 1)."""
    left, right = (rank - 1) % ranks, (rank + 1) % ranks
    if left == rank:
        return []
    return [left] if left == right else sorted((left, right))


def bipartite_peer(rank: int, ranks: int, t: int) -> int:
    """AD-PSGD's partner of ``rank`` at iteration ``t``: a bipartite matching (even P).

    Even ranks are active, odd ranks passive; the offset ``2^(rho+1) - 1`` with
    ``rho = t mod max(1, floor(log2 P))`` is odd, so every round is a perfect matching of the
    even ranks onto the odd ones and the graph stays bipartite.
    """
    if ranks % 2:
        raise ValueError(f"the bipartite graph needs an even rank count (got {ranks})")
    rho = t % max(1, ranks.bit_length() - 1)
    offset = (2 ** (rho + 1) - 1) % ranks
    return (rank + offset) % ranks if rank % 2 == 0 else (rank - offset) % ranks


def bipartite_exponential_shift(ranks: int, t: int) -> int:
    """D-PSGD ``bipartite_exponential``: rank i sends to ``i + d`` and receives from ``i - d``.

    The SGP reference code's ``DynamicBipartiteExponentialGraph`` with one peer per iteration:
    odd offsets 1, 1 + 2, 1 + 4, ..., 1 + 2^(L-1) (L = floor(log2(P - 1)) + 1), each used
    forward, then backward: with ``s = t mod 2L`` the offset is number ``s // 2`` and ``d`` is
    it for even s, minus it for odd s. A round is a shift, not a matching (P = 4, t = 0: rank 0
    sends to 1 and receives from 3); an odd offset links even ranks with odd ones only (even P).

    >>> [bipartite_exponential_shift(8, t) for t in range(7)]
    [1, -1, 3, -3, 5, -5, 1]
    """
    if ranks % 2:
        raise ValueError(f"the bipartite graph needs an even rank count (got {ranks})")
    step = t % (2 * exponential_levels(ranks))
    level = step // 2
    offset = 1 if level == 0 else 1 + 2**level
    return offset if step % 2 == 0 else -offset


# Pure, and the same on every rank: the simulator's ranks of one process ask for each round's
# draw once each (a numpy generator per draw costs tens of microseconds); ranks drift apart by
# far fewer rounds than the cache holds.
@lru_cache(maxsize=4096)
def majority_initiator(seed: int, t: int, ranks: int) -> int:
    """eager-SGD majority mode: the rank that initiates round ``t`` (same draw on every rank)."""
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

    ``x_rank <- sum_j W_rank,j x_j``: the j are the ranks whose models ``rank`` receives.

    >>> mixing_row(0, 4, 0, "ring")
    {0: 0.3333333333333333, 1: 0.3333333333333333, 3: 0.3333333333333333}
    >>> mixing_row(1, 2, 5, "ring")
    {1: 0.5, 0: 0.5}
    """
    if graph == "ring":
        neighbours = ring_neighbors(rank, ranks)
    elif graph == "bipartite_exponential":  # W_ij = 1/2 from the in-peer: doubly stochastic, not symmetric
        neighbours = [(rank - bipartite_exponential_shift(ranks, t)) % ranks] if ranks > 1 else []
    else:
        raise ValueError(f"unknown D-PSGD graph {graph!r} (valid: ring, bipartite_exponential)")
    weight = 1.0 / (len(neighbours) + 1)
    return {rank: weight, **{j: weight for j in neighbours}}


def osgp_rounds_due(t: int, synch_freq: int) -> int:
    """Gossip rounds an OSGP rank must have pushed by the end of iteration ``t`` (pure schedule)."""
    return t // (synch_freq + 1) + 1


def fragment_sync(t: int, fragment: int, fragments: int, inner_steps: int) -> bool:
    """Streaming DiLoCo: whether fragment ``fragment`` (of ``fragments``) starts its outer step
    after the step of iteration ``t``.

    Fragment p's outer steps are ``inner_steps`` apart, the first after ``(p + 1) * H // F``
    steps, so the fragments' outer allreduces are staggered evenly over a period and the last
    fragment keeps DiLoCo's schedule (``periodic_sync(t, H)``); with one fragment it is DiLoCo's.

    >>> [[t for t in range(12) if fragment_sync(t, p, 3, 6)] for p in range(3)]
    [[1, 7], [3, 9], [5, 11]]
    """
    offset = (fragment + 1) * inner_steps // fragments
    return t + 1 >= offset and (t + 1 - offset) % inner_steps == 0
