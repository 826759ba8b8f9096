"""harness.api (your own training script) and ``python -m harness launch``.

The API's behaviour on every rank is checked under real mpiexec (tests/mpi/api_checks.py) with
1, 2 and 3 ranks; the command line, the watchdog and the examples as a user runs them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO, harness_cli, mpi_check_suite, save_test_calibration

SCRIPT = "api_checks.py"
EXAMPLE = REPO / "examples" / "own_training_script"


TestApiChecks = mpi_check_suite(SCRIPT, (1, 2, 3), checks=8)


TINY_SCRIPT = '''
import sys
import torch
import harness.api as hx

with hx.Run(algorithm="dpsgd", iterations=int(sys.argv[1]), batch_size=8) as run:
    model = torch.nn.Linear(4, 2)
    opt = hx.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), model)
    for t in range(run.iterations):
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step(loss=loss)
'''


def scenario(tmp_path: Path, **extra) -> Path:
    data = {"name": "tiny", "ranks": 3, "workload": {"batch_size": 8, "iterations": 8},
            "algorithms": ["allreduce_sgd", "dpsgd"], **extra}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.mpi
def test_plain_mpiexec_without_scenario_writes_its_own_results(tmp_path):
    from harness.launch import mpiexec_path

    (tmp_path / "train.py").write_text(TINY_SCRIPT)
    import subprocess
    import sys

    proc = subprocess.run([str(mpiexec_path()), "-n", "2", sys.executable, "train.py", "5"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "results" / "train").iterdir()
    assert len(pd.read_csv(run / "steps.csv")) == 2 * 5
    assert json.loads((run / "run.json").read_text())["status"] == "complete"


@pytest.mark.mpi
def test_launch_names_a_killed_rank(tmp_path):
    # The fault strikes in the script's communication too: just after D-PSGD's exchange is posted.
    (tmp_path / "train.py").write_text(TINY_SCRIPT)
    path = scenario(tmp_path, faults=[{"kind": "kill", "rank": 1, "at_iteration": 3, "algorithm": "dpsgd",
                                       "during": "communication"}])
    proc = harness_cli("launch", "--scenario", str(path), "--out", str(tmp_path / "out"), str(tmp_path / "train.py"),
                       "8")
    assert proc.returncode == 1
    assert "rank 1" in proc.stderr and "dpsgd" in proc.stderr, proc.stderr[-3000:]
    (run,) = (tmp_path / "out" / "tiny").iterdir()
    meta = json.loads((run / "run.json").read_text())
    assert meta["finished_algorithms"] == ["allreduce_sgd"] and meta["status"] == "failed"
    assert meta["fault"]["rank"] == 1 and meta["fault"]["evidence"] == "announced"


@pytest.mark.parametrize("args, words", [
    (["launch", "missing.py"], "no such script"),
    (["launch", "{script}"], "-n N"),
    (["launch", "--scenario", "{bad}", "{script}"], "algorithms[0].name"),
    (["launch", "-n", "2", "--only", "sgp", "{script}"], "--scenario"),
])
@pytest.mark.subprocess
def test_launch_bad_input_starts_nothing(tmp_path, args, words):
    (tmp_path / "train.py").write_text(TINY_SCRIPT)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "bad", "ranks": 2, "workload": {"batch_size": 1, "iterations": 1},
                                   "algorithms": ["nope"]}))
    args = [a.format(script=tmp_path / "train.py", bad=bad) for a in args]
    proc = harness_cli(args[0], "--out", str(tmp_path / "out"), *args[1:], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.subprocess
def test_run_refuses_a_script_scenario(tmp_path):
    proc = harness_cli("run", str(scenario(tmp_path)), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "harness launch" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.mpi
def test_example_training_script_launches_and_compares(tmp_path):
    """Example 2 of the README as a user runs it (smaller): launched under its scenario, once per
    algorithm into one results directory, then compared with its simulation."""
    proc = harness_cli("launch", "-n", "2", "--iterations", "12", "--scenario", str(EXAMPLE / "scenario.yaml"),
                       "--out", str(tmp_path / "out"), str(EXAMPLE / "train.py"), "--lr", "0.005")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "out" / "own_training_script").iterdir()
    steps = pd.read_csv(run / "steps.csv")
    assert len(steps) == 2 * 2 * 12  # the scenario's iterations replace the script's own 60
    summary = pd.read_csv(run / "summary.csv").set_index("algorithm")
    assert list(summary.index) == ["allreduce_sgd", "wagma"] and summary["complete"].all()
    assert summary["final_accuracy"].between(0, 1).all() and summary.loc["allreduce_sgd", "final_accuracy"] > 0.3
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["script"] == "train.py"
    floats = 64 * 128 + 128 + 2 * 128 + 128 * 10 + 10  # the example's model: Linear, BatchNorm1d, Linear
    assert meta["script_workload"]["params"] == floats and "AdamW" in meta["script_workload"]["optimizer"]
    recorded = yaml.safe_load((run / "scenario.resolved.yaml").read_text())["workload"]
    assert recorded["params"] == floats and recorded["compute"]["emulate_ms"] > 0
    calibration = save_test_calibration(tmp_path / "calibration.json", 2)
    compare = harness_cli("compare", str(run), "--calibration", str(calibration))
    assert compare.returncode == 0, compare.stderr[-3000:]
    table = pd.read_csv(run / "compare.csv")
    assert set(table["algorithm"]) == {"allreduce_sgd", "wagma"} and set(table["mode"]) == {"trace", "predictive"}
    simulated = pd.read_csv(run / "sim-trace" / "steps.csv")  # the simulator communicates the script's model
    assert (simulated.groupby("algorithm")["bytes_sent"].max() == steps.groupby("algorithm")["bytes_sent"].max()).all()


def test_srun_tasks_without_pmi_are_refused(monkeypatch):
    """`srun --mpi=none python train.py`: every task would train alone; the Run says so instead."""
    from harness.api import Run, ScriptError

    for var in ("PMI_SIZE", "PMI_FD", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    with pytest.raises(ScriptError, match="srun --mpi=pmi2"):
        Run(algorithm="allreduce_sgd", iterations=1, batch_size=1)


def test_validate_summary_says_whose_optimizer():
    from harness.commands.validate import summary
    from harness.scenario import load_scenario, scenario_from_dict

    assert "optimizer: the training script's own" in summary(load_scenario(EXAMPLE / "scenario.yaml"))
    adamw = scenario_from_dict({"name": "x", "ranks": 2, "optimizer": "adamw", "algorithms": ["sgp"],
                                "workload": {"model": "logreg", "dataset": "digits", "batch_size": 4,
                                             "iterations": 2}})
    assert "optimizer: adamw lr=0.001 betas=[0.9, 0.999] eps=1e-08 weight_decay=0.01" in summary(adamw)
