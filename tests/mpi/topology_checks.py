"""Multi-rank checks of the emulated topology (nodes sharing NICs) and the hierarchical allreduce.

Run once per rank count under mpiexec (tests/test_topology.py); rank 0 writes the JSON report
of checklib. torch is not imported: it costs seconds per launch.
"""

from __future__ import annotations

import hashlib
import sys
import time

import numpy as np
from mpi4py import MPI

from checklib import Checks, Skip, run_checks
from harness.comm import Communicator
from harness.scenario.network import NodeTopology
from harness.sim.calibration import NetworkModel
from harness.sim.network import SimNetwork

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
CHECKS = check = Checks()
FLOAT_BYTES = 4


def topology(node_of: list[int], nic_gbps: float | None = None, hierarchical: bool = False) -> NodeTopology:
    nic = None if nic_gbps is None else nic_gbps * 1e9 / 8
    return NodeTopology(tuple(node_of), 0.0, None, 0.0, nic, None, hierarchical)


def digest_everywhere(a: np.ndarray) -> int:
    return len(set(WORLD.allgather(hashlib.sha1(a.tobytes()).hexdigest())))


# Placements: nodes of 2 in rank order (the last one short for odd counts), ranks dealt
# round-robin over 2 nodes (a node's members are not neighbours), and everyone on one node.
PLACEMENTS = {
    "pairs": [r // 2 for r in range(SIZE)],
    "round_robin": [r % 2 for r in range(SIZE)],
    "one_node": [0] * SIZE,
}


@check
def hierarchical_allreduce_matches_mpi() -> None:
    for name, node_of in PLACEMENTS.items():
        for threshold in (64 * 1024, 0):  # leaders by recursive doubling, and by ring
            comm = Communicator(WORLD, ring_threshold_bytes=threshold)
            try:
                comm.set_topology(topology(node_of, hierarchical=True))
                for n in (1, 7, 1000, 100_003):
                    x = np.random.default_rng([RANK, n]).standard_normal(n).astype(np.float32)
                    ref = np.empty_like(x)
                    WORLD.Allreduce(x, ref, op=MPI.SUM)
                    got = x.copy()
                    comm.allreduce(got, op="sum")
                    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * SIZE, err_msg=f"{name}, n={n}")
                    assert digest_everywhere(got) == 1, f"{name}, n={n}: sums differ across ranks"
                    mean = x.copy()
                    comm.allreduce(mean, op="mean")
                    np.testing.assert_allclose(mean, ref / SIZE, rtol=1e-5, atol=1e-5, err_msg=f"{name}, mean")
            finally:
                comm.close()


@check
def nic_contention_agrees_with_the_simulator() -> str:
    """Ranks of node 0 exchange 1 MB with their partners on node 1 through 1 Gb/s NICs, posted
    3 ms apart: the emulated exchanges end when the simulator's network says they do."""
    if SIZE < 4 or SIZE % 2:
        raise Skip("needs two nodes of at least 2 ranks")
    half = SIZE // 2
    node_of = [r // half for r in range(SIZE)]
    nic_gbps, count, gap = 1.0, 256 * 1024, 3e-3
    comm = Communicator(WORLD)
    try:
        comm.set_topology(topology(node_of, nic_gbps))
        send = np.full(count, RANK, dtype=np.float32)
        recv = np.zeros(count, dtype=np.float32)
        peer = (RANK + half) % SIZE
        WORLD.Barrier()
        t0 = WORLD.bcast(time.monotonic() + 0.05, root=0)  # the ranks share CLOCK_MONOTONIC
        time.sleep(max(0.0, t0 + (RANK % half) * gap - time.monotonic()))
        comm.drain_records()
        comm.exchange(send, recv, peer)
        assert recv[0] == peer
        (record,) = [r for r in comm.drain_records() if r.op == "exchange"]
    finally:
        comm.close()
    records = WORLD.gather((record.start_s, record.end_s), root=0)
    if RANK:
        return ""
    # The same messages through the simulator, in the order they were posted (their start).
    net = SimNetwork(SIZE, NetworkModel(latency_s=0.0, bandwidth_bytes_per_s=1e15), topology=topology(node_of, nic_gbps))
    order = sorted(range(SIZE), key=lambda r: records[r][0])
    release, arrival = {}, {}
    for r in order:
        release[r], arrival[(r + half) % SIZE] = net.message(r, (r + half) % SIZE, count * FLOAT_BYTES, records[r][0])
    lines, worst = [], 0.0
    for r in range(SIZE):
        start, end = records[r]
        predicted = max(release[r], arrival[r])
        error = abs(end - predicted)
        # 10% of the predicted time plus 4 ms: the progress thread's wake-up and MPI's own copy.
        allowed = 0.1 * (predicted - start) + 4e-3
        worst = max(worst, error / allowed)
        lines.append(f"rank {r}: emulated {1e3 * (end - start):.1f} ms, simulated {1e3 * (predicted - start):.1f} ms")
        assert error <= allowed, "\n".join(lines)
    return f"worst error {worst:.2f} of the tolerance; " + "; ".join(lines)


def main(out_path: str) -> int:
    run_checks(CHECKS, out_path, WORLD)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
