"""Heartbeats under concurrency: the watchdog receives only states a rank was really in, and never
stops healthy ranks however their beats and the sender thread's copies interleave."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from harness.scenario import scenario_from_dict
from harness.watchdog.heartbeat_net import HeartbeatServer
from harness.watchdog.heartbeat_row import FIELDS, Field, Phase, TableReader
from harness.watchdog.supervision import read_states
from harness.watchdog.verdict import JobJudge, RankState

# A rank's whole life, replayed on one row as fast as Python goes: report in, two algorithms of
# three iterations (with hook phase switches and an injected delay), evaluation, results, done.
# Its sender thread copies the row every 0.5 ms (not every 0.2 s), and the interpreter switches
# threads every 10 us (not 5 ms), so copies land in the middle of beats all the time.
# It stops when the file ``stop`` appears (at most after a minute).
_WRITER = """
import os, sys, time
from harness.watchdog import heartbeat_net
from harness.watchdog.heartbeat import Heartbeat
from harness.watchdog.heartbeat_row import Phase
heartbeat_net.SEND_INTERVAL_S = 0.0005
sys.setswitchinterval(1e-5)
url, rank, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
beat = Heartbeat(url, rank)
print("ready", flush=True)
lives = 0
end = time.monotonic() + 60
while not os.path.exists(stop) and time.monotonic() < end:
    beat.reset()
    beat.report_in()
    for a in range(2):
        beat.algorithm(a)
        for t in range(3):
            beat.iteration(t)
            beat.phase(Phase.COMMUNICATING)
            beat.phase(Phase.LOCAL)
            beat.expect(0.0)
            beat.iteration_done(1e-6)
        beat.stage(Phase.EVALUATING)
        beat.stage(Phase.RESULTS)
    beat.stage(Phase.DONE)
    lives += 1
beat.close()
print(lives, flush=True)
"""


def _impossible(st: RankState, pid: int, launched_at: float) -> str | None:
    """What is wrong with ``st`` as a state of the writer above (pid ``pid``), or None."""
    if not st.started:
        fresh = (st.phase, st.algorithm, st.iteration, st.progress_at, st.slowest_iteration_s, st.iterations_done)
        return None if fresh == (Phase.NOT_STARTED, 0, 0, 0.0, 0.0, 0) else "a row without pid is not a fresh row"
    if st.pid != pid:
        return f"pid {st.pid}, not the writer's {pid}"
    if st.phase == Phase.NOT_STARTED:
        return "reported in but not started"
    if not st.progress_at >= launched_at:
        return f"progress time {st.progress_at} is before the launch ({launched_at})"
    if st.phase in (Phase.SETUP, Phase.RESULTS, Phase.DONE) and st.iteration != -1:
        return f"iteration {st.iteration} outside training"
    if st.phase in (Phase.LOCAL, Phase.COMMUNICATING, Phase.EVALUATING) and not (0 <= st.algorithm < 2
                                                                              and 0 <= st.iteration < 3):
        return f"training without an algorithm or iteration (algorithm {st.algorithm}, iteration {st.iteration})"
    return None


@pytest.mark.subprocess
def test_watchdog_receives_no_torn_row_under_concurrent_writers(tmp_path):
    writers, min_reads, min_s, max_s = 3, 2000, 2.0, 30.0
    stop = tmp_path / "stop"
    scenario = scenario_from_dict({
        "name": "hammer", "ranks": writers, "algorithms": ["allreduce_sgd", "dpsgd"],
        "workload": {"model": "logreg", "dataset": "synthetic", "batch_size": 8, "iterations": 3,
                     "compute": {"emulate_ms": 1}},
        # Rows go back to "not started" on every life, so the start-up timeout outlasts the test;
        # a row read with its pid but a progress time of 0 would still be "stuck" at once.
        "watchdog": {"startup_timeout_s": 60, "stall_timeout_s": 10},
    })
    launched_at = time.monotonic()
    dog = JobJudge(scenario, launched_at)
    reads, wrong, changes = 0, [], 0
    with HeartbeatServer(writers, "127.0.0.1") as server:
        procs = [subprocess.Popen([sys.executable, "-c", _WRITER, server.url, str(r), str(stop)],
                                  stdout=subprocess.PIPE, text=True) for r in range(writers)]
        try:
            assert [p.stdout.readline().strip() for p in procs] == ["ready"] * writers
            started = time.monotonic()
            previous = None
            while all(p.poll() is None for p in procs) and not wrong:
                states = read_states(server)
                now = time.monotonic()
                if now - started > max_s or (reads >= min_reads and now - started > min_s):
                    break
                reads += 1
                changes += states != previous
                previous = states
                verdict = dog.check(states, now, ended={})
                if verdict is not None:
                    wrong.append(f"false verdict: {verdict.message}")
                for st, proc in zip(states, procs):
                    problem = _impossible(st, proc.pid, launched_at)
                    if problem is not None:
                        wrong.append(f"rank {st.rank}: {problem}: {st}")
                time.sleep(0.0005)  # the receiver's thread needs the interpreter too
        finally:
            stop.touch()
            outputs = [p.communicate(timeout=30)[0] for p in procs]  # after "ready": the lives lived
    assert not wrong, f"after {reads} reads: {wrong[:3]}"
    assert all(p.returncode == 0 for p in procs), outputs
    lives = [int(out) for out in outputs]
    # Enough copies taken mid-beat that a torn one shows: with a plain copy instead of the
    # seqlock's, rows with a pid but no progress time arrive within the first second.
    assert reads >= min_reads and changes > 500 and min(lives) > 100, (reads, changes, lives)


def _beat_by_hand(table: np.ndarray, row: int, **cells: float) -> None:
    """One sequenced write of ``cells`` into ``table[row]``, as ``Heartbeat`` makes it."""
    table[row, Field.SEQUENCE] += 1
    for name, value in cells.items():
        table[row, Field[name.upper()]] = value
    table[row, Field.SEQUENCE] += 1


def test_reader_keeps_the_last_whole_copy_of_a_row_being_written():
    table = np.zeros((2, FIELDS))
    reader = TableReader(table)
    _beat_by_hand(table, 1, pid=1234, phase=float(Phase.SETUP), progress_at=50.0)
    whole = reader.read()
    assert whole[1, Field.PID] == 1234 and whole[1, Field.SEQUENCE] % 2 == 0
    # The rank stops in the middle of its next beat (descheduled, or killed there).
    table[1, Field.SEQUENCE] += 1
    table[1, Field.PID] = 0
    table[1, Field.PROGRESS_AT] = 0
    t0 = time.monotonic()
    again = reader.read()
    assert time.monotonic() - t0 < 1.0  # a few short retries, then the last whole copy
    np.testing.assert_array_equal(again, whole)
    table[1, Field.SEQUENCE] += 1  # the beat completes
    assert reader.read()[1, Field.PID] == 0


def test_fresh_reader_takes_a_row_being_written_for_not_started():
    table = np.zeros((1, FIELDS))
    table[0, Field.SEQUENCE] = 1
    table[0, Field.PID] = 1234  # report-in half written
    assert TableReader(table).read()[0, Field.PID] == 0
