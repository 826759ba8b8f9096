"""Devices: ``workload.device`` in the scenario, the refusal of cuda without a GPU, host staging.

The staging points of the CUDA path are tested without a GPU by staging through a second CPU
buffer (``HARNESS_STAGE_ON_CPU=1``): a staged run must give bit-identical final models.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, harness_cli, write_scenario_file
from harness.device import STAGE_ON_CPU_VAR, Staging, unavailable_reason
from harness.mpi_library import native_build
from harness.scenario import ScenarioError, scenario_from_dict
from harness.workload import build_model, flat_grads, flat_params

NO_GPU = not torch.cuda.is_available()


def _scenario(**workload) -> dict:
    return {
        "name": "devices",
        "ranks": 3,
        "workload": {"model": "mlp", "dataset": "digits", "batch_size": 16, "iterations": 8, "eval_every": 4,
                     **workload},
        # Deterministic algorithms touching the model in every hook: gradients reduced after
        # backward, parameters mixed after backward, averaged after the step, block updates.
        "algorithms": ["allreduce_sgd", "dpsgd", {"name": "local_sgd", "period": 3}, "bmuf"],
    }


def test_device_field_takes_cpu_or_cuda():
    assert scenario_from_dict(_scenario()).workload.device == "cpu"
    assert scenario_from_dict(_scenario(device="cuda")).workload.device == "cuda"
    with pytest.raises(ScenarioError, match=r"workload.device: give 'cuda' without an index"):
        scenario_from_dict(_scenario(device="cuda:1"))
    with pytest.raises(ScenarioError, match=r"workload.device"):
        scenario_from_dict(_scenario(device="tpu"))


@pytest.mark.skipif(not NO_GPU, reason="this machine has a usable GPU")
@pytest.mark.subprocess
def test_cuda_without_a_gpu_is_refused_before_anything_runs(tmp_path):
    assert "no CUDA device is usable on this machine" in unavailable_reason("cuda")
    path = write_scenario_file(tmp_path, _scenario(device="cuda"))
    for args in (["validate", str(path)], ["run", str(path), "--out", str(tmp_path / "out")]):
        proc = harness_cli(*args)
        assert proc.returncode == 2, proc.stderr
        assert f"error: {path}: workload.device: cuda: no CUDA device is usable" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_staging_on_the_cpu_is_the_identity():
    params, grads = torch.arange(4.0), torch.zeros(4)
    staging = Staging.of(params, grads, stage_on_cpu=False)
    assert not staging.staged and staging.host_params is params and staging.host_grads is grads


def test_staging_copies_each_way_at_its_point():
    device_params, device_grads = torch.arange(4.0), torch.full((4,), 2.0)
    s = Staging.of(device_params, device_grads, stage_on_cpu=True)
    assert s.staged and torch.equal(s.host_params, device_params) and s.host_params is not device_params
    s.host_params += 10  # an algorithm averages on the host
    assert torch.equal(device_params, torch.arange(4.0))  # not yet on the device
    s.params_to_device()
    assert torch.equal(device_params, torch.arange(4.0) + 10)
    device_grads *= 3  # backward on the device
    s.grads_to_host()
    assert torch.equal(s.host_grads, torch.full((4,), 6.0))
    s.host_grads /= 2  # an allreduce's mean on the host
    s.grads_to_device()
    assert torch.equal(device_grads, torch.full((4,), 3.0))
    device_params -= 1  # the optimizer step on the device
    s.params_to_host()
    assert torch.equal(s.host_params, torch.arange(4.0) + 9)


def test_flat_buffers_live_on_the_models_device():
    model = build_model("mlp", (1, 8, 8), 10, 0).to("meta")  # a device other than the CPU, on any machine
    assert flat_params(model).device.type == "meta" and flat_grads(model).device.type == "meta"


@pytest.mark.subprocess
def test_mpi_cuda_awareness_is_read_from_the_loaded_mpi_library():
    def probe(setup: str) -> str:
        code = f"{setup}; from harness.device import mpi_cuda_aware; print(mpi_cuda_aware())"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        return out.stdout.strip() or out.stderr

    assert probe("import json") == "None"  # the native layer not loaded: cannot tell
    # Its library answers MPIX_Query_cuda_support: the PyPI MPICH has it and is not CUDA-aware
    # (another MPI without the function gives None).
    answer = probe("from harness.mpi_library import import_mpi; import_mpi()")
    assert answer == "False" or (answer == "None" and native_build()["mpicc"]), answer


def _final_models(run: Path) -> dict[str, torch.Tensor]:
    return {p.stem: torch.load(p) for p in sorted((run / "provenance").glob("final_models_*.pt"))}


def _run(tmp_path: Path, name: str, env: dict[str, str], **workload) -> Path:
    data = _scenario(**workload)
    out = tmp_path / name
    proc = subprocess.run([sys.executable, "-m", "harness", "run", str(write_scenario_file(tmp_path, data)),
                           "--out", str(out)], env={**os.environ, **env}, cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (out / data["name"]).iterdir()
    return run


@pytest.mark.mpi
def test_staged_run_gives_bit_identical_models(tmp_path):
    plain = _run(tmp_path, "plain", {STAGE_ON_CPU_VAR: "0"})
    staged = _run(tmp_path, "staged", {STAGE_ON_CPU_VAR: "1"})
    a, b = _final_models(plain), _final_models(staged)
    assert list(a) == [f"final_models_{n}" for n in ("allreduce_sgd", "bmuf", "dpsgd", "local_sgd")]
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name}: staging changed the result"
    meta = json.loads((plain / "run.json").read_text())
    assert meta["device"] == "cpu" and meta["mpi_cuda_aware"] is False


@pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU (torch.cuda.is_available() is False here)")
def test_cuda_run_matches_the_cpu_run_closely(tmp_path):
    cpu = _final_models(_run(tmp_path, "cpu", {}))
    gpu_run = _run(tmp_path, "cuda", {}, device="cuda")
    assert json.loads((gpu_run / "run.json").read_text())["device"].startswith("cuda")
    for name, models in _final_models(gpu_run).items():
        torch.testing.assert_close(models, cpu[name], rtol=1e-3, atol=1e-4)


def _simulated_final_models(tmp_path: Path, label: str, **workload) -> dict[str, torch.Tensor]:
    """``simulate --train`` of ``_scenario`` (a fixed calibration, the wait-avoiding and gossip
    methods added); every algorithm's final models."""
    from harness.sim.calibration import save_fixed_calibration

    data = _scenario(**workload)
    data["algorithms"] = [*data["algorithms"], "sgp", {"name": "wagma", "group_size": 2}]
    data["name"] = f"devices_{label}"
    path = write_scenario_file(tmp_path / label, data)
    calibration = save_fixed_calibration(tmp_path / label / "calibration.json", 3, [("mlp", "digits", 16, 0.002)])
    proc = harness_cli("simulate", str(path), "--train", "--calibration", str(calibration),
                       "--out", str(tmp_path / label / "out"))
    assert proc.returncode == 0, proc.stderr
    (run,) = (tmp_path / label / "out" / data["name"]).glob("sim-*")
    assert json.loads((run / "run.json").read_text())["device"].startswith(workload.get("device", "cpu"))
    return {p.stem: torch.load(p) for p in sorted((run / "provenance").glob("final_models_*.pt"))}


@pytest.mark.skipif(not NO_GPU, reason="this machine has a usable GPU")
@pytest.mark.subprocess
def test_simulated_training_on_cuda_without_a_gpu_is_refused(tmp_path):
    path = write_scenario_file(tmp_path, _scenario(device="cuda"))
    proc = harness_cli("simulate", str(path), "--train", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "no CUDA device is usable" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU (torch.cuda.is_available() is False here)")
def test_simulated_training_on_the_gpu_matches_the_cpu_closely(tmp_path):
    cpu = _simulated_final_models(tmp_path, "cpu")
    gpu = _simulated_final_models(tmp_path, "cuda", device="cuda")
    assert list(gpu) == list(cpu)
    for name, models in gpu.items():
        torch.testing.assert_close(models, cpu[name], rtol=1e-3, atol=1e-4)
