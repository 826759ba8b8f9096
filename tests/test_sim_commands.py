"""``simulate`` and ``compare`` end to end, and a small real run against its simulation."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from harness.results.records import STEP_COLUMNS, SUMMARY_COLUMNS
from harness.sim.calibration import (
    Calibration,
    CalibrationEntry,
    ComputePoint,
    NetworkModel,
    save_calibration,
)
from harness.sim.compare import COMPARE_COLUMNS
from conftest import harness_cli, run_scenario, write_scenario_file

# Emulated compute: the local work is a sleep, so the comparison tests the communication model
# and not how well a noisy CI machine reproduces forward/backward times.
SMALL = {
    "name": "simcheck",
    "ranks": 4,
    "seed": 3,
    "workload": {"model": "mlp", "dataset": "digits", "batch_size": 8, "iterations": 24, "eval_every": 12,
                 "compute": {"emulate_ms": 20}, "params": 2000},
    "algorithms": ["allreduce_sgd", {"name": "local_sgd", "period": 3}, "sgp",
                   {"name": "wagma", "group_size": 2, "sync_period": 3}],
    "imbalance": [{"kind": "random_ranks", "count": 1, "delay_ms": 40}],
}


def calibration_file(path, ranks=(4,), latency_s=3e-4):
    entries = [
        CalibrationEntry(ranks=r, network=NetworkModel(latency_s=latency_s, bandwidth_bytes_per_s=1e9),
                         compute=[ComputePoint(model="mlp", dataset="mnist5k", batch_size=32, median_s=0.003,
                                               p95_s=0.004, samples=10)])
        for r in ranks
    ]
    save_calibration(Calibration(created_at="2026-01-01T00:00:00+00:00", harness_version="test", cpus=2,
                                 entries=entries), path)
    return path


def test_simulate_writes_a_marked_run_with_the_real_columns(tmp_path) -> None:
    scenario = write_scenario_file(tmp_path, SMALL)
    # Run where there is no results/calibration.json: emulated compute uses the default network.
    proc = harness_cli("simulate", str(scenario), "--out", str(tmp_path / "out"), "--trace-ranks", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "no calibration file" in proc.stderr
    (run,) = (tmp_path / "out" / "simcheck").iterdir()
    assert run.name.startswith("sim-")
    meta = json.loads((run / "run.json").read_text())
    assert meta["simulated"] is True and meta["mode"] == "predictive" and meta["status"] == "complete"
    assert meta["events"] > 0
    summary = pd.read_csv(run / "summary.csv")
    assert tuple(summary.columns) == SUMMARY_COLUMNS
    assert list(summary["algorithm"]) == ["allreduce_sgd", "local_sgd", "sgp", "wagma"]
    assert summary["complete"].all()
    steps = pd.read_csv(run / "steps.csv")
    assert tuple(steps.columns) == STEP_COLUMNS and len(steps) == 4 * 4 * 24
    trace = json.loads((run / "trace.json").read_text())
    tids = {e["tid"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert tids == {0, 1}
    assert "events/s" in proc.stdout


def test_simulate_scales_past_a_thousand_ranks(tmp_path) -> None:
    scenario = write_scenario_file(tmp_path, {**SMALL, "algorithms": [{"name": "wagma", "group_size": 8,
                                                                       "sync_period": 3}]})
    proc = harness_cli("simulate", str(scenario), "--ranks", "1100", "--iterations", "5", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (run,) = (tmp_path / "simcheck").iterdir()
    assert pd.read_csv(run / "summary.csv")["ranks"].tolist() == [1100]


def test_simulate_real_compute_needs_a_calibration(tmp_path) -> None:
    data = {**SMALL, "workload": {**SMALL["workload"], "compute": "real"}}
    data["workload"].pop("params")
    scenario = write_scenario_file(tmp_path, data)
    proc = harness_cli("simulate", str(scenario), "--out", str(tmp_path / "out"),
                       "--calibration", str(tmp_path / "missing.json"))
    assert proc.returncode == 2
    assert "missing.json" in proc.stderr and "calibrate" in proc.stderr
    # A calibration without this workload's compute time is named as such.
    cal = calibration_file(tmp_path / "cal.json")
    proc = harness_cli("simulate", str(scenario), "--out", str(tmp_path / "out"), "--calibration", str(cal))
    assert proc.returncode == 2
    assert "no compute time for model mlp, dataset digits, batch 8" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_simulate_rejects_bad_input(tmp_path) -> None:
    scenario = write_scenario_file(tmp_path, {**SMALL, "ranks": 0})
    proc = harness_cli("simulate", str(scenario), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "ranks" in proc.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": 1, "entries": [}')
    proc = harness_cli("simulate", str(write_scenario_file(tmp_path, SMALL)), "--calibration", str(bad))
    assert proc.returncode == 2 and "bad.json" in proc.stderr and "JSON" in proc.stderr
    bad.write_text(json.dumps({"created_at": "x", "harness_version": "x", "cpus": 2,
                               "entries": [{"ranks": 4, "network": {"latency_s": -1, "bandwidth_bytes_per_s": 1}}]}))
    proc = harness_cli("simulate", str(write_scenario_file(tmp_path, SMALL)), "--calibration", str(bad))
    assert proc.returncode == 2 and "entries.0.network.latency_s" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    return run_scenario(tmp_path_factory.mktemp("simreal"), SMALL)


def test_a_small_real_run_agrees_with_its_simulation(real_run, tmp_path) -> None:
    cal = calibration_file(tmp_path / "cal.json")
    proc = harness_cli("compare", str(real_run), "--calibration", str(cal))
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(real_run / "compare.csv")
    assert tuple(table.columns) == COMPARE_COLUMNS
    assert sorted(set(table["mode"])) == ["predictive", "trace"]
    assert len(table) == 2 * 4
    # Wide enough for a loaded 2-core CI machine; the README reports the measured errors.
    trace = table[table["mode"] == "trace"]
    assert (trace["throughput_error"].abs() < 0.25).all(), trace.to_string()
    predictive = table[table["mode"] == "predictive"]
    assert (predictive["throughput_error"].abs() < 0.35).all(), predictive.to_string()
    assert (real_run / "compare.png").stat().st_size > 0
    for mode in ("trace", "predictive"):
        meta = json.loads((real_run / f"sim-{mode}" / "run.json").read_text())
        assert meta["simulated"] and meta["mode"] == mode
    assert "median |error|" in proc.stdout


def test_compare_rejects_what_it_cannot_compare(real_run, tmp_path) -> None:
    proc = harness_cli("compare", str(tmp_path), "--calibration", str(calibration_file(tmp_path / "c.json")))
    assert proc.returncode == 2 and "not a run directory" in proc.stderr
    assert harness_cli("simulate", str(write_scenario_file(tmp_path, SMALL)), "--out", str(tmp_path)).returncode == 0
    (simulated,) = (tmp_path / "simcheck").iterdir()
    proc = harness_cli("compare", str(simulated), "--calibration", str(tmp_path / "c.json"))
    assert proc.returncode == 2 and "simulated run" in proc.stderr
    proc = harness_cli("compare", str(real_run), "--calibration", str(tmp_path / "nothing.json"))
    assert proc.returncode == 2 and "nothing.json" in proc.stderr


def test_simulate_imports_neither_torch_nor_mpi(tmp_path) -> None:
    scenario = write_scenario_file(tmp_path, SMALL)
    code = (
        "import sys\n"
        "from harness.cli import main\n"
        f"status = main(['simulate', {str(scenario)!r}, '--out', {str(tmp_path / 'out')!r}])\n"
        "loaded = [m for m in ('torch', 'mpi4py', 'harness._core') if m in sys.modules]\n"
        "print('loaded:', loaded)\n"
        "sys.exit(status or (3 if loaded else 0))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
