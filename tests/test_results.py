"""Tests for harness.results: atomic writes, run directory, summary numbers and the trace."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from harness.results import atomic
from conftest import run_scenario
from harness.results.columns import (
    COMM_OP_COLUMNS,
    COMM_OP_NAMES,
    EVAL_COLUMNS,
    STEP_COLUMNS,
    SUMMARY_COLUMNS,
    CommOpRecord,
    EvalRecord,
    StepRecord,
    read_frame,
)
from harness.results.records import RunDirectory
from harness.results.summary import format_table, summarize
from harness.results.trace import COMM_TID_BASE, chrome_trace

# --- atomic writes --------------------------------------------------------------------------


def _listing(path):
    return sorted(p.name for p in path.iterdir())


def test_atomic_writers_leave_only_the_file(tmp_path):
    atomic.write_text(tmp_path / "a.txt", "hello\n")
    atomic.write_bytes(tmp_path / "b.bin", b"\x00\x01")
    atomic.write_csv(tmp_path / "c.csv", pd.DataFrame({"x": [1, 2], "y": [0.5, math.nan]}))
    atomic.write_json(tmp_path / "d.json", {"k": [1, 2]})
    atomic.save_torch(tmp_path / "e.pt", {"w": torch.arange(3)})
    assert _listing(tmp_path) == ["a.txt", "b.bin", "c.csv", "d.json", "e.pt"]
    assert (tmp_path / "a.txt").read_text() == "hello\n"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "c.csv").read_text() == "x,y\n1,0.5\n2,NaN\n"
    assert json.loads((tmp_path / "d.json").read_text()) == {"k": [1, 2]}
    assert torch.equal(torch.load(tmp_path / "e.pt")["w"], torch.arange(3))
    atomic.write_text(tmp_path / "a.txt", "replaced")
    assert (tmp_path / "a.txt").read_text() == "replaced"


class _ExplodingFrame(pd.DataFrame):
    """A DataFrame whose to_csv writes part of the file, then fails."""

    def to_csv(self, handle, **kwargs):
        handle.write("x,y\n1,")
        raise RuntimeError("disk on fire")


def test_failed_csv_write_keeps_old_file_and_no_temp(tmp_path):
    target = tmp_path / "steps.csv"
    atomic.write_csv(target, pd.DataFrame({"x": [1]}))
    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic.write_csv(target, _ExplodingFrame({"x": [2]}))
    assert target.read_text() == "x\n1\n"
    assert _listing(tmp_path) == ["steps.csv"]


def test_failed_first_write_leaves_nothing(tmp_path, monkeypatch):
    def boom(obj, handle):
        handle.write(b"partial")
        raise OSError("no space left")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError, match="no space"):
        atomic.save_torch(tmp_path / "model.pt", {"w": 1})
    with pytest.raises(TypeError):
        atomic.write_text(tmp_path / "t.txt", 42)  # not a str: fails inside the writer
    assert _listing(tmp_path) == []


def test_write_json_rejects_nan(tmp_path):
    with pytest.raises(ValueError):
        atomic.write_json(tmp_path / "x.json", {"v": math.nan})
    assert _listing(tmp_path) == []


# --- a small hand-built run -----------------------------------------------------------------

BATCH = 10


def _hand_steps():
    """Two ranks x two iterations of "sgp" and one rank x one iteration of "ar"."""
    return [
        # algorithm, rank, iteration, start, end, compute, injected, blocked, loss, bytes, stale
        StepRecord("sgp", 0, 0, 1.0, 2.0, 0.5, 0.25, 0.125, 2.0, 100, 0),
        StepRecord("sgp", 1, 0, 1.0, 3.0, 1.0, 0.0, 0.5, 2.5, 100, 1),
        StepRecord("sgp", 0, 1, 2.0, 3.0, 0.5, 0.0, 0.25, 1.5, 200, 0),
        StepRecord("sgp", 1, 1, 3.0, 5.0, 1.0, 0.5, 0.5, 1.0, 200, 2),
        StepRecord("ar", 0, 0, 10.0, 10.5, 0.25, 0.0, 0.125),
    ]


def _hand_evals():
    return [
        EvalRecord("sgp", 0, 2.0, "average", 2.0, 0.25, 0.5),
        EvalRecord("sgp", 1, 5.0, "average", 1.0, 0.75, 0.125),
        EvalRecord("sgp", 1, 5.0, "rank0", 1.5, 0.5, 0.125),
    ]


def _hand_ops():
    return [
        CommOpRecord("sgp", 0, "send", 1.5, 1.75, 2.0, 64),
        CommOpRecord("sgp", 1, "recv", 2.0, 2.5, 3.0, 0),
    ]


def test_summary_numbers_by_hand():
    steps = pd.DataFrame([r.as_row() for r in _hand_steps()])
    evals = pd.DataFrame([r.as_row() for r in _hand_evals()])
    summary = summarize(steps, evals, BATCH, {"sgp": 2, "ar": 2}, ranks={"sgp": 2, "ar": 1})
    assert list(summary.columns) == list(SUMMARY_COLUMNS)
    assert list(summary["algorithm"]) == ["sgp", "ar"]
    sgp, ar = (row for _, row in summary.iterrows())
    # sgp durations 1, 2, 1, 2 (sum 6); span 1.0 .. 5.0.
    assert sgp["ranks"] == 2 and sgp["iterations"] == 2 and sgp["steps_recorded"] == 4
    assert sgp["wall_s"] == 4.0
    assert sgp["samples_per_s"] == 2 * BATCH * 2 / 4.0
    assert sgp["iter_time_median_s"] == 1.5
    assert sgp["iter_time_p95_s"] == 2.0
    assert sgp["compute_fraction"] == 3.0 / 6.0
    assert sgp["wait_fraction"] == 1.375 / 6.0
    assert sgp["injected_fraction"] == 0.75 / 6.0
    assert sgp["bytes_sent_per_step"] == 150.0
    assert sgp["final_accuracy"] == 0.75 and sgp["final_test_loss"] == 1.0
    assert sgp["final_consensus_distance"] == 0.125
    assert bool(sgp["complete"]) is True
    # ar: 1 of 2 iterations recorded, no evals.
    assert ar["wall_s"] == 0.5 and ar["samples_per_s"] == BATCH / 0.5
    assert ar["iter_time_median_s"] == 0.5 and ar["iter_time_p95_s"] == 0.5
    assert ar["wait_fraction"] == 0.25 and ar["injected_fraction"] == 0.0
    assert math.isnan(ar["final_accuracy"]) and math.isnan(ar["final_consensus_distance"])
    assert bool(ar["complete"]) is False


def test_summary_p95_interpolates_and_missing_rank_is_incomplete():
    steps = pd.DataFrame(
        [StepRecord("x", 0, i, 0.0, float(i + 1), 0.0, 0.0, 0.0).as_row() for i in range(21)]
    )
    row = summarize(steps, None, 1, 21).iloc[0]
    assert row["iter_time_median_s"] == 11.0
    assert row["iter_time_p95_s"] == 20.0  # rank 0.95 * 20 = 19 -> the 20th value
    assert bool(row["complete"]) is True
    assert bool(summarize(steps, None, 1, 21, ranks=2).iloc[0]["complete"]) is False


def test_format_table_is_readable():
    steps = pd.DataFrame([r.as_row() for r in _hand_steps()])
    evals = pd.DataFrame([r.as_row() for r in _hand_evals()])
    text = format_table(summarize(steps, evals, BATCH, 2, ranks=2, target_accuracy=0.5))
    table, notes = text.split("\n\n")
    assert max(len(line) for line in notes.splitlines()) <= 100
    notes = " ".join(notes.split())  # the footnotes are wrapped
    lines = table.splitlines()
    for header in ("samples/s", "vs sgp", "waiting %", "acc avg %", "acc r0 %", "to 50% s", "consensus"):
        assert header in lines[0]
    # sgp: 10 samples/s, itself the baseline, median 1.5 s, p95 2 s.
    assert lines[2].split()[:6] == ["sgp", "2", "10.0", "1.00", "1500.00", "2000.00"]
    assert lines[2].split()[6] == f"{100 * 1.375 / 6:.1f}"
    # Averaged 75 %, rank 0 50 %, 50 % first reached by the eval at 5.0 s, 4 s after the start.
    assert lines[2].split()[-5:] == ["75.00", "50.00", "4.000", "0.125", "yes"]
    assert lines[3].split()[3] == "2.00"  # ar: 20 samples/s, twice sgp's
    assert lines[3].split()[-5:-1] == ["-", "-", "-", "-"]  # no accuracy, time or consensus for ar
    # Fixed width: every column starts at the same offset on every line.
    assert len({line.rindex(" ") for line in lines}) == 1
    assert len({line.index(" 2 ") for line in lines[2:]}) == 1
    # The footnotes define the relative, accuracy, time and consensus columns.
    assert notes.startswith("vs sgp: samples/s over that algorithm's (1.00 = as fast")
    assert "acc r0 %: of rank 0's own model" in notes
    assert "to 50% s: training time" in notes and "reached 50% test accuracy, evaluation time excluded" in notes
    assert "consensus: mean over ranks of ||x_i - x_mean||^2" in notes and "squared L2" in notes


# A run with evaluations after iterations 2 and 4 (the end) of 2 ranks; rank 0, which tests the
# models, spends 0.5 s in the first evaluation (2.0 .. 2.5); rank 1 resumes at 2.1.
TIMED_STEPS = [
    StepRecord("sgp", rank, it, start, end, 0.0, 0.0, 0.0)
    for rank, starts in ((0, (0.0, 1.0, 2.5, 3.5)), (1, (0.2, 1.0, 2.1, 3.5)))
    for it, (start, end) in enumerate(zip(starts, (1.0, 2.0, 3.5, 4.5)))
]
TIMED_EVALS = [
    EvalRecord("sgp", 2, 2.0, "average", 1.0, 0.6, 5.0),
    EvalRecord("sgp", 2, 2.0, "rank0", 1.0, 0.55, 5.0),
    EvalRecord("sgp", 4, 4.5, "average", 0.5, 0.95, 1e-13),
    EvalRecord("sgp", 4, 4.5, "rank0", 0.6, 0.9, 1e-13),
]


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (0.5, 2.0),  # the first evaluation: nothing before it to subtract
        (0.6, 2.0),  # reaching the target exactly counts
        (0.9, 4.0),  # 4.5 s minus rank 0's 0.5 s in the first evaluation (rank 1's 0.1 s is not it)
        (0.99, math.nan),  # never reached
        (None, math.nan),  # no target asked for
    ],
)
def test_time_to_target_excludes_evaluation(target, expected):
    row = summarize(pd.DataFrame([s.as_row() for s in TIMED_STEPS]), pd.DataFrame([e.as_row() for e in TIMED_EVALS]),
                    BATCH, 4, ranks=2, target_accuracy=target).iloc[0]
    assert row["time_to_target_s"] == pytest.approx(expected, nan_ok=True)
    assert row["target_accuracy"] == pytest.approx(math.nan if target is None else target, nan_ok=True)
    assert (row["final_accuracy"], row["final_accuracy_rank0"]) == (0.95, 0.9)
    assert bool(row["complete"]) is True


def test_time_to_target_never_reached_shows_a_dash():
    summary = summarize(pd.DataFrame([s.as_row() for s in TIMED_STEPS]), pd.DataFrame([e.as_row() for e in TIMED_EVALS]),
                        BATCH, 4, ranks=2, target_accuracy=0.975)
    table = format_table(summary).splitlines()
    assert "to 97.5% s" in table[0]
    assert table[2].split()[-3:] == ["-", "1e-13", "yes"]


def test_time_to_target_without_evaluations_or_target():
    steps = pd.DataFrame([s.as_row() for s in TIMED_STEPS])
    row = summarize(steps, None, BATCH, 4, ranks=2, target_accuracy=0.5).iloc[0]  # a simulated run
    assert math.isnan(row["time_to_target_s"]) and math.isnan(row["final_accuracy_rank0"])
    assert "to target s" in format_table(summarize(steps, None, BATCH, 4)).splitlines()[0]
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="target_accuracy"):
            summarize(steps, None, BATCH, 4, target_accuracy=bad)


def _rate_steps(algorithm: str, seconds: float) -> list[StepRecord]:
    """One rank, one iteration of ``seconds``: BATCH / seconds samples/s."""
    return [StepRecord(algorithm, 0, 0, 0.0, seconds, 0.0, 0.0, 0.0)]


@pytest.mark.parametrize(
    ("algorithms", "baseline", "ratios"),
    [
        # allreduce_sgd is the baseline wherever it ran, first or not.
        ((("sgp", 1.0), ("allreduce_sgd", 4.0), ("wagma", 2.0)), "allreduce_sgd", [4.0, 1.0, 2.0]),
        # Without it, the first algorithm is.
        ((("sgp", 1.0), ("wagma", 2.0)), "sgp", [1.0, 0.5]),
    ],
)
def test_throughput_relative_to_baseline(algorithms, baseline, ratios):
    steps = pd.DataFrame([s.as_row() for name, seconds in algorithms for s in _rate_steps(name, seconds)])
    summary = summarize(steps, None, BATCH, 1)
    assert list(summary["baseline"]) == [baseline] * len(algorithms)
    assert list(summary["throughput_vs_baseline"]) == pytest.approx(ratios)
    assert f"vs {baseline}" in format_table(summary).splitlines()[0]


# --- trace ----------------------------------------------------------------------------------


def test_trace_tracks_and_spans_match_records():
    steps = pd.DataFrame([r.as_row() for r in _hand_steps()])
    ops = pd.DataFrame([r.as_row() for r in _hand_ops()])
    trace = json.loads(json.dumps(chrome_trace(steps, ops), allow_nan=False))
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert names == {(1, "sgp"), (2, "ar")}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    assert threads == {
        (1, 0): "rank 0",
        (1, 1): "rank 1",
        (1, COMM_TID_BASE): "rank 0 comm",
        (1, COMM_TID_BASE + 1): "rank 1 comm",
        (2, 0): "rank 0",
    }
    spans = [e for e in events if e["ph"] == "X"]
    assert {(e["pid"], e["tid"]) for e in spans if e["cat"] == "step"} == {(1, 0), (1, 1), (2, 0)}

    def span(pid, tid, name, iteration):
        (match,) = [
            e
            for e in spans
            if (e["pid"], e["tid"], e["name"]) == (pid, tid, name)
            and e["args"]["iteration"] == iteration
        ]
        return match["ts"], match["dur"]

    # sgp rank 1 iteration 1: start 3.0, injected 0.5, compute 1.0, blocked 0.5, end 5.0.
    assert span(1, 1, "iteration", 1) == (3.0e6, 2.0e6)
    assert span(1, 1, "injected_delay", 1) == (3.0e6, 0.5e6)
    assert span(1, 1, "compute", 1) == (3.5e6, 1.0e6)
    assert span(1, 1, "comm_blocked", 1) == (4.5e6, 0.5e6)
    # No injected delay at sgp rank 1 iteration 0: no zero-length span, compute starts at 1.0.
    injected = [
        (e["pid"], e["tid"], e["args"]["iteration"]) for e in spans if e["name"] == "injected_delay"
    ]
    assert (1, 1, 0) not in injected
    assert span(1, 1, "compute", 0) == (1.0e6, 1.0e6)
    iteration_spans = [e for e in spans if e["name"] == "iteration"]
    assert len(iteration_spans) == len(steps)
    # Every part nests inside its iteration.
    for e in spans:
        if e["cat"] == "step" and e["name"] != "iteration":
            ts, dur = span(e["pid"], e["tid"], "iteration", e["args"]["iteration"])
            assert ts <= e["ts"] and e["ts"] + e["dur"] <= ts + dur
    (send,) = [e for e in spans if e["cat"] == "comm" and e["name"] == "send"]
    assert (send["tid"], send["ts"], send["dur"]) == (COMM_TID_BASE, 1.75e6, 0.25e6)
    assert send["args"]["bytes"] == 64 and send["args"]["queued_us"] == 0.25e6
    # NaN loss (emulated compute) becomes JSON null.
    (ar_iter,) = [e for e in iteration_spans if e["pid"] == 2]
    assert ar_iter["args"]["loss"] is None


def test_trace_clips_inconsistent_parts():
    row = StepRecord("a", 0, 0, 0.0, 1.0, compute_s=0.75, injected_delay_s=0.5, comm_blocked_s=0.5)
    spans = [e for e in chrome_trace(pd.DataFrame([row.as_row()]))["traceEvents"] if e["ph"] == "X"]
    by_name = {e["name"]: (e["ts"], e["dur"]) for e in spans}
    assert by_name == {
        "iteration": (0.0, 1e6),
        "injected_delay": (0.0, 0.5e6),
        "compute": (0.5e6, 0.5e6),
    }


# --- the run directory ----------------------------------------------------------------------


def test_run_directory_end_to_end(tmp_path):
    run = RunDirectory.create(tmp_path, "straggler-demo")
    assert run.path.parent == tmp_path / "straggler-demo"
    assert len(run.run_id) == len("YYYYmmdd-HHMMSS") and run.run_id[8] == "-"
    scenario = {"name": "straggler-demo", "ranks": 2, "shape": (1, 8, 8), "lr": np.float64(0.1)}
    run.write_resolved_scenario(scenario)
    run.write_run_json("incomplete", [])
    steps, evals, ops = _hand_steps(), _hand_evals(), _hand_ops()
    run.append_algorithm("sgp", [s for s in steps if s.algorithm == "sgp"], evals, ops)
    run.append_algorithm("ar", [s for s in steps if s.algorithm == "ar"])
    # Re-appending replaces that algorithm's rows instead of duplicating them.
    run.append_algorithm("ar", [s for s in steps if s.algorithm == "ar"])
    summary = run.write_summary(BATCH, {"sgp": 2, "ar": 1}, ranks={"sgp": 2, "ar": 1}, target_accuracy=0.5)
    run.write_trace()
    run.write_run_json("complete", ["sgp", "ar"], hosts=1)
    torch_path = atomic.save_torch(run.provenance_dir() / "model.pt", {"x": 1})
    assert torch_path.parent.name == "provenance"

    assert _listing(run.path) == [
        "comm_ops.csv",
        "evals.csv",
        "provenance",
        "run.json",
        "scenario.resolved.yaml",
        "steps.csv",
        "summary.csv",
        "summary.txt",
        "trace.json",
    ]
    on_disk = read_frame(run.path / "steps.csv", STEP_COLUMNS)
    assert list(on_disk.columns) == list(STEP_COLUMNS)
    pd.testing.assert_frame_equal(on_disk, run.steps)
    assert len(on_disk) == 5 and on_disk["loss"].isna().sum() == 1
    assert list(read_frame(run.path / "evals.csv", EVAL_COLUMNS).columns) == list(EVAL_COLUMNS)
    assert len(read_frame(run.path / "comm_ops.csv", COMM_OP_COLUMNS)) == 2
    on_disk_summary = pd.read_csv(run.path / "summary.csv", keep_default_na=False, na_values=["NaN"])
    assert list(on_disk_summary.columns) == list(SUMMARY_COLUMNS)
    pd.testing.assert_frame_equal(on_disk_summary, summary, check_dtype=False)
    assert (run.path / "summary.txt").read_text() == format_table(summary) + "\n"
    assert bool(summary["complete"].all())

    meta = json.loads((run.path / "run.json").read_text())
    assert meta["status"] == "complete"
    assert meta["finished_algorithms"] == ["sgp", "ar"]
    assert meta["ranks"] == 2 and meta["hosts"] == 1
    assert meta["scenario"] == "straggler-demo" and meta["run_id"] == run.run_id
    assert meta["harness_version"]
    assert "T" in meta["started_at"]
    assert "shape:\n- 1\n- 8\n- 8\n" in (run.path / "scenario.resolved.yaml").read_text()
    trace = json.loads((run.path / "trace.json").read_text())
    assert trace["otherData"]["run_id"] == run.run_id

    reopened = RunDirectory.open(run.path)
    assert reopened.algorithms == ["sgp", "ar"] and reopened.run_id == run.run_id
    pd.testing.assert_frame_equal(reopened.evals, run.evals)


def test_run_json_status_is_validated(tmp_path):
    run = RunDirectory.create(tmp_path, "s", run_id="r1")
    with pytest.raises(ValueError):
        run.write_run_json("done", [])
    run.write_run_json("failed", [], ranks=4, extra={"error": "boom"})
    meta = json.loads((run.path / "run.json").read_text())
    assert (meta["status"], meta["ranks"], meta["error"]) == ("failed", 4, "boom")


def test_run_ids_do_not_collide(tmp_path):
    ids = {RunDirectory.create(tmp_path, "s").run_id for _ in range(3)}
    assert len(ids) == 3
    RunDirectory.create(tmp_path, "s", run_id="fixed")
    with pytest.raises(FileExistsError):
        RunDirectory.create(tmp_path, "s", run_id="fixed")
    with pytest.raises(ValueError):
        RunDirectory.create(tmp_path, "../escape")


def test_append_rejects_foreign_records(tmp_path):
    run = RunDirectory.create(tmp_path, "s")
    with pytest.raises(ValueError):
        run.append_algorithm("sgp", _hand_steps())
    with pytest.raises(ValueError):
        EvalRecord("sgp", 0, 0.0, "median", 1.0, 0.5)


# --- comm_ops.csv op names: the native layer, the records module and the docs agree -----------

REPO = Path(__file__).resolve().parent.parent
UNTRACED = "bool traced() const override { return false; }"


def _native_op_names() -> set[str]:
    """The names the C++ layer gives the operations it records, read from kernels/: the ops
    built by name (``submit("allreduce", ...)``, ``make_unique<StepProgramOp>("push", ...)``) and
    the records added by hand (``add_record({"wa_sync_round", ...})``). Ops that subclass
    ``Op`` directly (listeners, the persistent wait-avoiding op) must not be traced."""
    names: set[str] = set()
    for path in sorted((REPO / "kernels").glob("*.[ch]pp")):
        text = path.read_text()
        names |= set(re.findall(r'\bsubmit\(\s*"(\w+)"', text))
        for first in re.findall(r"make_unique<StepProgramOp>\(\s*([^,\s]+)\s*,", text):
            # `name`: the generic submit(name, ...) helper, whose literal names are found above.
            assert first == "name" or re.fullmatch(r'"\w+"', first), f"{path.name}: StepProgramOp named by {first}"
            names.add(first.strip('"'))
        for record in re.findall(r"add_record\(\{(.*?)\}", text, re.S):
            names |= set(re.findall(r'"(\w+)"', record))
        direct = re.findall(r':\s*Op\(\s*"(\w+)"', text)
        if direct:
            header = path.with_suffix(".hpp").read_text()
            assert header.count(UNTRACED) == len(direct), (
                f"{path.name}: Op subclasses {direct} are traced: their names would reach comm_ops.csv")
    names.discard("name")
    assert names, "found no op names in kernels/: has the C++ source moved?"
    return names


def _documented_op_names() -> list[str]:
    """The op names listed in results/README.md's comm_ops.csv section, in order."""
    text = (REPO / "results" / "README.md").read_text()
    section = text.split("\n## comm_ops.csv\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("\n| op | meaning |\n", 1)[1].split("\n\n", 1)[0]
    return [re.match(r"\| `(\w+)` \|", line).group(1) for line in table.splitlines()[1:]]


def test_comm_op_names_are_what_the_native_layer_records_and_the_docs_list():
    assert len(set(COMM_OP_NAMES)) == len(COMM_OP_NAMES)
    assert _native_op_names() == set(COMM_OP_NAMES)
    assert _documented_op_names() == list(COMM_OP_NAMES)


# --- a real run: every op it writes is documented, and its summary reads -----------------------

OPS_SCENARIO = {
    "name": "ops_and_summary",
    "ranks": 4,
    "seed": 7,
    "workload": {"model": "logreg", "dataset": "digits", "batch_size": 16, "iterations": 8, "eval_every": 4},
    "optimizer": {"lr": 0.05},
    "algorithms": ["sgp", "allreduce_sgd", "dpsgd", "adpsgd", {"name": "wagma", "group_size": 2, "period": 5}],
    "results": {"target_accuracy": 0.3},
}
# What each algorithm's training issues (wagma, period 5 over 8 iterations: round 4 is synchronous).
EXPECTED_OPS = {
    "sgp": {"push"},
    "allreduce_sgd": {"allreduce"},
    "dpsgd": {"exchange"},
    "adpsgd": {"pair_request"},
    "wagma": {"wa_group_round", "wa_sync_round"},
}


@pytest.fixture(scope="module")
def ops_run(tmp_path_factory) -> Path:
    return run_scenario(tmp_path_factory.mktemp("ops"), OPS_SCENARIO)


@pytest.mark.mpi
def test_real_run_writes_only_documented_op_names(ops_run):
    ops = read_frame(ops_run / "comm_ops.csv", COMM_OP_COLUMNS)
    assert set(ops["op"]) <= set(COMM_OP_NAMES)
    assert {name: set(part["op"]) for name, part in ops.groupby("algorithm")} == EXPECTED_OPS


@pytest.mark.mpi
def test_real_run_summary_names_baseline_target_and_both_accuracies(ops_run):
    summary = pd.read_csv(ops_run / "summary.csv", keep_default_na=False, na_values=["NaN"])
    steps = read_frame(ops_run / "steps.csv", STEP_COLUMNS)
    evals = read_frame(ops_run / "evals.csv", EVAL_COLUMNS)
    assert list(summary["algorithm"]) == list(EXPECTED_OPS)
    assert set(summary["baseline"]) == {"allreduce_sgd"}  # not the first algorithm, still the baseline
    ar = summary[summary["algorithm"] == "allreduce_sgd"].iloc[0]
    assert ar["throughput_vs_baseline"] == 1.0
    assert np.allclose(summary["throughput_vs_baseline"], summary["samples_per_s"] / ar["samples_per_s"])
    assert (summary["target_accuracy"] == 0.3).all()
    for row in summary.itertuples():
        mine = evals[evals["algorithm"] == row.algorithm]
        average, rank0 = (mine[mine["model"] == m].sort_values("iteration") for m in ("average", "rank0"))
        assert row.final_accuracy == average["test_accuracy"].iloc[-1]
        assert row.final_accuracy_rank0 == rank0["test_accuracy"].iloc[-1]
        reached = average[average["test_accuracy"] >= 0.3]
        if reached.empty:
            assert math.isnan(row.time_to_target_s)
            continue
        # At most the plain wall time until that evaluation's model existed (every rank done with
        # the iteration before it): evaluation time is taken out, not added.
        mine_steps = steps[steps["algorithm"] == row.algorithm]
        first = reached.iloc[0]
        ready = max(first["time_s"], mine_steps.loc[mine_steps["iteration"] == first["iteration"] - 1, "end_s"].max())
        assert 0 < row.time_to_target_s <= ready - mine_steps["start_s"].min()
    assert not math.isnan(ar["time_to_target_s"])  # 30 % on digits is within reach of 8 steps
    table = (ops_run / "summary.txt").read_text()
    assert table.splitlines()[0].split()[:5] == ["algorithm", "ranks", "samples/s", "vs", "allreduce_sgd"]
    assert "to 30% s" in table and "acc r0 %" in table and "\nconsensus: mean over ranks of ||x_i - x_mean||^2" in table


@pytest.mark.subprocess
def test_recording_ranks_do_not_load_pandas():
    """Every rank fills records and reads run.json; only rank 0 makes frames. The record types,
    the file names and the loop import no pandas (0.35 s of CPU per rank otherwise), and
    ``harness.results`` still offers every name."""
    import subprocess
    import sys

    script = ("import sys; import harness.results.columns, harness.results.layout, harness.runner.loop, "
              "harness.runner.report, harness.results.provenance; print('pandas' in sys.modules); "
              "import harness.results as r; [getattr(r, n) for n in r.__all__]; print('pandas' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]


def test_an_empty_cell_of_a_float_column_reads_as_missing(tmp_path):
    """pandas' to_csv writes NaN as an empty cell: a steps.csv edited so still reads."""
    import math

    from harness.results.columns import STEP_COLUMNS, read_frame

    row = ["a", 0, 0, 0.0, 1.0, 0.5, 0.0, 0.5, 2.3, 100, -1, ""]
    (tmp_path / "steps.csv").write_text(",".join(STEP_COLUMNS) + "\n" + ",".join(map(str, row)) + "\n")
    frame = read_frame(tmp_path / "steps.csv", STEP_COLUMNS)
    assert math.isnan(frame["accuracy"].iloc[0]) and frame["loss"].iloc[0] == 2.3
