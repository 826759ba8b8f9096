"""The watchdog: ends a job that cannot finish, naming the rank, its host and what happened.

It judges the ranks' heartbeats (``harness.runner.heartbeat``), which every rank ships over TCP
wherever it runs (``harness.runner.heartbeat_net``). A rank's process has ended when its
connection closed (EOF arrives even after SIGKILL); a rank on the watchdog's own host is also
watched through a Linux pidfd (polling ``kill(pid, 0)`` where pidfds are missing), which is
exact and immediate. It never spins: it sleeps in ``poll()`` until a process ends or ``POLL_S``
passes. Three things end a job:

- a rank's process ends before the rank reported DONE (killed, crashed, or raised an error);
- a rank did not report in within ``startup_timeout_s`` of the launch;
- the job is stuck: some rank made no progress for longer than its timeout (see
  ``harness.scenario.schema.Watchdog``). The rank named is the one furthest behind, preferring
  a rank that is not waiting in communication: the others are usually waiting for it.

Where it runs: in the launching process when ``python -m harness run`` or ``launch`` start the
ranks (:func:`run_watched`, :func:`supervise`), on one host or many; in rank 0, in a thread,
when the user started the ranks (``mpiexec -n 8 python -m harness run FILE``, ``srun``, a
``harness.api`` script), where a verdict aborts the MPI job (:func:`join_watchdog`).

The verdict names the root cause first: the rank, its pid and host, the algorithm, the iteration
and what happened, and says when the scenario itself injected that fault; then what followed, as
consequences ("rank 3 then failed: ...", "ranks 0, 1 were stopped"). When one rank dies, MPI's
clean-up ends the others within milliseconds and the survivors' receives fail, so which rank is
the root is decided on evidence, in this order (:func:`root_cause`):

1. a rank that announced an injected fault (``kill`` ships its row just before the SIGKILL,
   ``hang`` as it stops): the scenario's fault is the cause, however the others then ended;
2. else the earliest of: a rank that raised an error of its own (its FAILED row carries when),
   and a rank whose process ended without a word (killed by the kernel's out-of-memory killer, a
   segfault, a node failure), by when its connection ended, in the order the kernel saw the ends
   arrive (``harness.runner.heartbeat_net``); a rank that failed because it lost a peer
   (``PeerLostError``) or was interrupted is a consequence, not a candidate;
3. else (only consequences are known) the earliest of those.

It never counts a rank's silence from before the launch: a rank that reported in without a
progress time (or with one older than the launch) has been quiet since the launch, not since the
machine booted.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping

import numpy as np

from harness.launch import abort_mpi_job, descends_from
from harness.runner.heartbeat import ENV_VAR, Heartbeat
from harness.runner.heartbeat_row import Cause, Field, Phase
from harness.scenario.fault_fields import HangFault, KillFault, SlowStartFault
from harness.scenario.schema import Scenario
from harness.scenario.schema import Watchdog as WatchdogSettings

POLL_S = 0.5  # how often the table is read when no process ends: cheap, and bounds the delay
GRACE_S = 10.0  # after a rank died, how long the MPI launcher gets to end the others itself
CLOSE_WAIT_S = 1.0  # after a rank's process ended, for its last rows (its connection's end follows them)

_DOING = {
    Phase.NOT_STARTED: "not started",
    Phase.SETUP: "setting up",
    Phase.LOCAL: "local work (compute, injected delay or optimizer step)",
    Phase.COMMUNICATING: "waiting in communication",
    Phase.EVALUATING: "evaluating",
    Phase.RESULTS: "gathering and writing results",
    Phase.DONE: "done",
    Phase.FAILED: "failed",
    Phase.STARTING: "in MPI's start-up, which waits for every rank",
}


@dataclasses.dataclass(frozen=True)
class RankState:
    """One row of the heartbeat table, read at one moment (``progress_at`` on the watchdog's
    clock), and the host the rank said it runs on (None before it connected)."""

    rank: int
    pid: int
    phase: Phase
    algorithm: int
    iteration: int
    progress_at: float
    slowest_iteration_s: float
    iterations_done: int
    host: str | None = None
    cause: Cause = Cause.NONE

    @property
    def started(self) -> bool:
        return self.pid > 0

    @property
    def finished(self) -> bool:
        return self.phase in (Phase.DONE, Phase.FAILED)

    @property
    def announced(self) -> bool:
        """Whether the rank said an injected fault strikes it."""
        return self.cause in (Cause.INJECTED_KILL, Cause.INJECTED_HANG)


def read_states(server) -> list[RankState]:
    """Every rank's state as a ``HeartbeatServer`` last received it."""
    table, hosts, _ = server.snapshot()
    return _states(table, hosts)


def _states(table: np.ndarray, hosts: list[str | None]) -> list[RankState]:
    return [
        RankState(r, int(row[Field.PID]), Phase(int(row[Field.PHASE])), int(row[Field.ALGORITHM]),
                  int(row[Field.ITERATION]), float(row[Field.PROGRESS_AT]),
                  float(row[Field.SLOWEST_ITERATION_S]), int(row[Field.ITERATIONS_DONE]), hosts[r],
                  Cause(int(row[Field.CAUSE])))
        for r, row in enumerate(table)
    ]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Why the watchdog ends (or ended) the job."""

    kind: str  # "died", "failed", "not_started", "stuck"
    rank: int
    message: str
    algorithm: str | None = None
    iteration: int | None = None
    host: str | None = None
    evidence: str | None = None  # why ``rank`` is the root cause: "announced", "first_error", "first_end", ...
    after_s: float | None = None  # from the root cause (its announcement, error or end) to the verdict

    def as_json(self) -> dict:
        return dataclasses.asdict(self)


class Watchdog:
    """The pure decision part: given the table and which processes ended, is the job done for?

    ``hosts``: where each rank was to start (None: unknown), named for ranks that never
    connected. ``startup``: whether ranks that did not report in within ``startup_timeout_s``
    end the job (not where every rank is known to run already: a job the user started).
    """

    def __init__(self, scenario: Scenario, launched_at: float, faults_enabled: bool = True,
                 hosts: list[str | None] | None = None, startup: bool = True) -> None:
        self.settings: WatchdogSettings = scenario.watchdog
        self.algorithms = [a.name for a in scenario.algorithms]
        self.faults = list(scenario.faults) if faults_enabled else []
        self.launched_at = launched_at
        self.hosts = hosts
        self.startup = startup

    def host_of(self, st: RankState) -> str | None:
        """The host ``st`` runs on, or was to start on; None when unknown."""
        if st.host is not None:
            return st.host
        return self.hosts[st.rank] if self.hosts is not None and st.rank < len(self.hosts) else None

    def quiet_for(self, state: RankState, now: float) -> float:
        """Seconds since ``state``'s last progress, counted from the launch at the earliest."""
        return now - max(state.progress_at, self.launched_at)

    # -- timeouts ----------------------------------------------------------------------------
    def iteration_timeout(self, states: list[RankState]) -> tuple[float, str] | None:
        """The timeout in training iterations and how it was derived; None before any
        iteration finished (then the start-up timeout applies)."""
        s = self.settings
        if s.stall_timeout_s is not None:
            return s.stall_timeout_s, f"stall_timeout_s = {s.stall_timeout_s:g} s"
        slowest = max((st.slowest_iteration_s for st in states), default=0.0)
        if slowest <= 0.0:
            return None
        timeout = max(s.min_timeout_s, s.factor * slowest)
        return timeout, (f"{timeout:.1f} s = max(min_timeout_s {s.min_timeout_s:g} s, factor {s.factor:g} x "
                         f"slowest iteration so far {slowest:.3f} s)")

    def timeout(self, state: RankState, states: list[RankState]) -> tuple[float, str]:
        startup = (self.settings.startup_timeout_s, f"startup_timeout_s = {self.settings.startup_timeout_s:g} s")
        it = self.iteration_timeout(states)
        if state.phase in (Phase.LOCAL, Phase.COMMUNICATING) and it is not None:
            return it
        return max(startup, it or startup)

    # -- the verdict ---------------------------------------------------------------------------
    def check(self, states: list[RankState], now: float, ended: Mapping[int, float]) -> Verdict | None:
        """``ended``: the ranks whose process is gone, with when that was seen (on the clock of
        ``now``; their order is the order the ends arrived). None while the job may still finish."""
        died = [st for st in states if st.rank in ended and st.started and st.phase != Phase.DONE]
        if died:
            return self._died(states, ended, now)
        waited = now - self.launched_at
        absent = [st for st in states if not st.started]
        if self.startup and absent and waited > self.settings.startup_timeout_s:
            return self._not_started(absent, waited, [st.rank for st in states if st.phase == Phase.STARTING])
        running = [st for st in states if st.started and not st.finished]
        stuck = [st for st in running if self.quiet_for(st, now) > self.timeout(st, states)[0]]
        if stuck:
            return self._stuck(running, states, now)
        return None

    def _died(self, states: list[RankState], ended: Mapping[int, float], now: float) -> Verdict:
        root, evidence, at = root_cause(states, ended)
        where = self._where(root)
        if root.phase == Phase.FAILED:
            what = f"{self._who(root)} raised an error {where} (its traceback is above)"
            kind = "failed"
        elif root.rank in ended or root.cause == Cause.INJECTED_KILL:
            what = f"{self._who(root)} died {where}: its process ended without finishing"
            kind = "died"
        else:  # an injected hang, announced before the others ended
            what = f"{self._who(root)} stopped making progress {where}"
            kind = "stuck"
        what += self._injected(root) + _consequences(root, states, ended)
        return self._verdict(kind, root, what, evidence, now - at)

    def _stuck(self, running: list[RankState], states: list[RankState], now: float) -> Verdict:
        announced = [st for st in running if st.cause == Cause.INJECTED_HANG]
        if announced:
            culprit, evidence = min(announced, key=lambda st: st.progress_at), "announced"
        else:
            culprit = min(running, key=lambda st: (st.phase == Phase.COMMUNICATING, st.algorithm, st.iteration,
                                                   st.progress_at))
            evidence = "furthest_behind"
        timeout, how = self.timeout(culprit, states)
        what = (f"{self._who(culprit)} made no progress for {self.quiet_for(culprit, now):.1f} s "
                f"{self._where(culprit)} ({_DOING[culprit.phase]}); timeout {how}")
        others = [st for st in running if st is not culprit]
        if others:
            what += f"; the other running ranks: {_tally(others)}"
        return self._verdict("stuck", culprit, what + self._injected(culprit), evidence,
                             now - max(culprit.progress_at, self.launched_at))

    def _not_started(self, absent: list[RankState], waited: float, waiting: list[int]) -> Verdict:
        """``waiting``: the ranks that started but wait in MPI's start-up (for the absent ones)."""
        groups: dict[str | None, list[int]] = {}  # by host, in rank order
        for st in absent:
            groups.setdefault(self.host_of(st), []).append(st.rank)
        names = " and ".join(f"{', '.join(map(str, ranks))} ({'on host ' + host if host else 'host unknown'})"
                             for host, ranks in groups.items())
        what = (f"rank{'s' if len(absent) > 1 else ''} {names} did not start within startup_timeout_s "
                f"({self.settings.startup_timeout_s:g} s; waited {waited:.1f} s)")
        rank = absent[0].rank
        for f in self.faults:
            if isinstance(f, SlowStartFault) and f.rank == rank:
                what += f" (the scenario injects faults[{self.faults.index(f)}]: slow_start, delay_s {f.delay_s:g})"
                break
        if waiting:
            what += (f"; rank{'s' if len(waiting) > 1 else ''} {', '.join(map(str, waiting))} started and "
                     f"wait{'' if len(waiting) > 1 else 's'} for {'them' if len(absent) > 1 else 'it'} in MPI's start-up")
        return Verdict("not_started", rank, what, host=self.host_of(absent[0]))

    # -- wording ------------------------------------------------------------------------------
    def _who(self, st: RankState) -> str:
        """E.g. "rank 3 (pid 1234 on host vh2)"."""
        host = self.host_of(st)
        return f"rank {st.rank} (pid {st.pid}{' on host ' + host if host else ''})"

    def _algorithm(self, st: RankState) -> str | None:
        return self.algorithms[st.algorithm] if 0 <= st.algorithm < len(self.algorithms) else None

    def _where(self, st: RankState) -> str:
        name = self._algorithm(st)
        if name is None:
            return "during start-up"
        if st.iteration < 0:
            return f"in {_DOING[st.phase] if st.phase != Phase.FAILED else 'the set-up or results'} of {name}"
        if st.phase == Phase.EVALUATING:
            return f"while evaluating {name} after iteration {st.iteration}"
        return f"in iteration {st.iteration} of {name}"

    def _injected(self, st: RankState) -> str:
        """" (the scenario injects this: faults[i] kill)" when ``st`` announced an injected fault."""
        kind = {Cause.INJECTED_KILL: KillFault, Cause.INJECTED_HANG: HangFault}.get(st.cause)
        name = self._algorithm(st)
        for i, f in enumerate(self.faults):
            if isinstance(f, kind or ()) and f.rank == st.rank and (f.algorithm or self.algorithms[0]) == name:
                return f" (the scenario injects this: faults[{i}] {f.kind})"
        return " (the scenario injects this)" if kind is not None else ""

    def _verdict(self, kind: str, st: RankState, message: str, evidence: str | None = None,
                 after_s: float | None = None) -> Verdict:
        return Verdict(kind, st.rank, message, self._algorithm(st), st.iteration if st.iteration >= 0 else None,
                       self.host_of(st), evidence, None if after_s is None else round(max(after_s, 0.0), 3))


def root_cause(states: list[RankState], ended: Mapping[int, float]) -> tuple[RankState, str, float]:
    """The rank whose fault the others' ends followed, the evidence for it and when it struck (see
    the module's doc for the order of evidence). ``ended`` must name at least one rank, or a rank
    must have failed or announced a fault."""
    announced = [st for st in states if st.started and st.announced]
    if announced:
        first = min(announced, key=lambda st: (st.progress_at, st.rank))
        return first, "announced", first.progress_at
    own = [(st.progress_at, st.rank, st, "first_error") for st in states
           if st.phase == Phase.FAILED and st.cause in (Cause.OWN_ERROR, Cause.NONE)]
    silent = [(ended[st.rank], st.rank, st, "first_end") for st in states
              if st.rank in ended and st.started and st.phase not in (Phase.DONE, Phase.FAILED)]
    candidates = own + silent
    if not candidates:  # only consequences are known: the earliest of them
        candidates = [(st.progress_at, st.rank, st, "first_consequence") for st in states
                      if st.phase == Phase.FAILED]
    at, _, first, evidence = min(candidates, key=lambda c: (c[0], c[1]))
    return first, evidence, at


_FOLLOWED = {
    Cause.PEER_LOST: "then failed: it lost a peer (PeerLostError; its traceback is above)",
    Cause.INTERRUPTED: "then was interrupted",
    Cause.OWN_ERROR: "then raised an error (its traceback is above)",
    Cause.NONE: "then raised an error (its traceback is above)",
}


def _consequences(root: RankState, states: list[RankState], ended: Mapping[int, float]) -> str:
    """What followed the root cause, in order: "; then: rank 3 then failed: ...; ranks 0, 1 were
    stopped (their processes ended after it)"."""
    failed = [st for st in states if st is not root and st.phase == Phase.FAILED]
    stopped = sorted((ended[st.rank], st.rank) for st in states
                     if st is not root and st.rank in ended and st.started and st.phase not in (Phase.DONE, Phase.FAILED))
    parts = [f"rank {st.rank} {_FOLLOWED[st.cause] if st.cause in _FOLLOWED else 'then failed'}"
             for st in sorted(failed, key=lambda st: (st.progress_at, st.rank))]
    if stopped:
        ranks = [r for _, r in stopped]
        parts.append(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
                     f"{'were' if len(ranks) > 1 else 'was'} stopped (ended after it)")
    return "; then: " + "; ".join(parts) if parts else ""


def _tally(states: list[RankState]) -> str:
    """E.g. "2 waiting in communication (iterations 14-15), 1 evaluating (iteration 18)"."""
    parts = []
    for phase in Phase:
        group = [st for st in states if st.phase == phase]
        if not group:
            continue
        its = sorted({st.iteration for st in group if st.iteration >= 0})
        span = "" if not its else (f" (iteration {its[0]})" if len(its) == 1 else f" (iterations {its[0]}-{its[-1]})")
        parts.append(f"{len(group)} {_DOING[phase]}{span}")
    return ", ".join(parts)


def supervise(proc: subprocess.Popen, server, watchdog: Watchdog, stop_job,
              here: str | None = None) -> tuple[int, Verdict | None]:
    """Wait for the launcher ``proc``, judging every ``POLL_S`` the ranks whose beats ``server``
    (a ``HeartbeatServer``) receives; returns its exit status and the verdict, if any.

    ``stop_job(proc, reported_in, remote=...)`` ends the whole job, given the pids of the ranks
    on this host that have reported in (those handle an interrupt; the others are still
    starting) and whether ranks run elsewhere (they get the interrupt through the launcher).
    ``here``: this host's name (default ``socket.gethostname()``); ranks that name another
    host are watched through their connection alone. A KeyboardInterrupt (Ctrl+C, SIGTERM)
    stops the job before it goes on."""
    here = socket.gethostname() if here is None else here
    processes = _ProcessWatch(proc)
    ours: dict[int, bool] = {}  # pid -> whether it is a process of this job on this host

    def local(st: RankState) -> bool:
        # The host name alone could match a process of another pid namespace (a container, a
        # test bed's virtual host): only a descendant of the launcher is this job's for sure.
        if not st.started or st.host != here:
            return False
        if st.pid not in ours:
            ours[st.pid] = descends_from(st.pid, proc.pid)
        return ours[st.pid]

    def observe() -> tuple[list[RankState], dict[int, float]]:
        """The ranks' states and which have ended, when (connection closed, or process seen to end)."""
        table, hosts, closed = server.snapshot()
        states = _states(table, hosts)
        gone = processes.ended_ranks(states)
        if gone - closed.keys() and server.wait_closed(gone - closed.keys(), CLOSE_WAIT_S):
            table, hosts, closed = server.snapshot()  # now with the rows they sent last
            states = _states(table, hosts)
        # A process seen to end whose connection has not (yet) ended: after every end seen so far.
        seen = time.monotonic()
        return states, {**{r: seen for r in gone}, **closed}

    def stop(states: list[RankState]) -> None:
        mine = {st.pid for st in states if local(st)}
        remote = any(not local(st) if st.started else watchdog.host_of(st) != here for st in states)
        stop_job(proc, mine, remote=remote)

    verdict: Verdict | None = None
    deadline = None
    states, ended = observe()
    try:
        while proc.poll() is None:
            processes.watch([st.pid for st in states if local(st)])
            processes.wait(POLL_S, also=server.ended_fd())
            if proc.poll() is not None:
                break
            states, ended = observe()
            if verdict is None:
                verdict = watchdog.check(states, time.monotonic(), ended)
                if verdict is not None and verdict.kind in ("stuck", "not_started"):
                    stop(states)
                    break
                if verdict is not None:
                    deadline = time.monotonic() + GRACE_S
            elif deadline is not None and time.monotonic() > deadline:
                stop(states)  # the launcher did not end the others by itself
                break
    except KeyboardInterrupt:
        stop(read_states(server))
        raise
    finally:
        processes.close()
    rc = proc.wait()
    if verdict is not None and verdict.kind in ("died", "failed"):
        # Judged at the first end; now every rank has ended: judge again with all the evidence,
        # so the verdict lists what followed (its time stays that of the first judgement).
        server.wait_closed([st.rank for st in states if st.host is not None], CLOSE_WAIT_S)
        states, ended = observe()
        final = watchdog.check(states, time.monotonic(), ended)
        if final is not None:
            verdict = dataclasses.replace(final, after_s=verdict.after_s) if final.rank == verdict.rank else final
    elif verdict is None and rc != 0:
        # The launcher ended first (it ends the job when a rank dies). Judge by the ends seen,
        # or, if none was seen, by every rank: all of them have ended with the launcher.
        server.wait_closed([st.rank for st in states if st.host is not None], CLOSE_WAIT_S)
        states, ended = observe()
        if all(states[r].phase == Phase.DONE for r in ended):
            seen = time.monotonic()
            ended = {st.rank: seen for st in states if st.started}
        verdict = watchdog.check(states, time.monotonic(), ended)
    return rc, verdict


class _ProcessWatch:
    """Which of the ranks' processes (and the launcher) have ended, without spinning."""

    def __init__(self, launcher: subprocess.Popen) -> None:
        self._fds: dict[int, int] = {}  # pid -> pidfd, or -1: no pidfd, polled with kill(pid, 0)
        self._ended: set[int] = set()
        self._launcher_fd = _pidfd(launcher.pid)

    def watch(self, pids: list[int]) -> None:
        for pid in pids:
            if pid > 0 and pid not in self._fds and pid not in self._ended:
                fd = _pidfd(pid)
                self._fds[pid] = -1 if fd is None else fd

    def wait(self, timeout: float, also: int | None = None) -> None:
        """Sleep until a watched process ends, ``also`` (a file descriptor) becomes readable or
        ``timeout`` passes, then note what ended."""
        poller = select.poll()
        for fd in [self._launcher_fd, also, *self._fds.values()]:
            if fd is not None and fd >= 0:
                poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(timeout * 1000)}
        for pid, fd in list(self._fds.items()):
            if (fd in ready) if fd >= 0 else not _alive(pid):
                self._ended.add(pid)
                if fd >= 0:
                    os.close(fd)
                del self._fds[pid]

    def ended_ranks(self, states: list[RankState]) -> set[int]:
        """The ranks whose process was seen to end."""
        return {st.rank for st in states if st.pid in self._ended}

    def close(self) -> None:
        for fd in [self._launcher_fd, *self._fds.values()]:
            if fd is not None and fd >= 0:
                os.close(fd)
        self._fds.clear()
        self._launcher_fd = None


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_watched(scenario, ranks: int, argv: list[str], env: dict[str, str], launch, faults_enabled: bool = True,
                on_interrupt: Callable[[], None] | None = None) -> tuple[int, Verdict | None]:
    """Start ``argv`` on ``ranks`` ranks with ``launch`` (extra environment ``env``) and wait for
    them, watched by the watchdog (``scenario``'s settings and faults) on this host or across
    hosts: it listens for their heartbeats (``HARNESS_HEARTBEAT``; see
    ``harness.runner.heartbeat_net`` for the address). Returns the exit status and the verdict,
    if any. ``python -m harness run`` and ``launch`` both start their jobs here.

    Ctrl+C, SIGINT and SIGTERM (batch system, timeout) stop every rank, then ``on_interrupt``
    runs (the caller's tidying up), then the KeyboardInterrupt goes on; until then further
    interrupts are ignored, so none cuts the bounded stop short and orphans ranks.
    """

    from harness.launch import LaunchError, start_ranks, stop_job  # noqa: PLC0415
    from harness.runner.heartbeat_net import HeartbeatServer, watchdog_address  # noqa: PLC0415

    base = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    proc = None
    single = True
    try:
        single = launch.single_host()
        hosts = launch.rank_hosts(ranks)
        try:
            server = HeartbeatServer(ranks, watchdog_address(single))
        except ValueError as exc:
            raise LaunchError(f"the watchdog cannot start: {exc}") from None
        with server:
            proc = start_ranks(ranks, argv, env={**base, **env, ENV_VAR: server.url}, launch=launch)
            watchdog = Watchdog(scenario, time.monotonic(), faults_enabled, hosts=hosts)
            return supervise(proc, server, watchdog, stop_job)
    except KeyboardInterrupt:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        if proc is not None and proc.poll() is None:  # supervise stops the job it watches itself
            stop_job(proc, (), remote=not single)  # no rank known to have reported in
        if on_interrupt is not None:
            on_interrupt()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# -- the watchdog of a job the user started ------------------------------------------------------

_joined: Heartbeat | None = None  # this process's heartbeat, once join_watchdog made it
_in_job: _InJobWatchdog | None = None  # rank 0's watchdog, in a job the user started


def report_in_before_mpi() -> Heartbeat | None:
    """Report this rank in to the launcher's watchdog before MPI is initialized, in phase
    STARTING; None when there is no launcher's watchdog, or the launcher's environment does not
    say which rank this process is (``launch.launcher_rank``).

    MPI's start-up waits for every rank of every host, so a rank that reported in only after it
    would leave the watchdog unable to tell a host that never started its ranks from the hosts
    whose ranks wait for it: all would be "not started". Reported in here, the ranks that wait
    are known, and the verdict names the absent ones and their hosts.
    """
    from harness.launch import launcher_rank

    url, rank = os.environ.get(ENV_VAR), launcher_rank()
    if not url or rank is None:
        return None
    beat = Heartbeat(url, rank)
    beat.report_in(Phase.STARTING)
    return beat


def join_watchdog(world, scenario, faults_enabled: bool = True,
                  on_verdict: Callable[[Verdict], None] | None = None,
                  early: Heartbeat | None = None) -> Heartbeat:
    """This rank's heartbeat, beating to the job's watchdog. Every rank calls it at the same
    point (it may be collective); ``python -m harness run`` in place (through the worker) and
    ``harness.api.Run`` both do.

    - Launched by ``python -m harness run`` or ``launch``: to the launcher's watchdog
      (``HARNESS_HEARTBEAT``).
    - Started by the user (``mpiexec``, ``srun``; ``world`` has more than one rank and no
      launcher's watchdog is named): rank 0 starts the watchdog in a thread of its own process
      (:class:`_InJobWatchdog`) and broadcasts its address; every rank, rank 0 included, beats
      to it. On a verdict rank 0 prints it and aborts the MPI job, after calling
      ``on_verdict(verdict)`` (to record it). The start-up timeout does not apply: every rank
      runs already.
    - A job of one process the user started: no watchdog; beats are no-ops.

    Once per process: a later call (a script's next ``harness.api.Run``) returns the same
    heartbeat, and rank 0's watchdog then judges by the new ``scenario``. ``early``: the
    heartbeat to the launcher's watchdog this rank opened before MPI started
    (:func:`report_in_before_mpi`), used instead of a new one.
    """
    global _joined, _in_job
    if _joined is not None:
        if _in_job is not None:
            _in_job.follow(scenario, faults_enabled, on_verdict)
        return _joined
    url = os.environ.get(ENV_VAR)
    if url or world.size == 1:
        _joined = early if early is not None and early.watched else Heartbeat(url, world.rank)
        return _joined
    from harness.runner.heartbeat_net import HeartbeatServer, watchdog_address

    hosts = world.gather(socket.gethostname(), root=0)
    if world.rank == 0:
        try:
            server = HeartbeatServer(world.size, watchdog_address(all(h == hosts[0] for h in hosts)))
        except ValueError as exc:
            print(f"warning: the watchdog cannot start ({exc}): this job runs unwatched, so a hang lasts until "
                  "your launcher's or batch system's time limit", file=sys.stderr)
        else:
            watchdog = Watchdog(scenario, time.monotonic(), faults_enabled, hosts=hosts, startup=False)
            _in_job = _InJobWatchdog(server, watchdog, world, on_verdict)
            url = server.url
    url = world.bcast(url, root=0)
    _joined = Heartbeat(url, world.rank)
    return _joined


class _InJobWatchdog:
    """Rank 0's watchdog over a job the user started: a daemon thread judges the ranks every
    ``POLL_S``. A stuck job is aborted at once; a rank that died or raised is left to MPI for
    ``GRACE_S`` (MPICH's launcher ends the job when a rank dies, and a rank that raises aborts
    it), then aborted. Aborting is the only way to end every rank from here: MPI_Abort ends the
    whole job, on every host, now rather than at the batch system's time limit."""

    def __init__(self, server, watchdog: Watchdog, world, on_verdict: Callable[[Verdict], None] | None) -> None:
        self.server, self.world = server, world
        self._lock = threading.Lock()  # the watchdog and on_verdict may change under the thread
        self._watchdog, self._on_verdict = watchdog, on_verdict
        threading.Thread(target=self._run, name="watchdog", daemon=True).start()

    def follow(self, scenario, faults_enabled: bool, on_verdict: Callable[[Verdict], None] | None) -> None:
        """Judge by ``scenario`` from now on (a script's next ``harness.api.Run``)."""
        with self._lock:
            old = self._watchdog
            self._watchdog = Watchdog(scenario, old.launched_at, faults_enabled, hosts=old.hosts, startup=False)
            self._on_verdict = on_verdict

    def _run(self) -> None:
        deadline = None
        while True:
            time.sleep(POLL_S)
            table, hosts, closed = self.server.snapshot()
            with self._lock:
                watchdog, on_verdict = self._watchdog, self._on_verdict
            verdict = watchdog.check(_states(table, hosts), time.monotonic(), closed)
            if verdict is None:
                deadline = None
                continue
            if verdict.kind in ("died", "failed"):
                deadline = deadline or time.monotonic() + GRACE_S
                if time.monotonic() < deadline:
                    continue
            self._abort(verdict, on_verdict)
            return

    def _abort(self, verdict: Verdict, on_verdict: Callable[[Verdict], None] | None) -> None:
        print(f"\nerror: watchdog: {verdict.message}; aborting the MPI job", file=sys.stderr, flush=True)
        if on_verdict is not None:
            try:
                on_verdict(verdict)
            except Exception as exc:  # noqa: BLE001  the abort must happen whatever this did
                print(f"warning: could not record the watchdog's verdict ({exc.__class__.__name__}: {exc})",
                      file=sys.stderr, flush=True)
        abort_mpi_job(self.world)
