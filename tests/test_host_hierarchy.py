"""Ranks on several hosts: the collectives through each host's shared memory and messages between
the hosts (kernels/host_hierarchy.hpp), under real mpiexec on this one machine.

MPICH splits one machine into several "hosts" for MPI (``MPI_Comm_split_type`` and its own
transports) with its debugging settings ``MPIR_CVAR_NUM_CLIQUES`` (blocks of consecutive ranks)
and ``MPIR_CVAR_ODD_EVEN_CLIQUES`` (odd and even ranks): 4 ranks as 2 + 2 and 5 ranks as 3 + 2.
The collective checks of tests/mpi/comm_checks.py run there, the hierarchy's own check with them.
``tests/test_vhosts.py`` runs the same on virtual hosts of their own (network namespaces).

Only those checks: the others (wait-avoiding rounds, pairwise averaging) hang in MPICH's UCX
transport between cliques of one machine, with or without the shared-memory path.
"""

from __future__ import annotations

import json
import os

import pytest

from conftest import HIERARCHY_CHECKS, MPI_DIR, assert_hierarchy_report
from harness.launch import run_ranks

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]


@pytest.mark.parametrize(("ranks", "cliques"), [(4, {"MPIR_CVAR_NUM_CLIQUES": "2"}),
                                                 (5, {"MPIR_CVAR_ODD_EVEN_CLIQUES": "1"})],
                         ids=["4ranks-2+2", "5ranks-3+2"])
def test_collectives_across_hosts(tmp_path, ranks, cliques):
    out = tmp_path / "report.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1", **cliques)
    proc = run_ranks(ranks, ["python", "-u", str(MPI_DIR / "comm_checks.py"), str(out), "-v", "--only",
                             ",".join(HIERARCHY_CHECKS)], timeout=240, env=env, capture=True)
    assert proc.returncode == 0 and out.exists(), f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert_hierarchy_report(json.loads(out.read_text()), ranks, hosts=2)
