"""A new algorithm is one class, one parameter model and one registration, and nothing else.

The algorithm below lives in this test module and is registered with
``harness.algorithms.registry.register`` only. With no other edit it validates in a scenario,
trains on real ranks (``mpiexec -n 3`` starting a driver that registers it, then runs ``python
-m harness run`` in place), is simulated by ``simulate`` (its own hooks on the simulated
communicator), is compared by ``compare``, and figures draw it with its label and colour.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pandas as pd
import pytest
import torch
import yaml

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.params import AlgorithmParams
from harness.algorithms.registry import register, unregister
from harness.strict_model import PositiveInt
from harness.launch import run_ranks
from harness.results.records import RunDirectory

from conftest import save_test_calibration

NAME = "ring_average"
LABEL = "Ring average"
COLOUR = "#8c6d31"  # no built-in algorithm's
EVERY = 2
RANKS = 3  # odd: each rank has two distinct ring neighbours
ITERATIONS = 8
LOGREG_DIGITS_FLOATS = 8 * 8 * 10 + 10  # logreg on digits: a 64 x 10 weight and 10 biases
FLOAT_BYTES = 4

SCENARIO = {
    "name": "newalgo",
    "ranks": RANKS,
    "seed": 5,
    "workload": {"model": "logreg", "dataset": "digits", "batch_size": 16, "iterations": ITERATIONS,
                 "eval_every": 4},
    "optimizer": {"lr": 0.05},
    "algorithms": [{"name": NAME, "every": EVERY}],
}


class RingAverageParams(AlgorithmParams):
    """Ring averaging: every ``every`` steps each model becomes the mean of itself and its ring neighbours'."""

    name: Literal["ring_average"] = "ring_average"
    every: PositiveInt = 4


class RingAverage(Algorithm):
    """After steps t with (t + 1) % every == 0: x_i <- mean of x_i and the models of ranks i - 1
    and i + 1 (one neighbour on 2 ranks), exchanged pairwise. Every exchange is posted before
    any is waited for, so the ring cannot deadlock."""

    name = "ring_average"

    def __init__(self, params: RingAverageParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        self.peers = sorted({(ctx.rank - 1) % ctx.size, (ctx.rank + 1) % ctx.size} - {ctx.rank})
        self.received = [torch.empty_like(ctx.params) for _ in self.peers]

    def after_step(self, t: int) -> None:
        if (t + 1) % self.params.every:
            return
        x = self.ctx.params
        handles = [self.ctx.comm.iexchange(x, buf, peer) for peer, buf in zip(self.peers, self.received)]
        for handle in handles:
            handle.wait()
        weight = 1.0 / (len(self.peers) + 1)
        x.mul_(weight)  # x is the send buffer: changed only once every exchange has completed
        for buf in self.received:
            x.add_(buf, alpha=weight)


def register_ring_average() -> None:
    """The one registration: what a project adding this algorithm would write."""
    register(NAME, RingAverageParams, RingAverage, label=LABEL, colour=COLOUR)


# Each rank is a process of its own: it registers the algorithm, then runs the harness in place.
DRIVER = """\
import sys
sys.path.insert(0, {tests!r})
import test_new_algorithm
test_new_algorithm.register_ring_average()
from harness.cli import main
sys.exit(main({argv!r}))
"""


@pytest.fixture(scope="module")
def registered():
    register_ring_average()
    try:
        yield
    finally:
        unregister(NAME)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The scenario file and a calibration of 3 ranks with this workload's compute time."""
    root = tmp_path_factory.mktemp("new_algorithm")
    (root / "scenario.yaml").write_text(yaml.safe_dump(SCENARIO))
    save_test_calibration(root / "calibration.json", RANKS, [("logreg", "digits", 16, 0.002)])
    return root


@pytest.fixture(scope="module")
def real_run(workdir) -> Path:
    """``mpiexec -n 3`` ranks that each register the algorithm and run the scenario in place."""
    argv = ["run", str(workdir / "scenario.yaml"), "--out", str(workdir / "out")]
    code = DRIVER.format(tests=str(Path(__file__).resolve().parent), argv=argv)
    try:
        proc = run_ranks(RANKS, [sys.executable, "-c", code], timeout=180, capture=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run of {NAME} on {RANKS} ranks did not finish in 180 s")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (run,) = (workdir / "out" / SCENARIO["name"]).iterdir()
    return run


def expected_bytes(ranks: int) -> list[int]:
    """bytes_sent per iteration of one rank: the model to each distinct neighbour on sync steps."""
    neighbours = len({-1 % ranks, 1 % ranks} - {0})
    return [neighbours * LOGREG_DIGITS_FLOATS * FLOAT_BYTES if (t + 1) % EVERY == 0 else 0
            for t in range(ITERATIONS)]


def assert_bytes_per_iteration(steps: pd.DataFrame, ranks: int) -> None:
    assert set(steps["algorithm"]) == {NAME}
    assert sorted(steps["rank"].unique()) == list(range(ranks))
    for rank, mine in steps.groupby("rank"):
        assert mine.sort_values("iteration")["bytes_sent"].tolist() == expected_bytes(ranks), rank


@pytest.mark.mpi
def test_real_run_trains_it_and_records_its_traffic(real_run):
    meta = json.loads((real_run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["finished_algorithms"] == [NAME]
    assert_bytes_per_iteration(pd.read_csv(real_run / "steps.csv"), RANKS)
    ops = pd.read_csv(real_run / "comm_ops.csv")
    exchanges = ops[ops["op"] == "exchange"]
    assert len(exchanges) == RANKS * 2 * (ITERATIONS // EVERY)  # two neighbours per rank per sync step
    assert (exchanges["bytes"] == LOGREG_DIGITS_FLOATS * FLOAT_BYTES).all()
    # The last step averages: on 3 ranks every rank's neighbours are the two others, so all
    # ranks end with the mean of the three models (up to the order of the float additions).
    finals = torch.load(real_run / "provenance" / f"final_models_{NAME}.pt")
    initial = torch.load(real_run / "provenance" / "initial_model.pt")
    assert finals.shape == (RANKS, LOGREG_DIGITS_FLOATS)
    assert torch.allclose(finals[0], finals[1], atol=1e-6) and torch.allclose(finals[0], finals[2], atol=1e-6)
    assert not torch.allclose(finals[0], initial)
    summary = pd.read_csv(real_run / "summary.csv")
    assert summary["algorithm"].tolist() == [NAME] and bool(summary["complete"].iloc[0])


@pytest.mark.parametrize("ranks", [RANKS, 2])
def test_simulate_runs_its_own_hooks(registered, workdir, ranks, capsys):
    from harness.cli import main

    out = workdir / f"sim-{ranks}"
    assert main(["simulate", str(workdir / "scenario.yaml"), "--ranks", str(ranks), "--out", str(out),
                 "--calibration", str(workdir / "calibration.json")]) == 0, capsys.readouterr().err
    (run,) = (out / SCENARIO["name"]).iterdir()
    assert json.loads((run / "run.json").read_text())["finished_algorithms"] == [NAME]
    assert_bytes_per_iteration(pd.read_csv(run / "steps.csv"), ranks)


@pytest.mark.mpi
def test_compare_and_figures_take_it(registered, real_run, workdir, capsys):
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from harness.cli import main
    from harness.report import style
    from harness.sim.compare import comparison_figure
    from paper_figs import fig5_real_vs_sim

    assert main(["compare", str(real_run), "--calibration", str(workdir / "calibration.json")]) == 0, \
        capsys.readouterr().err
    table = pd.read_csv(real_run / "compare.csv")
    assert sorted(zip(table["algorithm"], table["mode"])) == [(NAME, "predictive"), (NAME, "trace")]
    assert (table["predicted_samples_per_s"] > 0).all()
    assert_bytes_per_iteration(RunDirectory.open(real_run / "sim-trace").steps, RANKS)
    assert (real_run / "compare.png").is_file()

    assert (style.label(NAME), style.color(NAME)) == (LABEL, COLOUR)
    fig = comparison_figure(table, "compare")
    legend = {h.get_label(): h.get_color() for h in fig.axes[0].get_legend().legend_handles
              if isinstance(h, Line2D)}
    plt.close(fig)
    assert legend[LABEL] == COLOUR
    fig, data = fig5_real_vs_sim.draw({"newalgo": real_run})
    plt.close(fig)
    assert set(data["algorithm"]) == {NAME} and set(data["mode"]) == {"trace", "predictive"}


def test_its_parameter_is_validated(registered, workdir, capsys):
    from harness.cli import main

    bad = workdir / "bad.yaml"
    bad.write_text(yaml.safe_dump({**SCENARIO, "algorithms": [{"name": NAME, "every": 0}]}))
    assert main(["validate", str(bad)]) == 2
    assert "algorithms[0].every: must be >= 1 (got 0)" in capsys.readouterr().err
