"""Faults and the watchdog: injected kills, hangs and slow starts end the job in bounded time,
name the rank, keep finished results, leave no process; ``run --resume``; Ctrl+C; partial files."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import harness_cli, kill_rank_mid_run, write_scenario_file
from harness.faults import FaultPlan
from harness.mpi_library import native_build
from harness.results import atomic
from harness.scenario import ScenarioError, scenario_from_dict
from harness.testing.processes import processes_mentioning
from harness.watchdog.heartbeat import Heartbeat
from harness.watchdog.heartbeat_net import HeartbeatServer
from harness.watchdog.heartbeat_row import Cause, Phase
from harness.watchdog.supervision import read_states
from harness.watchdog.verdict import JobJudge
from harness.watchdog.verdict import RankState


def _scenario(**changes) -> dict:
    data = {
        "name": "faulty",
        "ranks": 3,
        "workload": {"model": "logreg", "dataset": "synthetic", "batch_size": 8, "iterations": 12,
                     "compute": {"emulate_ms": 5}},
        "algorithms": ["allreduce_sgd", "dpsgd"],
    }
    data.update(changes)
    return data


# --- the scenario's faults and watchdog sections ----------------------------------------------


@pytest.mark.parametrize(
    "faults, message",
    [
        ([{"kind": "kill", "rank": 3, "at_iteration": 1}], "faults[0].rank: rank must be < ranks (3) (got 3)"),
        ([{"kind": "hang", "rank": 0, "at_iteration": 12}], "faults[0].at_iteration: must be < workload.iterations (12)"),
        ([{"kind": "kill", "rank": 0, "at_iteration": 1, "algorithm": "sgp"}],
         "faults[0].algorithm: not one of the algorithms run (allreduce_sgd, dpsgd) (got 'sgp')"),
        ([{"kind": "slow_start", "rank": 1, "delay_s": 1}, {"kind": "slow_start", "rank": 1, "delay_s": 2}],
         "faults[1].rank: rank already has a slow_start (faults[0])"),
        ([{"kind": "slow_start", "rank": 1, "delay_s": -1}], "faults[0].delay_s"),
        ([{"kind": "explode", "rank": 1}], "faults[0]"),
        ([{"kind": "kill", "rank": 1}], "faults[0].at_iteration"),
        ([{"kind": "kill", "rank": 1, "during": "evaluation"}],
         "faults[0].at_iteration: is required with during: evaluation (got None)"),
        ([{"kind": "hang", "rank": 1, "during": "finish", "at_iteration": 3}],
         "faults[0].at_iteration: must be left out with during: finish"),
        ([{"kind": "hang", "rank": 1, "during": "forward", "at_iteration": 3}], "faults[0].during: must be"),
    ],
)
def test_bad_faults_are_refused_with_their_place(faults, message):
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(_scenario(faults=faults))
    assert message in str(err.value)
    assert "Traceback" not in str(err.value)


def test_watchdog_settings_are_checked_and_resolved():
    with pytest.raises(ScenarioError, match=r"watchdog.factor"):
        scenario_from_dict(_scenario(watchdog={"factor": 0.5}))
    with pytest.raises(ScenarioError, match=r"watchdog.stall_timeout_s"):
        scenario_from_dict(_scenario(watchdog={"stall_timeout_s": 0}))
    resolved = scenario_from_dict(_scenario()).resolved_dict()
    assert resolved["faults"] == []
    assert resolved["watchdog"] == {"stall_timeout_s": None, "factor": 20.0, "min_timeout_s": 10.0,
                                    "startup_timeout_s": 120.0}


def test_fault_plan_strikes_where_the_scenario_says():
    scenario = scenario_from_dict(_scenario(faults=[
        {"kind": "kill", "rank": 1, "at_iteration": 4},  # no algorithm: the first one run
        {"kind": "hang", "rank": 1, "at_iteration": 2, "algorithm": "dpsgd"},
        {"kind": "slow_start", "rank": 1, "delay_s": 1.5},
    ]))
    plan = FaultPlan(scenario, 1)
    assert plan.start_delay_s == 1.5
    assert set(plan._strikes) == {("allreduce_sgd", "iteration"), ("dpsgd", "iteration")}
    assert not FaultPlan(scenario, 0)  # other ranks: nothing
    assert not FaultPlan(scenario, 1, enabled=False)  # a resumed run injects nothing
    FaultPlan(scenario, 1).at_iteration("allreduce_sgd", 3)  # not due: returns


def _recording(plan: FaultPlan) -> list:
    """``plan`` with its strike recorded instead of carried out; the record."""
    struck = []
    plan._strike = lambda fault: struck.append((fault.kind, fault.during))
    return struck


def test_each_point_strikes_where_it_says_and_only_for_its_algorithm():
    scenario = scenario_from_dict(_scenario(workload={**_scenario()["workload"], "eval_every": 4}, faults=[
        {"kind": "kill", "rank": 1, "at_iteration": 6, "during": "communication"},
        {"kind": "hang", "rank": 1, "at_iteration": 5, "during": "evaluation", "algorithm": "dpsgd"},
        {"kind": "kill", "rank": 1, "during": "finish", "algorithm": "dpsgd"},
    ]))
    plan = FaultPlan(scenario, 1)
    struck = _recording(plan)
    plan.at_iteration("allreduce_sgd", 5)
    plan.posted()
    assert struck == []  # communication: not before iteration 6
    plan.at_evaluation("allreduce_sgd", 8)
    plan.at_finish("allreduce_sgd")
    assert struck == []  # the evaluation and finish faults are dpsgd's
    plan.at_iteration("allreduce_sgd", 6)
    assert struck == []  # an iteration begins: nothing posted yet
    plan.posted()
    assert struck == [("kill", "communication")]
    struck.clear()
    plan.at_iteration("dpsgd", 6)
    plan.posted()
    plan.at_evaluation("dpsgd", 4)  # after iteration 3: before the fault's iteration 5
    assert struck == []
    plan.at_evaluation("dpsgd", 8)
    plan.at_finish("dpsgd")
    assert struck == [("hang", "evaluation"), ("kill", "finish")]


class _Posting:
    """A communicator that notes what it was asked to post, and its handles' waits."""

    def __init__(self, log: list) -> None:
        self.log = log

    def iallreduce(self, buf, op="sum"):
        self.log.append("posted iallreduce")
        return self

    def wait_avoiding(self, initial, **kwargs):
        return self

    def iround(self, buf, out, may_activate=True):
        self.log.append("posted iround")
        return self

    def wait(self, timeout=None):
        self.log.append("waited")

    def info(self):
        return {"round": 0}


def test_a_communication_fault_strikes_after_posting_while_the_operation_is_in_flight():
    scenario = scenario_from_dict(_scenario(faults=[
        {"kind": "kill", "rank": 1, "at_iteration": 0, "during": "communication"}]))
    plan = FaultPlan(scenario, 1)
    log: list = []
    plan._strike = lambda fault: log.append("struck")
    comm = _Posting(log)
    assert FaultPlan(scenario, 0).striking(comm, "allreduce_sgd") is comm  # nothing due: the communicator itself
    assert plan.striking(comm, "dpsgd") is comm
    striking = plan.striking(comm, "allreduce_sgd")
    plan.at_iteration("allreduce_sgd", 0)
    striking.allreduce([0.0])  # blocking: posted as its non-blocking form, struck, then waited for
    assert log == ["posted iallreduce", "struck", "waited"]
    log.clear()
    assert striking.wait_avoiding([0.0], phases=[[0, 1]], sync_every=2).round([0.0], [0.0]) == {"round": 0}
    assert log == ["posted iround", "struck", "waited"]


# --- the watchdog's decisions, on hand-made heartbeat tables ---------------------------------


def _state(rank, phase, iteration=5, algorithm=0, progress_at=100.0, slowest=0.1, pid=None, host=None,
           cause=Cause.NONE):
    return RankState(rank, 1000 + rank if pid is None else pid, phase, algorithm, iteration, progress_at, slowest,
                     iteration, host, cause)


def _watchdog(**settings) -> JobJudge:
    data = _scenario(faults=[{"kind": "hang", "rank": 2, "at_iteration": 5},
                             {"kind": "kill", "rank": 1, "at_iteration": 5}],
                     watchdog=settings)
    return JobJudge(scenario_from_dict(data), launched_at=0.0)


def test_timeout_follows_the_slowest_iteration():
    dog = _watchdog(factor=20, min_timeout_s=1)
    states = [_state(0, Phase.LOCAL, slowest=0.3), _state(1, Phase.LOCAL, slowest=0.05)]
    assert dog.iteration_timeout(states)[0] == pytest.approx(6.0)
    assert dog.iteration_timeout([_state(0, Phase.LOCAL, slowest=0.01)])[0] == 1.0  # the floor
    assert dog.iteration_timeout([_state(0, Phase.SETUP, slowest=0.0)]) is None  # nothing finished yet
    assert dog.timeout(_state(0, Phase.SETUP), states)[0] == 120.0  # set-up: the start-up timeout
    assert _watchdog(stall_timeout_s=7).iteration_timeout(states)[0] == 7.0


def test_no_verdict_while_every_rank_progresses():
    dog = _watchdog(min_timeout_s=1)
    states = [_state(r, Phase.COMMUNICATING, progress_at=100.0) for r in range(3)]
    assert dog.check(states, now=101.5, ended={}) is None  # 1.5 s < 20 x 0.1 s
    done = [_state(r, Phase.DONE) for r in range(3)]
    assert dog.check(done, now=1000.0, ended={0: 1.0, 1: 1.0, 2: 1.0}) is None  # finished ranks may end


def test_stuck_job_names_the_rank_that_is_not_waiting_for_others():
    dog = _watchdog(min_timeout_s=1)
    # Rank 0 blocked in communication longest; rank 2 stopped in its local work: rank 2 is the cause.
    states = [_state(0, Phase.COMMUNICATING, progress_at=90.0), _state(1, Phase.COMMUNICATING, 6, progress_at=95.0),
              _state(2, Phase.LOCAL, progress_at=92.0, host="vh3")]
    verdict = dog.check(states, now=100.0, ended={})
    assert verdict.kind == "stuck" and verdict.rank == 2 and verdict.host == "vh3"
    assert verdict.algorithm == "allreduce_sgd" and verdict.iteration == 5 and verdict.evidence == "furthest_behind"
    assert "rank 2 (pid 1002 on host vh3) made no progress for 8.0 s in iteration 5 of allreduce_sgd" in verdict.message
    assert "injects" not in verdict.message  # rank 2 said nothing of a fault: none is claimed
    assert "2 waiting in communication (iterations 5-6)" in verdict.message


def test_a_rank_that_announced_an_injected_hang_is_the_stuck_one():
    dog = _watchdog(min_timeout_s=1)
    # Rank 1 is further behind and not communicating, but rank 2 said an injected hang strikes it.
    states = [_state(0, Phase.COMMUNICATING, 6, progress_at=90.0), _state(1, Phase.LOCAL, 4, progress_at=91.0),
              _state(2, Phase.COMMUNICATING, progress_at=92.0, cause=Cause.INJECTED_HANG)]
    verdict = dog.check(states, now=100.0, ended={})
    assert verdict.kind == "stuck" and verdict.rank == 2 and verdict.evidence == "announced"
    assert "faults[0] hang" in verdict.message and verdict.after_s == pytest.approx(8.0)


def test_an_announced_kill_is_the_root_whatever_order_the_others_ended_in():
    dog = _watchdog()
    # Rank 0's end was seen first and rank 2 raised first; rank 1 announced its injected kill.
    states = [_state(0, Phase.COMMUNICATING), _state(1, Phase.LOCAL, host="vh2", cause=Cause.INJECTED_KILL),
              _state(2, Phase.FAILED, progress_at=99.0, cause=Cause.PEER_LOST)]
    verdict = dog.check(states, now=101.0, ended={0: 100.1, 1: 100.2, 2: 100.3})
    assert verdict.kind == "died" and verdict.rank == 1 and verdict.as_json()["host"] == "vh2"
    assert verdict.evidence == "announced"
    assert verdict.message == (
        "rank 1 (pid 1001 on host vh2) died in iteration 5 of allreduce_sgd: its process ended without finishing "
        "(the scenario injects this: faults[1] kill); then: rank 2 then failed: it lost a peer (PeerLostError; its "
        "traceback is above); rank 0 was stopped (ended after it)")


def test_without_an_announcement_the_first_end_is_the_root_and_lost_peers_are_consequences():
    dog = _watchdog()
    # An out-of-memory kill of rank 2: its connection ended first; rank 3 raised PeerLostError
    # before the watchdog saw that end (a lost peer is never a root while a death is known); the
    # clean-up then ended ranks 1 and 0, in that order.
    states = [_state(0, Phase.COMMUNICATING), _state(1, Phase.LOCAL), _state(2, Phase.COMMUNICATING, iteration=7),
              _state(3, Phase.FAILED, progress_at=100.0, cause=Cause.PEER_LOST)]
    verdict = dog.check(states, now=101.0, ended={0: 100.3, 1: 100.2, 2: 100.1, 3: 100.4})
    assert verdict.kind == "died" and verdict.rank == 2 and verdict.evidence == "first_end"
    assert verdict.iteration == 7 and "injects" not in verdict.message
    assert verdict.message.endswith("; then: rank 3 then failed: it lost a peer (PeerLostError; its traceback is "
                                    "above); ranks 1, 0 were stopped (ended after it)")
    assert verdict.after_s == pytest.approx(0.9)


def test_an_error_of_a_ranks_own_before_any_end_is_the_root():
    dog = _watchdog()
    failed = dog.check([_state(0, Phase.FAILED, iteration=-1, algorithm=1, host="vh1", progress_at=100.0,
                               cause=Cause.OWN_ERROR), _state(1, Phase.LOCAL)], 101.0, {0: 100.3, 1: 100.2})
    assert failed.kind == "failed" and failed.rank == 0 and failed.evidence == "first_error"
    assert failed.message == ("rank 0 (pid 1000 on host vh1) raised an error in the set-up or results of dpsgd (its "
                              "traceback is above); then: rank 1 was stopped (ended after it)")
    # A rank that died before the other raised is the root.
    died = dog.check([_state(0, Phase.FAILED, progress_at=100.5, cause=Cause.OWN_ERROR), _state(1, Phase.LOCAL)],
                     101.0, {1: 100.2, 0: 100.6})
    assert died.rank == 1 and died.kind == "died"
    assert died.message.endswith("; then: rank 0 then raised an error (its traceback is above)")


def test_when_only_consequences_are_known_the_earliest_is_named():
    dog = _watchdog()
    states = [_state(0, Phase.FAILED, progress_at=100.4, cause=Cause.INTERRUPTED),
              _state(1, Phase.FAILED, progress_at=100.1, cause=Cause.PEER_LOST), _state(2, Phase.DONE)]
    verdict = dog.check(states, now=101.0, ended={0: 100.5, 1: 100.2})
    assert verdict.rank == 1 and verdict.kind == "failed" and verdict.evidence == "first_consequence"
    assert verdict.message.endswith("; then: rank 0 then was interrupted")


def test_rank_that_never_reports_in_is_named_after_the_startup_timeout():
    dog = _watchdog(startup_timeout_s=5)
    states = [_state(0, Phase.SETUP, iteration=-1, algorithm=-1, progress_at=1.0), _state(1, Phase.NOT_STARTED, pid=0),
              _state(2, Phase.SETUP, iteration=-1, algorithm=-1, progress_at=1.0)]
    assert dog.check(states, now=4.0, ended={}) is None
    verdict = dog.check(states, now=6.0, ended={})
    assert verdict.kind == "not_started" and verdict.rank == 1
    assert "rank 1 (host unknown) did not start within startup_timeout_s (5 s; waited 6.0 s)" in verdict.message
    # Where the launcher placed them; a rank that connected but did not report in names its own host.
    planned = JobJudge(dog_scenario := scenario_from_dict(_scenario(watchdog={"startup_timeout_s": 5})), 0.0,
                       hosts=["vh1", "vh2", "vh2"])
    absent = [states[0], states[1], _state(2, Phase.NOT_STARTED, pid=0)]
    verdict = planned.check(absent, now=6.0, ended={})
    assert verdict.message.startswith("ranks 1, 2 (on host vh2) did not start within startup_timeout_s (5 s")
    assert verdict.host == "vh2"
    absent[2] = _state(2, Phase.NOT_STARTED, pid=0, host="vh3")
    assert planned.check(absent, 6.0, {}).message.startswith("ranks 1 (on host vh2) and 2 (on host vh3) did not")
    # In a job the user started every rank runs already: no start-up verdict.
    assert JobJudge(dog_scenario, 0.0, startup=False).check(absent, 6.0, {}) is None
    # Ranks that reported in before MPI's start-up and wait there for the absent one are named too.
    waiting = [_state(0, Phase.STARTING, iteration=-1, algorithm=-1, progress_at=1.0, slowest=0.0, host="vh1"),
               _state(1, Phase.STARTING, iteration=-1, algorithm=-1, progress_at=1.0, slowest=0.0, host="vh2"),
               _state(2, Phase.NOT_STARTED, pid=0, slowest=0.0)]
    assert planned.check(waiting, 4.0, {}) is None
    assert planned.timeout(waiting[0], waiting)[0] == 5.0  # MPI's start-up: the start-up timeout
    assert planned.check(waiting, 6.0, {}).message == (
        "rank 2 (on host vh2) did not start within startup_timeout_s (5 s; waited 6.0 s); ranks 0, 1 started and "
        "wait for it in MPI's start-up")


def test_silence_is_counted_from_the_launch_at_the_earliest():
    # A rank that reported in with no progress time yet (0), or one from before the launch,
    # has been quiet since the launch, not since the machine booted.
    dog = JobJudge(scenario_from_dict(_scenario(watchdog={"startup_timeout_s": 5})), launched_at=1000.0)
    for progress_at in (0.0, 900.0):
        states = [_state(0, Phase.SETUP, iteration=-1, algorithm=-1, progress_at=progress_at, slowest=0.0),
                  _state(1, Phase.SETUP, iteration=-1, algorithm=-1, progress_at=1003.0, slowest=0.0)]
        assert dog.check(states, now=1004.0, ended={}) is None
        verdict = dog.check(states, now=1006.0, ended={})
        assert verdict.kind == "stuck" and verdict.rank == 0
        assert "rank 0 (pid 1000) made no progress for 6.0 s during start-up (setting up)" in verdict.message


def test_heartbeat_rows_reach_the_watchdog():
    with HeartbeatServer(2, "127.0.0.1") as server:
        beat = Heartbeat(server.url, 1)
        beat.report_in()
        beat.algorithm(1)
        beat.iteration(7)
        beat.phase(Phase.COMMUNICATING)
        beat.iteration_done(0.25)
        beat.stage(Phase.EVALUATING)
        beat.phase(Phase.COMMUNICATING)  # evaluation's own collectives
        deadline = time.monotonic() + 10
        while read_states(server)[1].phase != Phase.COMMUNICATING and time.monotonic() < deadline:
            time.sleep(0.05)  # shipped by the sender thread within 0.2 s
        first, second = read_states(server)
        assert not first.started and first.host is None
        assert (second.pid, second.phase, second.algorithm, second.iteration) == (os.getpid(), Phase.COMMUNICATING, 1, 7)
        assert second.slowest_iteration_s == 0.25 and second.iterations_done == 1
        assert second.host == socket.gethostname()
        assert abs(second.progress_at - time.monotonic()) < 5
        beat.expect(30.0)  # an injected delay of 30 s: progress until it is over
        deadline = time.monotonic() + 10
        while read_states(server)[1].progress_at < time.monotonic() + 25 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert read_states(server)[1].progress_at > time.monotonic() + 25
        beat.close()
    Heartbeat(None, 0).iteration(3)  # no watchdog listening: a no-op


# --- atomic results under SIGKILL -------------------------------------------------------------

_WRITER = """
import sys, numpy as np, pandas as pd
from harness.results import atomic
frame = pd.DataFrame({"a": np.arange(400_000), "b": np.linspace(0, 1, 400_000)})
n = 0
while True:
    frame["a"] = n
    atomic.write_csv(sys.argv[1], frame)
    n += 1
    print(n, flush=True)
"""


def _stopped(proc: subprocess.Popen) -> None:
    """SIGSTOP ``proc`` and return once it is stopped (nothing it does moves on meanwhile)."""
    proc.send_signal(signal.SIGSTOP)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), status


@pytest.mark.subprocess
def test_a_writer_killed_mid_write_leaves_the_old_file_whole(tmp_path):
    target = tmp_path / "steps.csv"
    partial = f".*{atomic.PARTIAL_SUFFIX}"
    with subprocess.Popen([sys.executable, "-c", _WRITER, str(target)], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout.readline().strip() == "1"  # one complete write, then kill during the next
            # Mid-write: stopped while its partial file exists (a stopped writer cannot finish it).
            deadline = time.monotonic() + 60
            while True:
                assert time.monotonic() < deadline, "the writer was never caught mid-write in 60 s: nothing tested"
                if list(tmp_path.glob(partial)):
                    _stopped(proc)
                    if list(tmp_path.glob(partial)):
                        break
                    proc.send_signal(signal.SIGCONT)  # it finished that write meanwhile: the next one
                time.sleep(0.001)  # polls for the partial file, with a deadline
        finally:
            proc.kill()
    leftovers = list(tmp_path.glob(partial))
    assert leftovers, "the writer was not killed mid-write: nothing tested"
    frame = pd.read_csv(target)
    assert len(frame) == 400_000 and frame["a"].nunique() == 1  # one whole version, never a mix
    assert sorted(atomic.remove_partial_files(tmp_path)) == sorted(leftovers)
    assert [p.name for p in tmp_path.iterdir()] == ["steps.csv"]


# --- whole runs under real mpiexec --------------------------------------------------------------


def _only_run(root: Path, name: str) -> Path:
    (run,) = (root / name).iterdir()
    return run


def _assert_failed_cleanly(run: Path, finished: list[str]) -> dict:
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "failed" and meta["finished_algorithms"] == finished
    assert not list(run.rglob(f".*{atomic.PARTIAL_SUFFIX}"))
    steps = pd.read_csv(run / "steps.csv")
    assert sorted(set(steps["algorithm"])) == sorted(finished)
    assert not processes_mentioning(str(run)), "ranks left running"
    return meta


@pytest.mark.mpi
def test_killed_rank_ends_the_job_and_resume_finishes_it(tmp_path):
    data = _scenario(faults=[{"kind": "slow_start", "rank": 2, "delay_s": 1.5},
                             {"kind": "kill", "rank": 1, "at_iteration": 5, "algorithm": "dpsgd"}])
    proc = harness_cli("run", str(write_scenario_file(tmp_path, data)), "--out", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert re.search(rf"error: rank 1 \(pid \d+ on host {re.escape(socket.gethostname())}\) died in iteration 5 of "
                     r"dpsgd: its process ended without finishing", proc.stderr), proc.stderr[-3000:]
    # A real failure: the MPI launcher's own report is not hidden (Hydra's on stdout, mpirun's on stderr).
    report = {"mpich": "BAD TERMINATION", "openmpi": "exited on signal"}[native_build()["family"]]
    assert report in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    run = _only_run(tmp_path / "out", "faulty")
    meta = _assert_failed_cleanly(run, ["allreduce_sgd"])
    assert meta["fault"]["rank"] == 1 and meta["fault"]["iteration"] == 5 and meta["fault"]["kind"] == "died"
    assert meta["fault"]["host"] == socket.gethostname()
    assert meta["device"] == "cpu" and meta["hosts"] == 1  # what the ranks wrote is kept
    first = pd.read_csv(run / "steps.csv")

    proc = harness_cli("run", "--resume", str(run), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["finished_algorithms"] == ["allreduce_sgd", "dpsgd"]
    assert "error" not in meta and "fault" not in meta and len(meta["resumed_at"]) == 1
    steps = pd.read_csv(run / "steps.csv")
    assert steps.groupby("algorithm").size().to_dict() == {"allreduce_sgd": 36, "dpsgd": 36}
    pd.testing.assert_frame_equal(steps[steps["algorithm"] == "allreduce_sgd"], first)  # kept as it was
    summary = pd.read_csv(run / "summary.csv")
    assert list(summary["algorithm"]) == ["allreduce_sgd", "dpsgd"] and summary["complete"].all()

    again = harness_cli("run", "--resume", str(run), timeout=60)
    assert again.returncode == 0 and "nothing to resume" in again.stderr


@pytest.mark.mpi
def test_hung_rank_is_found_by_the_watchdog(tmp_path):
    data = _scenario(ranks=4, algorithms=["allreduce_sgd", "dpsgd"],
                     faults=[{"kind": "hang", "rank": 2, "at_iteration": 7, "algorithm": "dpsgd"}],
                     watchdog={"min_timeout_s": 2, "factor": 5})
    proc = harness_cli("run", str(write_scenario_file(tmp_path, data)), "--out", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert re.search(rf"error: rank 2 \(pid \d+ on host {re.escape(socket.gethostname())}\) made no progress for",
                     proc.stderr), proc.stderr[-3000:]
    assert "in iteration 7 of dpsgd" in proc.stderr and "faults[0] hang" in proc.stderr
    meta = _assert_failed_cleanly(_only_run(tmp_path / "out", "faulty"), ["allreduce_sgd"])
    assert meta["fault"]["kind"] == "stuck" and meta["fault"]["rank"] == 2


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV], ids=["out_of_memory_kill", "segfault"])
@pytest.mark.mpi
def test_a_real_crash_is_named_by_when_its_connection_ended(tmp_path, sig):
    # Nothing injected: rank 2 is killed from outside in mid-run, as the kernel's out-of-memory
    # killer or a segfault would. It cannot say anything first; its connection's end, which
    # arrives before MPI's clean-up ends the others, names it.
    data = _scenario(ranks=4, algorithms=["allreduce_sgd"],
                     workload={**_scenario()["workload"], "iterations": 4000, "compute": {"emulate_ms": 5}})
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "harness", "run", str(write_scenario_file(tmp_path, data)), "--out", str(out)]
    pid, proc = kill_rank_mid_run(cmd, out, 2, sig)  # in the 4000 x 5 ms iterations
    err = proc.stderr
    assert proc.returncode == 1, err[-3000:]
    # Where it died depends on how far a loaded machine got; who died does not.
    assert re.search(rf"error: rank 2 \(pid {pid} on host {re.escape(socket.gethostname())}\) died [^:]*: its process "
                     r"ended without finishing", err), err[-3000:]
    assert "injects" not in err
    run = _only_run(out, "faulty")
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "failed" and meta["fault"]["rank"] == 2 and meta["fault"]["evidence"] == "first_end"
    assert not processes_mentioning(str(run)), "ranks left running"


@pytest.mark.mpi
def test_rank_that_starts_too_late_is_named(tmp_path):
    # harness_cli fails the test if the run outlives its timeout: far less than the delay.
    data = _scenario(faults=[{"kind": "slow_start", "rank": 1, "delay_s": 600}], watchdog={"startup_timeout_s": 8})
    proc = harness_cli("run", str(write_scenario_file(tmp_path, data)), "--out", str(tmp_path / "out"), timeout=150)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"error: rank 1 (on host {socket.gethostname()}) did not start within startup_timeout_s (8 s" in proc.stderr, \
        proc.stderr[-3000:]
    run = _only_run(tmp_path / "out", "faulty")
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    assert not processes_mentioning(str(run))


def _start_in_background_of_a_script(cmd: list[str]) -> tuple[subprocess.Popen, int]:
    """Start ``cmd`` as a script does with `cmd &`: a non-interactive shell starts it with
    SIGINT ignored. Returns the shell (its exit status is the command's) and the command's pid."""
    shell = subprocess.Popen(["bash", "-c", '"$@" & echo $!; wait $!', "bash", *cmd],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return shell, int(shell.stdout.readline())


@pytest.mark.subprocess
def test_a_scripts_background_job_starts_with_sigint_ignored():
    # What the next test relies on: without its own handler, a launcher started so ignores SIGINT.
    shell, _ = _start_in_background_of_a_script([sys.executable, "-c",
                                                 "import signal; print(signal.getsignal(signal.SIGINT).name)"])
    out, _ = shell.communicate(timeout=60)
    assert out.strip() == "SIG_IGN"


@pytest.mark.parametrize("started", ["in the foreground", "in the background of a script"])
@pytest.mark.mpi
def test_sigint_stops_every_rank_quietly_and_keeps_finished_algorithms(tmp_path, started):
    # About 3 s per algorithm: interrupt once the first is written, while the second runs.
    data = _scenario(ranks=4, workload={"model": "logreg", "dataset": "synthetic", "batch_size": 8,
                                        "iterations": 800, "eval_every": 1000, "compute": {"emulate_ms": 2}})
    path = write_scenario_file(tmp_path, data)
    cmd = [sys.executable, "-m", "harness", "run", str(path), "--out", str(tmp_path / "out")]
    if started == "in the foreground":
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        launcher = proc.pid
    else:
        proc, launcher = _start_in_background_of_a_script(cmd)
    try:
        deadline = time.monotonic() + 120
        run_json = None
        while time.monotonic() < deadline and proc.poll() is None:
            runs = list((tmp_path / "out" / "faulty").glob("*/run.json"))
            if runs and "allreduce_sgd" in runs[0].read_text():
                run_json = runs[0]
                break
            time.sleep(0.2)
        assert run_json is not None, "the first algorithm did not finish in time"
        t0 = time.monotonic()
        os.kill(launcher, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        stopped_in = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.kill(launcher, signal.SIGKILL)
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert stopped_in < 10
    meta = json.loads(run_json.read_text())
    assert meta["status"] == "incomplete" and meta["finished_algorithms"] == ["allreduce_sgd"]
    assert "interrupted" in meta["stopped"]
    assert not processes_mentioning(str(run_json.parent))
    # Only the harness's own message: no traceback, nothing from MPICH's mpiexec (its "BAD
    # TERMINATION" report, its "Sending Ctrl-C to processes").
    assert f"interrupted: finished algorithms are kept in {run_json.parent}" in err
    for noise in ("Traceback", "BAD TERMINATION", "mpiexec@"):
        assert noise not in out + err, (out + err)[-3000:]


_BLOCKED_RANK = """
import ctypes
from harness.rank_exit import exit_promptly_when_interrupted
exit_promptly_when_interrupted(grace_s=1.0)
mutex = ctypes.create_string_buffer(64)  # all zero: PTHREAD_MUTEX_INITIALIZER
libc = ctypes.CDLL(None)
libc.pthread_mutex_lock(mutex)
print("blocking", flush=True)
libc.pthread_mutex_lock(mutex)  # locked again: waits for good, deaf to signals, like a wait for a peer gone
"""


def _until_asleep(pid: int, timeout: float = 30) -> None:
    """Return once the main thread of ``pid`` sleeps in the kernel (state S in /proc)."""
    deadline = time.monotonic() + timeout
    while (state := Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "S":
        assert time.monotonic() < deadline, f"process {pid} never went to sleep in {timeout} s (state {state})"
        time.sleep(0.001)  # polls for the state, with a deadline


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.subprocess
def test_a_rank_blocked_in_native_code_still_ends_with_a_status(sig):
    proc = subprocess.Popen([sys.executable, "-c", _BLOCKED_RANK], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "blocking\n"
        _until_asleep(proc.pid)  # in the second lock: nothing else puts it to sleep after that line
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        ended_in = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == 1, err  # an exit status: mpiexec reports no "BAD TERMINATION"
    assert 0.9 < ended_in < 10
    assert out == "" and err == ""


_SWALLOWING_IMPORT = """
import sys
print("in the import", flush=True)
try:
    sys.stdin.readline()  # the import goes on when the test says so
except BaseException:
    pass  # as some extension modules' imports do: an interrupt raised here would be lost
"""

_IMPORTING_RANK = """
import sys, time
from harness.rank_exit import exit_promptly_when_interrupted
exit_promptly_when_interrupted(grace_s=20.0)
print("importing", flush=True)
try:
    import swallowing
    print("imported", flush=True)
    time.sleep(30)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.subprocess
def test_an_interrupt_during_an_import_waits_for_its_end(tmp_path):
    (tmp_path / "swallowing.py").write_text(_SWALLOWING_IMPORT)
    proc = subprocess.Popen([sys.executable, "-c", _IMPORTING_RANK], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    try:
        assert proc.stdout.readline() == "importing\n"
        assert proc.stdout.readline() == "in the import\n"  # and it stays there until told to go on
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate("go on\n", timeout=60)
        ended_in = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == 130 and out == "imported\n", (proc.returncode, out, err)
    assert ended_in < 10 and err == ""


@pytest.mark.subprocess
def test_resume_refuses_what_it_cannot_resume(tmp_path):
    proc = harness_cli("run", "--resume", str(tmp_path))
    assert proc.returncode == 2 and "not a run directory" in proc.stderr
    proc = harness_cli("run", "--resume", str(tmp_path), "scenarios/straggler.yaml")
    assert proc.returncode == 2 and "--resume takes only the run directory" in proc.stderr
    proc = harness_cli("run")
    assert proc.returncode == 2 and "give a scenario FILE, or --resume RUN_DIR" in proc.stderr


# --- bench faults: the verdict at scale --------------------------------------------------------------


def test_bench_faults_matrix_rotates_the_faulted_rank_over_every_rank():
    from harness.bench.faults import cases

    matrix = cases(["wagma", "sgp"], ["kill", "hang"], ["iteration", "finish"], [3, 4], repeats=2)
    assert len(matrix) == 2 * 2 * 2 * 2 * 2
    for n in (3, 4):
        assert {c.rank for c in matrix if c.ranks == n} == set(range(n))
    finish = next(c for c in matrix if c.during == "finish").scenario()["faults"][0]
    assert "at_iteration" not in finish and finish["during"] == "finish"
    for c in matrix:  # every case's scenario is valid
        scenario_from_dict(c.scenario())
    from harness.bench.faults import Case, invalid

    assert "adpsgd needs an even number of ranks" in invalid(Case("adpsgd", "kill", "iteration", 3, 0, 0))


@pytest.mark.parametrize("args, message", [
    (["--only", "nosuch"], "--only: unknown algorithm 'nosuch'"),
    (["--during", "forward"], "--during: unknown point 'forward'"),
    (["--kinds", "explode"], "--kinds: unknown fault kind 'explode'"),
])
@pytest.mark.subprocess
def test_bench_faults_refuses_bad_arguments(args, message):
    proc = harness_cli("bench", "faults", *args, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


@pytest.mark.mpi
def test_bench_faults_names_the_faulted_rank_in_a_slice_of_its_matrix(tmp_path):
    # The CI-sized slice: a fault inside a wait-avoiding round, a push-sum push, an AD-PSGD pair
    # request and a DiLoCo outer step, killed and hung (odd rank counts: the other tests here).
    report = tmp_path / "faults.json"
    proc = harness_cli("bench", "faults", "--only", "wagma,sgp,adpsgd,diloco", "--during", "communication",
                       "--ranks", "4", "--jobs", "2", "--json", str(report), timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    outcomes = json.loads(report.read_text())
    n = 8
    assert len(outcomes) == n
    for o in outcomes:
        assert o["named"] and o["evidence"] == "announced" and o["left"] == 0 and o["problem"] == "", o
    assert f"{n}/{n} cases ok; faulted rank named first in {n}/{n}" in proc.stdout
