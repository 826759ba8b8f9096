"""The launcher's side of the watchdog: start a job's ranks and watch them until the job ends.

``python -m harness run`` and ``launch`` start their jobs here (:func:`run_watched`), on one host
or many. The launching process listens for the ranks' heartbeats, which every rank ships over TCP
wherever it runs (``harness.watchdog.heartbeat_net``), and asks the judge
(``harness.watchdog.verdict``) whether the job is done for. A rank's process has ended when its
connection closed (EOF arrives even after SIGKILL); a rank on the watchdog's own host is also
watched through a Linux pidfd (``harness.process_tree.EndWatch``), which is exact and immediate.
It never spins: it sleeps in ``poll()`` until a process ends or ``POLL_S`` passes. On a verdict
it stops the whole job (``harness.process_tree.stop_job``), leaving no process behind.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Collection
from typing import Protocol

from harness.launch import Launch, LaunchError, start_ranks
from harness.process_tree import EndWatch, descends_from, stop_job
from harness.scenario.schema import Scenario
from harness.watchdog.heartbeat import ENV_VAR
from harness.watchdog.heartbeat_net import HeartbeatServer, watchdog_address
from harness.watchdog.heartbeat_row import Phase
from harness.watchdog.verdict import GRACE_S, POLL_S, JobJudge, RankState, Verdict, states_of

CLOSE_WAIT_S = 1.0  # after a rank's process ended, for its last rows (its connection's end follows them)


class EndJob(Protocol):
    """How a supervisor ends the job: ``harness.process_tree.stop_job``, or a test's wrapper of it."""

    def __call__(
        self, proc: subprocess.Popen, reported_in: Collection[int] | None = None, remote: bool = False
    ) -> None: ...


def read_states(server: HeartbeatServer) -> list[RankState]:
    """Every rank's state as ``server`` last received it."""
    table, hosts, _ = server.snapshot()
    return states_of(table, hosts)


def supervise(
    proc: subprocess.Popen, server: HeartbeatServer, judge: JobJudge, end_job: EndJob, here: str | None = None
) -> tuple[int, Verdict | None]:
    """Wait for the launcher ``proc``, letting ``judge`` judge every ``POLL_S`` the ranks whose
    beats ``server`` receives; returns its exit status and the verdict, if any.

    ``end_job(proc, reported_in, remote=...)`` ends the whole job, given the pids of the ranks
    on this host that have reported in (those handle an interrupt; the others are still
    starting) and whether ranks run elsewhere (they get the interrupt through the launcher).
    ``here``: this host's name (default ``socket.gethostname()``); ranks that name another
    host are watched through their connection alone. A KeyboardInterrupt (Ctrl+C, SIGTERM)
    stops the job before it goes on."""
    here = socket.gethostname() if here is None else here
    processes = EndWatch(proc)
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
        states = states_of(table, hosts)
        gone = {st.rank for st in states if st.pid in processes.ended}
        if gone - closed.keys() and server.wait_closed(gone - closed.keys(), CLOSE_WAIT_S):
            table, hosts, closed = server.snapshot()  # now with the rows they sent last
            states = states_of(table, hosts)
        # A process seen to end whose connection has not (yet) ended: after every end seen so far.
        seen = time.monotonic()
        return states, {**{r: seen for r in gone}, **closed}

    def stop(states: list[RankState]) -> None:
        mine = {st.pid for st in states if local(st)}
        remote = any(not local(st) if st.started else judge.host_of(st) != here for st in states)
        end_job(proc, mine, remote=remote)

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
                verdict = judge.check(states, time.monotonic(), ended)
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
        final = judge.check(states, time.monotonic(), ended)
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
        verdict = judge.check(states, time.monotonic(), ended)
    return rc, verdict


def run_watched(
    scenario: Scenario,
    ranks: int,
    argv: list[str],
    env: dict[str, str],
    launch: Launch,
    faults_enabled: bool = True,
    on_interrupt: Callable[[], None] | None = None,
) -> tuple[int, Verdict | None]:
    """Start ``argv`` on ``ranks`` ranks with ``launch`` (extra environment ``env``) and wait for
    them, watched by the watchdog (``scenario``'s settings and faults) on this host or across
    hosts: it listens for their heartbeats (``HARNESS_HEARTBEAT``; see
    ``harness.watchdog.heartbeat_net`` for the address). Returns the exit status and the verdict,
    if any. ``python -m harness run`` and ``launch`` both start their jobs here.

    Ctrl+C, SIGINT and SIGTERM (batch system, timeout) stop every rank, then ``on_interrupt``
    runs (the caller's tidying up), then the KeyboardInterrupt goes on; until then further
    interrupts are ignored, so none cuts the bounded stop short and orphans ranks.
    """
    base = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    proc: subprocess.Popen | None = None
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
            judge = JobJudge(scenario, time.monotonic(), faults_enabled, hosts=hosts)
            return supervise(proc, server, judge, stop_job)
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
