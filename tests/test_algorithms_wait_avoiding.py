"""WAGMA-SGD and eager-SGD: wiring, exact multi-rank rules, wait avoidance and training, end to end.

* Wiring (one process, a fake communicator): the schedules, buffers and flags each algorithm
  hands to ``Communicator.wait_avoiding``.
* Exact rules (``tests/mpi/wait_avoiding_algo_checks.py`` under mpiexec at 4 and 6 ranks, 2 and 3
  marked slow; 6 ranks with S = 4 is the mixed-radix case, groups of 3 then 2): a late member's
  stale model in the WAGMA group sum, identical models after every synchronous round, WAGMA
  with every round synchronous against Local SGD with period 1, eager-SGD against
  Allreduce-SGD, no late gradient lost.
* End to end (``python -m harness run``): fast ranks do not wait for a slow one; both train.
* Validation (``python -m harness validate``): impossible parameters exit 2; the old spelling
  ``sync_period`` still validates, with a note giving the ``period`` it stands for.
"""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest
import torch

from conftest import harness_cli as harness, mpi_check_suite, run_scenario
from conftest import write_scenario_file as write_scenario
from harness.algorithms import algorithm_class, params_model
from harness.algorithms.base import AlgorithmContext
from harness.algorithms.eager_sgd import EagerSGD
from harness.algorithms.params import EagerSGDParams, WAGMAParams
from harness.algorithms.wagma import WAGMA, wagma_average
from harness.schedules import majority_initiator, wagma_phases

CHECKS_SCRIPT = "wait_avoiding_algo_checks.py"


# -- the model rule and the wiring, in one process -------------------------------------------------

def test_wagma_average_by_hand():
    x = torch.tensor([1.0, -2.0])
    # Group of S = 2: the sum holds this rank's own published model and a (stale) peer's.
    out = wagma_average(torch.tensor([4.0, 1.0]), x, group_size=2, sync=False)
    assert out is x and x.tolist() == pytest.approx([(4.0 + 1.0) / 3, (1.0 - 2.0) / 3])
    y = torch.tensor([9.0])
    wagma_average(torch.tensor([12.0]), y, group_size=4, sync=True)  # sync: mean over all P = 4
    assert y.tolist() == [3.0]


class FakeOp:
    """Stands in for the native op: records what is published and returns a scripted sum."""

    def __init__(self, initial, phases, sync_every, accumulate):
        self.initial = initial.detach().clone().numpy()
        self.phases, self.sync_every, self.accumulate = phases, sync_every, accumulate
        self.published, self.may_activate = [], []
        self.closed = False
        self.next_sum = None
        self.next_info = {}

    def round(self, buf, out, may_activate=True):
        self.published.append(buf.detach().clone().numpy())
        self.may_activate.append(may_activate)
        k = len(self.published) - 1
        out[...] = torch.as_tensor(self.next_sum)
        return {"round": k, "sync": False, "group_size": 2, "staleness": 0, "joined_early": False,
                **self.next_info}

    def close(self):
        self.closed = True


class FakeComm:
    def __init__(self, rank, size):
        self.rank, self.size = rank, size
        self.op = None

    def wait_avoiding(self, initial, *, phases, sync_every, accumulate=False):
        self.op = FakeOp(initial, phases, sync_every, accumulate)
        return self.op


def fake_ctx(rank=1, size=4, n=3, seed=7):
    params = torch.arange(n, dtype=torch.float32) + 10 * rank
    grads = torch.full((n,), 4.0)
    return AlgorithmContext(FakeComm(rank, size), params, grads, 0.1, seed)


def test_registry_finds_both():
    assert algorithm_class("wagma") is WAGMA and params_model("wagma") is WAGMAParams
    assert algorithm_class("eager_sgd") is EagerSGD and params_model("eager_sgd") is EagerSGDParams


def test_wagma_wiring_publishes_the_pre_step_model_and_averages_in_place():
    ctx = fake_ctx(rank=5, size=8)
    algo = WAGMA(WAGMAParams(group_size=2, period=5), ctx)
    op = ctx.comm.op
    assert op.phases == wagma_phases(5, 8, 2) and op.sync_every == 5 and not op.accumulate
    assert np.array_equal(op.initial, ctx.params.numpy())
    before = ctx.params.clone()
    op.next_sum, op.next_info = [3.0, 3.0, 3.0], {"staleness": 2, "group_size": 2}
    algo.after_backward(0)
    assert np.array_equal(op.published[0], before.numpy())  # the model the gradient was computed at
    torch.testing.assert_close(ctx.params, (before + 3.0) / 3)  # emulated compute: no optimizer needed
    assert algo.staleness == 2 and algo.info["round"] == 0
    op.next_sum, op.next_info = [8.0, 8.0, 8.0], {"sync": True, "group_size": 8}
    algo.after_backward(1)
    assert ctx.params.tolist() == [1.0, 1.0, 1.0]
    algo.finish()
    assert op.closed


def test_wagma_refuses_a_skipped_round():
    ctx = fake_ctx()
    algo = WAGMA(WAGMAParams(group_size=2, period=5), ctx)
    ctx.comm.op.next_sum = [0.0, 0.0, 0.0]
    with pytest.raises(RuntimeError, match="iteration 3 ran round 0"):
        algo.after_backward(3)


@pytest.mark.parametrize("mode", ["solo", "majority"])
def test_eager_wiring_publishes_g_over_p_and_applies_the_sum(mode):
    size, seed = 4, 7
    flags = []
    for rank in range(size):
        ctx = fake_ctx(rank=rank, size=size, seed=seed)
        algo = EagerSGD(EagerSGDParams(mode=mode, period=5), ctx)
        op = ctx.comm.op
        assert op.accumulate and op.sync_every == 5 and op.phases == [[0, 1, 2, 3]]
        for t in range(12):
            ctx.grads.fill_(4.0)
            op.next_sum, op.next_info = [0.5, 1.5, 2.5], {"staleness": t % 2}
            algo.after_backward(t)
            assert op.published[t].tolist() == [1.0, 1.0, 1.0]  # g / P
            assert ctx.grads.tolist() == [0.5, 1.5, 2.5] and algo.staleness == t % 2
        algo.finish()
        assert op.closed
        flags.append(op.may_activate)
    if mode == "solo":
        assert all(all(f) for f in flags)
    else:  # exactly the shared initiator of each round may trigger it
        for t in range(12):
            assert [flags[r][t] for r in range(size)] == [r == majority_initiator(seed, t, size) for r in range(size)]


# -- exact rules under mpiexec --------------------------------------------------------------------

TestWaitAvoidingAlgoChecks = mpi_check_suite(CHECKS_SCRIPT, (4, 6), slow_ranks=(2, 3), checks=6, timeout=280)


# -- end to end ------------------------------------------------------------------------------------

WORKLOAD = {"model": "logreg", "dataset": "digits", "batch_size": 16}
DELAY_S, SLOW_RANK = 0.2, 2


@pytest.fixture(scope="module")
def imbalanced_run(tmp_path_factory):
    return run_scenario(tmp_path_factory.mktemp("imbalance"), {
        "name": "wa_imbalance", "ranks": 4, "seed": 5,
        "workload": {**WORKLOAD, "iterations": 20, "eval_every": 20},
        "algorithms": ["allreduce_sgd", {"name": "wagma", "group_size": 2, "period": 11},
                       {"name": "eager_sgd", "mode": "solo", "period": 10}],
        "imbalance": [{"kind": "fixed", "ranks": [SLOW_RANK], "delay_ms": int(DELAY_S * 1000)}],
    })


def fast_median(steps: pd.DataFrame, algorithm: str) -> float:
    fast = steps[(steps.algorithm == algorithm) & (steps["rank"] != SLOW_RANK)]
    return float((fast.end_s - fast.start_s).median())


@pytest.mark.mpi
def test_allreduce_fast_ranks_wait_for_the_slow_one(imbalanced_run):
    steps = pd.read_csv(imbalanced_run / "steps.csv")
    assert fast_median(steps, "allreduce_sgd") >= 0.8 * DELAY_S


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["wagma", "eager_sgd"])
def test_wait_avoiding_fast_ranks_do_not_wait(imbalanced_run, algorithm):
    steps = pd.read_csv(imbalanced_run / "steps.csv")
    ours = steps[steps.algorithm == algorithm]
    slow = ours[ours["rank"] == SLOW_RANK]
    assert np.allclose(slow.injected_delay_s, DELAY_S)
    # Measured against the slow rank's own iterations in the same run (a slower machine slows
    # both): lockstep would make them as long; not waiting leaves them shorter by about the delay.
    median, slow_median = fast_median(steps, algorithm), float((slow.end_s - slow.start_s).median())
    assert median < slow_median - 0.5 * DELAY_S, \
        f"fast ranks' median iteration {median:.3f} s, the slow rank's {slow_median:.3f} s ({DELAY_S} s delay)"
    # The slow rank was left behind: its progress thread contributed stale buffers for it.
    assert slow.staleness.max() >= 1, slow.staleness.tolist()


@pytest.fixture(scope="module")
def training_run(tmp_path_factory):
    return run_scenario(tmp_path_factory.mktemp("train"), {
        "name": "wa_train", "ranks": 4, "seed": 3,
        "workload": {**WORKLOAD, "iterations": 60, "eval_every": 30},
        "optimizer": {"lr": 0.05},
        "algorithms": ["allreduce_sgd", {"name": "wagma", "group_size": 2, "period": 11},
                       {"name": "eager_sgd", "mode": "solo", "period": 10}],
    })


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["wagma", "eager_sgd"])
def test_trains_like_allreduce_sgd(training_run, algorithm):
    evals = pd.read_csv(training_run / "evals.csv")
    final = evals[(evals.iteration == 60) & (evals.model == "average")].set_index("algorithm").test_accuracy
    assert final[algorithm] > 0.80, final.to_dict()
    assert final[algorithm] >= final["allreduce_sgd"] - 0.05, final.to_dict()
    steps = pd.read_csv(training_run / "steps.csv")
    assert (steps[steps.algorithm == algorithm].staleness >= 0).all()


@pytest.mark.mpi
def test_eager_models_stay_identical(training_run):
    finals = torch.load(training_run / "provenance" / "final_models_eager_sgd.pt")
    assert finals.shape[0] == 4 and all(torch.equal(finals[0], f) for f in finals[1:])


# -- validation --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "entry, message",
    [
        ({"name": "wagma", "group_size": 8}, "algorithms[0].group_size: must be <= ranks (4) (got 8)"),
        ({"name": "wagma", "group_size": 1}, "algorithms[0].group_size: must be >= 2 when ranks > 1"),
        ({"name": "wagma", "period": 0}, "algorithms[0].period: must be >= 1 (got 0)"),
        ({"name": "wagma", "groups": 2}, "algorithms[0].groups: unknown key"),
        ({"name": "wagma", "sync_period": 10, "period": 11}, "algorithms[0].sync_period: give period only"),
        ({"name": "eager_sgd", "mode": "bogus"}, "algorithms[0].mode: must be 'solo' or 'majority' (got 'bogus')"),
        ({"name": "eager_sgd", "period": 0}, "algorithms[0].period: must be >= 1 (got 0)"),
        ({"name": "eager_sgd", "sync_period": 0}, "algorithms[0].sync_period: must be an integer >= 1 (got 0)"),
    ],
)
@pytest.mark.subprocess
def test_bad_params_exit_2(tmp_path, entry, message):
    path = write_scenario(tmp_path, {"name": "bad", "ranks": 4, "workload": {**WORKLOAD, "iterations": 4},
                                     "algorithms": [entry]})
    proc = harness("validate", str(path), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and proc.stderr.startswith("error:")


@pytest.mark.subprocess
def test_good_params_validate(tmp_path):
    path = write_scenario(tmp_path, {"name": "good", "ranks": 6, "workload": {**WORKLOAD, "iterations": 4},
                                     "algorithms": [{"name": "wagma", "group_size": 4},
                                                    {"name": "eager_sgd", "mode": "majority"}]})
    proc = harness("validate", str(path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "wagma group_size=4 period=11" in proc.stdout


@pytest.mark.subprocess
def test_old_sync_period_spelling_validates_with_a_note(tmp_path):
    path = write_scenario(tmp_path, {"name": "old", "ranks": 4, "workload": {**WORKLOAD, "iterations": 4},
                                     "algorithms": [{"name": "wagma", "group_size": 2, "sync_period": 10},
                                                    {"name": "eager_sgd", "sync_period": 33}]})
    proc = harness("validate", str(path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    # The same schedules: WAGMA's sync_period counted the group rounds between two global ones.
    assert "wagma group_size=2 period=11" in proc.stdout and "eager_sgd mode=solo period=33" in proc.stdout
    assert proc.stderr.splitlines() == [
        f"note: {path}: wagma: sync_period: 10 is the old spelling of period: 11 (a synchronous round every "
        "11 rounds); write period: 11",
        f"note: {path}: eager_sgd: sync_period: 33 is the old spelling of period: 33 (a synchronous round "
        "every 33 rounds); write period: 33",
    ]
