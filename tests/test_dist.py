"""The torch.distributed backend ``harness`` (harness.dist).

Every check runs under real mpiexec (tests/mpi/dist_checks.py), one launch per rank count:
the operations against gloo for every supported dtype and reduce op, async work and futures,
subgroups, and the same training loop on gloo and on harness (DDP, ZeroRedundancyOptimizer,
PostLocalSGDOptimizer, FSDP2) ending with the same parameters: bitwise at 2 ranks, within 1e-6
relative at 3 and 4.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_check, check_names, report_cache

SCRIPT = "dist_checks.py"
CUDA_SCRIPT = "dist_cuda_checks.py"
NO_GPU = not torch.cuda.is_available()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return report_cache(SCRIPT, tmp_path_factory)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3, 4])
@pytest.mark.parametrize("name", check_names(SCRIPT))
def test_dist_on_ranks(report, name, ranks):
    assert_check(report(ranks), name)


@pytest.fixture(scope="module")
def cuda_report(tmp_path_factory):
    return report_cache(CUDA_SCRIPT, tmp_path_factory)


@pytest.mark.mpi
@pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU (torch.cuda.is_available() is False here)")
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", check_names(CUDA_SCRIPT))
def test_dist_with_cuda_tensors(cuda_report, name, ranks):
    """CUDA tensors are staged through the host: results equal the host's bitwise, and DDP and
    FSDP2 on the GPU train as on the CPU."""
    assert_check(cuda_report(ranks), name)


def test_import_registers_the_backend_without_mpi_launcher():
    """Outside an MPI job importing harness.dist only registers the backend (no env changes)."""
    import os
    import subprocess
    import sys

    code = ("import os, torch.distributed as dist, harness.dist; "
            "print(dist.Backend.HARNESS, 'harness' in dist.Backend.backend_list, 'RANK' in os.environ)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "RANK", "WORLD_SIZE"))}
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["harness", "True", "False"], out.stdout
