"""``simulate`` and ``compare`` end to end, and a small real run against its simulation."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from harness.testing.real_runs import run_and_compare
from harness.testing.scenarios import SMALL_COMPUTE, SMALL_SCENARIO
from harness.results.columns import STEP_COLUMNS, SUMMARY_COLUMNS
from harness.scenario.loader import scenario_from_dict
from harness.sim.calibration import (
    Calibration,
    CalibrationEntry,
    CalibrationError,
    ComputePoint,
    EvalPoint,
    NetworkModel,
    load_calibration,
    save_calibration,
)
from harness.sim.compare import COMPARE_COLUMNS
from harness.sim.runs import calibration_entry, predict
from conftest import harness_cli, write_scenario_file

# Emulated compute: the local work is a sleep, so the comparison tests the communication model
# and not how well a noisy CI machine reproduces forward/backward times. The scenario of
# `python -m harness bench agreement`'s small_run case, which reports how close they are.
SMALL = SMALL_SCENARIO


def calibration_file(path, ranks=(4,), latency_s=3e-4, cpus=2):
    entries = [
        CalibrationEntry(ranks=r, network=NetworkModel(latency_s=latency_s, bandwidth_bytes_per_s=1e9),
                         compute=[ComputePoint(model="mlp", dataset="mnist5k", batch_size=32, median_s=0.003,
                                               p95_s=0.004, samples=10)])
        for r in ranks
    ]
    save_calibration(Calibration(created_at="2026-01-01T00:00:00+00:00", harness_version="test", cpus=cpus,
                                 entries=entries), path)
    return path


def real_compute(data):
    """``data`` with real compute (its communicated size is then the model's own)."""
    workload = {k: v for k, v in data["workload"].items() if k != "params"}
    return {**data, "workload": {**workload, "compute": "real"}}


@pytest.mark.subprocess
def test_simulate_writes_a_marked_run_with_the_real_columns(tmp_path) -> None:
    scenario = write_scenario_file(tmp_path, SMALL)
    # Run where there is no results/calibration.json: emulated compute uses the default network.
    proc = harness_cli("simulate", str(scenario), "--out", str(tmp_path / "out"), "--trace-ranks", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "no calibration file" in proc.stderr
    (run,) = (tmp_path / "out" / "simcheck").iterdir()
    assert run.name.startswith("sim-")
    meta = json.loads((run / "run.json").read_text())
    assert meta["simulated"] is True and meta["mode"] == "predictive" and meta["status"] == "complete"
    assert meta["events"] > 0
    assert meta["calibration"] is None and meta["calibration_ranks"] is None
    assert meta["wagma_group_sizes"] == {"wagma": [2, 2]}
    summary = pd.read_csv(run / "summary.csv")
    assert tuple(summary.columns) == SUMMARY_COLUMNS
    assert list(summary["algorithm"]) == ["allreduce_sgd", "local_sgd", "sgp", "wagma"]
    assert summary["complete"].all()
    steps = pd.read_csv(run / "steps.csv")
    assert tuple(steps.columns) == STEP_COLUMNS and len(steps) == 4 * 4 * 24
    trace = json.loads((run / "trace.json").read_text())
    tids = {e["tid"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert tids == {0, 1}
    assert "events/s" in proc.stdout


@pytest.mark.subprocess
def test_simulate_scales_past_a_thousand_ranks(tmp_path) -> None:
    scenario = write_scenario_file(tmp_path, {**SMALL, "algorithms": [{"name": "wagma", "group_size": 8,
                                                                       "period": 4}]})
    proc = harness_cli("simulate", str(scenario), "--ranks", "1100", "--iterations", "5", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (run,) = (tmp_path / "simcheck").iterdir()
    assert pd.read_csv(run / "summary.csv")["ranks"].tolist() == [1100]


@pytest.mark.subprocess
def test_simulate_real_compute_needs_a_calibration_and_gives_the_command(tmp_path) -> None:
    scenario = write_scenario_file(tmp_path, real_compute(SMALL))
    missing = tmp_path / "missing.json"
    proc = harness_cli("simulate", str(scenario), "--out", str(tmp_path / "out"), "--calibration", str(missing))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {missing}: no calibration file")
    command = f"python -m harness calibrate --scenario {scenario} --ranks 4 --output {missing}"
    assert proc.stderr.splitlines()[-1] == f"  {command}"
    # A calibration without this workload's compute time is named as such; the command
    # measures it at the rank count of the entry the simulation takes (8, for 4 ranks on 2 CPUs).
    cal = calibration_file(tmp_path / "cal.json", ranks=(8,))
    proc = harness_cli("simulate", str(scenario), "--out", str(tmp_path / "out"), "--calibration", str(cal))
    assert proc.returncode == 2
    assert "the calibration for 8 ranks has no compute time for model mlp, dataset digits, batch 8" in proc.stderr
    command = f"python -m harness calibrate --scenario {scenario} --ranks 8 --output {cal}"
    assert proc.stderr.splitlines()[-1] == f"  {command}"
    assert not (tmp_path / "out").exists()


@pytest.mark.mpi
@pytest.mark.slow
def test_the_printed_calibrate_command_makes_simulate_work(tmp_path) -> None:
    data = real_compute({**SMALL, "ranks": 2, "algorithms": ["allreduce_sgd"], "imbalance": []})
    scenario = write_scenario_file(tmp_path, data)
    # This machine's CPU count, or calibrate would replace the file instead of merging into it.
    cal = calibration_file(tmp_path / "cal.json", ranks=(2,), cpus=os.cpu_count())
    args = ("simulate", str(scenario), "--out", str(tmp_path / "out"), "--calibration", str(cal))
    proc = harness_cli(*args)
    assert proc.returncode == 2
    command = shlex.split(proc.stderr.splitlines()[-1])
    assert command[:3] == ["python", "-m", "harness"]
    calibrated = harness_cli(*command[3:], "--quick", timeout=300)
    assert calibrated.returncode == 0, calibrated.stderr[-3000:]
    (entry,) = load_calibration(cal).entries
    # The new workload is added; the one already measured is kept.
    assert {(p.dataset, p.batch_size) for p in entry.compute} == {("digits", 8), ("mnist5k", 32)}
    proc = harness_cli(*args)
    assert proc.returncode == 0, proc.stderr
    assert "note:" not in proc.stderr


def test_a_new_entry_keeps_the_other_workloads_of_the_one_it_replaces() -> None:
    def point(batch, seconds):
        return ComputePoint(model="mlp", dataset="digits", batch_size=batch, median_s=seconds, p95_s=seconds,
                            samples=1)

    net = NetworkModel(latency_s=1e-6, bandwidth_bytes_per_s=1e9)
    old = CalibrationEntry(ranks=2, network=net, compute=[point(8, 1.0), point(16, 2.0)],
                           evaluation=[EvalPoint(model="mlp", dataset="digits", median_s=0.1)])
    new = CalibrationEntry(ranks=2, network=net.model_copy(update={"latency_s": 5e-6}), compute=[point(8, 3.0)])
    other = CalibrationEntry(ranks=4, network=net)
    cal = Calibration(created_at="x", harness_version="x", cpus=2, entries=[old, other]).with_entry(new)
    merged = cal.choose(2).entry
    assert merged.network.latency_s == 5e-6
    assert merged.compute_s("mlp", "digits", 8) == 3.0 and merged.compute_s("mlp", "digits", 16) == 2.0
    assert merged.evaluation_s("mlp", "digits") == 0.1
    assert [e.ranks for e in cal.entries] == [2, 4]


def test_trace_replay_of_real_compute_needs_no_compute_time() -> None:
    scenario = scenario_from_dict(real_compute(SMALL), source="test")
    cal = Calibration(created_at="x", harness_version="x", cpus=2,
                      entries=[CalibrationEntry(ranks=4, network=NetworkModel(latency_s=1e-6,
                                                                              bandwidth_bytes_per_s=1e9))])
    assert calibration_entry(scenario, cal, "s.yaml", needs_compute=False) == (cal.entries[0], None)
    with pytest.raises(CalibrationError, match="python -m harness calibrate --scenario s.yaml --ranks 4$"):
        calibration_entry(scenario, cal, "s.yaml")


@pytest.mark.subprocess
def test_simulate_says_which_rank_count_it_took_the_calibration_from(tmp_path) -> None:
    cal = calibration_file(tmp_path / "cal.json", ranks=(2, 8))
    proc = harness_cli("simulate", str(write_scenario_file(tmp_path, SMALL)), "--out", str(tmp_path / "out"),
                       "--calibration", str(cal), "--iterations", "4")
    assert proc.returncode == 0, proc.stderr
    assert ("note: no calibration for 4 ranks (measured: 2, 8): using the one measured at 2 ranks "
            "(the most ranks that did not share the 2 CPUs)") in proc.stderr
    (run,) = (tmp_path / "out" / "simcheck").iterdir()
    meta = json.loads((run / "run.json").read_text())
    assert meta["calibration"] == str(cal) and meta["calibration_ranks"] == 2


@pytest.mark.subprocess
def test_simulate_rejects_bad_input(tmp_path) -> None:
    scenario = write_scenario_file(tmp_path, {**SMALL, "ranks": 0})
    proc = harness_cli("simulate", str(scenario), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "ranks" in proc.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": 1, "entries": [}')
    proc = harness_cli("simulate", str(write_scenario_file(tmp_path, SMALL)), "--calibration", str(bad))
    assert proc.returncode == 2 and "bad.json" in proc.stderr and "JSON" in proc.stderr
    bad.write_text(json.dumps({"created_at": "x", "harness_version": "x", "cpus": 2,
                               "entries": [{"ranks": 4, "network": {"latency_s": -1, "bandwidth_bytes_per_s": 1}}]}))
    proc = harness_cli("simulate", str(write_scenario_file(tmp_path, SMALL)), "--calibration", str(bad))
    assert proc.returncode == 2 and "entries.0.network.latency_s" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def small_compared(tmp_path_factory):
    """SMALL for real, then ``compare`` of it in both modes (a fixed calibration)."""
    from harness.sim.calibration import save_fixed_calibration

    tmp = tmp_path_factory.mktemp("simsmall")
    cal = save_fixed_calibration(tmp / "cal.json", SMALL["ranks"], SMALL_COMPUTE)
    return run_and_compare(SMALL, tmp, cal)


@pytest.fixture(scope="module")
def real_run(small_compared, tmp_path_factory):
    """A copy of ``small_compared``'s real run as ``run`` left it (no compare results), for the
    tests of what ``compare`` accepts: one real run for the file, not two."""
    copy = tmp_path_factory.mktemp("simreal") / small_compared.run.name
    shutil.copytree(small_compared.run, copy, ignore=shutil.ignore_patterns("compare.*", "sim-*"))
    assert not list(copy.glob("compare*")) and not list(copy.glob("sim-*"))
    return copy


@pytest.mark.mpi
def test_a_small_real_run_and_its_simulation_agree_within_a_factor_of_two(small_compared) -> None:
    """SMALL for real, then ``compare``: the tables and files it writes, and coarse agreement
    that catches a broken model (off by 2x, the wrong way round), not a loaded machine. How
    close they are is ``python -m harness bench agreement --only small_run``'s report (1-5% here)."""
    compared = small_compared
    real_run, table = compared.run, compared.table
    assert tuple(table.columns) == COMPARE_COLUMNS
    assert sorted(set(table["mode"])) == ["predictive", "trace"]
    assert len(table) == 2 * 4
    ratio = table["measured_iter_s"] / table["predicted_iter_s"]
    assert ratio.between(0.5, 2.0).all(), table.to_string()
    # Allreduce-SGD waits for the late rank every iteration, Local SGD every third: the simulator
    # orders them as the real run does, in both modes (about 61 against 44 ms here).
    by = table.set_index(["mode", "algorithm"])
    for mode in ("trace", "predictive"):
        assert by.loc[(mode, "allreduce_sgd"), "measured_iter_s"] > by.loc[(mode, "local_sgd"), "measured_iter_s"]
        assert by.loc[(mode, "allreduce_sgd"), "predicted_iter_s"] > by.loc[(mode, "local_sgd"), "predicted_iter_s"], \
            table.to_string()
    assert (real_run / "compare.png").stat().st_size > 0
    for mode in ("trace", "predictive"):
        meta = json.loads((real_run / f"sim-{mode}" / "run.json").read_text())
        assert meta["simulated"] and meta["mode"] == mode and meta["calibration_ranks"] == 4
    assert (table["calibration_ranks"] == 4).all()
    assert "median |error|" in compared.output and "note: no calibration" not in compared.output
    assert json.loads((real_run / "run.json").read_text())["wagma_group_sizes"] == {"wagma": [2, 2]}


@pytest.mark.mpi
def test_compare_says_which_rank_count_it_took_the_calibration_from(real_run, tmp_path) -> None:
    cal = calibration_file(tmp_path / "cal.json", ranks=(8,))
    proc = harness_cli("compare", str(real_run), "--calibration", str(cal), "--mode", "trace")
    assert proc.returncode == 0, proc.stderr
    assert "note: no calibration for 4 ranks (measured: 8): using the one measured at 8 ranks" in proc.stderr
    table = pd.read_csv(real_run / "compare.csv")
    assert set(table["mode"]) == {"trace"} and (table["calibration_ranks"] == 8).all()
    assert json.loads((real_run / "sim-trace" / "run.json").read_text())["calibration_ranks"] == 8


@pytest.mark.mpi
def test_compare_rejects_what_it_cannot_compare(real_run, tmp_path) -> None:
    proc = harness_cli("compare", str(tmp_path), "--calibration", str(calibration_file(tmp_path / "c.json")))
    assert proc.returncode == 2 and "not a run directory" in proc.stderr
    assert harness_cli("simulate", str(write_scenario_file(tmp_path, SMALL)), "--out", str(tmp_path)).returncode == 0
    (simulated,) = (tmp_path / "simcheck").iterdir()
    proc = harness_cli("compare", str(simulated), "--calibration", str(tmp_path / "c.json"))
    assert proc.returncode == 2 and "simulated run" in proc.stderr
    proc = harness_cli("compare", str(real_run), "--calibration", str(tmp_path / "nothing.json"))
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {tmp_path / 'nothing.json'}: no calibration file")
    command = (f"python -m harness calibrate --scenario {real_run}/scenario.resolved.yaml --ranks 4 "
               f"--output {tmp_path / 'nothing.json'}")
    assert proc.stderr.splitlines()[-1] == f"  {command}"


@pytest.mark.subprocess
def test_simulate_needs_no_mpi(tmp_path) -> None:
    """``simulate`` runs outside any MPI job: it never imports mpi4py (whose import initializes
    MPI) nor the native layer that links libmpi. It does import torch, on purpose:
    simulated ranks run the algorithms' own torch code on stand-in buffers, and the model's size
    comes from building it on the meta device."""
    scenario = write_scenario_file(tmp_path, SMALL)
    code = (
        "import sys\n"
        "from harness.cli import main\n"
        f"status = main(['simulate', {str(scenario)!r}, '--out', {str(tmp_path / 'out')!r}])\n"
        "loaded = [m for m in ('mpi4py', 'harness._core') if m in sys.modules]\n"
        "print('loaded:', loaded)\n"
        "sys.exit(status or (3 if loaded else 0))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- runs on several hosts (harness.sim.hosts) ------------------------------------------------------
INTRA = NetworkModel(latency_s=10e-6, bandwidth_bytes_per_s=5e9)
INTER = NetworkModel(latency_s=60e-6, bandwidth_bytes_per_s=1e8)


def _hosts_entry(ranks: int, inter: NetworkModel | None = INTER, rank_hosts: list[str] | None = None):
    """An entry with an intra-host link (``p2p_network``) and, unless None, an inter-host one."""
    rank_hosts = rank_hosts or (["h0"] * ranks if inter is None else ["h0"] * (ranks - 1) + ["h1"])
    hosts = list(dict.fromkeys(rank_hosts))
    return CalibrationEntry(ranks=ranks, network=NetworkModel(latency_s=3e-4, bandwidth_bytes_per_s=1e9),
                            p2p_network=INTRA, inter_host_network=inter, rank_hosts=rank_hosts, hosts=hosts,
                            ranks_per_host=[rank_hosts.count(h) for h in hosts],
                            inter_host_pair=(0, ranks - 1) if inter is not None else None)


@pytest.mark.parametrize(("rank_hosts", "placement"), [
    (["b", "b", "b", "a", "a"], [0, 0, 0, 1, 1]),  # 2 hosts, 3 + 2 ranks
    (["x", "y", "x", "z", "y", "x", "z"], [0, 1, 0, 2, 1, 0, 2]),  # 3 hosts, 3 + 2 + 2, interleaved
])
def test_a_multi_host_run_is_simulated_with_its_hosts_as_nodes(rank_hosts, placement) -> None:
    from harness.sim.hosts import run_rank_hosts, simulated_topology

    ranks = len(rank_hosts)
    scenario = scenario_from_dict({**SMALL, "ranks": ranks}, source="test")
    known, notes = run_rank_hosts({"hosts": len(set(rank_hosts)), "rank_hosts": rank_hosts}, ranks)
    assert (known, notes) == (rank_hosts, [])
    chosen = simulated_topology(scenario, _hosts_entry(ranks), known)
    assert chosen.source == "hosts" and chosen.notes == ()
    # Hosts numbered in order of first appearance; the NIC adds what the inter-host link costs
    # beyond the intra-host one: 50 us, and 1 / (1/1e8 - 1/5e9) bytes per second.
    assert list(chosen.hosts.node_of) == placement
    assert chosen.hosts.nic_latency_s == pytest.approx(50e-6)
    assert chosen.hosts.nic_bandwidth_bytes_per_s == pytest.approx(1 / (1 / 1e8 - 1 / 5e9))
    assert chosen.hosts.intra_bandwidth_bytes_per_s is None and chosen.hosts.intra_latency_s == 0.0
    assert chosen.description.startswith(f"the run's {len(set(rank_hosts))} hosts as nodes ({rank_hosts[0]} (3 ranks)")
    assert chosen.record()["placement"] == placement and chosen.record()["rank_hosts"] == rank_hosts
    # ... and the simulation sees them: the same run on one host is faster.
    entry = _hosts_entry(ranks)
    on_hosts, _ = predict(scenario, entry, hosts=chosen.hosts)
    on_one, _ = predict(scenario, entry)
    for name, frame in on_hosts.items():
        assert frame["end_s"].max() > on_one[name]["end_s"].max(), name


def test_the_scenario_topology_wins_over_the_hosts_and_one_host_changes_nothing() -> None:
    from harness.sim.hosts import simulated_topology

    topo = {**SMALL, "network": {"topology": {"preset": "ethernet_1g", "ranks_per_node": 2}}}
    scenario = scenario_from_dict(topo, source="test")
    chosen = simulated_topology(scenario, _hosts_entry(4), ["a", "a", "b", "b"])
    assert chosen.source == "scenario" and chosen.hosts is None
    assert "the scenario declares network.topology: simulating that topology" in chosen.notes[0]
    assert chosen.description == "the scenario's network.topology (2 nodes, emulated in the run)"
    plain = scenario_from_dict(SMALL, source="test")
    for rank_hosts in (None, ["a"] * 4):
        chosen = simulated_topology(plain, _hosts_entry(4), rank_hosts)
        assert (chosen.source, chosen.hosts, chosen.notes, chosen.worth_recording) == ("none", None, (), False)


def test_a_multi_host_run_with_a_single_host_calibration_says_so() -> None:
    from harness.sim.hosts import run_rank_hosts, simulated_topology

    scenario = scenario_from_dict(SMALL, source="test")
    chosen = simulated_topology(scenario, _hosts_entry(4, inter=None), ["a", "b", "a", "b"])
    assert chosen.source == "none" and chosen.hosts is None
    (note,) = chosen.notes
    assert note.startswith("the run's ranks ran on 2 hosts (a (2 ranks), b (2 ranks)), but the calibration of 4 ranks "
                           "was measured on one host: it has no inter-host link; simulating every pair")
    assert "--hosts FILE" in note and chosen.worth_recording
    separate = _hosts_entry(2, inter=None, rank_hosts=["p", "q"])  # no two ranks on one host
    assert "no two ranks on one host" in simulated_topology(scenario, separate, ["a", "b", "a", "b"]).notes[0]
    assert "no calibration" in simulated_topology(scenario, None, ["a", "b", "a", "b"]).notes[0]
    # run.json read defensively: older runs, wrong lengths, not names.
    assert run_rank_hosts({"hosts": 1}, 4) == (None, [])
    assert run_rank_hosts(None, 4) == (None, [])
    known, notes = run_rank_hosts({"hosts": 2}, 4)
    assert known is None and "does not say which rank ran where (no rank_hosts)" in notes[0]
    known, notes = run_rank_hosts({"rank_hosts": ["a", "b"]}, 4)
    assert known is None and "names the hosts of 2 ranks, the simulation has 4: ignored" in notes[0]
    known, notes = run_rank_hosts({"rank_hosts": "a,b"}, 2)
    assert known is None and "is not a list of host names" in notes[0]


def _multi_host_run(tmp_path, rank_hosts):
    """A run directory of SMALL (4 ranks) as a real run on ``rank_hosts`` would leave it, run.json
    ``rank_hosts`` included; its steps come from a simulation on one host (what compare does with
    the hosts is under test here, not how well it predicts: test_a_small_real_run_agrees...)."""
    from harness.sim.runs import write_simulated_run

    scenario = scenario_from_dict(SMALL, source="test")
    frames, stats = predict(scenario, _hosts_entry(4))
    path = tmp_path / "run"
    write_simulated_run(path, scenario, frames, stats, "predictive", None, calibration_ranks=None)
    meta = json.loads((path / "run.json").read_text())
    meta = {k: v for k, v in meta.items() if k not in ("simulated", "mode", "calibration", "calibration_ranks")}
    (path / "run.json").write_text(json.dumps({**meta, "hosts": len(set(rank_hosts)), "rank_hosts": rank_hosts}))
    return path


@pytest.mark.subprocess
def test_compare_and_simulate_of_a_multi_host_run_use_its_hosts(tmp_path) -> None:
    """A run whose 4 ranks ran on two hosts, a calibration with a slow inter-host link: compare
    says which topology it simulated, records it in the simulated runs, and predicts the run
    slower than the same run on one host; simulate of the run's scenario.resolved.yaml does
    the same."""
    rank_hosts = ["vh1", "vh1", "vh2", "vh2"]
    run = _multi_host_run(tmp_path, rank_hosts)
    cal = tmp_path / "cal.json"
    save_calibration(Calibration(created_at="x", harness_version="x", cpus=2,
                                 entries=[_hosts_entry(4, rank_hosts=rank_hosts)]), cal)
    proc = harness_cli("compare", str(run), "--calibration", str(cal), "--mode", "trace")
    assert proc.returncode == 0, proc.stderr
    line = ("simulated network topology: the run's 2 hosts as nodes (vh1 (2 ranks), vh2 (2 ranks)); each host's NIC "
            "adds 50.0 us and 0.816 Gb/s")
    assert line in proc.stdout and "note:" not in proc.stderr
    recorded = json.loads((run / "sim-trace" / "run.json").read_text())["network_topology"]
    assert recorded["source"] == "hosts" and recorded["placement"] == [0, 0, 1, 1]
    assert recorded["rank_hosts"] == rank_hosts
    on_hosts = pd.read_csv(run / "compare.csv").set_index("algorithm")["predicted_iter_s"]

    proc = harness_cli("simulate", str(run / "scenario.resolved.yaml"), "--calibration", str(cal),
                       "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert line in proc.stderr
    (simulated,) = (tmp_path / "out" / "simcheck").iterdir()
    assert json.loads((simulated / "run.json").read_text())["network_topology"]["placement"] == [0, 0, 1, 1]

    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "hosts": 1, "rank_hosts": ["vh1"] * 4}))  # on one host
    proc = harness_cli("compare", str(run), "--calibration", str(cal), "--mode", "trace")
    assert proc.returncode == 0, proc.stderr
    assert "simulated network topology" not in proc.stdout
    assert "network_topology" not in json.loads((run / "sim-trace" / "run.json").read_text())
    on_one = pd.read_csv(run / "compare.csv").set_index("algorithm")["predicted_iter_s"]
    assert (on_hosts > on_one).all(), (on_hosts, on_one)

    single = tmp_path / "single.json"  # a calibration measured on one host: said, and used as it is
    save_calibration(Calibration(created_at="x", harness_version="x", cpus=2, entries=[_hosts_entry(4, inter=None)]),
                     single)
    (run / "run.json").write_text(json.dumps(meta))
    proc = harness_cli("compare", str(run), "--calibration", str(single), "--mode", "trace")
    assert proc.returncode == 0, proc.stderr
    assert "note: the run's ranks ran on 2 hosts (vh1 (2 ranks), vh2 (2 ranks)), but the calibration" in proc.stderr
    assert "simulated network topology: no topology: 2 hosts, but no inter-host link calibrated" in proc.stdout
