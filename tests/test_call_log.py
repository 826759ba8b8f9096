"""The call log (``harness.comm.call_log``): what it records, that it changes nothing, and the
comm_calls.csv it makes in simulated runs (real runs: ``tests/test_conformance.py``)."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from harness.comm.call_log import CALL_NAMES, CallLog
from harness.errors import HarnessError
from harness.results.columns import COMM_CALL_COLUMNS
from harness.results.records import COMM_CALLS_FILE, RunDirectory
from harness.scenario.loader import scenario_from_dict
from harness.sim.calibration import CalibrationEntry
from harness.sim.runs import DEFAULT_NETWORK, predict, write_simulated_run

README = Path(__file__).resolve().parent.parent / "results" / "README.md"


def logged(log: CallLog) -> list[tuple]:
    return [(c.iteration, c.seq, c.op, c.peers, c.floats, c.detail, c.result) for c in log.calls]


def test_calls_are_passed_on_and_logged_per_iteration():
    comm = mock.MagicMock(rank=2, size=4)
    comm.iallreduce.return_value.done.return_value = False
    comm.push_channel.return_value.drain.return_value = 3
    comm.push_channel.return_value.pending.return_value = 1
    log = CallLog(comm)
    x = np.zeros(10, dtype=np.float32)
    channel = log.push_channel(11)  # before the first iteration
    log.begin_iteration(0)
    handle = log.iallreduce(x, op="mean")
    assert handle.done() is False
    handle.wait()
    log.exchange(x, x, peer=3)
    log.begin_iteration(1)
    channel.send(x, [0, 3], round=1)
    assert channel.drain(x, min_messages=2, round=1) == 3
    assert channel.pending() == 1
    log.begin_iteration(None)  # finish()
    channel.close()
    log.barrier()
    assert logged(log) == [
        (-1, 0, "push_channel", "", 11, "", ""),
        (0, 0, "iallreduce", "", 10, "op=mean", ""),
        (0, 1, "done", "", 0, "of=0.0", "0"),
        (0, 2, "wait", "", 0, "of=0.0", ""),
        (0, 3, "exchange", "3", 10, "", ""),
        (1, 0, "push.send", "0;3", 10, "round=1", ""),
        (1, 1, "push.drain", "", 10, "min_messages=2 round=1", "3"),
        (1, 2, "push.pending", "", 0, "", "1"),
        (2, 0, "push.close", "", 0, "", ""),
        (2, 1, "barrier", "", 0, "", ""),
    ]
    comm.iallreduce.assert_called_once_with(x, "mean")
    comm.iallreduce.return_value.wait.assert_called_once_with(None)
    comm.push_channel.return_value.drain.assert_called_once_with(x, 2, None, 1)
    assert {c.op for c in log.calls} <= set(CALL_NAMES)


def test_wait_avoiding_and_pairwise_calls_log_what_the_caller_passes_and_gets():
    info = {"round": 4, "sync": False, "group_size": 2, "staleness": 1, "joined_early": True,
            "t_join": 0.5, "t_done": 0.6}
    comm = mock.MagicMock(rank=0, size=4)
    comm.wait_avoiding.return_value.round.return_value = info
    comm.wait_avoiding.return_value.iround.return_value.info.return_value = info
    comm.pairwise_averager.return_value.drain.return_value = 2
    log = CallLog(comm)
    x = np.zeros(6, dtype=np.float32)
    op = log.wait_avoiding(x, phases=[[0, 1], [0, 2]], sync_every=4)
    averager = log.pairwise_averager(x)
    log.begin_iteration(0)
    assert op.round(x, x, may_activate=False) is info
    op.iround(x, x).info()
    averager.irequest(x, x, 1).wait(timeout=0.5)
    averager.publish(x)
    assert averager.drain(x) == 2
    expected_info = "round=4 sync=0 group_size=2 staleness=1 joined_early=1"
    assert logged(log) == [
        (-1, 0, "wait_avoiding", "", 6, "sync_every=4 accumulate=0 phases=0;1|0;2", ""),
        (-1, 1, "pairwise_averager", "", 6, "", ""),
        (0, 0, "wa.round", "", 6, "may_activate=0", expected_info),
        (0, 1, "wa.iround", "", 6, "may_activate=1", ""),
        (0, 2, "info", "", 0, "of=0.1", expected_info),
        (0, 3, "pair.irequest", "1", 6, "", ""),
        (0, 4, "wait", "", 0, "of=0.3 timeout=0.5", ""),
        (0, 5, "pair.publish", "", 6, "", ""),
        (0, 6, "pair.drain", "", 6, "", "2"),
    ]


def test_what_the_runner_uses_is_passed_on_unlogged():
    comm = mock.MagicMock(rank=3, size=5)
    comm.drain_records.return_value = ["record"]
    log = CallLog(comm)
    assert (log.rank, log.size) == (3, 5)
    assert log.drain_records() == ["record"]
    log.close()
    comm.close.assert_called_once_with()
    assert log.calls == []


SCENARIO = {
    "name": "calls", "ranks": 3,
    "workload": {"model": "logreg", "dataset": "digits", "batch_size": 8, "iterations": 4,
                 "compute": {"emulate_ms": 10}, "params": 100},
    "algorithms": [{"name": "overlap_local_sgd", "period": 2}, "sgp"],
}


def test_simulated_runs_write_comm_calls_when_the_scenario_asks(tmp_path):
    entry = CalibrationEntry(ranks=3, network=DEFAULT_NETWORK)
    scenario = scenario_from_dict({**SCENARIO, "results": {"comm_calls": True}})
    frames, stats = predict(scenario, entry)
    calls = frames.comm_calls["overlap_local_sgd"]
    rank0 = calls[calls["rank"] == 0]
    # sync at iterations 1 and 3: post the anchor's allreduce, from the second on wait for the last first
    assert list(zip(rank0["iteration"], rank0["op"], rank0["detail"])) == [
        (1, "iallreduce", "op=mean"), (3, "wait", "of=1.0"), (3, "iallreduce", "op=mean"), (4, "wait", "of=3.1")]
    assert set(calls["rank"]) == {0, 1, 2} and set(calls["floats"]) <= {0, 100}
    run = write_simulated_run(tmp_path / "sim", scenario, frames, stats, "predictive", None, calibration_ranks=None)
    again = RunDirectory.open(run.path).comm_calls
    assert list(again.columns) == list(COMM_CALL_COLUMNS)
    assert again.equals(run.comm_calls) and len(again) == sum(len(f) for f in frames.comm_calls.values())

    plain = scenario_from_dict(SCENARIO)
    frames, stats = predict(plain, entry)
    assert frames.comm_calls == {}
    run = write_simulated_run(tmp_path / "plain", plain, frames, stats, "predictive", None, calibration_ranks=None)
    assert not (run.path / COMM_CALLS_FILE).exists()


def test_comm_calls_setting_is_a_boolean():
    assert scenario_from_dict(SCENARIO).results.comm_calls is False
    with pytest.raises(HarnessError, match="results.comm_calls"):
        scenario_from_dict({**SCENARIO, "results": {"comm_calls": "yes"}})


def test_readme_documents_every_column_and_op():
    section = README.read_text(encoding="utf-8").split("## comm_calls.csv", 1)[1].split("\n## ", 1)[0]
    for name in (*COMM_CALL_COLUMNS, *CALL_NAMES):
        assert f"| `{name}` |" in section, name
