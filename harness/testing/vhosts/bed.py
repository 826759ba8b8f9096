"""The virtual-host test bed from Python: where its scripts are, whether it runs, a command on its
first host, and the small scenario its runs share (``tests/test_vhosts.py``, ``bench
agreement``'s ``kernel_shaping`` case)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.testing.real_runs import REPO, RUN_TIMEOUT_S, run_command

#: The bed's shell scripts (start_vhosts.sh, vhost_exec.sh, stop_vhosts.sh): files of this package.
SCRIPTS = Path(__file__).resolve().parent


def vhost_scenario(ranks: int, name: str = "vhosts", iterations: int = 30, **extra: Any) -> dict:
    """The test bed's small scenario: emulated compute (5 ms), a 100,000-parameter model (400 kB
    messages), Allreduce-SGD; ``extra`` top-level fields added."""
    return {
        "name": name,
        "ranks": ranks,
        "seed": 1,
        "workload": {
            "model": "logreg",
            "dataset": "synthetic",
            "batch_size": 8,
            "iterations": iterations,
            "eval_every": iterations,
            "compute": {"emulate_ms": 5},
            "params": 100_000,
        },
        "algorithms": ["allreduce_sgd"],
        "results": {"comm_calls": False},
        **extra,
    }


def vhost_bed_missing() -> str | None:
    """Why the virtual-host test bed cannot be used now (None: it runs, and we are root)."""
    if sys.platform != "linux":
        return f"the virtual hosts need Linux namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the virtual hosts need root (network namespaces, tc)"
    if not (SCRIPTS / "vhost_exec.sh").is_file():
        return f"no virtual-host test bed in this installation ({SCRIPTS / 'vhost_exec.sh'} is missing)"
    try:
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot list network namespaces: {exc}"
    if "harness-vh1" not in namespaces or "harness-vh2" not in namespaces:
        return (
            "the virtual-host test bed is not running (start it as root: bash harness/testing/vhosts/start_vhosts.sh)"
        )
    return None


def harness_on_vh1(*args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` on virtual host vh1, in the repository."""
    return run_command(
        ["bash", str(SCRIPTS / "vhost_exec.sh"), "vh1", sys.executable, "-m", "harness", *map(str, args)],
        timeout=timeout,
        cwd=REPO,
    )
