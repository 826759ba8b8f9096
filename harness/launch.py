"""Launching ranks: always with the venv's own ``mpiexec``, never whatever is first on PATH.

The MPICH wheel installs ``mpiexec`` next to the interpreter; using that one guarantees that
the launcher, the ``libmpi`` mpi4py loads and the one the native layer links are the same.

Three ways to start a job (``python -m harness run --launcher ...``):

- ``mpiexec``: this host, or the hosts of a Hydra host file (``--hosts FILE``: lines
  ``host[:slots]``; Hydra starts its proxies there over ssh).
- ``slurm``: inside a SLURM allocation (``salloc``, or the batch script ``python -m harness
  sbatch`` writes), the same ``mpiexec`` with Hydra's SLURM bootstrap: it starts one proxy per
  allocated node with ``srun`` and places the ranks on the allocation's nodes.
- ranks started by the user (``mpiexec -n 8 python -m harness run FILE``, ``srun ...``):
  detected by :func:`inside_mpi_job`; the command then runs in place.

``auto`` (the default) picks ``slurm`` inside an allocation, ``mpiexec`` otherwise.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LAUNCHERS = ("auto", "mpiexec", "slurm")


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
    initializing MPI (so a parent process can still launch its own job). Raises LaunchError
    for srun tasks that MPI cannot join into one job (see :func:`srun_without_pmi`).
    """
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        if var in os.environ:
            return int(os.environ[var])
    problem = srun_without_pmi()
    if problem is not None:
        raise LaunchError(problem)
    if "SLURM_STEP_ID" in os.environ and "SLURM_NTASKS" in os.environ and "SLURM_PROCID" in os.environ:
        return int(os.environ["SLURM_NTASKS"])
    return None


def srun_without_pmi() -> str | None:
    """Why this srun task cannot be one rank of a job, or None.

    ``srun --mpi=none`` (SLURM's usual default) hands MPI no process-management interface, and
    ``--mpi=pmix`` one this MPICH cannot speak: each task would initialize as a job of its own.
    """
    if "SLURM_STEP_ID" not in os.environ or int(os.environ.get("SLURM_NTASKS", "1") or 1) <= 1:
        return None
    if "PMI_FD" in os.environ or "PMI_SIZE" in os.environ:
        return None
    plugin = "PMIx, which this MPI library (MPICH from PyPI) cannot use" if "PMIX_RANK" in os.environ else "no PMI"
    return (f"srun started {os.environ['SLURM_NTASKS']} tasks with {plugin}, so MPI cannot join them into one job: "
            "start them with `srun --mpi=pmi2 ...`, or run `python -m harness run FILE` once in the batch script "
            "(it starts the ranks itself)")


def slurm_allocation() -> str | None:
    """The SLURM job id when this process runs inside an allocation but outside a job step
    (a batch script or an ``salloc`` shell), else None."""
    if "SLURM_JOB_ID" in os.environ and "SLURM_STEP_ID" not in os.environ:
        return os.environ["SLURM_JOB_ID"]
    return None


@dataclass(frozen=True)
class Launch:
    """How to start a job's ranks: ``launcher`` is ``mpiexec`` or ``slurm``; ``hosts`` a Hydra
    host file (mpiexec only)."""

    launcher: str = "mpiexec"
    hosts: Path | None = None

    @classmethod
    def choose(cls, launcher: str = "auto", hosts: str | Path | None = None) -> Launch:
        """Resolve ``auto`` and check what the choice needs; LaunchError says what is missing."""
        if launcher not in LAUNCHERS:
            raise LaunchError(f"--launcher must be one of {', '.join(LAUNCHERS)} (got {launcher!r})")
        if launcher == "auto":
            launcher = "slurm" if slurm_allocation() is not None and hosts is None else "mpiexec"
        if hosts is not None:
            if launcher != "mpiexec":
                raise LaunchError("--hosts goes with --launcher mpiexec (under SLURM the allocation says where)")
            read_hosts(hosts)  # fails early, with the line, on a bad file
            return cls("mpiexec", Path(hosts).absolute())
        if launcher == "slurm" and slurm_allocation() is None:
            raise LaunchError("--launcher slurm: not inside a SLURM allocation (no SLURM_JOB_ID); write a batch "
                              "script with `python -m harness sbatch FILE` and submit it, or get one with salloc")
        return cls(launcher)

    def command(self, ranks: int, argv: Sequence[str]) -> list[str]:
        """The command line starting ``argv`` on ``ranks`` processes.

        ``-n`` larger than the core count is allowed (ranks usually outnumber cores here);
        the native layer never busy-waits, so oversubscription only slows, never deadlocks.
        """
        if ranks < 1:
            raise LaunchError(f"ranks must be >= 1 (got {ranks})")
        where: list[str] = []
        if self.launcher == "slurm":
            where = ["-launcher", "slurm", "-rmk", "slurm"]
        elif self.hosts is not None:
            where = ["-f", str(self.hosts)]
        return [str(mpiexec_path()), *where, "-n", str(ranks), *argv]

    def single_host(self) -> bool:
        """Whether every rank runs on this host (the watchdog can then see every process)."""
        if self.launcher == "slurm":
            return os.environ.get("SLURM_JOB_NUM_NODES", os.environ.get("SLURM_NNODES", "1")) == "1"
        if self.hosts is None:
            return True
        here = {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.gethostname().split(".")[0],
                socket.getfqdn()}
        return all(host in here for host, _ in read_hosts(self.hosts))


def read_hosts(path: str | Path) -> list[tuple[str, int | None]]:
    """The ``(host, slots)`` entries of a Hydra host file (``host`` or ``host:slots`` per line,
    ``#`` comments); LaunchError naming the file and line for anything else."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise LaunchError(f"--hosts {path}: cannot read it ({exc.__class__.__name__}: {exc})") from None
    hosts: list[tuple[str, int | None]] = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        host, _, slots = text.partition(":")
        if not host or any(c.isspace() for c in host) or (slots and not slots.isdigit()) or slots == "0":
            raise LaunchError(f"--hosts {path}:{number}: expected 'host' or 'host:slots' with slots >= 1, "
                              f"got {line.strip()!r}")
        hosts.append((host, int(slots) if slots else None))
    if not hosts:
        raise LaunchError(f"--hosts {path}: no hosts in it")
    return hosts


def start_ranks(ranks: int, argv: Sequence[str], *, env: dict | None = None,
                capture: bool = False, launch: Launch | None = None) -> subprocess.Popen:
    """Start ``argv`` on ``ranks`` processes and return the launcher; end it with :func:`stop_job`.

    The launcher gets its own process group, so stopping the group takes every local rank
    with it and nothing is left running (remote ranks go with their Hydra proxies).
    """
    return subprocess.Popen(
        (launch or Launch()).command(ranks, argv),
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
