"""nccl-tests measurements simulated: an allreduce alone, timed on a topology of nodes.

An allreduce alone is Allreduce-SGD with no compute: every iteration is one allreduce of the
buffer (``workload.params`` floats), so the simulated time per iteration is the collective's
time, through the same code that times training. nccl-tests reports the algorithm bandwidth
``size / time`` and the bus bandwidth ``algbw * 2 (n - 1) / n`` for an allreduce
(nccl-tests doc/PERFORMANCE.md), which does not depend on the rank count for a ring.
"""

from __future__ import annotations

from functools import cache

from harness.validation.simulated import FREE_NETWORK, iteration_s, simulate_one

ITERATIONS = 3  # every iteration is the same collective: three give its time and nothing more


@cache
def allreduce_s(
    nodes: int,
    gpus_per_node: int,
    nbytes: int,
    nic_gbytes_per_s: float,
    nic_latency_us: float,
    intra_gbytes_per_s: float,
    intra_latency_us: float,
    algorithm: str = "ring",
) -> float:
    """Seconds of one allreduce of ``nbytes`` over ``nodes`` x ``gpus_per_node`` ranks (one per
    GPU, nodes filled in rank order, as NCCL orders a ring through each node's GPUs), every
    node's traffic to other nodes through one NIC of ``nic_gbytes_per_s`` (a node's NICs
    together: NCCL spreads its channels over all of them), ranks of a node over private links of
    ``intra_gbytes_per_s`` (NVLink through NVSwitch: every GPU at its full rate)."""
    ranks = nodes * gpus_per_node
    topology = {
        "ranks_per_node": gpus_per_node,
        "nic": {"latency_us": nic_latency_us, "bandwidth_gbps": 8 * nic_gbytes_per_s},
        "intra": {"latency_us": intra_latency_us, "bandwidth_gbps": 8 * intra_gbytes_per_s},
    }
    row = simulate_one(
        "nccl_tests",
        ranks,
        "allreduce_sgd",
        ITERATIONS,
        1,
        0.0,
        [],
        FREE_NETWORK,
        topology,
        network_fields={"allreduce": algorithm},
        jitter=0.0,
        params=nbytes // 4,
    )
    return iteration_s(row)


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of an allreduce, bytes per second."""
    return nbytes / seconds * 2 * (ranks - 1) / ranks
