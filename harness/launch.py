"""Launching ranks: always with the venv's own ``mpiexec``, never whatever is first on PATH.

The MPICH wheel installs ``mpiexec`` next to the interpreter; using that one guarantees that
the launcher, the ``libmpi`` mpi4py loads and the one the native layer links are the same.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from collections.abc import Sequence


class LaunchError(RuntimeError):
    """The ranks could not be started or did not finish."""


def mpiexec_path() -> Path:
    """The ``mpiexec`` of the environment this interpreter runs in."""
    path = Path(sys.executable).parent / "mpiexec"
    if not path.exists():
        raise LaunchError(
            f"no mpiexec next to {sys.executable}: install the project (pip install -e .) "
            "into this environment; it brings MPICH's mpiexec with the 'mpich' package"
        )
    return path


def inside_mpi_job() -> int | None:
    """World size of the MPI job this process was started in by a launcher, or None.

    Looks at the variables MPICH's Hydra, Open MPI, Intel MPI and SLURM's srun set, without
    initializing MPI (so a parent process can still launch its own job).
    """
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        if var in os.environ:
            return int(os.environ[var])
    if "SLURM_STEP_ID" in os.environ and "SLURM_NTASKS" in os.environ and "SLURM_PROCID" in os.environ:
        return int(os.environ["SLURM_NTASKS"])
    return None


def mpiexec_command(ranks: int, argv: Sequence[str]) -> list[str]:
    """Command line running ``argv`` on ``ranks`` local processes.

    ``-n`` larger than the core count is allowed (ranks usually outnumber cores here);
    the native layer never busy-waits, so oversubscription only slows, never deadlocks.
    """
    if ranks < 1:
        raise LaunchError(f"ranks must be >= 1 (got {ranks})")
    return [str(mpiexec_path()), "-n", str(ranks), *argv]


def start_ranks(ranks: int, argv: Sequence[str], *, env: dict | None = None,
                capture: bool = False) -> subprocess.Popen:
    """Start ``argv`` on ``ranks`` processes and return the launcher; end it with :func:`stop_job`.

    The launcher gets its own process group, so stopping the group takes every rank with it
    and nothing is left running.
    """
    return subprocess.Popen(
        mpiexec_command(ranks, argv),
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        text=True,
    )


def run_ranks(ranks: int, argv: Sequence[str], *, timeout: float | None = None, env: dict | None = None,
              capture: bool = False) -> subprocess.CompletedProcess:
    """Run ``argv`` on ``ranks`` processes and wait; on timeout or Ctrl+C stop the whole job."""
    proc = start_ranks(ranks, argv, env=env, capture=capture)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop_job(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def stop_job(proc: subprocess.Popen) -> None:
    """End the launcher's whole process group: SIGINT (MPICH's launcher forwards it and cleans
    up), then SIGTERM, then SIGKILL, giving each a few seconds; finally SIGKILL whatever of
    the group outlived the launcher."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=3)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def abort_job_after_error() -> int:
    """In a rank's worker, after an exception: print it and abort the whole MPI job, so no other
    rank waits in a collective forever. Returns the exit status 1."""
    import traceback

    traceback.print_exc()
    sys.stderr.flush()
    from mpi4py import MPI  # only ranks call this; the launching parent never imports mpi4py

    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        MPI.COMM_WORLD.Abort(1)
    return 1
