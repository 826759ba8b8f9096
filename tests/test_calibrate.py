"""``python -m harness calibrate``: pure helpers, argument errors, and real quick calibrations."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import harness_cli, write_scenario_file
from harness.calibrate.measure import (
    MAX_OP_BYTES,
    QUICK,
    Plan,
    Workload,
    allreduce_sizes,
    parse_ranks,
    per_rep_mean_median,
    plan_from_scenarios,
    timed_iterations,
    window_means,
)
from harness.scenario import scenario_from_dict
from harness.sim.calibration import P2PPoint, fit_alpha_beta, load_calibration

TINY = {
    "name": "tiny",
    "ranks": 2,
    "seed": 7,
    "workload": {"model": "logreg", "dataset": "digits", "batch_size": 8, "iterations": 4},
    "algorithms": ["allreduce_sgd"],
}


def _scenario(**changes) -> object:
    data = json.loads(json.dumps(TINY))
    for key, value in changes.items():
        if key in ("compute", "params", "model", "batch_size"):
            data["workload"][key] = value
        else:
            data[key] = value
    return scenario_from_dict(data)


# -- pure helpers ---------------------------------------------------------------------------------
def test_fit_alpha_beta_recovers_exact_model():
    alpha, beta = 12e-6, 1 / 5e9
    points = [P2PPoint(bytes=b, one_way_s=alpha + b * beta) for b in (8, 1024, 65536, 1 << 20, 4 << 20)]
    net = fit_alpha_beta(points)
    assert net.latency_s == pytest.approx(alpha, rel=1e-9)
    assert net.bandwidth_bytes_per_s == pytest.approx(1 / beta, rel=1e-9)
    assert net.message_s(1 << 20) == pytest.approx(alpha + (1 << 20) * beta, rel=1e-9)


@pytest.mark.parametrize(("text", "counts"), [("2", [2]), ("8,2", [2, 8]), (" 3 , 2,3", [2, 3])])
def test_parse_ranks(text, counts):
    assert parse_ranks(text) == counts


@pytest.mark.parametrize(("text", "message"), [("0", "must be >= 2"), ("1,2", "must be >= 2"), ("", "bad rank list"),
                                               ("2,,8", "bad rank list"), ("two", "expected a whole number")])
def test_parse_ranks_refuses(text, message):
    with pytest.raises(ValueError, match=message):
        parse_ranks(text)


def test_plan_from_scenarios_dedupes_workloads_and_skips_emulated():
    scenarios = [
        _scenario(),
        _scenario(name="same", ranks=4),  # same (model, dataset, batch): one workload
        _scenario(name="bigger_batch", batch_size=16),
        _scenario(name="emulated", compute={"emulate_ms": 5}, params=1000),
        _scenario(name="emulated_model", model="mlp", compute={"emulate_ms": 5}),
    ]
    plan = plan_from_scenarios(scenarios, quick=True)
    assert [w.key for w in plan.workloads] == [("logreg", "digits", 8), ("logreg", "digits", 16)]
    assert plan.workloads[0].seed == 7 and plan.workloads[0].optimizer["momentum"] == 0.9
    assert [(w.model, w.dataset, w.seed) for w in plan.op_models] == [("logreg", "digits", 7), ("mlp", "digits", 7)]
    assert plan.op_bytes == (4000,)
    assert Plan.from_json(json.loads(json.dumps(plan.with_ranks(3).to_json()))) == plan.with_ranks(3)


def test_statistics_helpers():
    assert allreduce_sizes([100, 4, MAX_OP_BYTES + 4]) == [4, 100, 64 * 1024, 1 << 20]
    # skew alternating around 10 cancels in the per-repetition mean
    assert per_rep_mean_median([[11, 9, 11, 9], [9, 11, 9, 11]]) == pytest.approx(10)
    # time slicing: a rank runs 4 fast iterations then waits 12 for the core; windows see 4 per iteration
    times = [[1, 1, 1, 13] * 10] * 2
    assert window_means(times, window_s=16) == [4.0] * 20
    assert window_means([[30.0, 50.0]], window_s=16) == [30.0, 50.0]  # long iterations: one each
    assert timed_iterations(0.0001, QUICK) == QUICK.compute_max_iters
    assert timed_iterations(100.0, QUICK) == QUICK.compute_min_iters


def test_workload_key():
    assert Workload("mlp", "mnist5k", 32).key == ("mlp", "mnist5k", 32)


# -- the command ----------------------------------------------------------------------------------
def test_parent_never_imports_mpi4py_or_torch(tmp_path):
    scenario = write_scenario_file(tmp_path, TINY)
    script = textwrap.dedent(f"""
        import json, subprocess, sys
        import harness.commands.calibrate as cal
        import harness.launch
        calls = []
        def fake_run_ranks(n, argv, **kw):
            calls.append([n, list(argv)])
            return subprocess.CompletedProcess(argv, 3)
        harness.launch.run_ranks = fake_run_ranks
        from harness.cli import main
        rc = main(["calibrate", "--scenario", {str(scenario)!r}, "--ranks", "3,2",
                   "--output", {str(tmp_path / 'c.json')!r}])
        print(json.dumps({{"rc": rc, "calls": calls, "mods": [m for m in ("mpi4py", "torch") if m in sys.modules]}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["rc"] == 1 and out["mods"] == []
    assert [n for n, _ in out["calls"]] == [2]  # stops at the first failed rank count
    assert out["calls"][0][1][1:3] == ["-m", "harness.calibrate.worker"]
    assert "the calibration job of 2 ranks exited with status 3" in proc.stderr
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--ranks", "0"], "argument --ranks: rank counts must be >= 2"),
     (["--ranks", "2,x"], "argument --ranks: bad rank count 'x'"),
     (["--scenario", "no/such/file.yaml"], "no/such/file.yaml: cannot read"),
     (["--ranks", "2", "--output", "."], "--output .: is a directory")],
)
def test_bad_arguments_exit_2(tmp_path, args, message):
    proc = harness_cli("calibrate", "--quick", "--output", str(tmp_path / "c.json"), *args, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not (tmp_path / "c.json").exists()


def test_invalid_scenario_and_existing_file_exit_2(tmp_path):
    bad = write_scenario_file(tmp_path, {**TINY, "name": "bad", "ranks": 0})
    proc = harness_cli("calibrate", "--scenario", str(bad), "--output", str(tmp_path / "c.json"), timeout=60)
    assert proc.returncode == 2 and "bad.yaml" in proc.stderr and "ranks" in proc.stderr

    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    good = write_scenario_file(tmp_path, TINY)
    proc = harness_cli("calibrate", "--scenario", str(good), "--output", str(broken), timeout=60)
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr
    assert broken.read_text() == "{not json"  # left alone


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """One quick calibration of 2 and 3 ranks on the tiny scenario: (file, scenario file, stdout)."""
    tmp = tmp_path_factory.mktemp("calibrate")
    scenario = write_scenario_file(tmp, TINY)
    out = tmp / "cal.json"
    proc = harness_cli("calibrate", "--quick", "--ranks", "2,3", "--scenario", str(scenario), "--output", str(out),
                       timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, scenario, proc.stdout


@pytest.mark.mpi
def test_quick_calibration(calibrated):
    out, _, stdout = calibrated
    cal = load_calibration(out)
    assert [e.ranks for e in cal.entries] == [2, 3]
    assert cal.cpus >= 1 and cal.harness_version
    for entry in cal.entries:
        assert entry.network.latency_s > 0 and entry.network.bandwidth_bytes_per_s > 0
        assert [p.bytes for p in entry.p2p] == [8, 1024, 65536, 1 << 20, 4 << 20]
        assert all(p.one_way_s > 0 for p in entry.p2p)
        ops = {(o.op, o.bytes): o.median_s for o in entry.ops}
        assert ("barrier", 0) in ops and ("allreduce", 4) in ops
        assert ("allreduce", 4 * (64 + 1) * 10) in ops  # logreg on 8x8 digits: the model's own size
        assert all(t > 0 for t in ops.values())
        (point,) = entry.compute
        assert (point.model, point.dataset, point.batch_size) == ("logreg", "digits", 8)
        assert 0 < point.median_s <= point.p95_s and point.samples >= entry.ranks
        assert entry.compute_s("logreg", "digits", 8) == point.median_s
        assert entry.evaluation_s("logreg", "digits") > 0
        assert entry.loop_overhead_s >= 0
    assert "alpha (us)" in stdout and "2 ranks" in stdout and "3 ranks" in stdout
    assert "compute logreg/digits/b8 median (ms)" in stdout


@pytest.mark.mpi
def test_recalibrating_one_rank_count_keeps_the_others(calibrated):
    out, scenario, _ = calibrated
    before = {e.ranks: e for e in load_calibration(out).entries}
    proc = harness_cli("calibrate", "--quick", "--scenario", str(scenario), "--output", str(out), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # default ranks: the scenario's, 2
    after = {e.ranks: e for e in load_calibration(out).entries}
    assert sorted(after) == [2, 3]
    assert after[3] == before[3]
    assert "3 ranks (kept)" in proc.stdout
