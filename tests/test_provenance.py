"""What ``provenance/`` keeps at each level, the size check before launching, and the run's report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from conftest import harness_cli, write_scenario_file
from harness.cli import main as harness_main
from harness.results import provenance
from harness.scenario import load_scenario, scenario_from_dict
from harness.workload import DATASET_NAMES, build_model, load_dataset

# Local SGD's last two steps are local: its ranks end with different models, their average is a third.
REAL = {"name": "prov", "ranks": 3, "seed": 5,
        "workload": {"model": "logreg", "dataset": "digits", "batch_size": 8, "iterations": 6, "eval_every": 3},
        "optimizer": {"lr": 0.1}, "algorithms": ["allreduce_sgd", {"name": "local_sgd", "period": 4}]}
# The issue's scenario: 4 ranks, 25.6 M emulated parameters, two algorithms.
PAPER_SCALE = {"name": "paper_scale", "ranks": 4,
               "workload": {"model": "mlp", "dataset": "mnist5k", "batch_size": 32, "iterations": 10,
                            "compute": {"emulate_ms": 50}, "params": 25_600_000},
               "algorithms": ["allreduce_sgd", "local_sgd"]}
MODEL_BYTES = 4 * 25_600_000


def _with(base: dict, **changes) -> dict:
    return {**base, **changes}


@pytest.mark.parametrize("name", DATASET_NAMES)
def test_dataset_samples_are_the_loaded_sizes(name):
    data = load_dataset(name, seed=0)
    assert provenance.DATASET_SAMPLES[name] == data.num_train + data.num_test
    assert set(provenance.DATASET_SAMPLES) == set(DATASET_NAMES)


def test_auto_is_full_for_real_compute_and_none_for_emulated():
    real, emulated = scenario_from_dict(REAL), scenario_from_dict(PAPER_SCALE)
    assert real.results.provenance == emulated.results.provenance == "auto"
    assert provenance.resolve(real).results.provenance == "full"
    assert provenance.resolve(emulated).results.provenance == "none"
    assert provenance.resolve(emulated, "final").results.provenance == "final"  # --provenance wins
    own = scenario_from_dict(_with(PAPER_SCALE, results={"provenance": "full"}))
    assert provenance.level(own) == "full"
    assert provenance.resolve(own, "auto").results.provenance == "none"
    resolved = provenance.resolve(real).resolved_dict()
    assert resolved["results"]["provenance"] == "full"
    assert scenario_from_dict(resolved) == provenance.resolve(real)  # the resolved file loads back


def test_expected_bytes_of_the_issue_scenario():
    scenario = scenario_from_dict(PAPER_SCALE)
    assert provenance.expected_bytes(scenario, 2) == 0  # auto: emulated keeps nothing
    final = provenance.expected_bytes(provenance.resolve(scenario, "final"), 2)
    full = provenance.expected_bytes(provenance.resolve(scenario, "full"), 2)
    # final: initial model + one averaged model per algorithm; full adds 4 ranks' models each.
    assert 3 * MODEL_BYTES < final < 3 * MODEL_BYTES + 100_000
    assert full - final == pytest.approx(2 * 4 * MODEL_BYTES, abs=20_000)


@pytest.mark.subprocess
def test_a_run_that_keeps_nothing_is_checked_without_torch():
    """`harness run`'s own process checks the disk before it launches; where the run keeps no
    provenance (emulated compute by default) that must not cost it torch's import (seconds of
    CPU on a machine whose cores the ranks are about to share)."""
    import subprocess
    import sys

    script = (f"import sys; from harness.scenario import scenario_from_dict; "
              f"from harness.results.provenance import disk_problem; "
              f"print(disk_problem(scenario_from_dict({PAPER_SCALE!r}), 2, '.'), 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "False"]


def test_human_bytes():
    assert [provenance.human_bytes(n) for n in (0, 999, 1000, 12_345, 879_400_000, 1_126_000_000)] == [
        "0 B", "999 B", "1 kB", "12.3 kB", "879 MB", "1.13 GB"]


def test_free_bytes_of_a_folder_not_made_yet(tmp_path, monkeypatch):
    # The file system's reading is injected: two real readings, taken at different moments while
    # other tests write files, need not agree.
    assert provenance.free_bytes(tmp_path) > 0  # one real reading
    asked = []

    def disk_usage(path):
        asked.append(Path(path))
        return shutil._ntuple_diskusage(total=1000, used=400, free=600)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    assert provenance.free_bytes(tmp_path / "a" / "b") == 600
    assert asked == [tmp_path]  # the nearest folder that exists: the one the new folders would be on
    assert not (tmp_path / "a").exists()  # asking made nothing


def test_run_refuses_provenance_larger_than_the_free_space(tmp_path, monkeypatch, capsys):
    path = write_scenario_file(tmp_path, PAPER_SCALE)
    out = tmp_path / "out"
    monkeypatch.setattr(provenance, "free_bytes", lambda where: 500_000_000)
    assert harness_main(["run", str(path), "--out", str(out), "--provenance", "full"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"error: {path}: results.provenance 'full' would write up")
    assert "1.13 GB" in error and "500 MB are free" in error and "4 ranks x 2 algorithms" in error
    assert "'final', 'none'" in error
    assert not out.exists()  # refused before the run directory was made
    # The same space holds the smaller levels: the check passes them (asked directly, so nothing launches).
    from harness.commands.run_directory import provenance_problem

    scenario = load_scenario(path)
    assert provenance_problem(provenance.resolve(scenario, "final"), None, str(out)) is None
    assert provenance_problem(provenance.resolve(scenario), None, str(out)) is None


def test_resume_takes_no_provenance_option(tmp_path, capsys):
    assert harness_main(["run", "--resume", str(tmp_path), "--provenance", "none"]) == 2
    assert "--resume takes only the run directory" in capsys.readouterr().err


def test_full_example_sets_provenance():
    full = load_scenario(Path(__file__).parent / "data" / "scenarios" / "full.yaml")
    assert full.results.provenance == "final"


def _correct_and_total(flat: torch.Tensor, seed: int) -> tuple[int, int]:
    """Test samples a logreg on digits with parameters ``flat`` gets right, computed here from scratch."""
    data = load_dataset("digits", seed)
    model = build_model("logreg", tuple(data.input_shape), data.num_classes, seed)
    torch.nn.utils.vector_to_parameters(flat, model.parameters())
    with torch.no_grad():
        return int((model(data.test_x).argmax(1) == data.test_y).sum()), data.num_test


@pytest.mark.mpi
def test_final_keeps_the_averaged_models_and_reports_its_size(tmp_path):
    path = write_scenario_file(tmp_path, REAL)
    proc = harness_cli("run", str(path), "--out", str(tmp_path / "out"), "--provenance", "final")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "out" / "prov").iterdir()
    files = sorted(p.name for p in (run / "provenance").iterdir())
    assert files == ["final_average_allreduce_sgd.pt", "final_average_local_sgd.pt", "initial_model.pt",
                     "shards.npz"]
    assert yaml.safe_load((run / "scenario.resolved.yaml").read_text())["results"]["provenance"] == "final"
    assert json.loads((run / "run.json").read_text())["provenance"] == "final"
    written = provenance.directory_bytes(run / "provenance")
    assert f"provenance: final, {provenance.human_bytes(written)} in {run / 'provenance'}" in proc.stdout
    expected = provenance.expected_bytes(load_scenario(run / "scenario.resolved.yaml"), 2)
    assert written <= expected <= written + 40_000  # an upper bound, and a close one
    # The averaged model is the one final_accuracy was measured on (the harness counts in float32).
    summary = pd.read_csv(run / "summary.csv").set_index("algorithm")
    for algorithm in ("allreduce_sgd", "local_sgd"):
        average = torch.load(run / "provenance" / f"final_average_{algorithm}.pt")
        assert average.shape == (sum(p.numel() for p in build_model("logreg", (1, 8, 8), 10, 0).parameters()),)
        correct, total = _correct_and_total(average, REAL["seed"])
        assert correct == round(summary.loc[algorithm, "final_accuracy"] * total)  # the same predictions


@pytest.mark.mpi
def test_emulated_compute_keeps_nothing_by_default(tmp_path):
    data = _with(PAPER_SCALE, name="emulated", ranks=2, algorithms=["local_sgd"],
                 workload={**PAPER_SCALE["workload"], "iterations": 3, "compute": {"emulate_ms": 1},
                           "params": 1000})
    proc = harness_cli("run", str(write_scenario_file(tmp_path, data)), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "out" / "emulated").iterdir()
    assert not (run / "provenance").exists()
    assert "provenance: none (nothing saved)" in proc.stdout
    assert yaml.safe_load((run / "scenario.resolved.yaml").read_text())["results"]["provenance"] == "none"
    assert json.loads((run / "run.json").read_text())["provenance"] == "none"
