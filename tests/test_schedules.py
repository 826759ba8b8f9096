"""Pure schedule functions shared by the real run and the simulator."""

from __future__ import annotations

import math

import pytest

from harness.schedules import is_sync_round, wagma_group, wagma_phases, wagma_radices


@pytest.mark.parametrize("ranks, s, want", [(64, 8, [8, 8]), (16, 4, [4, 4]), (8, 2, [2, 2, 2]), (6, 4, [3, 2]),
                                            (5, 4, [5]), (12, 8, [6, 2]), (1, 4, [1]), (7, 8, [7])])
def test_radices(ranks, s, want):
    assert wagma_radices(ranks, s) == want
    assert math.prod(want) == ranks


def test_paper_groups_for_64_ranks():
    assert wagma_group(9, 64, 8, 0) == list(range(8, 16))
    assert wagma_group(9, 64, 8, 1) == [1 + 8 * i for i in range(8)]


@pytest.mark.parametrize("ranks", [1, 2, 3, 5, 6, 8, 12, 16, 27])
@pytest.mark.parametrize("s", [2, 3, 4, 8])
def test_each_phase_partitions_the_ranks_and_information_spreads(ranks, s):
    phases = len(wagma_radices(ranks, s))
    for j in range(phases):
        groups = {tuple(wagma_group(r, ranks, s, j)) for r in range(ranks)}
        members = sorted(m for g in groups for m in g)
        assert members == list(range(ranks)), "a phase must partition the ranks"
        for r in range(ranks):
            assert r in wagma_group(r, ranks, s, j)
    # After L consecutive phases every rank has (transitively) heard from every other.
    reach = {r: {r} for r in range(ranks)}
    for j in range(phases):
        reach = {r: set().union(*(reach[m] for m in wagma_group(r, ranks, s, j))) for r in range(ranks)}
    assert all(reach[r] == set(range(ranks)) for r in range(ranks))
    assert wagma_phases(0, ranks, s) == [wagma_group(0, ranks, s, j) for j in range(phases)]


def test_sync_rounds():
    assert [t for t in range(12) if is_sync_round(t, 4)] == [3, 7, 11]
    assert not any(is_sync_round(t, 0) for t in range(10))


def test_bad_arguments():
    with pytest.raises(ValueError, match="rank 5 out of range"):
        wagma_group(5, 4, 2, 0)
    with pytest.raises(ValueError):
        wagma_radices(0, 2)
