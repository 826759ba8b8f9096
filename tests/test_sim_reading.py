"""What a simulation predicts (harness.sim.runs.READINGS): the cluster reading by default beyond
the calibrated rank count, this machine's oversubscribed reading one option away, and the
calibration entry chosen for what the simulation needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.scenario.loader import scenario_from_dict
from harness.sim.calibration import Calibration, CalibrationEntry, CalibrationError, ComputePoint, NetworkModel
from harness.sim.runs import DEFAULT_NETWORK, calibration_entry, default_reading

REPO = Path(__file__).resolve().parents[1]
LOADED = NetworkModel(latency_s=3e-4, bandwidth_bytes_per_s=1e9, progress_s=1e-4, shared_cores=2)


def _point(median: float, alone: float | None = None, model: str = "mlp") -> ComputePoint:
    return ComputePoint(model=model, dataset="mnist5k", batch_size=32, median_s=median, p95_s=median * 1.2, samples=9,
                        alone_s=alone)


def _calibration(*entries: CalibrationEntry) -> Calibration:
    return Calibration(created_at="2026-01-01T00:00:00+00:00", harness_version="test", cpus=2, entries=list(entries))


def _scenario(ranks: int) -> object:
    return scenario_from_dict({"name": "r", "ranks": ranks, "workload": {"model": "mlp", "dataset": "mnist5k",
                                                                         "batch_size": 32, "iterations": 2},
                               "algorithms": ["local_sgd"]})


def test_the_default_reading_is_this_machine_only_at_a_measured_rank_count() -> None:
    cal = _calibration(CalibrationEntry(ranks=8, network=LOADED, compute=[_point(0.012, 0.003)]))
    assert default_reading(_scenario(8), cal) == "machine"
    assert default_reading(_scenario(1024), cal) == "cluster"
    assert default_reading(_scenario(8), None) == "cluster"


def test_the_cluster_reading_gives_every_rank_its_own_cores_on_the_cluster_network() -> None:
    cal = _calibration(CalibrationEntry(ranks=8, network=LOADED, compute=[_point(0.012, 0.003)], loop_overhead_s=1e-4))
    cluster, note = calibration_entry(_scenario(1024), cal, "s.yaml", reading="cluster")
    assert cluster.network == DEFAULT_NETWORK and cluster.network.shared_cores is None
    assert cluster.compute_s("mlp", "mnist5k", 32) == 0.003  # one rank alone
    assert cluster.ranks == 8 and cluster.loop_overhead_s == 1e-4 and "measured at 8 ranks" in note
    machine, note = calibration_entry(_scenario(1024), cal, "s.yaml", reading="machine")
    assert machine.network.shared_cores == 2
    assert machine.compute_s("mlp", "mnist5k", 32) == pytest.approx(0.012 * 128)  # 1,024 ranks on 2 cores
    assert "x128 for 1024 ranks sharing 2 CPUs" in note


def test_the_entry_chosen_has_the_workload() -> None:
    """A 6-rank entry without the workload and an 8-rank one with it: 1,024 ranks use the 8-rank
    entry (the fewest ranks is no reason to pick one that cannot serve)."""
    cal = _calibration(CalibrationEntry(ranks=6, network=LOADED, compute=[_point(0.01, 0.002, model="cnn")]),
                       CalibrationEntry(ranks=8, network=LOADED, compute=[_point(0.012, 0.003)]))
    for reading in ("cluster", "machine"):
        entry, note = calibration_entry(_scenario(1024), cal, "s.yaml", reading=reading)
        assert "measured at 8 ranks" in note and "of those that measured this workload" in note, note


def test_a_calibration_without_the_alone_time_says_what_to_run() -> None:
    cal = _calibration(CalibrationEntry(ranks=8, network=LOADED, compute=[_point(0.012)]))  # an older file
    with pytest.raises(CalibrationError, match="compute time of one rank alone .* cluster reading.*\n.*calibrate "
                                               "--scenario s.yaml --ranks 8"):
        calibration_entry(_scenario(1024), cal, "s.yaml", reading="cluster")
    calibration_entry(_scenario(1024), cal, "s.yaml", reading="machine")  # the machine reading still works


def _simulate(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict, str]:
    from harness.sim.calibration import save_fixed_calibration

    cal = save_fixed_calibration(tmp_path / "cal.json", 4, [("mlp", "mnist5k", 32, 0.003)])
    scenario = tmp_path / "r.yaml"
    scenario.write_text(yaml.safe_dump({"name": "r", "ranks": 4, "workload": {
        "model": "mlp", "dataset": "mnist5k", "batch_size": 32, "iterations": 4}, "algorithms": ["local_sgd"]}))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "harness", "simulate", str(scenario), "--calibration", str(cal),
                           "--out", str(out), *args], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = (out / "r").iterdir()
    return proc, json.loads((run / "run.json").read_text()), (run / "summary.txt").read_text()


@pytest.mark.parametrize("args,reading", [(("--ranks", "16"), "cluster"), (("--ranks", "16", "--reading", "machine"),
                                                                            "machine"), ((), "machine")])
@pytest.mark.subprocess
def test_simulate_says_which_reading_it_used(tmp_path, args, reading) -> None:
    proc, meta, summary = _simulate(tmp_path, *args)
    assert meta["reading"] == reading
    assert summary.startswith(f"simulated (predictive), {reading} reading")
    assert f"reading: {reading} reading" in proc.stderr
