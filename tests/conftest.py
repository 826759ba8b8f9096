"""Shared fixtures: launching multi-rank check scripts under the venv's mpiexec."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.launch import run_ranks

MPI_DIR = Path(__file__).parent / "mpi"


def launch_checks(script: str, ranks: int, tmp_path: Path, timeout: float = 240) -> dict:
    """Run ``tests/mpi/<script>`` on ``ranks`` ranks; return rank 0's JSON report."""
    out = tmp_path / f"{Path(script).stem}-{ranks}.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = run_ranks(ranks, ["python", "-u", str(MPI_DIR / script), str(out), "-v"], timeout=timeout,
                         env=env, capture=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{script} on {ranks} ranks did not finish in {timeout} s; last checks started:\n"
                    f"{(exc.stdout or '')[-2000:]}")
    if proc.returncode != 0 or not out.exists():
        pytest.fail(f"{script} on {ranks} ranks exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def assert_check(report: dict, name: str) -> None:
    result = report[name]
    if result["status"] == "skip":
        pytest.skip(result["detail"])
    assert result["status"] == "pass", result["detail"]
