"""The trace-driven replay of a torch.distributed script run (harness.sim.script_replay), without MPI.

The recorded sequence (collectives.csv, harness.dist.sequence) is made by hand here: where an
operation sits in its step, the matching of the ranks' collectives, the refusal at another rank
count where the sequence depends on it, the native group schedules the replay times, and a
replay whose timing follows from the recorded local work and the network alone.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from harness.dist.sequence import Shape, StepMarks, sequence_rows
from harness.results.columns import COLLECTIVE_COLUMNS, STEP_COLUMNS
from harness.scenario import scenario_from_dict
from harness.sim.calibration import NetworkModel
from harness.sim.step_programs import GROUP_KINDS, group_program
from harness.sim.script_replay import ReplayError, ScriptTrace, replay_script


def rows(ranks: int, steps: int, ops: list[tuple]) -> pd.DataFrame:
    """collectives.csv for ``ranks`` ranks posting ``ops`` (op, group, payload, peer, phase, at) every step."""
    data = [(r, t, i, op, group, payload, peer, phase, at, True)
            for r in range(ranks) for t in range(steps) for i, (op, group, payload, peer, phase, at) in enumerate(ops)]
    return pd.DataFrame(data, columns=list(COLLECTIVE_COLUMNS))


def test_an_operation_is_placed_in_its_step():
    marks = [StepMarks(0.0, 1.0, 3.0, 4.0), StepMarks(4.0, 4.5, 6.5, 7.0)]
    shape = Shape("allreduce", 400, -1, "0 1")
    ops = [SimpleNamespace(post_s=p, end_s=e) for p, e in
           [(-1.0, -0.5), (0.5, 0.6), (2.0, 3.5), (3.2, 3.3), (5.5, 5.6), (7.5, 7.6)]]
    out = sequence_rows(1, marks, ops, {o.post_s: shape for o in ops})
    # set-up before the first step and tear-down after the last are left out
    assert [(r[1], r[2], r[7]) for r in out] == [(0, 0, "before"), (0, 1, "overlap"), (0, 2, "after"),
                                                 (1, 0, "overlap")]
    assert out[1][8] == pytest.approx(0.5) and out[3][8] == pytest.approx(0.5)
    # waited: ended before the rank's next post (the one posted at 2.0 ran past 3.2)
    assert [r[9] for r in out] == [True, False, True, True]


def test_ranks_must_agree_on_each_collective_and_the_largest_size_counts():
    frame = rows(2, 1, [("alltoall", "0 1", 40, -1, "after", 0.0)])
    frame.loc[frame["rank"] == 1, "payload_bytes"] = 80  # uneven splits: each rank sends its own amount
    trace = ScriptTrace.from_frame(frame, 2, 1)
    assert trace.ops[0][0][0].count == trace.ops[1][0][0].count == 20  # floats
    frame.loc[frame["rank"] == 1, "op"] = "allgather"
    with pytest.raises(ReplayError, match="alltoall on rank 0 and a allgather on rank 1"):
        ScriptTrace.from_frame(frame, 2, 1)


def test_another_rank_count_only_where_a_rule_scales_the_sequence():
    ddp = ScriptTrace.from_frame(rows(3, 2, [("broadcast", "0 1 2", 8, 0, "before", 0.0),
                                             ("allreduce", "0 1 2", 4000, -1, "overlap", 0.4)]), 3, 2)
    five = ddp.at_ranks(5)
    assert five.ranks == 5 and all(op.members == (0, 1, 2, 3, 4) for op in five.ops[4][1])
    fsdp = ScriptTrace.from_frame(rows(3, 1, [("allgather", "0 1 2", 400, -1, "overlap", 0.1),
                                              ("reduce_scatter", "0 1 2", 1200, -1, "overlap", 0.8)]), 3, 1)
    assert fsdp.at_ranks(3) is fsdp
    # without the run's notes of its FSDP2 parameters, an all-gather's size at 4 ranks is unknown
    with pytest.raises(ReplayError, match=r"at 4 ranks: rank 0's allgather of 400 bytes over \[0 1 2\] in step 0: "
                                          r".*no FSDP2 parameter groups.* recorded 3 ranks"):
        fsdp.at_ranks(4)
    sub = ScriptTrace.from_frame(rows(4, 1, [("allreduce", "0 3", 40, -1, "after", 0.0)]).query("rank in (0, 3)"), 4, 1)
    with pytest.raises(ReplayError, match=r"over \[0 3\] .*neither the world, a block"):
        sub.at_ranks(6)


@pytest.mark.parametrize("p", [2, 3, 5, 8])
@pytest.mark.parametrize("kind", GROUP_KINDS)
def test_group_schedules_send_what_the_native_layer_sends(kind, p):
    count = 12 * p  # floats
    s = group_program(kind, p, count, root=1 % p)
    piece = count // p * 4
    expected = {
        "allgather": [(p - 1) * count * 4] * p,
        "reduce_scatter": [(p - 1) * piece] * p,
        "alltoall": [(p - 1) * piece] * p,
        "gather": [0 if m == 1 % p else count * 4 for m in range(p)],
        "scatter": [(p - 1) * count * 4 if m == 1 % p else 0 for m in range(p)],
    }
    if kind == "reduce":  # each non-root sends its partial sum once, up the tree
        assert sorted(s.bytes_sent.tolist()) == [0] + [count * 4] * (p - 1) and s.bytes_sent[1 % p] == 0
    else:
        assert s.bytes_sent.tolist() == expected[kind]
    for i in range(s.steps):  # every message received is one sent to that member in the same step
        for m in range(p):
            src = s.recv_from[i, m]
            if src >= 0:
                assert s.send_to[i, src] == m


def _steps_frame(ranks: int, steps: int, local_s: float) -> pd.DataFrame:
    data = {c: 0.0 for c in STEP_COLUMNS}
    frame = pd.DataFrame([{**data, "algorithm": "train", "rank": r, "iteration": t,
                           "start_s": t * local_s, "end_s": (t + 1) * local_s}
                          for t in range(steps) for r in range(ranks)], columns=list(STEP_COLUMNS))
    return frame


def test_a_replay_takes_the_local_work_and_the_network_time():
    """Two steps of 10 ms local work; a 4 MB allreduce posted at the end of the backward pass
    (at 0.99) is all exposed; one posted at the start (at 0) is hidden behind the compute."""
    scenario = scenario_from_dict({"name": "s", "ranks": 2, "workload": {"batch_size": 8, "iterations": 2}})
    network = NetworkModel(latency_s=1e-4, bandwidth_bytes_per_s=1e9)
    walls, blocked = {}, {}
    for at in (0.0, 0.99):
        trace = ScriptTrace.from_frame(rows(2, 2, [("allreduce", "0 1", 4_000_000, -1, "overlap", at)]), 2, 2)
        frame, _ = replay_script(scenario, "train", _steps_frame(2, 2, 0.01), trace, scenario, network)
        assert len(frame) == 4
        walls[at] = float(frame["end_s"].max())
        blocked[at] = float(np.median(frame["comm_blocked_s"]))
    # the 2-rank allreduce of 4 MB: two messages of 2 MB each way, about 4 ms at 1 GB/s
    assert walls[0.0] == pytest.approx(0.02, abs=1e-3) and blocked[0.0] == pytest.approx(0.0, abs=1e-3)
    assert walls[0.99] == pytest.approx(0.02 + 2 * 0.004, rel=0.1)
    assert blocked[0.99] == pytest.approx(0.004, rel=0.1)
