"""``torch.distributed`` on the harness's native layer: the backend named ``harness``.

Importing this module registers the backend; then any torch.distributed program runs on it::

    import torch.distributed as dist
    import harness.dist  # noqa: F401  registers "harness"

    dist.init_process_group("harness")  # env:// (launch sets the variables; plain mpiexec: from MPI)
    model = torch.nn.parallel.DistributedDataParallel(model)

Every byte crosses the native layer (``harness._core``), so the scenario's emulated links and
topology apply to it. Under ``mpiexec``/``srun`` without torchrun's variables, importing sets
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from MPI (unset
ones only). See docs/guides/torch-distributed.md.

``harness.dist.record(loss=..., accuracy=..., evaluation=False)`` hands the script's own loss and
accuracy to the results of ``python -m harness launch --scenario`` (steps.csv, evals.csv); a
no-op anywhere else (``harness.dist.metrics``).
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

from harness.comm.shm import warn_shm_fallback
from harness.dist import mismatch
from harness.dist.errors import BackendInitError, UnsupportedError
from harness.dist.metrics import record
from harness.dist.process_group import BACKEND, HarnessProcessGroup
from harness.dist.tensors import DTYPE_CODES
from harness.dist.world import (
    abort_job_on_uncaught_exception,
    check_against_mpi,
    communicator,
    fill_env_from_mpi,
    launched_by_mpi,
    use_communicator,
)

__all__ = [
    "BACKEND",
    "DTYPE_CODES",
    "BackendInitError",
    "HarnessProcessGroup",
    "UnsupportedError",
    "record",
    "use_communicator",
]

_ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _create(dist_opts: Any, _backend_opts: Any) -> HarnessProcessGroup:
    """torch's creator function (``extended_api``): called on the members of each new group."""
    comm = communicator()
    mismatch.ensure(comm.rank)  # every process checks its collectives against its peers'
    ranks = [int(r) for r in dist_opts.global_ranks_in_group]
    if not ranks:  # the default group
        check_against_mpi(dist_opts.group_rank, dist_opts.group_size)
        ranks = list(range(comm.size))
    native = comm._native.group(ranks)
    warn_shm_fallback(native.shm_fallback_reason)
    if (native.rank, native.size) != (dist_opts.group_rank, dist_opts.group_size):
        raise BackendInitError(
            f"new_group({ranks}): torch says rank {dist_opts.group_rank} of {dist_opts.group_size}, the native "
            f"group rank {native.rank} of {native.size}"
        )
    return HarnessProcessGroup(native, dist_opts.group_rank, dist_opts.group_size, ranks)


def _register() -> None:
    if BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])


_register()
if launched_by_mpi():
    if not all(v in os.environ for v in _ENV_VARS):
        fill_env_from_mpi()
    from harness.api.session import ENV_RUN_DIR

    if ENV_RUN_DIR not in os.environ:  # not under `launch`, whose watchdog ends a failed job
        abort_job_on_uncaught_exception()
