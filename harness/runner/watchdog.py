"""The watchdog: ``python -m harness run`` watches its ranks and ends a job that cannot finish.

It reads the heartbeat table (``harness.runner.heartbeat``) and watches every rank's process
through a Linux pidfd (polling ``kill(pid, 0)`` where pidfds are missing). It never spins: it
sleeps in ``poll()`` until a process ends or ``POLL_S`` passes. Three things end a job:

- a rank's process ends before the rank reported DONE (killed, crashed, or raised an error);
- a rank did not report in within ``startup_timeout_s`` of the launch;
- the job is stuck: some rank made no progress for longer than its timeout (see
  ``harness.scenario.schema.Watchdog``). The rank named is the one furthest behind, preferring
  a rank that is not waiting in communication: the others are usually waiting for it.

The verdict names the rank, the algorithm, the iteration and what happened, and says when the
scenario itself injected that fault. It judges only consistent rows (``TableReader``), and never
counts a rank's silence from before the launch: a rank that reported in without a progress time
(or with one older than the launch) has been quiet since the launch, not since the machine booted.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

from harness.runner.heartbeat import Field, Phase, TableReader
from harness.scenario.schema import FaultSpec, HangFault, KillFault, Scenario, SlowStartFault
from harness.scenario.schema import Watchdog as WatchdogSettings

POLL_S = 0.5  # how often the table is read when no process ends: cheap, and bounds the delay
GRACE_S = 10.0  # after a rank died, how long the MPI launcher gets to end the others itself

_DOING = {
    Phase.NOT_STARTED: "not started",
    Phase.SETUP: "setting up",
    Phase.LOCAL: "local work (compute, injected delay or optimizer step)",
    Phase.COMMUNICATING: "waiting in communication",
    Phase.EVALUATING: "evaluating",
    Phase.RESULTS: "gathering and writing results",
    Phase.DONE: "done",
    Phase.FAILED: "failed",
}


@dataclasses.dataclass(frozen=True)
class RankState:
    """One row of the heartbeat table, read at one moment."""

    rank: int
    pid: int
    phase: Phase
    algorithm: int
    iteration: int
    progress_at: float
    slowest_iteration_s: float
    iterations_done: int

    @property
    def started(self) -> bool:
        return self.pid > 0

    @property
    def finished(self) -> bool:
        return self.phase in (Phase.DONE, Phase.FAILED)


def read_states(reader: TableReader) -> list[RankState]:
    """Every rank's state, each row as its rank last wrote it completely."""
    rows = reader.read()
    return [
        RankState(r, int(row[Field.PID]), Phase(int(row[Field.PHASE])), int(row[Field.ALGORITHM]),
                  int(row[Field.ITERATION]), float(row[Field.PROGRESS_AT]),
                  float(row[Field.SLOWEST_ITERATION_S]), int(row[Field.ITERATIONS_DONE]))
        for r, row in enumerate(rows)
    ]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Why the watchdog ends (or ended) the job."""

    kind: str  # "died", "failed", "not_started", "stuck"
    rank: int
    message: str
    algorithm: str | None = None
    iteration: int | None = None

    def as_json(self) -> dict:
        return dataclasses.asdict(self)


class Watchdog:
    """The pure decision part: given the table and which processes ended, is the job done for?"""

    def __init__(self, scenario: Scenario, launched_at: float, faults_enabled: bool = True) -> None:
        self.settings: WatchdogSettings = scenario.watchdog
        self.algorithms = [a.name for a in scenario.algorithms]
        self.faults = list(scenario.faults) if faults_enabled else []
        self.launched_at = launched_at

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
    def check(self, states: list[RankState], now: float, ended: set[int]) -> Verdict | None:
        """``ended``: ranks whose process is gone. None while the job may still finish."""
        died = [st for st in states if st.rank in ended and st.started and st.phase != Phase.DONE]
        if died:
            return self._died(died)
        waited = now - self.launched_at
        absent = [st.rank for st in states if not st.started]
        if absent and waited > self.settings.startup_timeout_s:
            return self._not_started(absent, waited)
        running = [st for st in states if st.started and not st.finished]
        stuck = [st for st in running if self.quiet_for(st, now) > self.timeout(st, states)[0]]
        if stuck:
            return self._stuck(running, states, now)
        return None

    def _died(self, died: list[RankState]) -> Verdict:
        # Errors first (their traceback is above); then a rank not blocked in communication:
        # when one rank dies, the MPI launcher kills the others, which are usually waiting for it.
        first = min(died, key=lambda st: (st.phase != Phase.FAILED, st.phase == Phase.COMMUNICATING, st.rank))
        where = self._where(first)
        if first.phase == Phase.FAILED:
            what = f"rank {first.rank} raised an error {where} (its traceback is above)"
            kind = "failed"
        else:
            what = f"rank {first.rank} (pid {first.pid}) died {where}: its process ended without finishing"
            kind = "died"
        others = sorted(st.rank for st in died if st is not first)
        if others:
            what += f"; ranks {', '.join(map(str, others))} ended at about the same time"
        return self._verdict(kind, first, what + self._injected(first, KillFault))

    def _not_started(self, absent: list[int], waited: float) -> Verdict:
        names = ", ".join(map(str, absent))
        what = (f"rank{'s' if len(absent) > 1 else ''} {names} did not start within startup_timeout_s "
                f"({self.settings.startup_timeout_s:g} s; waited {waited:.1f} s)")
        rank = absent[0]
        for f in self.faults:
            if isinstance(f, SlowStartFault) and f.rank == rank:
                what += f" (the scenario injects faults[{self.faults.index(f)}]: slow_start, delay_s {f.delay_s:g})"
                break
        return Verdict("not_started", rank, what)

    def _stuck(self, running: list[RankState], states: list[RankState], now: float) -> Verdict:
        culprit = min(running, key=lambda st: (st.phase == Phase.COMMUNICATING, st.algorithm, st.iteration,
                                               st.progress_at))
        timeout, how = self.timeout(culprit, states)
        what = (f"rank {culprit.rank} made no progress for {self.quiet_for(culprit, now):.1f} s "
                f"{self._where(culprit)} ({_DOING[culprit.phase]}); timeout {how}")
        others = [st for st in running if st is not culprit]
        if others:
            what += f"; the other running ranks: {_tally(others)}"
        return self._verdict("stuck", culprit, what + self._injected(culprit, HangFault))

    # -- wording ------------------------------------------------------------------------------
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

    def _injected(self, st: RankState, kind: type[FaultSpec]) -> str:
        name = self._algorithm(st)
        for i, f in enumerate(self.faults):
            if (isinstance(f, kind) and f.rank == st.rank and f.at_iteration == st.iteration
                    and (f.algorithm or self.algorithms[0]) == name):
                return f" (the scenario injects this: faults[{i}] {f.kind})"
        return ""

    def _verdict(self, kind: str, st: RankState, message: str) -> Verdict:
        return Verdict(kind, st.rank, message, self._algorithm(st), st.iteration if st.iteration >= 0 else None)


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


def supervise(proc: subprocess.Popen, table: np.ndarray, watchdog: Watchdog,
              stop_job) -> tuple[int, Verdict | None]:
    """Wait for the launcher ``proc``, judging the ranks every ``POLL_S``; returns its exit
    status and the verdict, if any. ``stop_job(proc, reported_in)`` ends the whole job, given
    the pids of the ranks that have reported in (those handle an interrupt; the others are
    still starting). A KeyboardInterrupt (Ctrl+C, SIGTERM) stops the job before it goes on."""
    processes = _ProcessWatch(proc)
    reader = TableReader(table)

    def stop() -> None:
        stop_job(proc, {st.pid for st in read_states(reader) if st.started})

    verdict: Verdict | None = None
    deadline = None
    states = read_states(reader)
    try:
        while proc.poll() is None:
            processes.watch([st.pid for st in states])
            processes.wait(POLL_S)
            if proc.poll() is not None:
                break
            states = read_states(reader)
            if verdict is None:
                verdict = watchdog.check(states, time.monotonic(), processes.ended_ranks(states))
                if verdict is not None and verdict.kind in ("stuck", "not_started"):
                    stop()
                    break
                if verdict is not None:
                    deadline = time.monotonic() + GRACE_S
            elif deadline is not None and time.monotonic() > deadline:
                stop()  # the launcher did not end the others by itself
                break
    except KeyboardInterrupt:
        stop()
        raise
    finally:
        processes.close()
    rc = proc.wait()
    if verdict is None and rc != 0:
        # The launcher ended first (it ends the job when a rank dies). Judge by the ends seen,
        # or, if none was seen, by every rank: all of them have ended with the launcher.
        states = read_states(reader)
        ended = processes.ended_ranks(states)
        if all(states[r].phase == Phase.DONE for r in ended):
            ended = {st.rank for st in states if st.started}
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

    def wait(self, timeout: float) -> None:
        """Sleep until a watched process ends or ``timeout`` passes, then note what ended."""
        poller = select.poll()
        for fd in [self._launcher_fd, *self._fds.values()]:
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
    them: watched by the watchdog (``scenario``'s settings and faults) when they all run on this
    host, else left to the MPI launcher. Returns the exit status and the verdict, if any.
    ``python -m harness run`` and ``launch`` both start their jobs here.

    Ctrl+C, SIGINT and SIGTERM (batch system, timeout) stop every rank, then ``on_interrupt``
    runs (the caller's tidying up), then the KeyboardInterrupt goes on; until then further
    interrupts are ignored, so none cuts the bounded stop short and orphans ranks.
    """

    from harness.launch import start_ranks, stop_job  # noqa: PLC0415
    from harness.runner import heartbeat  # noqa: PLC0415

    base = {k: v for k, v in os.environ.items() if k != heartbeat.ENV_VAR}
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    proc = None
    watched = False
    try:
        watched = launch.single_host()
        if watched:
            with heartbeat.temporary_table(ranks) as (table_path, table):
                proc = start_ranks(ranks, argv, env={**base, **env, heartbeat.ENV_VAR: table_path}, launch=launch)
                rc, verdict = supervise(proc, table, Watchdog(scenario, time.monotonic(), faults_enabled), stop_job)
        else:
            print("note: ranks on several hosts: the watchdog is off (a dead rank still ends the job; a hang "
                  "lasts until your time limit)", file=sys.stderr)
            proc = start_ranks(ranks, argv, env={**base, **env}, launch=launch)
            rc, verdict = proc.wait(), None
        return rc, verdict
    except KeyboardInterrupt:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        if proc is not None and proc.poll() is None:  # supervise stops the job it watches itself
            stop_job(proc, () if watched else None)  # no rank known to have reported in
        if on_interrupt is not None:
            on_interrupt()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
