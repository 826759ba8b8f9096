"""A torch.distributed script's own loss and accuracy: ``harness.dist.record`` (harness/dist/metrics.py).

Pure Python: the API without a session (a no-op that still refuses bad values), which step and
which evaluation a call lands in, how the ranks' evaluations combine, the summary's time to a
target loss and its columns, the report's plot of a training loss alone. One sweep of two
launches (``launch --scenario FILE --sweep ranks=2,3 SCRIPT``) checks the whole path: each
point's steps.csv loss and accuracy and evals.csv, and sweep.csv's time to the target loss.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from conftest import harness_cli
from harness.dist import metrics
from harness.results.columns import EvalRecord, StepRecord
from harness.results.summary import format_table, summarize, time_to_target_loss


# -- the API without a session ------------------------------------------------------------------
def test_record_without_a_session_is_a_cheap_no_op():
    import harness.dist

    assert metrics._recorder is None  # no launch: nothing is stored anywhere
    loss = torch.tensor(0.5, requires_grad=True) * 2
    for kwargs in ({"loss": 1.25}, {"loss": loss}, {"accuracy": 0.5, "evaluation": True}, {"loss": np.float32(2.0)},
                   {"loss": np.array(3.0), "accuracy": torch.tensor([0.25])}, {}, {"loss": float("nan")}):
        assert harness.dist.record(**kwargs) is None
    for _ in range(2000):  # nothing accumulates without a session (the cost, about 1 us a call, is measured by hand)
        assert harness.dist.record(loss=loss, accuracy=0.5) is None
    assert metrics._recorder is None


@pytest.mark.parametrize("kwargs, error, match", [
    ({"loss": "0.3"}, TypeError, r"loss must be a number or a one-element tensor, got str '0.3'"),
    ({"loss": True}, TypeError, r"loss must be a number or a one-element tensor, got a bool"),
    ({"accuracy": [0.5]}, TypeError, r"accuracy must be a number"),
    ({"loss": torch.ones(3)}, ValueError, r"loss must be a scalar: got a tensor of shape \(3,\)"),
    ({"accuracy": torch.ones(2, 2), "evaluation": True}, ValueError, r"accuracy must be a scalar"),
    ({"loss": torch.tensor(1 + 2j)}, TypeError, r"loss must be real: got a tensor of dtype torch.complex64"),
    ({"loss": np.ones(2)}, ValueError, r"loss must be a scalar: got an array of shape \(2,\)"),
    ({"accuracy": 93.5, "evaluation": True}, ValueError, r"accuracy must be a fraction in \[0, 1\], got 93.5 "
                                                         r"\(a percentage\? divide it by 100\)"),
])
def test_bad_values_are_refused_naming_the_argument(kwargs, error, match):
    import harness.dist

    with pytest.raises(error, match=match):
        harness.dist.record(**kwargs)


# -- which step, which evaluation ----------------------------------------------------------------
@pytest.fixture
def recorder():
    """A recorder on a stand-in session (the three attributes it reads), as a launch makes one."""
    session = SimpleNamespace(_began=False, t=0, _start=10.0)
    recorder = metrics.Recorder(session)
    yield recorder
    recorder.close()


def test_calls_land_in_the_step_they_belong_to(recorder):
    import harness.dist

    session = recorder.session
    harness.dist.record(loss=9.0)  # before the first step: step 0
    session._began = True  # step 0's first training forward pass ran
    harness.dist.record(loss=torch.tensor(2.0))  # during step 0: the last call in a step wins
    session._began, session.t, session._start = False, 1, 11.0  # step 0's optimizer step returned
    harness.dist.record(accuracy=torch.tensor([0.75]))  # after the step: step 0's; its loss stays
    harness.dist.record(loss=0.5, accuracy=0.25, evaluation=True)  # an evaluation after 1 step ...
    harness.dist.record(accuracy=1.0, evaluation=True)  # ... the same one, its accuracy replaced
    session._began = True
    harness.dist.record(loss=1.5)  # step 1, during it
    session._began, session.t, session._start = False, 2, 12.0
    assert _nan_equal(recorder.steps(), {0: (2.0, 0.75), 1: (1.5, math.nan)})
    # The evaluated model existed when step 0 ended (11.0 on this rank's clock; t0 = 1.0).
    assert recorder.evaluations(rank=3, t0=1.0) == [(3, 1, 10.0, 0.5, 1.0)]
    recorder.close()
    harness.dist.record(loss=7.0)  # the script has ended: a no-op again
    assert 2 not in recorder.train


def test_device_tensors_are_read_together(recorder, capsys, monkeypatch):
    """Tensors on a device are kept as they are and read READ_EVERY at a time (one transfer);
    CPU tensors stand in for them here. A deferred accuracy outside [0, 1] is dropped, warned."""
    monkeypatch.setattr(metrics, "READ_EVERY", 5)
    session = recorder.session
    for t in range(4):
        session.t = t + 1  # after each step
        recorder.add(torch.tensor(float(t), dtype=torch.float64), torch.tensor(0.5 if t else 2.0), False)
        if t == 0:
            assert isinstance(recorder.train[0][0], torch.Tensor)  # not read yet
    assert recorder.train[0] == [0.0, 2.0] and isinstance(recorder.train[3][0], torch.Tensor)  # 6 read, 2 wait
    recorder.add(torch.tensor(9.0), None, False)  # step 3's loss again: the last one counts
    read = recorder.steps()
    assert read[3] == (9.0, 0.5) and read[1] == (1.0, 0.5) and math.isnan(read[0][1])
    assert "warning: harness.dist.record: accuracy must be a fraction in [0, 1], got 2 (a percentage" in capsys.readouterr().err


def _nan_equal(got: dict, expected: dict) -> bool:
    return got.keys() == expected.keys() and all(
        all((math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(got[k], expected[k])) for k in got)


def test_the_ranks_evaluations_combine_into_average_and_rank0():
    rows = [(1, 5, 2.5, 0.4, math.nan), (0, 5, 2.0, 0.6, 0.5), (2, 5, 2.2, 0.2, math.nan),  # rank 0 and others
            (2, 9, 4.0, 0.1, 0.9), (1, 9, 3.9, math.nan, 0.7)]  # rank 0 did not evaluate after 9 steps
    records = metrics.evaluation_records("train", rows)
    assert [(r.iteration, r.model, r.time_s) for r in records] == [(5, "average", 2.0), (5, "rank0", 2.0),
                                                                   (9, "average", 3.9)]
    average5, rank0, average9 = records
    assert average5.test_loss == pytest.approx(0.4) and average5.test_accuracy == 0.5  # the ranks that recorded
    assert (rank0.test_loss, rank0.test_accuracy) == (0.6, 0.5)
    assert average9.test_loss == 0.1 and average9.test_accuracy == pytest.approx(0.8)
    assert math.isnan(average5.consensus_distance)


# -- the summary and the report ------------------------------------------------------------------
def _script_run(losses: tuple[float, ...] = (1.2, 0.8, 0.4)) -> tuple[pd.DataFrame, pd.DataFrame]:
    """2 ranks, 6 steps of 1 s each (rank 1 ends each step 0.1 s later); an evaluation before the
    first step and after steps 2, 4 and 6, as a script records them."""
    steps = pd.DataFrame([StepRecord("train", r, t, float(t), t + 1.0 + 0.1 * r, 0.5, 0.0, 0.4, 2.0 - 0.1 * t, 64,
                                     -1, 0.1 * t).as_row() for r in (0, 1) for t in range(6)])
    evals = [EvalRecord("train", 0, -0.5, "average", 2.3, 0.1)]
    evals += [EvalRecord("train", k, float(k), model, loss, 0.5) for k, loss in zip((2, 4, 6), losses)
              for model in ("average", "rank0")]
    return steps, pd.DataFrame([e.as_row() for e in evals])


def test_time_to_a_target_loss():
    steps, evals = _script_run()
    row = summarize(steps, evals, 32, 6, ranks=2, target_accuracy=0.9, target_loss=0.8).iloc[0]
    # First at or below 0.8: the evaluation after 4 steps, its model whole when rank 1 ended step 3 (4.1 s).
    assert row["time_to_target_loss_s"] == pytest.approx(4.1) and row["target_loss"] == 0.8
    assert math.isnan(row["time_to_target_s"])  # 50% accuracy: never 90%
    assert row["final_test_loss"] == pytest.approx(0.4)
    assert row["final_train_loss"] == pytest.approx(1.5)  # both ranks' loss of the last step
    average = evals[evals["model"] == "average"]
    # The evaluation before the first step counts as 0 s, and takes nothing from the later ones.
    assert time_to_target_loss(steps, average, 2.5) == 0.0
    assert math.isnan(time_to_target_loss(steps, average, 0.1)) and math.isnan(time_to_target_loss(steps, average,
                                                                                                    None))
    unset = summarize(steps, evals, 32, 6, ranks=2, target_accuracy=0.9).iloc[0]
    assert math.isnan(unset["target_loss"]) and math.isnan(unset["time_to_target_loss_s"])
    with pytest.raises(ValueError, match="target_loss must be a finite number"):
        summarize(steps, evals, 32, 6, target_loss=math.inf)


def test_the_table_shows_loss_columns_for_a_loss_target_or_a_run_without_accuracy():
    steps, evals = _script_run()
    table = format_table(summarize(steps, evals, 32, 6, ranks=2, target_accuracy=0.9, target_loss=0.8))
    header = table.splitlines()[0]
    assert "train loss" in header and "test loss" in header and "to loss 0.8 s" in header
    assert table.splitlines()[2].split()[-3:] == ["4.100", "-", "yes"]  # to loss 0.8 s, consensus, complete
    assert "to loss 0.8 s: training time from the first step until an evaluation" in " ".join(table.split())
    only_loss = format_table(summarize(steps, None, 32, 6, ranks=2, target_accuracy=0.9))
    assert "train loss" in only_loss.splitlines()[0] and "to loss" not in only_loss
    # A run with accuracy and no loss target: the table as it always was.
    steps["loss"] = math.nan
    assert "loss" not in format_table(summarize(steps, evals, 32, 6, ranks=2, target_accuracy=0.9)).splitlines()[0]


def test_a_report_without_evaluations_draws_the_training_loss(tmp_path):
    from harness.report import write_report
    from harness.results.records import RunDirectory

    steps, _ = _script_run()
    run = RunDirectory.create(tmp_path, "script")
    run.write_resolved_scenario({"name": "script", "ranks": 2, "workload": {"batch_size": 32, "iterations": 6},
                                 "algorithms": []})
    run.append_algorithm("train", steps, [], [])
    run.write_summary(32, 6, ranks=2, target_accuracy=0.9)
    run.write_run_json("complete", ["train"], ranks=2, extra={"torch_distributed": True})
    written = write_report(run.path)
    assert not written.failed
    text = (run.path / "report.html").read_text(encoding="utf-8")
    assert "Training loss against time" in text and "harness.dist.record(..., evaluation=True)" in text
    assert (run.path / "report_accuracy.png").is_file()


# -- launched: a sweep over ranks of a script ----------------------------------------------------
SCRIPT = """
import argparse
import torch
import torch.distributed as dist
import harness.dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
args = p.parse_args()
dist.init_process_group("harness")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    optimizer.zero_grad()
    loss = model(torch.ones(8, 4)).pow(2).mean()
    loss.backward()
    harness.dist.record(loss=100.0 + 10 * rank + step)  # inside the step: the step's
    optimizer.step()
    harness.dist.record(accuracy=torch.tensor(0.01 * step))  # after it: still the step's
    if (step + 1) % 2 == 0:  # after 2, 4, 6 steps: a held-out loss of 0.9, 0.6, 0.3 (+ 0.1 on rank 1, ...)
        harness.dist.record(loss=1.2 - 0.15 * (step + 1) + 0.1 * rank, evaluation=True)
        if rank == 0:
            harness.dist.record(accuracy=0.5, evaluation=True)
dist.destroy_process_group()
"""


@pytest.mark.mpi
def test_a_sweep_over_ranks_of_a_script_shows_the_time_to_its_target_loss(tmp_path):
    from harness.cli import main

    (tmp_path / "script.py").write_text(SCRIPT)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({
        "name": "metrics", "ranks": 2, "workload": {"batch_size": 8, "iterations": 6},
        "results": {"target_loss": 0.75}}))
    proc = harness_cli("launch", "--scenario", "s.yaml", "--out", "out", "--sweep", "ranks=2,3", "script.py",
                       "--steps", "6", cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep,) = (tmp_path / "out" / "metrics").iterdir()
    assert json.loads((sweep / "sweep.json").read_text())["command"] == "launch"
    for name in ("sweep.csv", "sweep.png", "report.html"):
        assert (sweep / name).is_file(), name

    # Point 1 (3 ranks): each step's loss and accuracy as its rank recorded them ...
    point = sweep / "points" / "p001"
    steps = pd.read_csv(point / "steps.csv")
    assert sorted(steps.groupby("rank").size().items()) == [(r, 6) for r in range(3)]
    assert (steps["loss"] == 100.0 + 10 * steps["rank"] + steps["iteration"]).all()
    assert np.allclose(steps["accuracy"], 0.01 * steps["iteration"])
    # ... and the evaluations: the mean over the ranks (0.9, 1.0, 1.1 after 2 steps) and rank 0's own.
    evals = pd.read_csv(point / "evals.csv")
    average = evals[evals["model"] == "average"].set_index("iteration")
    assert list(average.index) == [2, 4, 6] and np.allclose(average["test_loss"], [1.0, 0.7, 0.4])
    assert (average["test_accuracy"] == 0.5).all()  # rank 0's alone: the others recorded none
    rank0 = evals[evals["model"] == "rank0"].set_index("iteration")
    assert np.allclose(rank0["test_loss"], [0.9, 0.6, 0.3])
    # The summary: first at or below 0.75 after 4 steps, when the last rank had ended step 3.
    summary = pd.read_csv(point / "summary.csv").iloc[0]
    finished = steps[steps["iteration"] == 3]["end_s"].max() - steps["start_s"].min()
    assert summary["time_to_target_loss_s"] == pytest.approx(finished) and summary["target_loss"] == 0.75
    assert summary["final_train_loss"] == pytest.approx(115.0)  # (105 + 115 + 125) / 3
    assert "to loss 0.75 s" in (point / "summary.txt").read_text()
    report = (point / "report.html").read_text(encoding="utf-8")
    assert "to loss 0.75 s" in report and "could not be drawn" not in report

    # sweep.csv: a row per point, its rank count, its time to the target loss.
    table = pd.read_csv(sweep / "sweep.csv")
    assert list(table["ranks"]) == [2, 3] and list(table["algorithm"]) == ["script", "script"]
    assert (table["time_to_target_loss_s"] > 0).all()
    assert table["time_to_target_loss_s"].iloc[1] == pytest.approx(summary["time_to_target_loss_s"])
    page = (sweep / "report.html").read_text(encoding="utf-8")
    assert "launches of a script" in page and "to target loss s" in page

    # --resume of a finished sweep launches nothing and redraws its table.
    (sweep / "sweep.csv").unlink()
    assert main(["launch", "--resume", str(sweep)]) == 0
    assert (sweep / "sweep.csv").is_file()


def test_launch_sweep_refusals(tmp_path, capsys):
    from harness.cli import main

    (tmp_path / "script.py").write_text("print('never runs')\n")
    assert main(["launch", "-n", "2", "--sweep", "ranks=2,3", str(tmp_path / "script.py")]) == 2
    assert "--sweep varies a scenario: give --scenario FILE" in capsys.readouterr().err
    assert main(["launch", "--resume", str(tmp_path), str(tmp_path / "script.py")]) == 2
    assert "--resume SWEEP_DIR takes no SCRIPT" in capsys.readouterr().err
    assert main(["launch", "--resume", str(tmp_path)]) == 2
    assert "not a sweep directory" in capsys.readouterr().err
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "m", "ranks": 2, "workload": {"batch_size": 8,
                                                                                          "iterations": 2}}))
    assert main(["launch", "--scenario", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out"), "--sweep",
                 "ranks=2,0", str(tmp_path / "script.py")]) == 2
    assert "sweep point 1 (ranks=0)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written when a point is invalid
