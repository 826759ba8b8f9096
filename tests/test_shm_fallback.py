"""The shared-memory path's fallback: a segment that cannot be made warns once and leaves the
collectives on MPI messages, with the same results (no crash, no hang)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from harness.launch import run_ranks

_SCRIPT = """
import warnings
import numpy as np
from mpi4py import MPI
from harness.comm import Communicator
from harness.comm.shm import SharedMemoryFallback

with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    comm = Communicator(MPI.COMM_WORLD)
fallbacks = [w for w in seen if issubclass(w.category, SharedMemoryFallback)]
x = np.full(1000, MPI.COMM_WORLD.rank + 1, dtype=np.float32)
comm.allreduce(x)
size = MPI.COMM_WORLD.size
assert (x == size * (size + 1) / 2).all(), x[:4]
print(f"rank {MPI.COMM_WORLD.rank}: {len(fallbacks)} warning(s): {fallbacks[0].message if fallbacks else ''}")
comm.close()
"""


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_a_missing_shared_memory_directory_warns_once_and_falls_back(tmp_path, ranks):
    env = dict(os.environ, HARNESS_SHM_DIR=str(tmp_path / "no_such_directory"))
    # 120 s: a hang guard (a fallback that hung); the job takes about a second
    proc = run_ranks(ranks, [sys.executable, "-c", _SCRIPT], env=env, timeout=120, capture=True)
    printed = proc.stdout + proc.stderr
    assert proc.returncode == 0, printed[-3000:]
    for rank in range(ranks):
        assert f"rank {rank}: 1 warning(s): no shared-memory segment" in printed, printed[-3000:]
    assert "no_such_directory" in printed and "No such file or directory" in printed, printed[-3000:]


@pytest.mark.mpi
def test_without_direct_reads_the_copies_go_through_the_slots(tmp_path):
    """HARNESS_SHM_DIRECT=0: gathers, scatters and allgathers go through the segment's slots (and
    the message path above one slot) instead of reading each other's memory; the typed
    collectives check of tests/mpi/comm_checks.py still gives numpy's exact results, at 3 ranks."""
    report = tmp_path / "report.json"
    script = Path(__file__).parent / "mpi" / "comm_checks.py"
    env = dict(os.environ, HARNESS_SHM_DIRECT="0")
    # 240 s: a hang guard; the job takes about 10 s
    proc = run_ranks(3, [sys.executable, "-u", str(script), str(report), "--only",
                         "typed_collectives_blocking_and_posted_give_exact_results"], env=env, timeout=240, capture=True)
    assert proc.returncode == 0 and report.exists(), (proc.stdout + proc.stderr)[-3000:]
    result = json.loads(report.read_text())["typed_collectives_blocking_and_posted_give_exact_results"]
    assert result["status"] == "pass", result["detail"]
