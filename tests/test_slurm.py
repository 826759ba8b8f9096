"""Against a real SLURM: a single-node slurmctld + slurmd (with munge) on this machine, started by
``tests/slurm/start_slurm.sh`` (Debian's packages installed beforehand by ``.ci/provision.sh``), and a 4-rank
scenario submitted with ``sbatch`` in the two ways a user would run the harness on a cluster:

* the launcher path: ``python -m harness sbatch FILE`` writes the batch script, which runs
  ``python -m harness run FILE --launcher slurm`` once; the harness starts its own ``mpiexec``
  inside the allocation (Hydra bootstraps through ``srun`` there);
* ranks started by the user: ``srun --mpi=pmi2 python -m harness run FILE``; the harness sees it is
  one rank of an MPI job (``PMI_SIZE``/``SLURM_*``) and runs in place.

The whole module is skipped, with the reason, where SLURM cannot be started here: not Linux, not
root, SLURM not installed (``.ci/provision.sh`` installs it as root), the daemons do not come up,
or ``HARNESS_SKIP_SLURM=1``. A third test checks that srun tasks MPI cannot join (no PMI) are
refused before anything is written.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness.launch import srun_plugin
from harness.mpi_library import MpiLibrary, native_build

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "slurm"
START_TIMEOUT_S = 600   # the daemons start in seconds; another session's start_slurm.sh may hold the lock
JOB_TIMEOUT_S = 300     # one job: ~20-35 s here, most of it Python/torch start-up of 4 ranks
RANKS, ITERATIONS, ALGORITHMS = 4, 10, ["allreduce_sgd", "dpsgd"]

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(START_TIMEOUT_S + 2 * JOB_TIMEOUT_S)]

# What tests/slurm/start_slurm.sh and the tests run (Debian's slurmctld slurmd slurm-client munge).
SLURM_TOOLS = ("munged", "munge", "unmunge", "slurmctld", "slurmd", "sinfo", "sbatch", "srun", "scontrol", "squeue",
               "scancel")

FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                "BOOT_FAIL", "DEADLINE"}


def _cannot_start() -> str | None:
    if os.environ.get("HARNESS_SKIP_SLURM") == "1":
        return "HARNESS_SKIP_SLURM=1"
    if platform.system() != "Linux":
        return f"SLURM test needs Linux (this is {platform.system()})"
    if os.geteuid() != 0:
        return "SLURM test needs root (it runs slurmd)"
    missing = [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"SLURM is not installed (no {', '.join(missing)}): .ci/provision.sh installs it (as root, with apt-get)"
    return None


@pytest.fixture(scope="module")
def slurm_env():
    """Environment for SLURM's clients (``SLURM_CONF`` of the test cluster); the daemons run meanwhile.

    The daemons are stopped at the end only if this session started them, so a session that found
    them running (another test session, a developer) leaves them be.
    """
    reason = _cannot_start()
    if reason:
        pytest.skip(reason)
    try:
        proc = subprocess.run(["bash", str(SCRIPTS / "start_slurm.sh")], capture_output=True, text=True,
                              timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        subprocess.run(["bash", str(SCRIPTS / "stop_slurm.sh")], capture_output=True, timeout=60)
        pytest.skip(f"SLURM: start_slurm.sh did not finish in {START_TIMEOUT_S} s")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].startswith("export SLURM_CONF="):
        errors = proc.stderr.strip().splitlines() or ["no output"]
        fail = [ln for ln in errors if "FAIL:" in ln]
        pytest.skip(f"SLURM cannot start here (start_slurm.sh exit {proc.returncode}): {(fail or errors)[-1]}")
    started = "start_slurm: starting" in proc.stderr
    # Nothing of a job this process may itself run in leaks into the test's jobs.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_", "PMIX_", "SBATCH_", "SRUN_"))}
    env["SLURM_CONF"] = lines[-1].split("=", 1)[1]
    env["PYTHONUNBUFFERED"] = "1"
    yield env
    if started:
        subprocess.run(["bash", str(SCRIPTS / "stop_slurm.sh")], capture_output=True, timeout=60)


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "slurmtest.yaml"
    path.write_text(yaml.safe_dump({
        "name": "slurmtest",
        "ranks": RANKS,
        "workload": {"model": "logreg", "dataset": "synthetic", "batch_size": 8, "iterations": ITERATIONS,
                     "compute": {"emulate_ms": 5}},
        "algorithms": ALGORITHMS,
    }, sort_keys=False))
    return path


def _srun_batch_script(scenario: Path, out: Path, log: Path, ranks: int = RANKS, launcher: bool = False) -> str:
    """A batch script in which ``srun --mpi=pmi2`` (``pmix`` under Open MPI) starts the ranks and the
    harness runs in place (results under ``out``, job output to ``log``); with ``launcher``, the
    harness runs once and starts them with ``--launcher srun``. PMI-2 is what the MPICHs' libmpi
    speaks with srun: ``--mpi=none``, SLURM's usual default, makes every task a 1-rank
    singleton, and the PyPI MPICH refuses ``--mpi=pmix``."""
    run = f"{sys.executable} -m harness run {scenario} --out {out}"
    # A library chosen at run time (HARNESS_LIBMPI): ranks the user starts need its folder on
    # LD_LIBRARY_PATH, as the harness's own launchers give it (docs/guides/clusters.md).
    exports = [f"export {name}={value}" for name, value in MpiLibrary.of_this_environment().rank_env().items()]
    return "\n".join([
        "#!/bin/bash",
        "#SBATCH --job-name=harness-slurmtest",
        f"#SBATCH --ntasks={ranks}",
        "#SBATCH --time=5",
        f"#SBATCH --output={log}",
        f"#SBATCH --chdir={REPO}",
        "set -eu",
        f"cd {REPO}",
        *exports,
        f"exec {run} --launcher srun" if launcher else f"exec srun --ntasks={ranks} --mpi={srun_plugin()} {run}",
        "",
    ])


def _job_state(job_id: str, env: dict) -> tuple[str, str]:
    """(JobState, ExitCode) of a job, e.g. ("COMPLETED", "0:0"); ("", "") once SLURM forgot it."""
    proc = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, env=env,
                          timeout=30)
    fields = dict(f.split("=", 1) for f in proc.stdout.split() if "=" in f)
    return fields.get("JobState", ""), fields.get("ExitCode", "")


def _submit_and_wait(script: str | Path, tmp_path: Path, env: dict, log: Path) -> tuple[str, str]:
    """Submit ``script`` (its text, or a script file); wait for the job to end (at most
    JOB_TIMEOUT_S, then cancel it and fail).

    Polls ``scontrol`` every half second instead of ``sbatch --wait``: that polls after 2, 10, 42,
    74... s (sleeps growing 2, 8, 32 s), so a 20 s job would be seen done only at 42 s.
    """
    if isinstance(script, Path):
        path = script
    else:
        path = tmp_path / "job.sh"
        path.write_text(script)
    proc = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60)
    assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
    job_id = proc.stdout.strip().split(";")[0]
    deadline = time.monotonic() + JOB_TIMEOUT_S
    state = exit_code = ""
    while time.monotonic() < deadline:
        state, exit_code = _job_state(job_id, env)
        if state in FINAL_STATES or state == "":
            return state, exit_code
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], env=env, timeout=30)
    output = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    pytest.fail(f"job {job_id} not done in {JOB_TIMEOUT_S} s (state {state}); output:\n{output}")


def _check_run(out: Path, log: Path, state: str, exit_code: str) -> None:
    output = log.read_text(errors="replace") if log.exists() else "(no job output)"
    assert state == "COMPLETED" and exit_code == "0:0", f"job {state} {exit_code}:\n{output[-3000:]}"
    runs = sorted(p for p in (out / "slurmtest").iterdir() if p.is_dir()) if (out / "slurmtest").is_dir() else []
    assert len(runs) == 1, f"expected one run directory, found {[r.name for r in runs]}:\n{output[-3000:]}"
    meta = json.loads((runs[0] / "run.json").read_text())
    assert meta["status"] == "complete", meta
    assert meta["ranks"] == RANKS
    assert meta["mpi"]["family"] == native_build()["family"], meta["mpi"]  # this environment's MPI ran it
    assert sorted(meta["finished_algorithms"]) == sorted(ALGORITHMS)
    with open(runs[0] / "steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == RANKS * ITERATIONS * len(ALGORITHMS)
    assert {(r["algorithm"], int(r["rank"]), int(r["iteration"])) for r in rows} == {
        (a, rank, i) for a in ALGORITHMS for rank in range(RANKS) for i in range(ITERATIONS)}


def test_script_of_the_sbatch_command_runs_the_scenario(slurm_env, tmp_path):
    """What a user does: ``python -m harness sbatch FILE``, then ``sbatch`` the script it wrote
    (which runs ``python -m harness run FILE --launcher slurm`` in the allocation)."""
    scenario, out, script = _scenario(tmp_path), tmp_path / "out", tmp_path / "slurmtest.sbatch"
    proc = subprocess.run([sys.executable, "-m", "harness", "sbatch", str(scenario), "--out", str(out),
                           "--time", "5", "--script", str(script)], capture_output=True, text=True, env=slurm_env,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"submit it with:  sbatch {script}" in proc.stdout
    assert f"#SBATCH --ntasks={RANKS}" in script.read_text().splitlines()
    state, exit_code = _submit_and_wait(script, tmp_path, slurm_env, tmp_path / "unused")
    logs = sorted((out / "slurmtest").glob("slurm-*.out"))
    assert len(logs) == 1, "the job's output is not where the script said"
    _check_run(out, logs[0], state, exit_code)


def test_sbatch_srun_ranks_run_in_place(slurm_env, tmp_path):
    scenario, out, log = _scenario(tmp_path), tmp_path / "out", tmp_path / "job.out"
    state, exit_code = _submit_and_wait(_srun_batch_script(scenario, out, log), tmp_path, slurm_env, log)
    _check_run(out, log, state, exit_code)
    assert "this job has 1" not in log.read_text(errors="replace")


def test_the_srun_launcher_starts_the_ranks_with_this_mpis_plugin(slurm_env, tmp_path):
    scenario, out, log = _scenario(tmp_path), tmp_path / "out", tmp_path / "job.out"
    state, exit_code = _submit_and_wait(_srun_batch_script(scenario, out, log, launcher=True), tmp_path, slurm_env,
                                        log)
    _check_run(out, log, state, exit_code)


def test_srun_without_pmi_fails_clearly(slurm_env, tmp_path):
    """srun tasks that MPI cannot join into one job: the harness should stop before writing anything
    and say how to start the ranks (``srun --mpi=pmi2``, or one ``python -m harness run`` per job)."""
    scenario, out = _scenario(tmp_path), tmp_path / "out"
    cmd = ["salloc", f"--ntasks={RANKS}", "--time=5", "srun", f"--ntasks={RANKS}", "--mpi=none",
           sys.executable, "-m", "harness", "run", str(scenario), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=slurm_env, cwd=REPO, timeout=JOB_TIMEOUT_S)
    assert proc.returncode != 0
    assert not (out / "slurmtest").exists() or not any((out / "slurmtest").iterdir()), \
        "run directories were created by ranks that are not one job"
    assert f"--mpi={srun_plugin()}" in proc.stderr, proc.stderr[-3000:]


def test_sbatch_sweep_runs_one_array_task_per_point(slurm_env, tmp_path):
    """``python -m harness sbatch FILE --sweep KEY=V1,V2``: a job array whose tasks each run one
    point into the sweep directory; ``report`` of the directory then tabulates them."""
    scenario, out = _scenario(tmp_path), tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "harness", "sbatch", str(scenario), "ranks=2", "--only", "dpsgd",
                           "--sweep", "workload.iterations=3,5", "--out", str(out), "--time", "5"],
                          capture_output=True, text=True, env=slurm_env, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (sweep,) = (out / "slurmtest").iterdir()
    script = sweep / "sweep.sbatch"
    assert "#SBATCH --array=0-1" in script.read_text().splitlines()
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=slurm_env,
                               cwd=REPO, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 2 * JOB_TIMEOUT_S
    while time.monotonic() < deadline:  # every task has left the queue
        queued = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True, env=slurm_env,
                                timeout=30)
        if queued.returncode == 0 and not queued.stdout.strip():
            break
        time.sleep(0.5)
    else:
        subprocess.run(["scancel", job_id], env=slurm_env, timeout=30)
        pytest.fail(f"job array {job_id} not done in {2 * JOB_TIMEOUT_S} s")
    logs = "".join(p.read_text(errors="replace") for p in sweep.glob("slurm-*.out"))
    for index in (0, 1):
        status = json.loads((sweep / "points" / f"p{index:03d}.json").read_text())
        assert status["status"] == "done", f"point {index}: {status}\n{logs[-3000:]}"
    report = subprocess.run([sys.executable, "-m", "harness", "report", str(sweep)], capture_output=True, text=True,
                            env=slurm_env, cwd=REPO, timeout=120)
    assert report.returncode == 0, report.stderr
    with open(sweep / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted((int(r["workload.iterations"]), r["algorithm"], int(r["steps_recorded"])) for r in rows) == [
        (3, "dpsgd", 6), (5, "dpsgd", 10)]
