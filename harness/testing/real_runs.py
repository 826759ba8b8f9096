"""Real runs for the benchmarks and tests that compare them with something: commands run with
their output captured and a timeout that stops a launcher's ranks, ``python -m harness run``
followed by ``compare``, and the two exceptions a case raises (``bench agreement``, ``bench
faults`` and the tests use them)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 600


class CaseFailed(Exception):
    """A command of a case failed; the message says which and what it printed."""


class CaseSkipped(Exception):
    """A case cannot run here; the message says why."""


def run_command(
    cmd: Sequence[str], timeout: float = RUN_TIMEOUT_S, cwd: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``cmd`` with its output captured; on timeout it is interrupted like Ctrl+C (a launcher
    then stops its ranks instead of orphaning them) and CaseFailed is raised."""
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=dict(os.environ if env is None else env, PYTHONUNBUFFERED="1"),
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        raise CaseFailed(f"{' '.join(map(str, cmd))} did not finish in {timeout} s\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def harness_here(*args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` on this host."""
    return run_command([sys.executable, "-m", "harness", *map(str, args)], timeout=timeout)


def succeeded(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if proc.returncode != 0:
        raise CaseFailed(f"{' '.join(map(str, proc.args[-6:]))} exited {proc.returncode}\n{proc.stderr[-3000:]}")
    return proc


@dataclass
class Compared:
    """A real run and its ``compare``: the run directory, ``compare.csv`` and what compare printed."""

    run: Path
    table: Any  # pandas.DataFrame, columns harness.sim.compare.COMPARE_COLUMNS
    output: str


def run_dirs(root: Path) -> set[Path]:
    return {p for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()


def run_and_compare(
    scenario: dict | Path,
    out: Path,
    calibration: Path,
    mode: str = "both",
    harness: Callable[..., subprocess.CompletedProcess] = harness_here,
) -> Compared:
    """Run ``scenario`` (a scenario dict, written to ``out``, or a scenario file) for real with
    ``python -m harness run`` into ``out``, then ``python -m harness compare`` it with
    ``calibration`` in ``mode`` (trace, predictive or both), each through ``harness``."""
    import pandas as pd  # noqa: PLC0415  (compare.csv only: the CLI imports this module at start-up)

    out.mkdir(parents=True, exist_ok=True)
    if isinstance(scenario, dict):
        path = out / f"{scenario['name']}.yaml"
        path.write_text(yaml.safe_dump(scenario, sort_keys=False))
        name = scenario["name"]
    else:
        path = scenario
        name = yaml.safe_load(path.read_text())["name"]
    before = run_dirs(out / "runs" / name)
    succeeded(harness("run", str(path), "--out", str(out / "runs")))
    runs = sorted(run_dirs(out / "runs" / name) - before)
    if len(runs) != 1:
        raise CaseFailed(f"expected one new run directory in {out / 'runs' / name}, found {runs}")
    proc = harness("compare", str(runs[0]), "--calibration", str(calibration), "--mode", mode)
    if proc.returncode == 2:  # the calibration lacks what the run needs: the message says what to do
        raise CaseSkipped(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "compare exited 2")
    succeeded(proc)
    return Compared(runs[0], pd.read_csv(runs[0] / "compare.csv"), proc.stdout + proc.stderr)
