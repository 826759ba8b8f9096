"""Multi-rank checks of the emulated topology (nodes sharing NICs) and the allreduce algorithms
of ``network.allreduce`` (hierarchical through the nodes, and the flat ones).

Run once per rank count under mpiexec (tests/test_topology.py); rank 0 writes the JSON report
of checklib. torch is not imported: it costs seconds per launch.
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np
from mpi4py import MPI

from checklib import Checks, Skip, agree_that, run_checks
from harness.bench.agreement import exchange_through_nics, nic_topology, simulated_exchange_ends
from harness.comm import Communicator

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
CHECKS = check = Checks()



def digest_everywhere(a: np.ndarray) -> int:
    return len(set(WORLD.allgather(hashlib.sha1(a.tobytes()).hexdigest())))


# Placements: nodes of 2 in rank order (the last one short for odd counts), ranks dealt
# round-robin over 2 nodes (a node's members are not neighbours), and everyone on one node.
PLACEMENTS = {
    "pairs": [r // 2 for r in range(SIZE)],
    "round_robin": [r % 2 for r in range(SIZE)],
    "one_node": [0] * SIZE,
}


def assert_allreduces_match_mpi(comm: Communicator, label: str) -> None:
    """``comm``'s allreduce sums and averages like MPI's, bitwise equal on every rank, for sizes
    below and above the ring threshold."""
    for n in (1, 7, 1000, 100_003):
        x = np.random.default_rng([RANK, n]).standard_normal(n).astype(np.float32)
        ref = np.empty_like(x)
        WORLD.Allreduce(x, ref, op=MPI.SUM)
        got = x.copy()
        comm.allreduce(got, op="sum")
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * SIZE, err_msg=f"{label}, n={n}")
        assert digest_everywhere(got) == 1, f"{label}, n={n}: sums differ across ranks"
        mean = x.copy()
        comm.allreduce(mean, op="mean")
        np.testing.assert_allclose(mean, ref / SIZE, rtol=1e-5, atol=1e-5, err_msg=f"{label}, mean")


@check
def hierarchical_allreduce_matches_mpi() -> None:
    for name, node_of in PLACEMENTS.items():
        for threshold in (64 * 1024, 0):  # leaders by recursive doubling, and by ring
            comm = Communicator(WORLD, ring_threshold_bytes=threshold)
            try:
                comm.set_topology(nic_topology(node_of))
                comm.set_allreduce("hierarchical")
                assert_allreduces_match_mpi(comm, name)
            finally:
                comm.close()


@check
def every_allreduce_algorithm_matches_mpi() -> None:
    """ring, recursive doubling and reduce + broadcast (network.allreduce), without a topology."""
    for algorithm in ("ring", "recursive_doubling", "reduce_broadcast"):
        comm = Communicator(WORLD)
        try:
            comm.set_allreduce(algorithm)
            assert_allreduces_match_mpi(comm, algorithm)
        finally:
            comm.close()


@check
def nic_contention_is_what_the_simulator_says_within_a_factor_of_two() -> str:
    """Ranks of node 0 exchange 1 MB with their partners on node 1 through 1 Gb/s NICs, posted
    3 ms apart (harness.bench.agreement.exchange_through_nics): each emulated exchange takes at
    least half and at most twice the time the simulator's network says, plus the longest of the
    same exchanges measured without NICs just before (the control: what MPI and this machine's
    load add by themselves). A coarse check that catches a broken rule (a NIC not shared: all
    four in 8 ms; counted twice); how close they are is `python -m harness bench agreement
    --only nic_messages`."""
    if SIZE < 4 or SIZE % 2:
        raise Skip("needs two nodes of at least 2 ranks")
    exchange = exchange_through_nics(WORLD)
    agree_that(exchange.received_right[RANK], f"rank {RANK} received the wrong data")
    predicted = simulated_exchange_ends([start for start, _ in exchange.spans])
    control = max(end - start for start, end in exchange.control)
    lines, bad = [], []
    for r, (start, end) in enumerate(exchange.spans):
        emulated, simulated = end - start, predicted[r] - start
        lines.append(f"rank {r}: emulated {1e3 * emulated:.1f} ms, simulated {1e3 * simulated:.1f} ms")
        if not 0.5 * simulated <= emulated <= 2 * simulated + control:
            bad.append(r)
    agree_that(not bad, f"ranks {bad} off by more than a factor of 2 (control {1e3 * control:.1f} ms): "
               + "; ".join(lines))
    return f"control {1e3 * control:.1f} ms; " + "; ".join(lines)


def main(out_path: str) -> int:
    run_checks(CHECKS, out_path, WORLD)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
