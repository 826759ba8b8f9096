"""The watchdog's verdict: given the ranks' heartbeats and which processes ended, is the job done
for, and whose fault is it? Pure: no sockets, no processes, no clock of its own.

Three things end a job:

- a rank's process ends before the rank reported DONE (killed, crashed, or raised an error);
- a rank did not report in within ``startup_timeout_s`` of the launch;
- the job is stuck: some rank made no progress for longer than its timeout (see
  ``harness.scenario.schema.WatchdogSettings``). The rank named is the one furthest behind, preferring
  a rank that is not waiting in communication: the others are usually waiting for it.

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
   arrive (``harness.watchdog.heartbeat_net``); a rank that failed because it lost a peer
   (``PeerLostError``) or was interrupted is a consequence, not a candidate;
3. else (only consequences are known) the earliest of those.

It never counts a rank's silence from before the launch: a rank that reported in without a
progress time (or with one older than the launch) has been quiet since the launch, not since the
machine booted. Who consults it, and how often: ``harness.watchdog.supervision`` (the launcher's
side) and ``harness.watchdog.in_job`` (rank 0's thread in a job the user started).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from harness.scenario.fault_fields import HangFault, KillFault, SlowStartFault
from harness.scenario.schema import Scenario, WatchdogSettings
from harness.watchdog.heartbeat_row import Cause, Field, Phase

# The pace both supervisors consult the judge at.
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


def states_of(table: np.ndarray, hosts: Sequence[str | None]) -> list[RankState]:
    """Every rank's state in ``table`` (a heartbeat table, ``Field`` layout) with its host."""
    return [
        RankState(
            r,
            int(row[Field.PID]),
            Phase(int(row[Field.PHASE])),
            int(row[Field.ALGORITHM]),
            int(row[Field.ITERATION]),
            float(row[Field.PROGRESS_AT]),
            float(row[Field.SLOWEST_ITERATION_S]),
            int(row[Field.ITERATIONS_DONE]),
            hosts[r],
            Cause(int(row[Field.CAUSE])),
        )
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


class JobJudge:
    """The pure decision part: given the table and which processes ended, is the job done for?

    ``hosts``: where each rank was to start (None: unknown), named for ranks that never
    connected. ``startup``: whether ranks that did not report in within ``startup_timeout_s``
    end the job (not where every rank is known to run already: a job the user started).
    """

    def __init__(
        self,
        scenario: Scenario,
        launched_at: float,
        faults_enabled: bool = True,
        hosts: Sequence[str | None] | None = None,
        startup: bool = True,
    ) -> None:
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
        return timeout, (
            f"{timeout:.1f} s = max(min_timeout_s {s.min_timeout_s:g} s, factor {s.factor:g} x "
            f"slowest iteration so far {slowest:.3f} s)"
        )

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
            culprit = min(
                running, key=lambda st: (st.phase == Phase.COMMUNICATING, st.algorithm, st.iteration, st.progress_at)
            )
            evidence = "furthest_behind"
        _, how = self.timeout(culprit, states)
        what = (
            f"{self._who(culprit)} made no progress for {self.quiet_for(culprit, now):.1f} s "
            f"{self._where(culprit)} ({_DOING[culprit.phase]}); timeout {how}"
        )
        others = [st for st in running if st is not culprit]
        if others:
            what += f"; the other running ranks: {_tally(others)}"
        return self._verdict(
            "stuck", culprit, what + self._injected(culprit), evidence, now - max(culprit.progress_at, self.launched_at)
        )

    def _not_started(self, absent: list[RankState], waited: float, waiting: list[int]) -> Verdict:
        """``waiting``: the ranks that started but wait in MPI's start-up (for the absent ones)."""
        groups: dict[str | None, list[int]] = {}  # by host, in rank order
        for st in absent:
            groups.setdefault(self.host_of(st), []).append(st.rank)
        names = " and ".join(
            f"{', '.join(map(str, ranks))} ({'on host ' + host if host else 'host unknown'})"
            for host, ranks in groups.items()
        )
        what = (
            f"rank{'s' if len(absent) > 1 else ''} {names} did not start within startup_timeout_s "
            f"({self.settings.startup_timeout_s:g} s; waited {waited:.1f} s)"
        )
        rank = absent[0].rank
        for f in self.faults:
            if isinstance(f, SlowStartFault) and f.rank == rank:
                what += f" (the scenario injects faults[{self.faults.index(f)}]: slow_start, delay_s {f.delay_s:g})"
                break
        if waiting:
            what += (
                f"; rank{'s' if len(waiting) > 1 else ''} {', '.join(map(str, waiting))} started and "
                f"wait{'' if len(waiting) > 1 else 's'} for {'them' if len(absent) > 1 else 'it'} "
                "in MPI's start-up"
            )
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
        """ " (the scenario injects this: faults[i] kill)" when ``st`` announced an injected fault."""
        kind = {Cause.INJECTED_KILL: KillFault, Cause.INJECTED_HANG: HangFault}.get(st.cause)
        name = self._algorithm(st)
        for i, f in enumerate(self.faults):
            if isinstance(f, kind or ()) and f.rank == st.rank and (f.algorithm or self.algorithms[0]) == name:
                return f" (the scenario injects this: faults[{i}] {f.kind})"
        return " (the scenario injects this)" if kind is not None else ""

    def _verdict(
        self, kind: str, st: RankState, message: str, evidence: str | None = None, after_s: float | None = None
    ) -> Verdict:
        return Verdict(
            kind,
            st.rank,
            message,
            self._algorithm(st),
            st.iteration if st.iteration >= 0 else None,
            self.host_of(st),
            evidence,
            None if after_s is None else round(max(after_s, 0.0), 3),
        )


def root_cause(states: list[RankState], ended: Mapping[int, float]) -> tuple[RankState, str, float]:
    """The rank whose fault the others' ends followed, the evidence for it and when it struck (see
    the module's doc for the order of evidence). ``ended`` must name at least one rank, or a rank
    must have failed or announced a fault."""
    announced = [st for st in states if st.started and st.announced]
    if announced:
        first = min(announced, key=lambda st: (st.progress_at, st.rank))
        return first, "announced", first.progress_at
    own = [
        (st.progress_at, st.rank, st, "first_error")
        for st in states
        if st.phase == Phase.FAILED and st.cause in (Cause.OWN_ERROR, Cause.NONE)
    ]
    silent = [
        (ended[st.rank], st.rank, st, "first_end")
        for st in states
        if st.rank in ended and st.started and st.phase not in (Phase.DONE, Phase.FAILED)
    ]
    candidates = own + silent
    if not candidates:  # only consequences are known: the earliest of them
        candidates = [(st.progress_at, st.rank, st, "first_consequence") for st in states if st.phase == Phase.FAILED]
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
    stopped = sorted(
        (ended[st.rank], st.rank)
        for st in states
        if st is not root and st.rank in ended and st.started and not st.finished
    )
    parts = [
        f"rank {st.rank} {_FOLLOWED.get(st.cause, 'then failed')}"
        for st in sorted(failed, key=lambda st: (st.progress_at, st.rank))
    ]
    if stopped:
        ranks = [r for _, r in stopped]
        parts.append(
            f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
            f"{'were' if len(ranks) > 1 else 'was'} stopped (ended after it)"
        )
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
