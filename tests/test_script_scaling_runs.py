"""A torch.distributed script recorded at 3 ranks, scaled to 2 by the rules of
harness.sim.script_scaling, against the same script really run at 2 ranks: the same operations
(kind, group, bytes, root or peer) on every rank and step, and the simulated bytes per rank and
step equal to the native layer's. FSDP2 (the shard follows the rank count, dim 0 padded) and
ZeroRedundancyOptimizer (its partition, rank by rank), each with 3 recorded and 2 real ranks.
``python -m harness bench scripts`` does the same for DDP, FSDP2, HSDP and ZeRO at 2, 3 and 8.
"""

from __future__ import annotations

import pandas as pd
import pytest

from conftest import REPO, harness_cli

EXAMPLE = REPO / "examples" / "torch_parallel"
STEPS = 3


def _launch(tmp_path, mode: str, ranks: int):
    out = tmp_path / f"{mode}{ranks}"
    proc = harness_cli("launch", "-n", str(ranks), "--scenario", str(EXAMPLE / "scenario.yaml"), "--out", str(out),
                       str(EXAMPLE / "train.py"), "--parallel", mode, "--steps", str(STEPS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (out / "torch_parallel").iterdir()
    return run


def _ops(trace) -> list:
    return [[[(o.op, o.members, o.nbytes, o.peer) for o in step] for step in rank] for rank in trace.ops]


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["fsdp", "zero"])
def test_recorded_at_3_ranks_is_what_2_ranks_send(tmp_path, mode):
    from harness.results.records import RunDirectory
    from harness.scenario import load_scenario
    from harness.sim.calibration import NetworkModel
    from harness.sim.script_replay import ScriptTrace, replay_script
    from harness.sim.script_scaling import ScriptStructure

    recorded, real = _launch(tmp_path, mode, 3), _launch(tmp_path, mode, 2)
    structure = ScriptStructure.read(recorded)
    assert (len(structure.fsdp) > 0, len(structure.zero)) == ((True, 0) if mode == "fsdp" else (False, 1))
    scaled = ScriptTrace.read(recorded, 3, STEPS).at_ranks(2, structure)
    assert _ops(scaled) == _ops(ScriptTrace.read(real, 2, STEPS))

    scenario = load_scenario(recorded / "scenario.resolved.yaml")
    at_two = scenario.model_copy(update={"ranks": 2, "workload": scenario.workload.model_copy(
        update={"iterations": STEPS})})
    network = NetworkModel(latency_s=1e-5, bandwidth_bytes_per_s=1e9)
    frame, _ = replay_script(at_two, "train", RunDirectory.open(recorded).steps, ScriptTrace.read(recorded, 3, STEPS),
                             scenario, network, mode="predictive", structure=structure)
    sent = frame.merge(RunDirectory.open(real).steps, on=["rank", "iteration"], suffixes=("_sim", "_real"))
    assert len(sent) == 2 * STEPS
    pd.testing.assert_series_equal(sent["bytes_sent_sim"], sent["bytes_sent_real"], check_names=False,
                                   check_dtype=False)


@pytest.mark.mpi
@pytest.mark.parametrize("variant", [["--bucket-cap-mb", "0.05", "--find-unused-parameters"], ["--static-graph"],
                                     ["--accumulate", "2"]], ids=["small-buckets-unused", "static-graph", "no-sync"])
def test_ddp_replays_at_its_rank_count_and_another(tmp_path, variant):
    """DDP's bucket rebuild in step 1 (two small broadcasts, then the rebuilt buckets) once made
    the ranks' replayed collectives disagree; every variant replays, at 3 and at 5 ranks."""
    from harness.results.records import RunDirectory
    from harness.scenario import load_scenario
    from harness.sim.calibration import NetworkModel
    from harness.sim.script_replay import ScriptTrace, replay_script
    from harness.sim.script_scaling import ScriptStructure

    out = tmp_path / "ddp"
    proc = harness_cli("launch", "-n", "3", "--scenario", str(EXAMPLE / "scenario.yaml"), "--out", str(out),
                       "--iterations", str(STEPS + 1), str(EXAMPLE / "train.py"), "--parallel", "ddp",
                       "--steps", str(STEPS + 1), *variant)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (out / "torch_parallel").iterdir()
    trace = ScriptTrace.read(run, 3, STEPS + 1)
    # step 1: the rebuilt buckets, after the rebuild's broadcasts where DDP rebuilds them
    assert "allreduce" in {o.op for o in trace.ops[0][1]}
    scenario = load_scenario(run / "scenario.resolved.yaml")
    steps = RunDirectory.open(run).steps
    network = NetworkModel(latency_s=1e-5, bandwidth_bytes_per_s=1e9)
    for ranks, mode in ((3, "trace"), (5, "predictive")):
        at = scenario.model_copy(update={"ranks": ranks})
        frame, _ = replay_script(at, "train", steps, trace, scenario, network, mode=mode,
                                 structure=ScriptStructure.read(run))
        assert sorted(frame.groupby("rank").size().items()) == [(r, STEPS + 1) for r in range(ranks)]
        # the straggler (rank 1, 20 ms a step) holds every rank back
        assert (frame.groupby("rank")["end_s"].max() >= 0.02 * (STEPS + 1)).all()
