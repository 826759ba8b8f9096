"""The native collective layer under real mpiexec at 1, 2, 3, 4, 5 and 8 ranks.

One launch per rank count runs every check of tests/mpi/comm_checks.py; each check is then
reported as its own test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import MPI_DIR, assert_check, launch_checks

RANK_COUNTS = (1, 2, 3, 4, 5, 8)


def _check_names() -> list[str]:
    # Read the names without importing the script (importing it would initialize MPI here).
    tree = ast.parse((MPI_DIR / "comm_checks.py").read_text())
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and any(getattr(d, "id", None) == "check" for d in node.decorator_list)
    ]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    cache: dict[int, dict] = {}

    def get(ranks: int) -> dict:
        if ranks not in cache:
            cache[ranks] = launch_checks("comm_checks.py", ranks, tmp_path_factory.mktemp(f"comm{ranks}"))
        return cache[ranks]

    return get


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", RANK_COUNTS)
@pytest.mark.parametrize("check", _check_names())
def test_comm(reports, ranks, check):
    assert_check(reports(ranks), check)


def test_check_names_found():
    assert len(_check_names()) >= 10
