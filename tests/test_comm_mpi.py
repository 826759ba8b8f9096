"""The native collective layer under real mpiexec at 1, 2, 3, 5 and 8 ranks.

One launch per rank count runs every check of tests/mpi/comm_checks.py; each check is then
reported as its own test.
"""

from __future__ import annotations


import pytest

from conftest import assert_check, check_names, report_cache

RANK_COUNTS = (1, 2, 3, 5, 8)  # odd and even, power of two and not; 4 added nothing 2 and 8 do not


def _check_names() -> list[str]:
    return check_names("comm_checks.py")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return report_cache("comm_checks.py", tmp_path_factory)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", RANK_COUNTS)
@pytest.mark.parametrize("check", _check_names())
def test_comm(reports, ranks, check):
    assert_check(reports(ranks), check)


def test_check_names_found():
    assert len(_check_names()) >= 10
