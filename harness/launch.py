"""Launching ranks: always with the launcher of the MPI the native layer runs on, never whatever
is first on PATH.

Which MPI that is, is ``harness.mpi_library``'s: by default MPICH from the PyPI wheel, whose
Hydra ``mpiexec`` lies next to the interpreter; or the system MPI the layer was built against
(``HARNESS_MPICC``: Open MPI's ``mpirun``, a system MPICH's ``mpiexec``); or a library of the
MPICH ABI chosen at run time (``HARNESS_LIBMPI``). Launcher, ``libmpi`` of mpi4py and ``libmpi``
of the native layer are then one MPI.

Four ways to start a job (``python -m harness run --launcher ...``), each under every MPI:

- ``mpiexec``: the MPI's own launcher, on this host or the hosts of a host file (``--hosts
  FILE``: lines ``host[:slots]``; Hydra's ``-f``, Open MPI's ``--host``; both start their helpers
  there over ssh).
- ``slurm``: inside a SLURM allocation (``salloc``, or the batch script ``python -m harness
  sbatch`` writes), the MPI's own launcher, which asks SLURM for the nodes: Hydra's SLURM
  bootstrap (one proxy per node through ``srun``), Open MPI's ``mpirun`` (its daemons through
  ``srun``).
- ``srun``: inside an allocation, ``srun`` starts the ranks itself, speaking the process
  management interface of the MPI: ``--mpi=pmix`` for Open MPI, ``--mpi=pmi2`` for the MPICHs.
- ranks started by the user (``mpiexec -n 8 python -m harness run FILE``, ``srun ...``, a
  launcher of their own): detected by :func:`inside_mpi_job`; the command then runs in place.

``auto`` (the default) picks ``slurm`` inside an allocation, ``mpiexec`` otherwise.

Here: which launcher, the command that starts the ranks, where each rank will run, and what a
rank can tell about the launcher that started it. Stopping a job's processes is
``harness.process_tree``'s; how a rank ends on an interrupt or an error, ``harness.rank_exit``'s.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.mpi_library import MpiLibrary, MpiLibraryError, native_build, tcp_warning_at_start
from harness.process_tree import stop_job

LAUNCHERS = ("auto", "mpiexec", "slurm", "srun")
# What Open MPI's mpirun passes to ranks on other hosts (it forwards no environment by itself).
FORWARDED_PREFIXES = ("HARNESS_", "MPI4PY_", "PYTHON", "OMP_", "MKL_", "UCX_", "FI_", "TORCH", "CUDA_", "NCCL_")
FORWARDED_NAMES = ("PATH", "LD_LIBRARY_PATH")


class LaunchError(HarnessError):
    """The ranks could not be started or did not finish."""


def mpiexec_path() -> Path:
    """The launcher of the MPI this environment runs on (``harness.mpi_library``): the venv's
    ``mpiexec`` for the PyPI wheel, the system MPI's ``mpirun`` or ``mpiexec`` otherwise."""
    try:
        return MpiLibrary.of_this_environment().launcher()
    except MpiLibraryError as exc:
        raise LaunchError(str(exc)) from None


def launcher_rank() -> int | None:
    """This process's rank as the launcher that started it says (MPICH's Hydra, Open MPI, PMIx,
    SLURM's srun), read without initializing MPI; None when none says."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    if "SLURM_STEP_ID" in os.environ and "SLURM_PROCID" in os.environ:
        return int(os.environ["SLURM_PROCID"])
    return None


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
    if "PMIX_RANK" in os.environ and srun_plugin() == "pmix":
        return None  # this MPI (Open MPI) speaks PMIx
    plugin = "PMIx, which this MPI library (an MPICH) cannot use" if "PMIX_RANK" in os.environ else "no PMI"
    return (
        f"srun started {os.environ['SLURM_NTASKS']} tasks with {plugin}, so MPI cannot join them into one job: "
        f"start them with `srun --mpi={srun_plugin()} ...`, or run `python -m harness run FILE` once in the batch "
        "script (it starts the ranks itself)"
    )


def srun_plugin() -> str:
    """srun's ``--mpi`` plugin for this environment's MPI: ``pmix`` for Open MPI, ``pmi2`` for the
    MPICHs (MPICH, Intel MPI, MVAPICH; the PyPI wheel's Hydra build speaks no PMIx)."""
    return "pmix" if native_build()["family"] == "openmpi" else "pmi2"


def slurm_allocation() -> str | None:
    """The SLURM job id when this process runs inside an allocation but outside a job step
    (a batch script or an ``salloc`` shell), else None."""
    if "SLURM_JOB_ID" in os.environ and "SLURM_STEP_ID" not in os.environ:
        return os.environ["SLURM_JOB_ID"]
    return None


@dataclass(frozen=True)
class Launch:
    """How to start a job's ranks: ``launcher`` is ``mpiexec``, ``slurm`` or ``srun``; ``hosts`` a
    host file (mpiexec only)."""

    launcher: str = "mpiexec"
    hosts: Path | None = None

    @classmethod
    def choose(cls, launcher: str = "auto", hosts: str | Path | None = None) -> Launch:
        """Resolve ``auto`` and check what the choice needs; LaunchError says what is missing."""
        if launcher not in LAUNCHERS:
            raise LaunchError(f"--launcher must be one of {', '.join(LAUNCHERS)} (got {launcher!r})")
        try:  # the MPI the ranks will use: refused here, before anything is written or started
            MpiLibrary.of_this_environment().check_mpi4py_choice()
        except MpiLibraryError as exc:
            raise LaunchError(str(exc)) from None
        if launcher == "auto":
            launcher = "slurm" if slurm_allocation() is not None and hosts is None else "mpiexec"
        if hosts is not None:
            if launcher != "mpiexec":
                raise LaunchError("--hosts goes with --launcher mpiexec (under SLURM the allocation says where)")
            read_hosts(hosts)  # fails early, with the line, on a bad file
            return cls("mpiexec", Path(hosts).absolute())
        if launcher in ("slurm", "srun") and slurm_allocation() is None:
            raise LaunchError(
                f"--launcher {launcher}: not inside a SLURM allocation (no SLURM_JOB_ID); write a batch "
                "script with `python -m harness sbatch FILE` and submit it, or get one with salloc"
            )
        return cls(launcher)

    @property
    def family(self) -> str:
        """The MPI family whose launcher this is: ``mpich`` (Hydra) or ``openmpi`` (mpirun)."""
        return str(native_build()["family"])

    def command(self, ranks: int, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """The command line starting ``argv`` on ``ranks`` processes (``env``: the environment the
        ranks get, which Open MPI is told to pass to other hosts).

        ``-n`` larger than the core count is allowed (ranks usually outnumber cores here);
        the native layer never busy-waits, so oversubscription only slows, never deadlocks.
        """
        if ranks < 1:
            raise LaunchError(f"ranks must be >= 1 (got {ranks})")
        if self.launcher == "srun":
            return ["srun", f"--mpi={srun_plugin()}", "--kill-on-bad-exit=1", "-n", str(ranks), *argv]
        if self.family == "openmpi":
            return [str(mpiexec_path()), *self._openmpi_options(ranks, env), "-n", str(ranks), *argv]
        where: list[str] = []
        if self.launcher == "slurm":
            where = ["-launcher", "slurm", "-rmk", "slurm"]
        elif self.hosts is not None:
            where = ["-f", str(self.hosts)]
        return [str(mpiexec_path()), *where, "-n", str(ranks), *argv]

    def _openmpi_options(self, ranks: int, env: Mapping[str, str] | None) -> list[str]:
        """mpirun's options: ranks may outnumber cores and are not bound to one (the same as
        Hydra's defaults), root may launch (CI's containers run as root), the host file's slots
        as ``--host``, and the harness's variables forwarded to other hosts."""
        options = ["--oversubscribe", "--bind-to", "none", "--map-by", "slot"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            options.append("--allow-run-as-root")
        if self.hosts is not None:
            counts = self._host_counts(ranks)
            options += ["--host", ",".join(f"{host}:{count}" for host, count in counts.items())]
            names = env if env is not None else os.environ
            for name in sorted(names):
                if name.startswith(FORWARDED_PREFIXES) or name in FORWARDED_NAMES:
                    options += ["-x", name]
        return options

    def _host_counts(self, ranks: int) -> Counter[str]:
        """Ranks per host of the host file, as Hydra would place them (what mpirun is given)."""
        assert self.hosts is not None
        return Counter(hydra_placement(read_hosts(self.hosts), ranks))

    def single_host(self) -> bool:
        """Whether every rank runs on this host (the watchdog then listens on 127.0.0.1)."""
        if self.launcher in ("slurm", "srun"):
            return os.environ.get("SLURM_JOB_NUM_NODES", os.environ.get("SLURM_NNODES", "1")) == "1"
        if self.hosts is None:
            return True
        here = _names_of_this_host()
        return all(host in here for host, _ in read_hosts(self.hosts))

    def rank_hosts(self, ranks: int) -> Sequence[str | None]:
        """The host each rank is to start on, as the launcher will place it; None where that
        cannot be known (the watchdog names the host of a rank that never reported in)."""
        if self.hosts is not None:
            if self.family == "openmpi":  # mpirun --host a:k,b:m --map-by slot: k ranks on a, then m on b
                return [host for host, count in self._host_counts(ranks).items() for _ in range(count)]
            return hydra_placement(read_hosts(self.hosts), ranks)
        if self.launcher in ("slurm", "srun") and not self.single_host():
            return _slurm_placement(ranks)
        return [socket.gethostname()] * ranks


def _names_of_this_host() -> set[str]:
    return {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}


def hydra_placement(hosts: Sequence[tuple[str, int | None]], ranks: int) -> list[str]:
    """The host of each of ``ranks`` ranks under Hydra with the host file entries ``hosts``
    (:func:`read_hosts`): it fills each host's slots in the file's order (a host without
    ``:slots`` has 1), and starts again from the first host when the ranks outnumber the slots."""
    if not hosts:
        raise ValueError("hydra_placement: no hosts")
    order = [host for host, slots in hosts for _ in range(slots or 1)]
    return [order[r % len(order)] for r in range(ranks)]


def _slurm_placement(ranks: int) -> Sequence[str | None]:
    """Where Hydra's SLURM bootstrap places ranks in this allocation: the nodes of
    ``SLURM_JOB_NODELIST`` (expanded by ``scontrol show hostnames``) with the slots of
    ``SLURM_TASKS_PER_NODE`` (e.g. ``2(x3),1``); None for every rank when either is missing."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST", os.environ.get("SLURM_NODELIST"))
    tasks = os.environ.get("SLURM_TASKS_PER_NODE")
    if not nodelist or not tasks:
        return [None] * ranks
    try:
        names = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=10, check=True
        ).stdout.split()
        slots: list[int] = []
        for part in tasks.split(","):
            count, _, times = part.partition("(x")
            slots += [int(count)] * (int(times.rstrip(")")) if times else 1)
    except (OSError, subprocess.SubprocessError, ValueError):
        return [None] * ranks
    if len(names) != len(slots) or not names:
        return [None] * ranks
    return hydra_placement(list(zip(names, slots)), ranks)


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
            raise LaunchError(
                f"--hosts {path}:{number}: expected 'host' or 'host:slots' with slots >= 1, got {line.strip()!r}"
            )
        hosts.append((host, int(slots) if slots else None))
    if not hosts:
        raise LaunchError(f"--hosts {path}: no hosts in it")
    return hosts


def start_ranks(
    ranks: int, argv: Sequence[str], *, env: dict | None = None, capture: bool = False, launch: Launch | None = None
) -> subprocess.Popen:
    """Start ``argv`` on ``ranks`` processes and return the launcher; end it with
    ``harness.process_tree.stop_job``.

    The launcher gets its own process group, so stopping the group takes every local rank
    with it and nothing is left running (remote ranks go with their Hydra proxies).
    """
    launch = launch or Launch()
    try:
        env = {**(os.environ if env is None else env), **MpiLibrary.of_this_environment().rank_env()}
    except MpiLibraryError as exc:
        raise LaunchError(str(exc)) from None
    if not launch.single_host():
        warning = tcp_warning_at_start(env)
        if warning is not None:
            print(warning, file=sys.stderr)
    return subprocess.Popen(
        launch.command(ranks, argv, env),
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        text=True,
    )


def run_ranks(
    ranks: int,
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    env: dict | None = None,
    capture: bool = False,
    launch: Launch | None = None,
) -> subprocess.CompletedProcess:
    """Run ``argv`` on ``ranks`` processes and wait; on timeout or Ctrl+C stop the whole job."""
    proc = start_ranks(ranks, argv, env=env, capture=capture, launch=launch)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop_job(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
