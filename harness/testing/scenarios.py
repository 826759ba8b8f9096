"""The small real runs the simulator is compared with: scenarios, the fixed calibration of their
compute, and the least times physics allows them.

``bench agreement`` measures how close the simulator comes to each (its ``small_run``,
``nic_run`` and ``allreduce_runs`` cases); the tests run the same scenarios with coarse checks
(a factor of 2, the order of two cases: ``tests/test_sim_commands.py``,
``tests/test_topology.py``, ``tests/test_allreduce_algorithms.py``), which a loaded machine
cannot break for a healthy change.
"""

from __future__ import annotations

#: Emulated compute: the local work is a sleep, so the comparison is of the communication model,
#: not of how well a noisy machine reproduces forward/backward times.
SMALL_SCENARIO: dict = {
    "name": "simcheck",
    "ranks": 4,
    "seed": 3,
    "workload": {
        "model": "mlp",
        "dataset": "digits",
        "batch_size": 8,
        "iterations": 24,
        "eval_every": 12,
        "compute": {"emulate_ms": 20},
        "params": 2000,
    },
    "algorithms": [
        "allreduce_sgd",
        {"name": "local_sgd", "period": 3},
        "sgp",
        {"name": "wagma", "group_size": 2, "period": 4},
    ],
    "imbalance": [{"kind": "random_ranks", "count": 1, "delay_ms": 40}],
}
#: The compute of :data:`SMALL_SCENARIO`'s fixed calibration (predictive mode uses ``emulate_ms``).
SMALL_COMPUTE = [("mlp", "mnist5k", 32, 0.003)]

# The workload of the NIC and allreduce runs: a 1 MB buffer (250,000 floats), 10 ms of emulated
# compute a step, 8 steps.
_ONE_MB_WORKLOAD: dict = {
    "model": "mlp",
    "dataset": "digits",
    "batch_size": 8,
    "iterations": 8,
    "eval_every": 8,
    "compute": {"emulate_ms": 10},
    "params": 250_000,
}

#: 4 ranks as 2 nodes of 2 behind 0.2 Gb/s NICs, a 1 MB buffer: every allreduce (a flat ring)
#: puts 1.5 MB through each NIC, at 25 MB/s at least 60 ms per iteration against 10 ms of compute.
NIC_RUN_SCENARIO: dict = {
    "name": "nodes",
    "ranks": 4,
    "seed": 5,
    "workload": _ONE_MB_WORKLOAD,
    "algorithms": ["allreduce_sgd"],
    "network": {"topology": {"ranks_per_node": 2, "nic": {"latency_us": 50, "bandwidth_gbps": 0.2}}},
}
NIC_RUN_COMPUTE = [("mlp", "digits", 8, 0.01)]  # the fixed calibration of _ONE_MB_WORKLOAD's compute
#: The least time per iteration of :data:`NIC_RUN_SCENARIO`: 1.5 MB through a 25 MB/s NIC.
NIC_RUN_LEAST_S = 1.5e6 / 25e6


#: (algorithm, ranks) of the ``allreduce_runs`` case and tests/test_allreduce_algorithms.py: odd
#: rank counts, so recursive doubling folds a rank in and out and the binomial trees are uneven.
ALLREDUCE_RUNS = (("recursive_doubling", 5), ("reduce_broadcast", 3))
ALLREDUCE_RUN_COMPUTE = NIC_RUN_COMPUTE
#: 1 MB through a 0.2 Gb/s link: one whole-buffer step of the allreduce.
ALLREDUCE_RUN_HOP_S = 1e6 / 25e6


def allreduce_run_scenario(algorithm: str, ranks: int) -> dict:
    """Allreduce-SGD with ``network.allreduce: algorithm`` on ``ranks`` ranks: a 1 MB buffer
    through private 0.2 Gb/s links (40 ms per whole-buffer step), 10 ms of emulated compute, and
    local costs of ``harness.local_costs``: a node agent of 4 GPUs on a 0.8 Gb/s link (20 ms a
    iteration) and staging at 1.6 Gb/s (10 ms)."""
    return {
        "name": f"allreduce_{algorithm}",
        "ranks": ranks,
        "seed": 5,
        "workload": {
            **_ONE_MB_WORKLOAD,
            "node": {"gpus": 4, "link": {"bandwidth_gbps": 0.8}},
            "staging": {"bandwidth_gbps": 1.6},
        },
        "algorithms": ["allreduce_sgd"],
        "network": {"default": {"bandwidth_gbps": 0.2}, "allreduce": algorithm},
    }
