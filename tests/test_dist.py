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
from conftest import mpi_check_suite

SCRIPT = "dist_checks.py"
CUDA_SCRIPT = "dist_cuda_checks.py"
NO_GPU = not torch.cuda.is_available()


TestDistChecks = mpi_check_suite(SCRIPT, (2, 3, 4), checks=16)

TestDistCudaChecks = mpi_check_suite(
    CUDA_SCRIPT, (2, 3), checks=5,
    marks=[pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU (torch.cuda.is_available() is False here)")],
    doc="""CUDA tensors are staged through the host: results equal the host's bitwise, and DDP and
    FSDP2 on the GPU train as on the CPU.""")


@pytest.mark.subprocess
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
