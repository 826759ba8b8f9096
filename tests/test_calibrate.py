"""``python -m harness calibrate``: pure helpers, argument errors, and real quick calibrations."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import harness_cli, write_scenario_file
from harness.calibrate.measure import (
    MAX_OP_BYTES,
    QUICK,
    P2PPairs,
    Plan,
    TimedWorkload,
    allreduce_sizes,
    format_table,
    p2p_pairs,
    parse_ranks,
    per_rep_mean_median,
    plan_from_scenarios,
    timed_iterations,
    window_means,
)
from harness.scenario import scenario_from_dict
from harness.sim.calibration import CalibrationError, P2PPoint, fit_alpha_beta, load_calibration

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
    assert TimedWorkload("mlp", "mnist5k", 32).key == ("mlp", "mnist5k", 32)


# -- the command ----------------------------------------------------------------------------------
@pytest.mark.subprocess
def test_parent_never_imports_mpi4py_or_torch(tmp_path):
    scenario = write_scenario_file(tmp_path, TINY)
    script = textwrap.dedent(f"""
        import json, subprocess, sys
        import harness.commands.calibrate as cal
        calls = []
        def fake_run_ranks(n, argv, **kw):
            calls.append([n, list(argv)])
            return subprocess.CompletedProcess(argv, 3)
        cal.run_ranks = fake_run_ranks
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
@pytest.mark.subprocess
def test_bad_arguments_exit_2(tmp_path, args, message):
    proc = harness_cli("calibrate", "--quick", "--output", str(tmp_path / "c.json"), *args, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not (tmp_path / "c.json").exists()


@pytest.mark.subprocess
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


# -- ranks on several hosts -------------------------------------------------------------------------
@pytest.mark.parametrize(("rank_hosts", "pairs"), [
    (["a", "a", "a"], P2PPairs((0, 1), None)),  # one host: ranks 0 and 1, as always
    (["a", "b", "a", "b", "b"], P2PPairs((0, 2), (0, 1))),  # both from rank 0
    (["b", "b", "b", "a", "a"], P2PPairs((0, 1), (0, 3))),
    (["a", "b", "c", "b", "c"], P2PPairs((1, 3), (0, 1))),  # rank 0 alone: the lowest pair sharing a host
    (["a", "b", "c"], P2PPairs(None, (0, 1))),  # no two ranks on one host
])
def test_point_to_point_pairs_follow_the_hosts(rank_hosts, pairs):
    assert p2p_pairs(rank_hosts) == pairs
    if pairs.same_host is not None:
        a, b = pairs.same_host
        assert rank_hosts[a] == rank_hosts[b] and a != b
    if pairs.cross_host is not None:
        a, b = pairs.cross_host
        assert rank_hosts[a] != rank_hosts[b]


# What `calibrate` wrote before it recorded hosts: no rank_hosts, hosts, pairs or inter-host link.
OLDER_FILE = {
    "format": 1, "created_at": "2026-01-01T00:00:00+00:00", "harness_version": "0.9", "cpus": 2,
    "entries": [{
        "ranks": 4,
        "network": {"latency_s": 1.6e-4, "bandwidth_bytes_per_s": 9.3e7, "progress_s": 1.6e-4, "shared_cores": 2},
        "network_source": "reference trainings", "network_fit_error": 0.05,
        "p2p_network": {"latency_s": 1e-5, "bandwidth_bytes_per_s": 5e9, "progress_s": 0.0, "shared_cores": None},
        "p2p": [{"bytes": 8, "one_way_s": 1e-5}, {"bytes": 1048576, "one_way_s": 2.2e-4}],
        "ops": [{"op": "barrier", "bytes": 0, "median_s": 3e-5}],
        "compute": [], "evaluation": [], "loop_overhead_s": 1e-4,
    }],
}


def test_an_older_calibration_file_still_loads_and_reads_as_one_host(tmp_path):
    from harness.scenario import scenario_from_dict as scenario_of
    from harness.sim.hosts import simulated_topology

    path = tmp_path / "old.json"
    path.write_text(json.dumps(OLDER_FILE))
    (entry,) = load_calibration(path).entries
    assert (entry.rank_hosts, entry.hosts, entry.ranks_per_host) == ([], [], [])
    assert entry.p2p_pair == (0, 1) and entry.inter_host_network is None and entry.inter_host_p2p == []
    assert entry.network.latency_s == 1.6e-4  # what simulate uses is untouched
    assert "hosts (ranks)" not in format_table(load_calibration(path))
    # A multi-host run simulated with it: the hosts are named, and why they cannot be used.
    scenario = scenario_of({**TINY, "ranks": 4})
    (note,) = simulated_topology(scenario, entry, ["a", "a", "b", "b"]).notes
    assert "the calibration of 4 ranks was measured on one host: it has no inter-host link" in note


def test_hosts_of_an_entry_must_agree_with_its_ranks(tmp_path):
    path = tmp_path / "c.json"
    data = json.loads(json.dumps(OLDER_FILE))
    data["entries"][0].update(rank_hosts=["a", "a", "b", "b"], hosts=["a", "b"], ranks_per_host=[2, 2],
                              inter_host_pair=[0, 2], inter_host_network=data["entries"][0]["p2p_network"])
    path.write_text(json.dumps(data))
    cal = load_calibration(path)
    table = format_table(cal)
    assert "a (2), b (2)" in table and "0-1 (one host)" in table and "inter-host alpha (us)" in table
    for change, message in [({"rank_hosts": ["a", "b"]}, "rank_hosts names 2 hosts for 4 ranks"),
                            ({"ranks_per_host": [3, 1]}, "disagree with rank_hosts"),
                            ({"rank_hosts": []}, "need rank_hosts")]:
        bad = json.loads(json.dumps(data))
        bad["entries"][0].update(change)
        path.write_text(json.dumps(bad))
        with pytest.raises(CalibrationError, match=f"c.json: entries.0: .*{message}"):
            load_calibration(path)


@pytest.mark.subprocess
def test_calibrate_launches_across_the_hosts_of_a_host_file(tmp_path):
    """``--hosts FILE`` reaches the launcher, and the job's files go next to ``--output`` (rank 0
    may run on another host); the fake launcher only records what it was asked."""
    scenario = write_scenario_file(tmp_path, TINY)
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("vh-elsewhere-1:2\nvh-elsewhere-2:2\n")
    output = tmp_path / "cal" / "c.json"
    script = textwrap.dedent(f"""
        import json, subprocess, sys
        import harness.launch
        calls = []
        def fake_run_ranks(n, argv, launch=None, **kw):
            calls.append([n, list(argv), launch.launcher, str(launch.hosts)])
            return subprocess.CompletedProcess(argv, 3)
        harness.launch.run_ranks = fake_run_ranks
        from harness.cli import main
        rc = main(["calibrate", "--scenario", {str(scenario)!r}, "--ranks", "4", "--hosts", {str(hosts)!r},
                   "--output", {str(output)!r}])
        print(json.dumps({{"rc": rc, "calls": calls}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    ((n, argv, launcher, host_file),) = out["calls"]
    assert (out["rc"], n, launcher, host_file) == (1, 4, "mpiexec", str(hosts))
    assert argv[1:3] == ["-m", "harness.calibrate.worker"]
    assert Path(argv[3]).parent.parent == output.parent  # plan and entry on the shared file system
    assert not output.exists() and list(output.parent.iterdir()) == []  # the job's directory is gone

    bad = tmp_path / "bad-hosts.txt"
    bad.write_text("vh1:x\n")
    proc = harness_cli("calibrate", "--scenario", str(scenario), "--hosts", str(bad), "--output", str(output))
    assert proc.returncode == 2 and f"--hosts {bad}:1: expected 'host' or 'host:slots'" in proc.stderr
    proc = harness_cli("calibrate", "--scenario", str(scenario), "--hosts", str(hosts), prefix=["env", "PMI_SIZE=2"])
    assert proc.returncode == 2
    assert "--launcher and --hosts are for starting ranks; this process already is one of an MPI job" in proc.stderr


def _can_rename_host() -> bool:
    """Whether this process may start one with a host name of its own (a UTS namespace)."""
    try:
        return subprocess.run(["unshare", "--uts", "sh", "-c", "hostname harness-probe"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.mpi
@pytest.mark.skipif(not _can_rename_host(), reason="needs `unshare --uts` (root or user namespaces) to give one "
                                                  "rank a host name of its own")
def test_a_calibration_across_two_host_names_measures_both_pairs(tmp_path):
    """Three ranks of one in-place calibration job (MPMD), the last in a UTS namespace whose host
    name differs: to the calibration that is a second host (its MPI traffic still goes through
    shared memory, so the two links measure alike here; the test bed of virtual hosts,
    harness/testing/vhosts/, has real separate network stacks)."""
    from harness.launch import mpiexec_path

    data = {**TINY, "ranks": 3, "workload": {**TINY["workload"], "compute": {"emulate_ms": 2}, "params": 2000}}
    scenario = write_scenario_file(tmp_path, data)
    command = [sys.executable, "-m", "harness", "calibrate", "--quick", "--scenario", str(scenario),
               "--output", str(tmp_path / "cal.json")]
    renamed = ["unshare", "--uts", "sh", "-c", 'hostname harness-other-host && exec "$@"', "sh", *command]
    proc = subprocess.run([str(mpiexec_path()), "-n", "2", *command, ":", "-n", "1", *renamed],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    (entry,) = load_calibration(tmp_path / "cal.json").entries
    here = entry.rank_hosts[0]
    assert entry.rank_hosts == [here, here, "harness-other-host"] and here != "harness-other-host"
    assert (entry.hosts, entry.ranks_per_host) == ([here, "harness-other-host"], [2, 1])
    assert entry.p2p_pair == (0, 1) and entry.inter_host_pair == (0, 2)
    assert [p.bytes for p in entry.inter_host_p2p] == [p.bytes for p in entry.p2p]
    assert all(p.one_way_s > 0 for p in entry.inter_host_p2p) and entry.inter_host_network is not None
    assert entry.network_source == "quiet allreduce times"  # fitted with the hosts as nodes
    assert f"{here} (2), harness-other-host (1)" in proc.stdout and "inter-host alpha (us)" in proc.stdout
