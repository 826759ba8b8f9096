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

from conftest import MPI_DIR
from harness.launch import run_ranks

# What runs across the split: every collective check, the typed ones included, and the hierarchy's.
HIERARCHY_CHECKS = (
    "allreduce_sum_and_mean_match_mpi",
    "allreduce_length_zero_and_many_outstanding",
    "broadcast_from_every_root",
    "size_mismatch_is_an_error_not_a_hang",
    "typed_collectives_blocking_and_posted_give_exact_results",
    "across_hosts_each_hosts_members_share_memory",
)

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
    report = json.loads(out.read_text())
    assert sorted(report) == sorted(HIERARCHY_CHECKS)
    failed = {name: r["detail"] for name, r in report.items() if r["status"] != "pass"}
    assert not failed, failed
    assert report["across_hosts_each_hosts_members_share_memory"]["detail"] == f"{ranks} ranks on 2 hosts"
