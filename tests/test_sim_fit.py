"""Fitting the simulated network to reference runs, and choosing a calibration entry."""

from __future__ import annotations

import pytest

from harness.scenario.loader import scenario_from_dict
from harness.sim.calibration import Calibration, CalibrationEntry, CalibrationError, ComputePoint, NetworkModel
from harness.sim.fit import ALPHAS, BANDWIDTHS, fit_loaded_network
from harness.sim.runs import predict


def _scenario(algorithm):
    return scenario_from_dict({
        "name": "ref", "ranks": 4, "seed": 5,
        "workload": {"model": "mlp", "dataset": "digits", "batch_size": 4, "iterations": 20, "eval_every": 20,
                     "compute": {"emulate_ms": 3, "jitter": 0.2}, "params": 50_000},
        "algorithms": [algorithm],
    }, source="test")


def test_fit_recovers_the_network_that_produced_the_references() -> None:
    truth = NetworkModel(latency_s=float(ALPHAS[6]), bandwidth_bytes_per_s=float(BANDWIDTHS[3]),
                         progress_s=float(ALPHAS[6]))
    references = []
    for algorithm in ("allreduce_sgd", "sgp"):
        sc = _scenario(algorithm)
        frames, _ = predict(sc, CalibrationEntry(ranks=4, network=truth))
        references.append((sc, frames[algorithm]))
    fitted, error = fit_loaded_network(references, shared_cores=None)
    assert fitted.latency_s == pytest.approx(truth.latency_s)
    assert fitted.bandwidth_bytes_per_s == pytest.approx(truth.bandwidth_bytes_per_s)
    assert error == pytest.approx(0.0, abs=1e-9)


def test_fit_needs_references() -> None:
    with pytest.raises(ValueError, match="no reference runs"):
        fit_loaded_network([], shared_cores=None)


def _entry(ranks: int) -> CalibrationEntry:
    compute = ComputePoint(model="mlp", dataset="mnist5k", batch_size=32, median_s=0.01, p95_s=0.02, samples=10)
    return CalibrationEntry(ranks=ranks, network=NetworkModel(latency_s=ranks * 1e-6, bandwidth_bytes_per_s=1e9),
                            compute=[compute], loop_overhead_s=1e-4)


def test_choose_prefers_the_rank_count_then_the_uncontended_one_and_says_so() -> None:
    cal = Calibration(created_at="x", harness_version="x", cpus=2, entries=[_entry(1), _entry(2), _entry(8)])
    assert cal.choose(8).entry.ranks == 8 and cal.choose(8).note is None
    entry, note = cal.choose(1024)
    assert entry.ranks == 2  # the most ranks that did not share cores
    assert note == ("no calibration for 1024 ranks (measured: 1, 2, 8): using the one measured at 2 ranks "
                    "(the most ranks that did not share the 2 CPUs)")
    only_contended = Calibration(created_at="x", harness_version="x", cpus=2, entries=[_entry(8), _entry(4)])
    entry, note = only_contended.choose(16)
    assert entry.ranks == 4 and "using the one measured at 4 ranks (the fewest ranks" in note
    # Measured with shared cores: this machine, where 16 ranks share the 2 CPUs 4x as much as 4 did.
    assert note.endswith("its CPU work (local work, copying message bytes) x4 for 16 ranks sharing 2 CPUs")
    measured = _entry(4)
    assert entry.compute[0].median_s == pytest.approx(4 * measured.compute[0].median_s)
    assert entry.loop_overhead_s == pytest.approx(4 * measured.loop_overhead_s)
    assert entry.network.bandwidth_bytes_per_s == pytest.approx(measured.network.bandwidth_bytes_per_s / 4)
    assert entry.network.latency_s == measured.network.latency_s
    # 2 ranks have a CPU each: their local work takes half as long as that of 4 ranks on 2 CPUs.
    assert only_contended.choose(2).entry.compute[0].median_s == pytest.approx(measured.compute[0].median_s / 2)
    assert cal.choose(1024).entry.compute == _entry(2).compute  # an uncontended entry stands for a cluster
    with pytest.raises(CalibrationError, match="no entries"):
        Calibration(created_at="x", harness_version="x", cpus=2, entries=[]).choose(8)
