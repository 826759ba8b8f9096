"""The native layer with its ranks on several hosts, under real mpiexec on this one machine:
every check of tests/mpi/comm_checks.py, the collectives through each host's shared memory and
messages between the hosts (kernels/host_hierarchy.hpp) among them.

MPICH splits one machine into several "hosts" for MPI (``MPI_Comm_split_type`` and its own
transports: UCX between the hosts, shared memory within each) with its debugging settings
``MPIR_CVAR_NUM_CLIQUES`` (blocks of consecutive ranks) and ``MPIR_CVAR_ODD_EVEN_CLIQUES`` (odd
and even ranks): 4 ranks as 2 + 2 and 5 ranks as 3 + 2. Between the cliques MPI's messages take
the network transport a cluster's hosts would, which is where the listeners' wildcard receives
went deaf before they probed (kernels/listener.hpp). ``tests/test_vhosts.py`` runs the same
checks on virtual hosts of their own (network namespaces).
"""

from __future__ import annotations

from conftest import launch_checks, mpi_check_suite

CLIQUES = {4: {"MPIR_CVAR_NUM_CLIQUES": "2"}, 5: {"MPIR_CVAR_ODD_EVEN_CLIQUES": "1"}}


def _launch_on_cliques(ranks: int, tmp) -> dict:
    return launch_checks("comm_checks.py", ranks, tmp, env=CLIQUES[ranks])


TestCommChecksAcrossHosts = mpi_check_suite("comm_checks.py", tuple(CLIQUES), checks=20, launch=_launch_on_cliques)
