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

import faulthandler
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.config import HarnessError

LAUNCHERS = ("auto", "mpiexec", "slurm")

INTERRUPT_GRACE_S = 5.0  # an interrupted rank ends within this, whatever it was doing
RANKS_STOP_S = 2.5  # stop_job: for ranks given SIGINT to end by themselves (< INTERRUPT_GRACE_S)
SIGNAL_STOP_S = 3.0  # stop_job: for the launcher after a signal to its process group
IMPORT_RETRY_S = 0.05  # an interrupt arriving during an import is delivered again after this
OUTPUT_DRAIN_S = 2.0  # before MPI_Abort: at most this long for the launcher to read what the rank printed
OUTPUT_DRAIN_POLL_S = 0.005


class LaunchError(HarnessError):
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
        """Whether every rank runs on this host (the watchdog then listens on 127.0.0.1)."""
        if self.launcher == "slurm":
            return os.environ.get("SLURM_JOB_NUM_NODES", os.environ.get("SLURM_NNODES", "1")) == "1"
        if self.hosts is None:
            return True
        here = _names_of_this_host()
        return all(host in here for host, _ in read_hosts(self.hosts))

    def rank_hosts(self, ranks: int) -> list[str | None]:
        """The host each rank is to start on, as the launcher will place it; None where that
        cannot be known (the watchdog names the host of a rank that never reported in)."""
        if self.hosts is not None:
            return hydra_placement(read_hosts(self.hosts), ranks)
        if self.launcher == "slurm" and not self.single_host():
            return _slurm_placement(ranks)
        return [socket.gethostname()] * ranks


def _names_of_this_host() -> set[str]:
    return {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.gethostname().split(".")[0],
            socket.getfqdn()}


def hydra_placement(hosts: Sequence[tuple[str, int | None]], ranks: int) -> list[str]:
    """The host of each of ``ranks`` ranks under Hydra with the host file entries ``hosts``
    (:func:`read_hosts`): it fills each host's slots in the file's order (a host without
    ``:slots`` has 1), and starts again from the first host when the ranks outnumber the slots."""
    if not hosts:
        raise ValueError("hydra_placement: no hosts")
    order = [host for host, slots in hosts for _ in range(slots or 1)]
    return [order[r % len(order)] for r in range(ranks)]


def _slurm_placement(ranks: int) -> list[str | None]:
    """Where Hydra's SLURM bootstrap places ranks in this allocation: the nodes of
    ``SLURM_JOB_NODELIST`` (expanded by ``scontrol show hostnames``) with the slots of
    ``SLURM_TASKS_PER_NODE`` (e.g. ``2(x3),1``); None for every rank when either is missing."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST", os.environ.get("SLURM_NODELIST"))
    tasks = os.environ.get("SLURM_TASKS_PER_NODE")
    if not nodelist or not tasks:
        return [None] * ranks
    try:
        names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                               timeout=10, check=True).stdout.split()
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
              capture: bool = False, launch: Launch | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` on ``ranks`` processes and wait; on timeout or Ctrl+C stop the whole job."""
    proc = start_ranks(ranks, argv, env=env, capture=capture, launch=launch)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop_job(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def stop_job(proc: subprocess.Popen, reported_in: Collection[int] | None = None, remote: bool = False) -> None:
    """End the job the launcher ``proc`` (mpiexec) runs, leaving no process of it behind.

    ``reported_in``: the pids of the ranks on this host known to handle SIGINT (the watchdog's;
    a rank still starting up may not handle it yet), or None when unknown. ``remote``: some
    ranks run on other hosts (or may: the watchdog does not know where one is).

    SIGINT goes straight to the known local ranks (the launcher's grandchildren, under Hydra's
    proxies; when unknown, to every one found), which then end with an exit status, so mpiexec
    ends quietly as after any exit. A rank that has not ended within ``RANKS_STOP_S`` (one
    blocked in a collective whose peers have left, one still starting) is ended by force, but
    mpiexec is killed first: it reports every rank that ends by a signal as a "BAD TERMINATION"
    that "typically refers to a problem with your application", which a stop asked for is not.

    With ranks elsewhere (``remote``), or when unknown and none is found here (started by
    srun): SIGINT to mpiexec, which forwards it through its proxies to every rank on every
    host (ranks end within ``INTERRUPT_GRACE_S``, see :func:`exit_promptly_when_interrupted`);
    then SIGTERM to the launcher's process group, then SIGKILL. Last, SIGKILL to whatever of
    the group, of the proxies and of their ranks outlived the launcher.
    """
    proxies = _children_of([proc.pid])
    ranks = _children_of(proxies, below=True)
    try:
        if remote or not (ranks or reported_in is not None):
            for pid, fd in ranks.items():
                if reported_in is not None and pid in reported_in:
                    _send(fd, signal.SIGINT)  # at once; mpiexec's copy comes through the proxy
            _interrupt_through_launcher(proc)
        else:
            asked = [fd for pid, fd in ranks.items() if reported_in is None or pid in reported_in]
            for fd in asked:
                _send(fd, signal.SIGINT)
            if not (asked and _waited(proc, RANKS_STOP_S)):
                _signal_group(proc, signal.SIGKILL)
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
        for fd in proxies.values():
            _send(fd, signal.SIGSTOP)  # a stopped proxy starts no rank while the last are found
        for pid, fd in _children_of(proxies, below=True).items():
            if pid in ranks:
                os.close(fd)
            else:
                ranks[pid] = fd
        for fd in [*ranks.values(), *proxies.values()]:
            _send(fd, signal.SIGKILL)
    finally:
        for fd in [*ranks.values(), *proxies.values()]:
            os.close(fd)


def _interrupt_through_launcher(proc: subprocess.Popen) -> None:
    """SIGINT to mpiexec alone (Hydra forwards it to every proxy, which signals its ranks; the
    ssh or srun clients of the group are left alone, so the proxies stay reachable), then, if
    it has not ended in time, SIGTERM to its process group; bounded either way."""
    try:
        proc.send_signal(signal.SIGINT)
    except ProcessLookupError:
        return
    if not _waited(proc, INTERRUPT_GRACE_S + SIGNAL_STOP_S) and _signal_group(proc, signal.SIGTERM):
        _waited(proc, SIGNAL_STOP_S)


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` of this host is ``ancestor`` or one of its descendants (False
    where /proc is missing or either has ended)."""
    seen = 0
    while pid > 1 and seen < 1000:  # a bounded walk up the parents
        if pid == ancestor:
            return True
        parent = _parent(pid)
        if parent is None:
            return False
        pid, seen = parent, seen + 1
    return pid == ancestor


def _waited(proc: subprocess.Popen, seconds: float) -> bool:
    """Whether ``proc`` ended within ``seconds``."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def _signal_group(proc: subprocess.Popen, sig: int) -> bool:
    """Send ``sig`` to the launcher's process group; False when the group is gone."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return False
    return True


def _children_of(parents, below: bool = False) -> dict[int, int]:
    """{pid: pidfd} of the live children of ``parents`` on this host (with ``below``, of
    their descendants too); {} where /proc or pidfds are missing. A pidfd names one process
    for good: a signal sent through it never reaches a later process that reuses the pid."""
    children: dict[int, list[int]] = {}
    try:
        pids = [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        parent = _parent(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    found: dict[int, int] = {}
    todo = [(child, parent) for parent in parents for child in children.get(parent, [])]
    while todo:
        pid, parent = todo.pop()
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            continue
        if _parent(pid) != parent:  # it ended, and the pid is someone else's now
            os.close(fd)
            continue
        found[pid] = fd
        if below:
            todo += [(child, pid) for child in children.get(pid, [])]
    return found


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(b")", 1)[1].split()[1])  # the name in (...) may hold spaces


def _send(pidfd: int, sig: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        pass


_interrupt_guard: tuple | None = None  # what exit_promptly_when_interrupted keeps alive
_interrupted = False  # whether this rank got SIGINT or SIGTERM (with the guard on)
_raised = False  # whether that interrupt has been raised as KeyboardInterrupt


def exit_promptly_when_interrupted(grace_s: float = INTERRUPT_GRACE_S) -> None:
    """In a rank, from its main thread: SIGINT and SIGTERM raise KeyboardInterrupt (whatever
    disposition the process inherited; after the import under way, if any), and the process
    ends with an exit status within ``grace_s`` even if its main thread cannot run Python by
    then.

    Python runs signal handlers only between bytecodes of the main thread, so a rank blocked
    in a native wait (a collective whose peers have already left) would never see its
    KeyboardInterrupt; ended by SIGTERM or SIGKILL instead, it makes mpiexec report a "BAD
    TERMINATION" that "typically refers to a problem with your application", which an
    interrupt is not. So the signal is also written to a wake-up pipe, and a thread blocked on
    it arms faulthandler's timer, a C thread that needs no interpreter lock, to ``_exit(1)``
    after ``grace_s`` unless the rank has ended by then (normally with 130, by itself).
    """
    global _interrupt_guard
    if _interrupt_guard is not None:
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # the C signal handler must never block on it
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_interrupt)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    sink = open(os.devnull, "w")  # where the timer writes the traceback nobody asked for

    def arm_on_interrupt() -> None:
        while True:
            got = os.read(read_end, 64)  # the numbers of the signals caught, one byte each
            if any(sig in got for sig in (signal.SIGINT, signal.SIGTERM)):
                faulthandler.dump_traceback_later(grace_s, exit=True, file=sink)
                return

    threading.Thread(target=arm_on_interrupt, name="exit-when-interrupted", daemon=True).start()
    _interrupt_guard = (read_end, write_end, sink)


def _raise_interrupt(signum: int, frame) -> None:
    """SIGINT, SIGTERM: KeyboardInterrupt, once, but never in the middle of an import. Raised
    there, it can be swallowed, turned into an ImportError, or make the interpreter end by
    SIGINT at exit (seen importing torch); so the signal comes again a little later instead.

    Later interrupts are ignored: a stop sends one straight to a rank and one through mpiexec
    (ranks on other hosts get only that), and a second KeyboardInterrupt raised while the
    first unwinds (in an ``except`` on the way to ``sys.exit(130)``) would end the rank with a
    traceback. The timer armed by the first ends the rank within its grace anyway."""
    global _interrupted, _raised
    _interrupted = True
    if _raised:
        return
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            again = threading.Timer(IMPORT_RETRY_S, os.kill, (os.getpid(), signum))
            again.daemon = True  # never keeps an exiting rank waiting
            again.start()
            return
        frame = frame.f_back
    _raised = True
    raise KeyboardInterrupt


def abort_job_after_error() -> int:
    """In a rank's worker, after an exception: print it and abort the whole MPI job, so no other
    rank waits in a collective forever; returns the exit status 1. After an interrupt (see
    :func:`exit_promptly_when_interrupted`) the error is its doing, e.g. an import it cut short
    and that reported it as an ImportError: nothing is printed and the status is 130."""
    if _interrupted:
        return 130
    import traceback

    traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    from mpi4py import MPI  # only ranks call this; the launching parent never imports mpi4py

    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        abort_mpi_job(MPI.COMM_WORLD)
    return 1


def abort_mpi_job(comm) -> None:
    """``comm.Abort(1)`` once the launcher has read what this rank printed (see
    :func:`wait_until_output_is_read`): otherwise the message saying why may never arrive."""
    wait_until_output_is_read()
    comm.Abort(1)


def wait_until_output_is_read(fds: Sequence[int] = (1, 2), limit_s: float = OUTPUT_DRAIN_S) -> bool:
    """Wait (sleeping, at most ``limit_s``) until whoever reads this process's stdout and stderr
    pipes has taken all that was written to them; False if it has not by then.

    Under mpiexec a rank's output goes through a pipe to Hydra's proxy, which forwards it. On
    MPI_Abort the proxy kills the job at once, and what it has not read from the pipe by then
    is lost: under load about one abort in ten lost the traceback that says why, and none did
    once the rank waited for the pipe to empty (measured, not a guarantee Hydra documents).
    Outputs that are not pipes (a terminal, a file) have nothing in flight and are not waited for."""
    import fcntl
    import stat
    import struct
    import termios
    import time

    pipes = []
    for fd in fds:
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                pipes.append(fd)
        except OSError:
            pass
    deadline = time.monotonic() + limit_s
    while True:
        unread = 0
        for fd in pipes:
            try:
                unread += struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
            except OSError:
                pass
        if unread == 0:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(OUTPUT_DRAIN_POLL_S)
