"""The low-communication family: DiLoCo, Streaming DiLoCo, quorum DiLoCo, SlowMo, Gossip-PGA.

Three kinds of proof:

* ``tests/mpi/low_communication_checks.py`` drives each algorithm hook by hook under mpiexec at
  3 and 4 ranks with a synthetic local step: the reductions bit for bit (SlowMo to Local SGD and
  to BMUF, Gossip-PGA to Local SGD, Streaming DiLoCo to DiLoCo), DiLoCo and Streaming DiLoCo
  against their rules replayed in float64, quorum DiLoCo's exact accounting with a late rank.
* The outer optimizer against ``torch.optim.SGD`` with Nesterov momentum.
* End to end: ``python -m harness run`` trains DiLoCo with AdamW inside, and an independent
  serial DiLoCo in the style of torchft's (one ``torch.optim.AdamW`` per worker, the outer step
  by ``torch.optim.SGD(nesterov=True)`` with the averaged pseudo-gradient as ``.grad``),
  replayed on the run's provenance (initial model, shards, batch order), ends at the same models.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import harness_cli, mpi_check_suite, run_scenario
from harness.algorithms.outer import OuterNesterov
from harness.algorithms.streaming_diloco import fragment_bounds, round_to
from harness.workload import batch_indices, build_model, flat_params, load_dataset

RANK_COUNTS = (3, 4)


# -- hook-level checks under mpiexec --------------------------------------------------------------


TestLowCommunicationChecks = mpi_check_suite("low_communication_checks.py", RANK_COUNTS, checks=10, timeout=280)


# -- pieces ----------------------------------------------------------------------------------------


def test_outer_step_is_torch_sgd_with_nesterov_momentum():
    torch.manual_seed(0)
    theta = torch.randn(1000)
    reference = theta.clone().requires_grad_(True)
    sgd = torch.optim.SGD([reference], lr=0.7, momentum=0.9, nesterov=True, foreach=False)
    outer = OuterNesterov(0.7, 0.9, theta)
    for _ in range(5):
        delta = torch.randn(1000)
        reference.grad = delta.clone()
        sgd.step()
        outer.step(theta, delta.clone())
        assert torch.equal(theta, reference.detach())


def test_outer_step_by_fragments_is_the_whole_step():
    torch.manual_seed(1)
    whole, parts = torch.randn(10), None
    parts = whole.clone()
    a, b = OuterNesterov(0.5, 0.8, whole), OuterNesterov(0.5, 0.8, parts)
    for _ in range(3):
        delta = torch.randn(10)
        a.step(whole, delta.clone())
        for s in fragment_bounds(10, 3):
            b.step(parts[s], delta[s].clone(), s)
    assert torch.equal(whole, parts)


def test_fragments_cover_the_model_once():
    for count, fragments in ((10, 3), (7, 7), (118_282, 4)):
        bounds = fragment_bounds(count, fragments)
        covered = [i for s in bounds for i in range(count)[s]]
        assert covered == list(range(count))
        assert max(s.stop - s.start for s in bounds) - min(s.stop - s.start for s in bounds) <= 1


@pytest.mark.parametrize("precision, dtype", [("bfloat16", torch.bfloat16), ("float8_e4m3", torch.float8_e4m3fn)])
def test_low_precision_rounds_values_and_keeps_float32(precision, dtype):
    x = torch.tensor([1.0 + 2**-12, -3.3, 1000.0, 1e-3])
    y = x.clone()
    round_to(y, precision)
    assert y.dtype == torch.float32
    assert torch.equal(y, x.clamp(-448, 448).to(dtype).float() if dtype is torch.float8_e4m3fn else x.to(dtype).float())
    assert not torch.equal(x, y)


# -- end to end: DiLoCo against a serial torchft-style replay -------------------------------------

RANKS, ITERS, BATCH, SEED, H = 3, 10, 8, 17, 4
ADAMW = {"name": "adamw", "lr": 0.01, "weight_decay": 0.01}
E2E = {
    "name": "diloco_replay", "ranks": RANKS, "seed": SEED,
    "workload": {"model": "logreg", "dataset": "digits", "batch_size": BATCH, "iterations": ITERS,
                 "eval_every": ITERS},
    "results": {"provenance": "full"},
    "algorithms": [
        {"name": "diloco", "inner_steps": H, "optimizer": ADAMW},
        {"name": "streaming_diloco", "inner_steps": H, "fragments": 2, "overlap": 1},
        {"name": "quorum_diloco", "inner_steps": H, "quorum": 0.5},
        {"name": "slowmo", "base": "sgp", "period": 3},
        {"name": "gossip_pga", "period": 3},
    ],
    "imbalance": [{"kind": "random_ranks", "count": 1, "delay_ms": 20}],
}


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    return run_scenario(tmp_path_factory.mktemp("diloco_replay"), E2E)


def torchft_style_diloco(run_dir) -> list[torch.Tensor]:
    """DiLoCo written the way torchft writes it, one worker after the other in this process."""
    data = load_dataset("digits", SEED)
    start = torch.load(run_dir / "provenance" / "initial_model.pt")
    shards = np.load(run_dir / "provenance" / "shards.npz")
    workers = [build_model("logreg", tuple(data.input_shape), data.num_classes, SEED) for _ in range(RANKS)]
    inner = []
    for model in workers:
        flat_params(model).copy_(start)
        inner.append(torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"], weight_decay=ADAMW["weight_decay"]))
    global_model = build_model("logreg", tuple(data.input_shape), data.num_classes, SEED)
    flat_params(global_model).copy_(start)
    outer = torch.optim.SGD(global_model.parameters(), lr=0.7, momentum=0.9, nesterov=True)

    def outer_step():
        for p_global, *p_workers in zip(global_model.parameters(), *(w.parameters() for w in workers)):
            p_global.grad = torch.stack([p_global.detach() - p.detach() for p in p_workers]).mean(0)
        outer.step()
        for model in workers:
            flat_params(model).copy_(flat_params(global_model))

    for t in range(ITERS):
        for r, (model, opt) in enumerate(zip(workers, inner)):
            idx = batch_indices(shards[f"rank{r}"], BATCH, t, SEED, r)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
            opt.step()
        if (t + 1) % H == 0:
            outer_step()
    if ITERS % H:
        outer_step()  # the harness's finish(): leftover inner steps get their outer step
    return [flat_params(w).detach().clone() for w in workers]


@pytest.mark.mpi
def test_diloco_equals_a_torchft_style_serial_replay_of_its_provenance(e2e):
    torch.set_num_threads(1)
    finals = torch.load(e2e / "provenance" / "final_models_diloco.pt")
    for r, want in enumerate(torchft_style_diloco(e2e)):
        torch.testing.assert_close(finals[r], want, rtol=1e-4, atol=1e-5)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["diloco", "quorum_diloco", "slowmo"])
def test_outer_methods_end_with_one_model(e2e, algorithm):
    # DiLoCo and quorum DiLoCo end with an outer step; SlowMo's 10th step is no slow step, but
    # push-sum's de-biased models still differ: only the first two are one model at the end.
    finals = torch.load(e2e / "provenance" / f"final_models_{algorithm}.pt")
    same = all(torch.equal(finals[0], finals[r]) for r in range(1, RANKS))
    assert same == (algorithm != "slowmo")


@pytest.mark.mpi
def test_every_new_algorithm_records_its_staleness(e2e):
    import pandas as pd

    steps = pd.read_csv(e2e / "steps.csv")
    outer = steps[(steps.algorithm == "diloco") & ((steps.iteration + 1) % H == 0)]
    assert (outer.staleness == 0).all() and (steps[(steps.algorithm == "diloco") & ~steps.index.isin(outer.index)]
                                             .staleness == -1).all()
    streaming = steps[steps.algorithm == "streaming_diloco"]
    assert set(streaming.staleness) == {-1, 1}  # 1: the overlap, at iterations that merge a fragment
    quorum = steps[(steps.algorithm == "quorum_diloco") & ((steps.iteration + 1) % H == 0)]
    assert (quorum.staleness >= 0).all()
    assert set(steps[steps.algorithm == "gossip_pga"].staleness) == {-1}


# -- convergence, CI-sized -------------------------------------------------------------------------

CONVERGENCE = ["allreduce_sgd", "diloco", "streaming_diloco", "quorum_diloco", "slowmo", "gossip_pga"]
CONVERGENCE_RUN = ["--ranks", "4", "--iterations", "150", "--provenance", "none"]
# Quorum DiLoCo's rounds depend on who arrives first, so its accuracy depends on the load (89.3-91.9%
# alone, 88.1% beside another test's ranks): its check is coarse, catching a broken method (with
# DiLoCo's outer momentum 0.9 instead of its 0.5 it ended at 64.1% against Allreduce-SGD's 93.1%
# in this run), not a loaded machine. Its exact accounting is checked hook by hook, without timing, above.
QUORUM_DILOCO_ALLOWED = 0.08


def _final_accuracy(out):
    """The final accuracy of each algorithm of the one run under ``out`` (a pandas Series)."""
    import pandas as pd

    (run,) = (out / "convergence").iterdir()
    return pd.read_csv(run / "summary.csv").set_index("algorithm")["final_accuracy"]


@pytest.fixture(scope="module")
def convergence(tmp_path_factory):
    """``scenarios/convergence.yaml``'s entries for the family, on 4 ranks for 150 iterations (the
    full run, 8 ranks and 300 iterations, is in the README): their final accuracies."""
    out = tmp_path_factory.mktemp("convergence")
    proc = harness_cli("run", "scenarios/convergence.yaml", "--only", ",".join(CONVERGENCE), *CONVERGENCE_RUN,
                       "--out", str(out), timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _final_accuracy(out)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", [a for a in CONVERGENCE[1:] if a != "quorum_diloco"])
def test_trains_within_3_points_of_allreduce_sgd(convergence, algorithm):
    assert convergence[algorithm] >= convergence["allreduce_sgd"] - 0.03, convergence.to_dict()


@pytest.mark.mpi
def test_quorum_diloco_trains_within_8_points_of_allreduce_sgd(convergence):
    assert convergence["quorum_diloco"] >= convergence["allreduce_sgd"] - QUORUM_DILOCO_ALLOWED, convergence.to_dict()
