"""End to end: ``python -m harness run`` under real mpiexec on small scenarios."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import harness_cli
from harness.launch import mpiexec_path
from harness.results.columns import COMM_OP_COLUMNS, EVAL_COLUMNS, STEP_COLUMNS

SMALL = {
    "name": "small",
    "ranks": 3,
    "seed": 7,
    "workload": {"model": "logreg", "dataset": "digits", "batch_size": 16, "iterations": 12, "eval_every": 6},
    "optimizer": {"lr": 0.05},
    "algorithms": ["allreduce_sgd", {"name": "local_sgd", "period": 3}],
    "imbalance": [{"kind": "fixed", "ranks": [1], "delay_ms": 80}],
}


def write_scenario(tmp_path: Path, **changes) -> Path:
    data = {**SMALL, **changes}
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def harness_run(*args: str, timeout: float = 240, cmd_prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    return harness_cli("run", *args, timeout=timeout, prefix=cmd_prefix or ())


def only_run_dir(out: Path, name: str) -> Path:
    runs = list((out / name).iterdir())
    assert len(runs) == 1, runs
    return runs[0]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    proc = harness_run(str(write_scenario(tmp)), "--out", str(tmp / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, only_run_dir(tmp / "out", "small")


@pytest.mark.mpi
def test_results_files_and_schema(small_run):
    proc, run = small_run
    for name in ("scenario.resolved.yaml", "run.json", "steps.csv", "evals.csv", "comm_ops.csv", "summary.csv",
                 "summary.txt", "trace.json", "provenance/initial_model.pt", "provenance/shards.npz",
                 "provenance/final_models_allreduce_sgd.pt", "provenance/final_models_local_sgd.pt"):
        assert (run / name).is_file(), name
    steps = pd.read_csv(run / "steps.csv")
    assert list(steps.columns) == list(STEP_COLUMNS)
    assert len(steps) == 2 * 3 * 12
    assert list(pd.read_csv(run / "evals.csv").columns) == list(EVAL_COLUMNS)
    assert list(pd.read_csv(run / "comm_ops.csv").columns) == list(COMM_OP_COLUMNS)
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["finished_algorithms"] == ["allreduce_sgd", "local_sgd"]
    resolved = yaml.safe_load((run / "scenario.resolved.yaml").read_text())
    assert resolved["optimizer"]["momentum"] == 0.9  # defaults filled in
    trace = json.loads((run / "trace.json").read_text())
    assert {e["tid"] for e in trace["traceEvents"] if e.get("ph") == "X" and e["tid"] < 1000} == {0, 1, 2}
    assert "allreduce_sgd" in proc.stdout and "samples/s" in proc.stdout


@pytest.mark.mpi
def test_injected_delay_shows_in_iteration_times(small_run):
    _, run = small_run
    steps = pd.read_csv(run / "steps.csv")
    ar = steps[steps.algorithm == "allreduce_sgd"]
    assert ar[ar["rank"] == 1].injected_delay_s.tolist() == pytest.approx([0.08] * 12)
    assert (ar[ar["rank"] != 1].injected_delay_s == 0).all()
    # Synchronous SGD: everyone waits for the delayed rank every iteration.
    durations = ar.end_s - ar.start_s
    assert durations.median() >= 0.07
    fast = ar[ar["rank"] != 1]
    assert fast.comm_blocked_s.median() >= 0.05, "fast ranks should block in the allreduce"


@pytest.mark.mpi
def test_final_models_equal_after_allreduce_sgd(small_run):
    import torch

    _, run = small_run
    finals = torch.load(run / "provenance" / "final_models_allreduce_sgd.pt")
    assert finals.shape[0] == 3
    assert torch.equal(finals[0], finals[1]) and torch.equal(finals[0], finals[2])


@pytest.mark.mpi
def test_slow_link_slows_iterations(tmp_path):
    base = {"ranks": 2, "algorithms": ["allreduce_sgd"], "imbalance": [],
            "workload": {**SMALL["workload"], "iterations": 8, "eval_every": 8}}
    medians = {}
    for name, network in (("fastnet", None), ("slownet", {"links": [{"rank": 0, "latency_ms": 40}]})):
        extra = {"network": network} if network else {}
        path = write_scenario(tmp_path, name=name, **base, **extra)
        proc = harness_run(str(path), "--out", str(tmp_path / "out"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        steps = pd.read_csv(only_run_dir(tmp_path / "out", name) / "steps.csv")
        medians[name] = (steps.end_s - steps.start_s).median()
    # Recursive doubling on 2 ranks: one message each way per allreduce, held 40 ms on rank 0's
    # link. A lower bound load cannot break (the emulator holds every message that long), and the
    # order against the run without it; not a difference of two runs' medians, which load shifts.
    assert medians["slownet"] >= 0.04, medians
    assert medians["slownet"] > medians["fastnet"], medians


@pytest.mark.mpi
def test_runs_in_place_inside_an_mpi_job(tmp_path):
    path = write_scenario(tmp_path, ranks=2, algorithms=["local_sgd"], imbalance=[],
                          workload={**SMALL["workload"], "iterations": 4, "eval_every": 4})
    proc = harness_run(str(path), "--out", str(tmp_path / "out"), cmd_prefix=[str(mpiexec_path()), "-n", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((only_run_dir(tmp_path / "out", "small") / "run.json").read_text())
    assert meta["status"] == "complete"
    wrong = harness_run(str(path), "--out", str(tmp_path / "out2"), cmd_prefix=[str(mpiexec_path()), "-n", "3"])
    assert wrong.returncode == 2 and "needs 2 ranks" in wrong.stderr
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize(
    "changes, args, message",
    [
        ({"ranks": 0}, [], "ranks"),
        ({"algorithms": ["nope"]}, [], "nope"),
        ({}, ["--only", "sgp"], "sgp"),
        ({"imbalance": [{"kind": "fixed", "ranks": [3], "delay_ms": 1}]}, [], "imbalance[0].ranks[0]"),
    ],
)
@pytest.mark.subprocess
def test_bad_scenarios_exit_2_and_launch_nothing(tmp_path, changes, args, message):
    path = write_scenario(tmp_path, **changes)
    proc = harness_run(str(path), "--out", str(tmp_path / "out"), *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and proc.stderr.startswith("error:")
    assert not (tmp_path / "out").exists()
