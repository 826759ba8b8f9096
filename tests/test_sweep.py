"""Sweeps (harness.sweep): a grid of overrides, one run per point in a directory of its own,
sweep.csv and sweep.png; simulated points in parallel, real ones one after another; a failed
point recorded while the others go on; an interrupted sweep resumed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO, harness_cli, write_scenario_file
from tests.test_report import check_in_chromium

SCENARIO = {
    "name": "swp", "ranks": 3,
    "workload": {"model": "mlp", "dataset": "digits", "batch_size": 8, "iterations": 6,
                 "compute": {"emulate_ms": 5}, "params": 1000},
    "algorithms": ["allreduce_sgd", {"name": "local_sgd", "period": 4}],
    "imbalance": [{"kind": "fixed", "ranks": [1], "delay_ms": 0}],
}


def _sweep_dir(out: Path) -> Path:
    (sweep,) = (out / "swp").iterdir()
    assert sweep.name.startswith("sweep-")
    return sweep


def _status(sweep: Path, index: int) -> dict:
    return json.loads((sweep / "points" / f"p{index:03d}.json").read_text())


@pytest.mark.subprocess
def test_a_simulated_sweep_of_four_points(tmp_path) -> None:
    path = write_scenario_file(tmp_path, SCENARIO)
    proc = harness_cli("simulate", str(path), "workload.iterations=8", "--sweep", "imbalance.0.delay_ms=0,80",
                       "--sweep", "algorithms.local_sgd.period=2,8", "--jobs", "2", "--out", str(tmp_path / "out"),
                       cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    sweep = _sweep_dir(tmp_path / "out")
    assert "sweep: 4 points of imbalance.0.delay_ms, algorithms.local_sgd.period" in proc.stderr
    assert "sweep: 4 of 4 points done" in proc.stderr and f"results: {sweep}" in proc.stdout
    table = pd.read_csv(sweep / "sweep.csv")
    assert list(table.columns[:4]) == ["point", "imbalance.0.delay_ms", "algorithms.local_sgd.period", "algorithm"]
    assert len(table) == 4 * 2
    assert sorted(zip(table["imbalance.0.delay_ms"], table["algorithms.local_sgd.period"])) == sorted(
        [(d, k) for d in (0, 80) for k in (2, 8)] * 2)
    assert (sweep / "sweep.png").stat().st_size > 0
    for index in range(4):  # each point: a simulated run of its own, its overrides recorded
        resolved = (sweep / "points" / f"p{index:03d}" / "scenario.resolved.yaml").read_text()
        assert "workload.iterations=8" in resolved and _status(sweep, index)["status"] == "done"
    page = (sweep / "report.html").read_text()
    assert f"report: {sweep / 'report.html'}" in proc.stdout
    assert page.count('<img src="data:image/png;base64,') == 1 and page.count('href="points/p0') == 4
    check_in_chromium(sweep / "report.html", tmp_path, images=1, plots_below=250, coloured=0.0005)
    local = table[table["algorithm"] == "local_sgd"].set_index(["imbalance.0.delay_ms", "algorithms.local_sgd.period"])
    # the injected delay costs local SGD throughput; syncing every 8 waits less than every 2
    assert local.loc[(80, 2), "samples_per_s"] < local.loc[(0, 2), "samples_per_s"]
    assert local.loc[(80, 8), "samples_per_s"] > local.loc[(80, 2), "samples_per_s"]


@pytest.mark.subprocess
def test_a_failed_point_is_recorded_and_the_others_go_on(tmp_path) -> None:
    # Real compute needs a calibration this directory does not have: that point fails when it
    # runs (it validates), the emulated one finishes.
    path = write_scenario_file(tmp_path, SCENARIO)
    proc = harness_cli("simulate", str(path), "~workload.params", "--sweep", "workload.compute=real,{emulate_ms: 5}",
                       "--jobs", "1", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    sweep = _sweep_dir(tmp_path / "out")
    failed = _status(sweep, 0)
    assert failed["status"] == "failed" and failed["exit"] == 2 and "no calibration file" in failed["error"]
    assert _status(sweep, 1)["status"] == "done"
    assert "point 0 (workload.compute=real) failed:" in proc.stderr and "1 of 2 points done, 1 failed" in proc.stderr
    assert set(pd.read_csv(sweep / "sweep.csv")["point"]) == {1}


@pytest.mark.subprocess
def test_an_invalid_point_writes_nothing(tmp_path) -> None:
    path = write_scenario_file(tmp_path, SCENARIO)
    proc = harness_cli("simulate", str(path), "--sweep", "workload.iterations=4,0", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "sweep point 1 (workload.iterations=0)" in proc.stderr
    assert "override 'workload.iterations=0': workload.iterations: must be >= 1 (got 0)" in proc.stderr
    assert not (tmp_path / "out").exists()
    for args, message in [(["--point", "0"], "--point I goes with --resume SWEEP_DIR"),
                          (["--resume", str(tmp_path)], "not a sweep directory")]:
        proc = harness_cli("simulate", str(path), *args, "--out", str(tmp_path / "out"))
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


@pytest.mark.subprocess
def test_an_interrupted_sweep_resumes(tmp_path) -> None:
    """Ctrl+C during the second point: the sweep stops its point and says how to go on; --resume
    runs what did not finish and leaves the finished point as it was."""
    path = write_scenario_file(tmp_path, SCENARIO)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "harness", "simulate", str(path), "--sweep", "seed=1,2,3", "--jobs", "1",
           "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            done = list(out.glob("swp/sweep-*/points/p000.json"))
            if done:
                break
            time.sleep(0.05)
        assert done, "the first point did not finish"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    sweep = _sweep_dir(out)
    assert f"finish the sweep with `python -m harness simulate --resume {sweep}`" in stderr
    first = _status(sweep, 0)
    assert first["status"] == "done"
    assert any(not (sweep / "points" / f"p{i:03d}.json").exists() or _status(sweep, i)["status"] != "done"
               for i in range(1, 3))
    resumed = harness_cli("simulate", "--resume", str(sweep))
    assert resumed.returncode == 0, resumed.stderr
    assert all(_status(sweep, i)["status"] == "done" for i in range(3))
    assert _status(sweep, 0) == first  # not run again
    assert set(pd.read_csv(sweep / "sweep.csv")["point"]) == {0, 1, 2}


@pytest.mark.mpi
def test_a_real_sweep_of_two_points(tmp_path) -> None:
    path = write_scenario_file(tmp_path, SCENARIO)
    proc = harness_cli("run", str(path), "--sweep", "workload.iterations=3,5", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    sweep = _sweep_dir(tmp_path / "out")
    table = pd.read_csv(sweep / "sweep.csv")
    assert sorted(zip(table["workload.iterations"], table["algorithm"])) == [
        (3, "allreduce_sgd"), (3, "local_sgd"), (5, "allreduce_sgd"), (5, "local_sgd")]
    assert list(table["steps_recorded"]) == [3 * it for it in table["workload.iterations"]]  # 3 ranks
    for index in (0, 1):
        meta = json.loads((sweep / "points" / f"p{index:03d}" / "run.json").read_text())
        assert meta["status"] == "complete" and not meta.get("simulated")


@pytest.mark.subprocess
def test_sbatch_sweep_writes_a_job_array(tmp_path) -> None:
    path = write_scenario_file(tmp_path, SCENARIO)
    proc = harness_cli("sbatch", str(path), "algorithms.local_sgd.period=2", "--sweep", "ranks=2,4",
                       "--out", str(tmp_path / "out"), "--time", "10")
    assert proc.returncode == 0, proc.stderr
    sweep = _sweep_dir(tmp_path / "out")
    script = (sweep / "sweep.sbatch").read_text().splitlines()
    assert "#SBATCH --array=0-1" in script and "#SBATCH --ntasks=4" in script  # the largest point's ranks
    assert script[-1].endswith(f"run --resume {sweep} --point \"$SLURM_ARRAY_TASK_ID\"")
    spec = json.loads((sweep / "sweep.json").read_text())
    assert spec["command"] == "run" and spec["arguments"]["launcher"] == "slurm"
    assert spec["arguments"]["assignments"] == ["algorithms.local_sgd.period=2"]
    assert [p["overrides"] for p in spec["points"]] == [["ranks=2"], ["ranks=4"]]
    proc = harness_cli("run", "--resume", str(sweep), "--point", "2")
    assert proc.returncode == 2 and "no point 2 (it has 2: 0 to 1)" in proc.stderr
