"""examples/torch_parallel under ``python -m harness launch --scenario``: FSDP2 at 3 ranks, one launch.

The script is stock torch.distributed; under the scenario every rank's FSDP2 all-gathers and
reduce-scatters go through the ``harness`` backend into collectives.csv, with the payloads that
torch 2.13's FSDP2 gives them: each parameter's dim 0 padded to a multiple of the shard group size
(here 3; none of the example's layer widths is a multiple of 3), no other padding of the flat buffer.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pandas as pd
import pytest

from conftest import REPO, harness_cli

EXAMPLE = REPO / "examples" / "torch_parallel"
RANKS, STEPS = 3, 4
FEATURES, WIDTHS, CLASSES = 48, (211, 173, 131, 67), 10  # train.py's model: Linear layers in -> out


def all_gather_bytes(fan_in: int, fan_out: int, shard: int) -> int:
    """One rank's piece of the all-gather of a Linear(fan_in, fan_out) (float32): weight and bias,
    each padded in dim 0 to ceil(fan_out / shard) rows."""
    rows = math.ceil(fan_out / shard)
    return 4 * (rows * fan_in + rows)


@pytest.mark.mpi
def test_fsdp_example_under_its_scenario(tmp_path):
    proc = harness_cli("launch", "-n", str(RANKS), "--iterations", str(STEPS),
                       "--scenario", str(EXAMPLE / "scenario.yaml"), "--out", str(tmp_path / "out"),
                       "--label", "fsdp", str(EXAMPLE / "train.py"), "--parallel", "fsdp", "--steps", str(STEPS),
                       timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bypasses" not in proc.stderr  # the script asked for "harness"
    (run,) = (tmp_path / "out" / "torch_parallel").iterdir()
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["optimizer_steps"] == [STEPS] * RANKS

    seq = pd.read_csv(run / "collectives.csv", keep_default_na=False, dtype={"group_ranks": str})
    assert set(seq["rank"]) == set(range(RANKS)) and set(seq["iteration"]) == set(range(STEPS))
    assert set(seq["op"]) == {"allgather", "reduce_scatter"}
    assert set(seq["group_ranks"]) == {"0 1 2"}  # FSDP over all ranks
    assert set(seq["phase"]) == {"overlap"}  # posted during the forward and backward passes

    # Per step: one all-gather per hidden layer in the forward pass and again in the backward pass
    # (resharded after forward), one for the root (the output layer, kept through the backward),
    # and one reduce-scatter per layer; the input of a reduce-scatter is 3 ranks' pieces.
    fans = list(zip((FEATURES, *WIDTHS), (*WIDTHS, CLASSES)))
    hidden = [all_gather_bytes(i, o, RANKS) for i, o in fans[:-1]]
    root = all_gather_bytes(*fans[-1], RANKS)
    expected_gathers = sorted([root, *hidden, *hidden])
    expected_scatters = sorted(RANKS * b for b in [root, *hidden])
    for (rank, step), ops in seq.groupby(["rank", "iteration"]):
        gathers = sorted(ops[ops["op"] == "allgather"]["payload_bytes"])
        scatters = sorted(ops[ops["op"] == "reduce_scatter"]["payload_bytes"])
        assert gathers == expected_gathers, (rank, step)
        assert scatters == expected_scatters, (rank, step)
    # The same collectives in the same order on every rank.
    per_rank = seq.groupby("rank")[["iteration", "op", "payload_bytes"]].apply(lambda f: list(map(tuple, f.to_numpy())))
    assert per_rank[0] == per_rank[1] == per_rank[2]

    steps = pd.read_csv(run / "steps.csv")
    if importlib.util.find_spec("harness.dist.metrics") is not None:  # harness.dist.record exists
        assert steps["loss"].notna().all()  # the script's record(loss=...) of every step
    assert (steps.set_index("rank")["injected_delay_s"].loc[1] == 0.02).all()  # the scenario's straggler
