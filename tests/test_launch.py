"""Launchers: mpiexec on this host or a host file, SLURM inside an allocation, ``sbatch`` scripts.

What needs a real SLURM is in ``tests/test_slurm.py``."""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
import time

import pytest

from conftest import harness_cli, write_scenario_file
from harness.launch import Launch, LaunchError, inside_mpi_job, read_hosts, slurm_allocation
from harness.rank_exit import wait_until_output_is_read

SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")


@pytest.fixture
def no_slurm(monkeypatch):
    for var in SLURM_VARS + ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _scenario(**changes) -> dict:
    data = {"name": "launched", "ranks": 3,
            "workload": {"model": "logreg", "dataset": "synthetic", "batch_size": 8, "iterations": 6,
                         "compute": {"emulate_ms": 2}},
            "algorithms": ["allreduce_sgd"]}
    data.update(changes)
    return data


def test_auto_picks_slurm_inside_an_allocation_only(no_slurm):
    assert Launch.choose() == Launch("mpiexec")
    no_slurm.setenv("SLURM_JOB_ID", "42")
    assert slurm_allocation() == "42" and Launch.choose() == Launch("slurm")
    no_slurm.setenv("SLURM_STEP_ID", "0")  # inside a job step: ranks started by srun, not an allocation shell
    assert slurm_allocation() is None


def test_ranks_started_by_srun_are_detected(no_slurm):
    assert inside_mpi_job() is None
    no_slurm.setenv("SLURM_JOB_ID", "42")
    no_slurm.setenv("SLURM_STEP_ID", "0")
    no_slurm.setenv("SLURM_PROCID", "3")
    no_slurm.setenv("SLURM_NTASKS", "4")
    no_slurm.setenv("PMI_FD", "13")  # srun --mpi=pmi2 (it sets PMI_SIZE too, read first)
    assert inside_mpi_job() == 4
    no_slurm.setenv("PMI_SIZE", "4")
    assert inside_mpi_job() == 4


def test_command_lines(no_slurm, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node1:4\n# spare\nnode2\n")
    assert Launch().command(4, ["x"])[1:] == ["-n", "4", "x"]
    assert Launch.choose("mpiexec", hosts).command(8, ["x"])[1:] == ["-f", str(hosts.absolute()), "-n", "8", "x"]
    no_slurm.setenv("SLURM_JOB_ID", "42")
    assert Launch.choose("slurm").command(4, ["x"])[1:] == ["-launcher", "slurm", "-rmk", "slurm", "-n", "4", "x"]
    with pytest.raises(LaunchError, match="ranks must be >= 1"):
        Launch().command(0, ["x"])


def test_single_host_jobs_are_told_from_multi_host_ones(no_slurm, tmp_path):
    """Single host: the watchdog listens on 127.0.0.1; otherwise on an address the hosts reach."""
    local, remote = tmp_path / "local", tmp_path / "remote"
    local.write_text("localhost:2\n127.0.0.1\n")
    remote.write_text("localhost\nnode7.cluster:8\n")
    assert Launch().single_host() and Launch.choose("mpiexec", local).single_host()
    assert not Launch.choose("mpiexec", remote).single_host()
    no_slurm.setenv("SLURM_JOB_ID", "42")
    no_slurm.setenv("SLURM_JOB_NUM_NODES", "2")
    assert not Launch.choose("slurm").single_host()


@pytest.mark.parametrize("text, message", [
    ("", "no hosts in it"),
    ("node1:0\n", ":1: expected 'host' or 'host:slots' with slots >= 1, got 'node1:0'"),
    ("node1\nnode 2:x\n", ":2: expected"),
    ("node1:-3\n", ":1: expected"),
])
def test_bad_host_files_name_the_line(tmp_path, text, message):
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(LaunchError, match=message):
        read_hosts(path)
    with pytest.raises(LaunchError, match="cannot read it"):
        read_hosts(tmp_path / "missing")


@pytest.mark.subprocess
def test_slurm_launcher_outside_an_allocation_is_refused(no_slurm, tmp_path):
    path = write_scenario_file(tmp_path, _scenario())
    proc = harness_cli("run", str(path), "--launcher", "slurm", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "not inside a SLURM allocation" in proc.stderr and "python -m harness sbatch" in proc.stderr
    proc = harness_cli("run", str(path), "--launcher", "slurm", "--hosts", str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "--hosts goes with --launcher mpiexec" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.mpi
def test_run_on_a_host_file(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:3\n")
    path = write_scenario_file(tmp_path, _scenario())
    proc = harness_cli("run", str(path), "--hosts", str(hosts), "--out", str(tmp_path / "out"), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "out" / "launched").iterdir()
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["hosts"] == 1 and meta["ranks"] == 3


@pytest.mark.subprocess
def test_sbatch_writes_a_script_with_the_task_count(tmp_path):
    path = write_scenario_file(tmp_path, _scenario(ranks=5))
    proc = harness_cli("sbatch", str(path), "--out", str(tmp_path / "res"), "--time", "00:20:00",
                       "--partition", "debug", "--iterations", "4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "res" / "launched" / "launched.sbatch"
    assert f"submit it with:  sbatch {script}" in proc.stdout
    text = script.read_text()
    for line in ("#SBATCH --ntasks=5", "#SBATCH --time=00:20:00", "#SBATCH --partition=debug",
                 f"#SBATCH --output={tmp_path / 'res' / 'launched' / 'slurm-%j.out'}", f"cd {tmp_path}"):
        assert line in text.splitlines(), line
    run_line = text.splitlines()[-1]
    assert "-m harness run" in run_line and "--launcher slurm" in run_line and "--iterations 4" in run_line
    assert run_line.startswith(shlex.quote(sys.executable) + " -m harness run")  # this environment's Python


@pytest.mark.parametrize("args, message", [
    (["--time", "soon"], "--time 'soon': not a SLURM time limit"),
    (["--nodes", "9"], "--nodes 9: must be between 1 and the scenario's 3 ranks"),
    (["--ranks", "0"], "ranks"),
])
@pytest.mark.subprocess
def test_sbatch_refuses_bad_input_and_writes_nothing(tmp_path, args, message):
    path = write_scenario_file(tmp_path, _scenario())
    proc = harness_cli("sbatch", str(path), "--out", str(tmp_path / "res"), *args)
    assert proc.returncode == 2 and message in proc.stderr
    assert not (tmp_path / "res").exists()


@pytest.mark.subprocess
def test_sbatch_does_not_need_a_gpu_on_the_login_node(tmp_path):
    path = write_scenario_file(tmp_path, _scenario(workload={**_scenario()["workload"], "device": "cuda"}))
    proc = harness_cli("sbatch", str(path), "--out", str(tmp_path / "res"))
    assert proc.returncode == 0, proc.stderr
    assert "each rank takes the GPU of its local rank" in proc.stdout


@pytest.mark.subprocess
def test_srun_tasks_mpi_cannot_join_are_refused_before_anything_is_written(no_slurm, tmp_path):
    for var, value in {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "4"}.items():
        no_slurm.setenv(var, value)
    with pytest.raises(LaunchError, match=r"srun started 4 tasks with no PMI.*srun --mpi=pmi2"):
        inside_mpi_job()
    proc = harness_cli("run", str(write_scenario_file(tmp_path, _scenario())), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "error: srun started 4 tasks with no PMI" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()
    no_slurm.setenv("PMIX_RANK", "1")
    with pytest.raises(LaunchError, match="PMIx, which this MPI library"):
        inside_mpi_job()
    no_slurm.delenv("PMIX_RANK")
    no_slurm.setenv("PMI_FD", "13")  # srun --mpi=pmi2: MPI can join the tasks
    assert inside_mpi_job() == 4


def test_an_aborting_rank_waits_until_its_output_pipe_is_read(tmp_path):
    """A rank about to call MPI_Abort waits until the proxy has read its traceback from the pipe
    (the abort would lose what is still in it); never for a file, never past its limit."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"Traceback (most recent call last): ...\n")
        started = time.monotonic()
        assert not wait_until_output_is_read([write_end], limit_s=0.2)  # nobody reads: gives up
        assert time.monotonic() - started >= 0.2
        reader = threading.Timer(0.1, os.read, (read_end, 4096))
        reader.start()
        assert wait_until_output_is_read([write_end], limit_s=5.0)
        reader.join()
        assert time.monotonic() - started < 5.0
    finally:
        os.close(read_end)
        os.close(write_end)
    with open(tmp_path / "stderr.txt", "w") as file:
        file.write("written, and nobody reads it")
        file.flush()
        assert wait_until_output_is_read([file.fileno()], limit_s=0.0)
