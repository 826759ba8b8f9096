"""Multi-rank checks of the emulated topology (nodes sharing NICs) and the allreduce algorithms
of ``network.allreduce`` (hierarchical and tree through the nodes, and the flat ones).

Run once per rank count under mpiexec (tests/test_topology.py); rank 0 writes the JSON report
of checklib. torch is not imported: it costs seconds per launch.
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np
from mpi4py import MPI

from checklib import Checks, Skip, agree_that, run_checks
from harness._core import DType, ReduceOp
from harness.testing.nic_exchange import exchange_through_nics, nic_topology, simulated_exchange_ends
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


def uneven_nodes(size: int) -> list[int]:
    """Nodes of 3, 2, 3, 2, ... ranks in rank order (the last one short)."""
    node_of, node = [], 0
    while len(node_of) < size:
        node_of += [node] * (3 if node % 2 == 0 else 2)
        node += 1
    return node_of[:size]


# The tree's nodes: none (a binary tree over the ranks), uneven ones, and ranks dealt round-robin
# over 2 nodes. tests/test_topology.py names the same.
TREE_PLACEMENTS = {"none": None, "uneven": uneven_nodes(SIZE), "round_robin": PLACEMENTS["round_robin"]}
TREE_SIZES = (1, 7, 1000, 100_003)
TREE_CHUNKS = (1 << 20, 4096)  # the default's one chunk, and up to 98 chunks in the pipeline


def tree_input(rank: int, n: int, dtype=np.float32) -> np.ndarray:
    """What ``rank`` contributes to the tree checks: magnitudes 1, 10, 100 by rank, so that the
    order of additions shows in the sum's bits (tests/test_topology.py makes the same)."""
    return (np.random.default_rng([rank, n]).standard_normal(n) * 10.0 ** (rank % 3)).astype(dtype)


def sha1(a: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()


@check
def tree_allreduce_matches_mpi() -> str:
    """``network.allreduce: tree`` without a topology, on uneven nodes and on interleaved ones,
    in one chunk and pipelined in 4 KiB chunks: sums and means like MPI's, bitwise equal on every
    rank; and a float64 group of every rank but rank 1 (a group's plan: its members' nodes).
    Returns the sums' digests, which tests/test_topology.py compares, bit for bit, with the
    simulator's sum (harness.sim.sums.native_sum of the tree schedule)."""
    lines = []
    for name, node_of in TREE_PLACEMENTS.items():
        for chunk in TREE_CHUNKS:
            comm = Communicator(WORLD, tree_chunk_bytes=chunk)
            try:
                if node_of is not None:
                    comm.set_topology(nic_topology(node_of))
                comm.set_allreduce("tree")
                label = f"{name} {chunk}"
                for n in TREE_SIZES:
                    x = tree_input(RANK, n)
                    ref = np.empty_like(x)
                    WORLD.Allreduce(x, ref, op=MPI.SUM)
                    got = x.copy()
                    comm.allreduce(got, op="sum")
                    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-3 * SIZE, err_msg=f"{label}, n={n}")
                    agree_that(digest_everywhere(got) == 1, f"{label}, n={n}: sums differ across ranks")
                    mean = x.copy()
                    comm.allreduce(mean, op="mean")
                    np.testing.assert_allclose(mean, ref / SIZE, rtol=1e-5, atol=1e-3, err_msg=f"{label}, mean")
                    agree_that(digest_everywhere(mean) == 1, f"{label}, n={n}: means differ across ranks")
                    lines.append(f"sum {name} {chunk} {n} {sha1(got)}")
                members = [r for r in range(SIZE) if r != 1]
                if SIZE >= 3 and RANK in members:  # a group of the others (collective over them only)
                    group = comm._native.group(members)
                    for n in (7, 100_003):
                        x64 = tree_input(RANK, n, np.float64)
                        total = x64.copy()
                        group.allreduce(total, total.ctypes.data, n, DType.float64, ReduceOp.SUM, 1).wait()  # tag 1
                        np.testing.assert_allclose(total, sum(tree_input(r, n, np.float64) for r in members),
                                                   rtol=1e-12, atol=1e-9, err_msg=f"{label}, group, n={n}")
                        lines.append(f"group {name} {chunk} {n} {sha1(total)}")
                WORLD.Barrier()
                if SIZE >= 3:  # the group's sums are equal on its members (rank 0 reports them)
                    group_lines = [line for line in lines if line.startswith(f"group {name} {chunk} ")]
                    seen = WORLD.allgather(group_lines if RANK in members else None)
                    agree_that(len({tuple(g) for g in seen if g is not None}) == 1,
                               f"{label}: group sums differ across members")
            finally:
                comm.close()
    return "\n".join(lines)


@check
def nic_contention_is_what_the_simulator_says_within_a_factor_of_two() -> str:
    """Ranks of node 0 exchange 1 MB with their partners on node 1 through 1 Gb/s NICs, posted
    3 ms apart (harness.testing.nic_exchange.exchange_through_nics): each emulated exchange takes at
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
