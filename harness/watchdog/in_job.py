"""How a rank joins its job's watchdog, and the watchdog rank 0 runs when the user started the job.

Where the watchdog runs: in the launching process when ``python -m harness run`` or ``launch``
start the ranks (``harness.watchdog.supervision``), on one host or many; in rank 0, in a thread,
when the user started the ranks (``mpiexec -n 8 python -m harness run FILE``, ``srun``, a
``harness.api`` script), where a verdict aborts the MPI job. Every rank calls
:func:`join_watchdog` at the same point of its start-up, whichever it is; a rank started by the
launcher reports in earlier still, before MPI's start-up (:func:`report_in_before_mpi`).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.launch import launcher_rank
from harness.rank_exit import abort_mpi_job
from harness.scenario.schema import Scenario
from harness.watchdog.heartbeat import ENV_VAR, Heartbeat
from harness.watchdog.heartbeat_net import HeartbeatServer, watchdog_address
from harness.watchdog.heartbeat_row import Phase
from harness.watchdog.verdict import GRACE_S, POLL_S, JobJudge, Verdict, states_of

if TYPE_CHECKING:
    from mpi4py import MPI  # the ranks' communicator; only ranks import mpi4py, when they start MPI

OnVerdict = Callable[[Verdict], object]  # records a verdict before rank 0 aborts the job (result unused)

_joined: Heartbeat | None = None  # this process's heartbeat, once join_watchdog made it
_in_job: _RankZeroWatch | None = None  # rank 0's watchdog, in a job the user started


def report_in_before_mpi() -> Heartbeat | None:
    """Report this rank in to the launcher's watchdog before MPI is initialized, in phase
    STARTING; None when there is no launcher's watchdog, or the launcher's environment does not
    say which rank this process is (``harness.launch.launcher_rank``).

    MPI's start-up waits for every rank of every host, so a rank that reported in only after it
    would leave the watchdog unable to tell a host that never started its ranks from the hosts
    whose ranks wait for it: all would be "not started". Reported in here, the ranks that wait
    are known, and the verdict names the absent ones and their hosts.
    """
    url, rank = os.environ.get(ENV_VAR), launcher_rank()
    if not url or rank is None:
        return None
    beat = Heartbeat(url, rank)
    beat.report_in(Phase.STARTING)
    return beat


def join_watchdog(
    world: MPI.Comm,
    scenario: Scenario,
    faults_enabled: bool = True,
    on_verdict: OnVerdict | None = None,
    early: Heartbeat | None = None,
) -> Heartbeat:
    """This rank's heartbeat, beating to the job's watchdog. Every rank calls it at the same
    point (it may be collective); ``python -m harness run`` in place (through the worker) and
    ``harness.api.Run`` both do.

    - Launched by ``python -m harness run`` or ``launch``: to the launcher's watchdog
      (``HARNESS_HEARTBEAT``).
    - Started by the user (``mpiexec``, ``srun``; ``world`` has more than one rank and no
      launcher's watchdog is named): rank 0 starts the watchdog in a thread of its own process
      (:class:`_RankZeroWatch`) and broadcasts its address; every rank, rank 0 included, beats
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
    hosts = world.gather(socket.gethostname(), root=0)
    if hosts is not None:  # rank 0, the gather's root
        try:
            server = HeartbeatServer(world.size, watchdog_address(all(h == hosts[0] for h in hosts)))
        except ValueError as exc:
            print(
                f"warning: the watchdog cannot start ({exc}): this job runs unwatched, so a hang lasts until "
                "your launcher's or batch system's time limit",
                file=sys.stderr,
            )
        else:
            judge = JobJudge(scenario, time.monotonic(), faults_enabled, hosts=hosts, startup=False)
            _in_job = _RankZeroWatch(server, judge, world, on_verdict)
            url = server.url
    url = world.bcast(url, root=0)
    _joined = Heartbeat(url, world.rank)
    return _joined


class _RankZeroWatch:
    """Rank 0's watchdog over a job the user started: a daemon thread judges the ranks every
    ``POLL_S``. A stuck job is aborted at once; a rank that died or raised is left to MPI for
    ``GRACE_S`` (MPICH's launcher ends the job when a rank dies, and a rank that raises aborts
    it), then aborted. Aborting is the only way to end every rank from here: MPI_Abort ends the
    whole job, on every host, now rather than at the batch system's time limit."""

    def __init__(self, server: HeartbeatServer, judge: JobJudge, world: MPI.Comm, on_verdict: OnVerdict | None) -> None:
        self.server, self.world = server, world
        self._lock = threading.Lock()  # the judge and on_verdict may change under the thread
        self._judge, self._on_verdict = judge, on_verdict
        threading.Thread(target=self._run, name="watchdog", daemon=True).start()

    def follow(self, scenario: Scenario, faults_enabled: bool, on_verdict: OnVerdict | None) -> None:
        """Judge by ``scenario`` from now on (a script's next ``harness.api.Run``)."""
        with self._lock:
            old = self._judge
            self._judge = JobJudge(scenario, old.launched_at, faults_enabled, hosts=old.hosts, startup=False)
            self._on_verdict = on_verdict

    def _run(self) -> None:
        deadline: float | None = None
        while True:
            time.sleep(POLL_S)
            table, hosts, closed = self.server.snapshot()
            with self._lock:
                judge, on_verdict = self._judge, self._on_verdict
            verdict = judge.check(states_of(table, hosts), time.monotonic(), closed)
            if verdict is None:
                deadline = None
                continue
            if verdict.kind in ("died", "failed"):
                deadline = deadline or time.monotonic() + GRACE_S
                if time.monotonic() < deadline:
                    continue
            self._abort(verdict, on_verdict)
            return

    def _abort(self, verdict: Verdict, on_verdict: OnVerdict | None) -> None:
        print(f"\nerror: watchdog: {verdict.message}; aborting the MPI job", file=sys.stderr, flush=True)
        if on_verdict is not None:
            try:
                on_verdict(verdict)
            except Exception as exc:  # noqa: BLE001  the abort must happen whatever this did
                print(
                    f"warning: could not record the watchdog's verdict ({exc.__class__.__name__}: {exc})",
                    file=sys.stderr,
                    flush=True,
                )
        abort_mpi_job(self.world)
