"""Processes of this host, through /proc and pidfds: a job's process tree, and ending all of it.

A job started by ``mpiexec`` is a tree: the launcher, Hydra's proxies under it, the ranks under
them (under Open MPI's ``mpirun`` the local ranks are its own children, the remote ones under
``ssh`` or ``srun``). The launcher's side of the harness has to find that tree (which ranks are this job's, not
a process of another pid namespace that happens to share a pid), to notice the moment one of
them ends, and to stop the whole tree without leaving anything behind and without the launcher
reporting a "BAD TERMINATION" for a stop that was asked for. This module is the one place that
reads /proc and handles pidfds for that.

A pidfd names one process for good: a signal sent through it never reaches a later process
that reuses the pid, and polling it tells when the process ended without spinning. Where
pidfds or /proc are missing (not Linux), the functions here find nothing and fall back to
``kill(pid, 0)``.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
from collections.abc import Collection, Iterable

from harness.rank_exit import INTERRUPT_GRACE_S

RANKS_STOP_S = 2.5  # stop_job: for ranks given SIGINT to end by themselves (< INTERRUPT_GRACE_S)
SIGNAL_STOP_S = 3.0  # stop_job: for the launcher after a signal to its process group


# -- finding processes ------------------------------------------------------------------------------
def live_pids() -> list[int]:
    """The pids /proc lists now; [] where there is no /proc."""
    try:
        return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return []


def command_line(pid: int) -> str | None:
    """Process ``pid``'s command line, its arguments joined by spaces; None when it has ended."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def parent_of(pid: int) -> int | None:
    """The parent's pid of process ``pid``; None when it has ended or /proc is missing."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(b")", 1)[1].split()[1])  # the name in (...) may hold spaces


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` of this host is ``ancestor`` or one of its descendants (False
    where /proc is missing or either has ended)."""
    seen = 0
    while pid > 1 and seen < 1000:  # a bounded walk up the parents
        if pid == ancestor:
            return True
        parent = parent_of(pid)
        if parent is None:
            return False
        pid, seen = parent, seen + 1
    return pid == ancestor


def children_of(parents: Iterable[int], below: bool = False) -> dict[int, int]:
    """{pid: pidfd} of the live children of ``parents`` on this host (with ``below``, of
    their descendants too); {} where /proc or pidfds are missing. The caller closes the pidfds."""
    children: dict[int, list[int]] = {}
    for pid in live_pids():
        parent = parent_of(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    found: dict[int, int] = {}
    todo = [(child, parent) for parent in parents for child in children.get(parent, [])]
    while todo:
        pid, parent = todo.pop()
        fd = open_pidfd(pid)
        if fd is None:
            continue
        if parent_of(pid) != parent:  # it ended, and the pid is someone else's now
            os.close(fd)
            continue
        found[pid] = fd
        if below:
            todo += [(child, pid) for child in children.get(pid, [])]
    return found


# -- pidfds -----------------------------------------------------------------------------------------
def open_pidfd(pid: int) -> int | None:
    """A pidfd of process ``pid``; None when it has ended or pidfds are missing."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def send(pidfd: int, sig: int) -> None:
    """``sig`` to the process of ``pidfd``, if it has not ended."""
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, sig)


def is_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (``kill(pid, 0)``: the fallback where pidfds are missing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EndWatch:
    """Which of some processes (and one launcher) have ended, found out without spinning: each is
    watched through a pidfd, or, where it has none, polled with ``kill(pid, 0)``."""

    def __init__(self, launcher: subprocess.Popen) -> None:
        self._fds: dict[int, int] = {}  # pid -> pidfd, or -1: no pidfd, polled with kill(pid, 0)
        self.ended: set[int] = set()  # the pids seen to end
        self._launcher_fd = open_pidfd(launcher.pid)

    def watch(self, pids: Iterable[int]) -> None:
        """Watch ``pids`` too (those already watched or ended are left as they are)."""
        for pid in pids:
            if pid > 0 and pid not in self._fds and pid not in self.ended:
                fd = open_pidfd(pid)
                self._fds[pid] = -1 if fd is None else fd

    def wait(self, timeout: float, also: int | None = None) -> None:
        """Sleep until a watched process or the launcher ends, ``also`` (a file descriptor) becomes
        readable or ``timeout`` passes, then note what ended."""
        poller = select.poll()
        for fd in [self._launcher_fd, also, *self._fds.values()]:
            if fd is not None and fd >= 0:
                poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(timeout * 1000)}
        for pid, fd in list(self._fds.items()):
            if (fd in ready) if fd >= 0 else not is_alive(pid):
                self.ended.add(pid)
                if fd >= 0:
                    os.close(fd)
                del self._fds[pid]

    def close(self) -> None:
        for fd in [self._launcher_fd, *self._fds.values()]:
            if fd is not None and fd >= 0:
                os.close(fd)
        self._fds.clear()
        self._launcher_fd = None


# -- stopping a job ---------------------------------------------------------------------------------
def stop_job(proc: subprocess.Popen, reported_in: Collection[int] | None = None, remote: bool = False) -> None:
    """End the job the launcher ``proc`` (mpiexec) runs, leaving no process of it behind.

    ``reported_in``: the pids of the ranks on this host known to handle SIGINT (the watchdog's;
    a rank still starting up may not handle it yet), or None when unknown. ``remote``: some
    ranks run on other hosts (or may: the watchdog does not know where one is).

    SIGINT goes straight to the known local ranks (under Hydra's proxies, or Open MPI's
    ``mpirun`` itself: everything under the launcher but its helpers, ``LAUNCHER_HELPERS``; when
    unknown, to every one found), which then end with an exit status, so mpiexec ends quietly as
    after any exit. A rank that has not ended within ``RANKS_STOP_S`` (one
    blocked in a collective whose peers have left, one still starting) is ended by force, but
    mpiexec is killed first: it reports every rank that ends by a signal as a "BAD TERMINATION"
    that "typically refers to a problem with your application", which a stop asked for is not.

    With ranks elsewhere (``remote``), or when unknown and none is found here (started by
    srun): SIGINT to mpiexec, which forwards it through its proxies to every rank on every
    host (ranks end within ``INTERRUPT_GRACE_S``, see
    ``harness.rank_exit.exit_promptly_when_interrupted``); then SIGTERM to the launcher's
    process group, then SIGKILL. Last, SIGKILL to whatever of the group, of the proxies and of
    their ranks outlived the launcher.
    """
    proxies, ranks = _helpers_and_ranks(proc)
    try:
        if remote or not (ranks or reported_in is not None):
            for pid, fd in ranks.items():
                if reported_in is not None and pid in reported_in:
                    send(fd, signal.SIGINT)  # at once; mpiexec's copy comes through the proxy
            _interrupt_through_launcher(proc)
        else:
            asked = [fd for pid, fd in ranks.items() if reported_in is None or pid in reported_in]
            for fd in asked:
                send(fd, signal.SIGINT)
            if not (asked and _waited(proc, RANKS_STOP_S)):
                _signal_group(proc, signal.SIGKILL)
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
        for fd in proxies.values():
            send(fd, signal.SIGSTOP)  # a stopped proxy starts no rank while the last are found
        for pid, fd in children_of(proxies, below=True).items():
            if pid in proxies:
                os.close(fd)
                continue
            if pid in ranks:
                os.close(fd)
            else:
                ranks[pid] = fd
        for fd in [*ranks.values(), *proxies.values()]:
            send(fd, signal.SIGKILL)
    finally:
        for fd in [*ranks.values(), *proxies.values()]:
            os.close(fd)


# The processes a launcher starts on the way to the ranks: Hydra's proxies, Open MPI's daemons (on
# other hosts, through ssh or srun), srun itself. Under Hydra the ranks are the proxies'
# children; under Open MPI's mpirun, the launcher's own.
LAUNCHER_HELPERS = frozenset({"hydra_pmi_proxy", "orted", "prted", "ssh", "srun", "rsh"})


def _helpers_and_ranks(proc: subprocess.Popen) -> tuple[dict[int, int], dict[int, int]]:
    """{pid: pidfd} of the launcher's helper processes on this host, and of everything else under
    it (the ranks and what they started)."""
    tree = children_of([proc.pid], below=True)
    helpers: dict[int, int] = {}
    for pid, fd in tree.items():
        line = command_line(pid) or ""
        if os.path.basename(line.split(" ", 1)[0]) in LAUNCHER_HELPERS:
            helpers[pid] = fd
    return helpers, {pid: fd for pid, fd in tree.items() if pid not in helpers}


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
