"""An unchanged torch.distributed script under ``python -m harness launch --scenario`` (harness.dist.session).

One launch (examples/torch_ddp at 3 ranks, DDP + PowerSGD under a straggler and a slow link)
checks the whole path: torchrun's variables and the ``harness`` backend for the script, one
iteration per optimizer step, the straggler in steps.csv, each collective's group in
comm_ops.csv, the results files and the report. The rest is pure Python.
"""

from __future__ import annotations

import json
import sys

import pandas as pd
import torch
import pytest
import yaml

from conftest import REPO, harness_cli, save_test_calibration

EXAMPLE = REPO / "examples" / "torch_ddp"
STEPS = 8


@pytest.mark.mpi
def test_torch_ddp_example_under_its_scenario(tmp_path):
    proc = harness_cli("launch", "--scenario", str(EXAMPLE / "scenario.yaml"), "--out", str(tmp_path / "out"),
                       str(EXAMPLE / "train.py"), "--steps", str(STEPS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bypasses" not in proc.stderr  # the script asked for "harness"
    (run,) = (tmp_path / "out" / "torch_ddp").iterdir()
    for name in ("steps.csv", "comm_ops.csv", "trace.json", "run.json", "summary.csv", "report.html",
                 "scenario.resolved.yaml"):
        assert (run / name).is_file(), name
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["finished_algorithms"] == ["train"]
    assert meta["torch_distributed"] and meta["optimizer_steps"] == [STEPS] * 3

    steps = pd.read_csv(run / "steps.csv")
    assert sorted(steps.groupby("rank").size().items()) == [(r, STEPS) for r in range(3)]
    assert set(steps["algorithm"]) == {"train"}
    # Rank 2 sleeps 30 ms before each step's compute (the scenario's `fixed` straggler), inside its step.
    delay = steps.set_index("rank")["injected_delay_s"]
    assert (delay.loc[2] == 0.03).all() and (delay.loc[[0, 1]] == 0).all()
    straggler = steps[steps["rank"] == 2]
    assert ((straggler["end_s"] - straggler["start_s"]) >= 0.03).all()
    # ... and the others wait for it in the collectives: side by side, more blocked than rank 2.
    later = steps[steps["iteration"] > 0]
    assert later[later["rank"] != 2]["comm_blocked_s"].median() > later[later["rank"] == 2]["comm_blocked_s"].median()
    # Iterations follow one another on each rank: one optimizer step each.
    for _, own in steps.groupby("rank"):
        assert (own["start_s"].to_numpy()[1:] == own["end_s"].to_numpy()[:-1]).all()
    assert (steps["bytes_sent"] > 0).all()

    ops = pd.read_csv(run / "comm_ops.csv", keep_default_na=False)
    assert set(ops["group"]) == {"default_pg [0 1 2]"}
    assert {"allreduce", "broadcast"} <= set(ops["op"])
    # Every byte counted in steps.csv is an operation in comm_ops.csv (posted inside the steps).
    assert steps["bytes_sent"].sum() <= ops["bytes"].sum()
    summary = pd.read_csv(run / "summary.csv")
    assert list(summary["algorithm"]) == ["train"]
    scenario = yaml.safe_load((run / "scenario.resolved.yaml").read_text())
    assert scenario["algorithms"] == []

    # collectives.csv: every step's operations, what the simulator replays. DDP's bucket
    # allreduces (and PowerSGD's, chained from them) are posted during the backward pass.
    seq = pd.read_csv(run / "collectives.csv")
    assert set(seq["rank"]) == {0, 1, 2} and set(seq["iteration"]) == set(range(STEPS))
    assert set(seq[seq["op"] == "allreduce"]["phase"]) == {"overlap"}
    assert set(seq["group_ranks"]) == {"0 1 2"} and (seq["payload_bytes"] >= 0).all()
    assert ((seq["at"] >= 0) & (seq["at"] < 1)).all()
    per_rank = seq.groupby("rank")[["op", "payload_bytes"]].apply(lambda f: list(map(tuple, f.to_numpy())))
    assert per_rank[0] == per_rank[1] == per_rank[2]  # the same collectives on every rank

    # compare replays the sequence on the recorded local work (trace) and on the script's
    # compute model (predictive, from the CPU time the run noted) ...
    structure = json.loads((run / "script_structure.json").read_text())["ranks"]
    assert len(structure) == 3 and all(r["cpu_s"] > 0 and r["groups"] == [[0, 1, 2]] for r in structure)
    calibration = save_test_calibration(tmp_path / "calibration.json", 3, [])
    proc = harness_cli("compare", str(run), "--mode", "both", "--calibration", str(calibration))
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_csv(run / "compare.csv")
    assert list(table["mode"]) == ["trace", "predictive"] and set(table["algorithm"]) == {"train"}
    assert (table["predicted_samples_per_s"] > 0).all()
    # ... and simulate replays it at another (odd) rank count: DDP's buckets do not depend on it.
    proc = harness_cli("simulate", str(run / "scenario.resolved.yaml"), "workload.batch_size=64", "--ranks", "7",
                       "--out", str(tmp_path / "sim"), "--calibration", str(calibration))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sim,) = (tmp_path / "sim" / "torch_ddp").iterdir()
    assert yaml.safe_load((sim / "scenario.resolved.yaml").read_text())["workload"]["batch_size"] == 64  # kept
    simulated = pd.read_csv(sim / "steps.csv")
    assert sorted(simulated.groupby("rank").size().items()) == [(r, STEPS) for r in range(7)]
    # The straggler (rank 2 of the scenario, 30 ms per step) holds every rank back there too.
    assert (simulated.groupby("rank")["end_s"].max() >= 0.03 * STEPS).all()


def test_label_needs_a_script_scenario(tmp_path, capsys):
    from harness.cli import main

    (tmp_path / "train.py").write_text("print('never runs')\n")
    assert main(["launch", "-n", "2", "--label", "x", str(tmp_path / "train.py")]) == 2
    assert "--label" in capsys.readouterr().err


def test_scenario_without_algorithms_only_for_a_script_workload():
    from harness.scenario import ScenarioError, scenario_from_dict

    script = scenario_from_dict({"name": "s", "ranks": 2, "workload": {"batch_size": 4, "iterations": 3}})
    assert script.algorithms == []
    with pytest.raises(ScenarioError, match="algorithms: at least one is required"):
        scenario_from_dict({"name": "s", "ranks": 2, "workload": {"model": "mlp", "dataset": "synthetic",
                                                                  "batch_size": 4, "iterations": 3}})


def test_other_backends_are_warned_about():
    from harness.dist.session import other_backend_warning

    assert other_backend_warning("harness") is None and other_backend_warning("cpu:harness") is None
    for backend in ("gloo", "nccl", "cpu:gloo,cuda:nccl", None):
        warning = other_backend_warning(backend)
        assert warning is not None and "bypasses the scenario's emulated network" in warning


def test_blocked_time_estimate():
    from harness.dist.session import blocked_s

    # Overlapped with the backward pass (posted in [forward, pre)): from the main thread's last post
    # to the last end (a callback's collective posted later does not shorten it), capped at pre.
    ops = [(1.0, 1.5, True), (2.0, 2.4, True), (2.1, 2.6, False)]
    assert blocked_s(ops, forward_s=0.5, pre_s=3.0, end_s=4.0) == pytest.approx(0.6)
    assert blocked_s(ops, forward_s=0.5, pre_s=2.5, end_s=4.0) == pytest.approx(0.5)
    # Waited where posted (between steps, or in the optimizer step): the union of the intervals.
    waited = [(0.1, 0.3, True), (0.2, 0.4, True), (3.1, 3.2, True)]
    assert blocked_s(waited, forward_s=0.5, pre_s=3.0, end_s=4.0) == pytest.approx(0.4)
    assert blocked_s([], forward_s=0.5, pre_s=3.0, end_s=4.0) == 0.0


WRONG = """
import torch
import torch.distributed as dist

dist.init_process_group("harness")
t = torch.ones(4)
if dist.get_rank() == 0:
    dist.all_reduce(t)
else:
    dist.broadcast(t, src=0)
dist.barrier()
"""


@pytest.mark.mpi
def test_ranks_calling_different_collectives_are_named(tmp_path):
    """Rank 1's broadcast takes rank 0's allreduce message and completes; rank 0 waits for ever.
    The mismatch watch names both ranks, the place and what differed, and the job ends."""
    (tmp_path / "wrong.py").write_text(WRONG)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "mismatch", "ranks": 2,
                                                     "workload": {"batch_size": 1, "iterations": 1}}))
    proc = harness_cli("launch", "--scenario", "s.yaml", "--out", "out", "wrong.py", cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert ("ranks 0 and 1 called different collectives at collective #0 of group default_pg [0 1]: rank 0 called "
            "all_reduce on 4 float32 elements, rank 1 called broadcast on 4 float32 elements (the operation "
            "differs)") in proc.stderr, proc.stderr[-3000:]


SILENTLY_WRONG = """
import sys
import time
import torch
import torch.distributed as dist
import harness.dist  # noqa: F401  registers the backend; env:// from MPI

dist.init_process_group("harness")
rank = dist.get_rank()
if sys.argv[1] == "dtype":  # the same bytes, so the allreduce completes: garbage, not a hang
    dist.all_reduce(torch.ones(4) if rank == 0 else torch.ones(4, dtype=torch.int32))
elif rank == 0:  # the same bytes again: a send and a receive that disagree on the dtype
    dist.send(torch.ones(4), dst=1, tag=int(sys.argv[1] == "p2p_size"))
elif rank == 1:
    dist.recv(torch.empty(8 if sys.argv[1] == "p2p_size" else 4, dtype=torch.float32 if sys.argv[1] == "p2p_size"
                          else torch.int32), src=0, tag=int(sys.argv[1] == "p2p_size"))
for _ in range(100):  # carry on as a training loop would, until the audit ends the job
    dist.barrier()
    time.sleep(0.05)
print("not caught", flush=True)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("case, ranks, message", [
    ("dtype", 3, r"ranks 0 and ([12]) called different collectives at collective #0 of group default_pg \[0 1 2\]: "
                 r"rank 0 called all_reduce on 4 float32 elements, rank \1 called all_reduce on 4 int32 elements "
                 r"\(the dtype differs\)"),
    ("p2p", 2, r"rank 0's send #0 to rank 1 \(tag 0\) carries 4 float32 elements, and rank 1's receive of it expects "
               r"4 int32 elements \(the dtype differs\)"),
    # what the native layer refuses ends the job too, instead of leaving the peers in the barrier
    ("p2p_size", 2, r"size mismatch: expected 8 floats from member 0 \(rank 0\), got 4"),
])
def test_operations_that_disagree_are_named_under_bare_mpiexec(tmp_path, case, ranks, message):
    """No launch, no watchdog: the backend's own audit compares each rank's operations with its
    peers' a tick after they were posted, names the ranks, the place and what differed, and
    ends the job (mpiexec ends the others); an uncaught exception aborts the job."""
    import re

    from harness.launch import run_ranks

    (tmp_path / "wrong.py").write_text(SILENTLY_WRONG)
    proc = run_ranks(ranks, [sys.executable, str(tmp_path / "wrong.py"), case], timeout=120, capture=True)
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert re.search(message, proc.stderr), proc.stderr[-3000:]
    assert "not caught" not in proc.stdout


def test_fingerprints_differ_in_what_must_agree():
    from harness.dist.fingerprints import difference, fingerprint

    t = torch.ones(4)
    a = fingerprint("all_reduce", "g", [0, 1], (3,), [t])
    assert a["place"] == "3" and a["dtype"] == "float32" and a["count"] == 4
    assert difference(a, fingerprint("all_reduce", "g", [0, 1], (3,), [t.clone()])) is None
    assert difference(a, fingerprint("broadcast", "g", [0, 1], (3,), [t])) == "the operation"
    assert difference(a, fingerprint("all_reduce", "g", [0, 1], (3,), [t.double()])) == "the dtype"
    assert difference(a, fingerprint("all_reduce", "g", [0, 1], (3,), [torch.ones(5)])) == "the element count"
    # uneven splits are legal: all_to_all_single's counts may differ between ranks
    b = fingerprint("all_to_all_single", "g", [0, 1], (3,), [torch.ones(2)])
    assert difference(b, fingerprint("all_to_all_single", "g", [0, 1], (3,), [torch.ones(6)])) is None
