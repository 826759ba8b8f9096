"""harness.local_costs: the node agent's combine and the staging of the buffer, as the scenario
states them, in the formula, and in the simulator's local time (the real loop's sleep is
checked by tests/test_allreduce_algorithms.py)."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import harness.local_costs
from harness.local_costs import iteration_overhead_s, node_combine_s, staging_s
from harness.scenario import scenario_from_dict
from harness.sim.calibration import CalibrationEntry, NetworkModel
from harness.sim.timing import PredictiveTiming


def _scenario(**workload) -> dict:
    return {"name": "t", "ranks": 4, "workload": {"model": "mlp", "dataset": "synthetic", "batch_size": 8,
                                                  "iterations": 3, "compute": {"emulate_ms": 100},
                                                  "params": 1_000_000, **workload},
            "algorithms": ["allreduce_sgd"]}


def test_the_module_examples_hold() -> None:
    assert doctest.testmod(harness.local_costs).failed == 0


def test_the_costs_follow_their_formulas() -> None:
    w = scenario_from_dict(_scenario(node={"gpus": 8, "link": {"latency_us": 10, "bandwidth_gbps": 80}},
                                     staging={"bandwidth_gbps": 40, "latency_us": 5})).workload
    nbytes = 4e6
    # reduce + broadcast, each a chain of 7 latencies and one pass of the buffer at 10 GB/s
    assert node_combine_s(w.node, nbytes) == pytest.approx(2 * (7 * 10e-6 + nbytes / 10e9))
    assert staging_s(w.staging, nbytes) == pytest.approx(2 * (5e-6 + nbytes / 5e9))
    assert iteration_overhead_s(w, 1_000_000) == pytest.approx(node_combine_s(w.node, nbytes) + staging_s(w.staging, nbytes))
    assert iteration_overhead_s(w, 1_000_000, staged_for_real=True) == pytest.approx(node_combine_s(w.node, nbytes))
    one_gpu = scenario_from_dict(_scenario(node={"gpus": 1})).workload
    assert node_combine_s(one_gpu.node, nbytes) == 0.0
    assert iteration_overhead_s(scenario_from_dict(_scenario()).workload, 1_000_000) == 0.0


def test_a_node_links_its_gpus_by_nvlink_unless_told() -> None:
    node = scenario_from_dict(_scenario(node={"gpus": 8})).workload.node
    assert (node.link.latency_us, node.link.bandwidth_gbps) == (3.0, 1200.0)


@pytest.mark.parametrize("workload,message", [
    ({"node": {"gpus": 0}}, "workload.node.gpus: must be >= 1 (got 0)"),
    ({"staging": {"latency_us": 3}}, "workload.staging.bandwidth_gbps: required field missing"),
    ({"staging": {"bandwidth_gbps": 10, "pcie": 3}}, "workload.staging.pcie: unknown key"),
])
def test_bad_local_costs_are_named(workload, message) -> None:
    from harness.errors import ParamError
    from harness.scenario.loader import ScenarioError

    with pytest.raises((ScenarioError, ParamError)) as info:
        scenario_from_dict(_scenario(**workload))
    assert message in str(info.value)


def test_the_simulator_adds_the_costs_to_every_rank_and_iteration() -> None:
    plain = scenario_from_dict(_scenario())
    costly = scenario_from_dict(_scenario(node={"gpus": 8}, staging={"bandwidth_gbps": 100}))
    entry = CalibrationEntry(ranks=4, network=NetworkModel(latency_s=1e-6, bandwidth_bytes_per_s=1e9))
    factors = np.ones((3, 4))
    extra = iteration_overhead_s(costly.workload, 1_000_000)
    assert extra > 0
    a, b = PredictiveTiming(plain, entry, factors), PredictiveTiming(costly, entry, factors)
    for t in range(3):
        for r in range(4):
            assert b.compute(t, r) == pytest.approx(a.compute(t, r) + extra)
