"""The native collective layer under real mpiexec at 1, 2, 3, 5 and 8 ranks.

One launch per rank count runs every check of tests/mpi/comm_checks.py; each check is then
reported as its own test.
"""

from __future__ import annotations

from conftest import mpi_check_suite

RANK_COUNTS = (1, 2, 3, 5, 8)  # odd and even, power of two and not; 4 added nothing 2 and 8 do not

TestCommChecks = mpi_check_suite("comm_checks.py", RANK_COUNTS, checks=20)
