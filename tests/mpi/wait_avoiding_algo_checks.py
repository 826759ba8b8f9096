"""Multi-rank checks of the WAGMA-SGD and eager-SGD algorithms, run once per rank count under mpiexec.

Like comm_checks.py: each check runs on every rank; rank 0 writes ``{name: {"status", "detail"}}``
as JSON to the path on the command line (statuses ``pass``, ``fail``, ``skip``). Two kinds of
checks:

* fake context: the algorithm gets tiny torch tensors whose values the check sets before each
  round (rank j "holds model" f(j, k) = 1000 j + k + 1 in round k, f(j, -1) before round 0), so
  every expected number can be computed by hand from who was stale by how much;
* real loop: ``harness.runner.loop.train`` on digits / logreg, exactly as a run does, compared
  with another algorithm or with a serial reference of the spec that simulates every rank.

    mpiexec -n 4 python tests/mpi/wait_avoiding_algo_checks.py report.json -v
"""

from __future__ import annotations

import hashlib
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

from checklib import Checks, Skip, run_checks
from harness.algorithms.allreduce_sgd import AllreduceSGD
from harness.algorithms.base import AlgorithmContext
from harness.algorithms.eager_sgd import EagerSGD
from harness.algorithms.local_sgd import LocalSGD
from harness.algorithms.params import AllreduceSGDParams, EagerSGDParams, LocalSGDParams, WAGMAParams
from harness.algorithms.wagma import WAGMA
from harness.comm import Communicator
from harness.injection import InjectionPlan
from harness.runner.local_work import LocalWork
from harness.runner.loop import train
from harness.runner.workload_state import build_state
from harness.scenario import scenario_from_dict
from harness.schedules import is_sync_round, wagma_phases
from harness.workload import configure_torch_threads, load_dataset

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
SLOW = SIZE - 1  # the late rank of the fake-context checks
CHECKS = check = Checks()
# 6 ranks with S = 4 give groups of 3, then 2 (mixed radix); fewer ranks use S = 2.
GROUP_SIZE = 4 if SIZE >= 6 else min(2, SIZE)
EVAL_COMM: Communicator | None = None





def same_on_all_ranks(t: torch.Tensor) -> bool:
    digests = WORLD.allgather(hashlib.sha1(t.numpy().tobytes()).hexdigest())
    return len(set(digests)) == 1


def f(rank: int, k: int) -> float:
    """The model rank ``rank`` holds (and publishes) in round k; k = -1: before round 0."""
    return 1000.0 * rank + k + 1


# -- fake context --------------------------------------------------------------------------------

def fake_context(comm: Communicator, n: int, value: float, lr: float) -> tuple[AlgorithmContext, torch.optim.SGD]:
    """Flat params / grads with one torch Parameter viewing them, and a plain SGD (no momentum) on them."""
    params = torch.full((n,), value, dtype=torch.float32)
    grads = torch.zeros(n, dtype=torch.float32)
    weight = torch.nn.Parameter(params)  # shares params' memory, as the model's parameters do
    weight.grad = grads
    opt = torch.optim.SGD([weight], lr=lr, momentum=0.0)
    return AlgorithmContext(comm, params, grads, lr, seed=5), opt


_FAKE_WAGMA: dict = {}


def fake_wagma_run(comm: Communicator) -> dict:
    """WAGMA over a fake context, rank SLOW sleeping before every round; cached across checks."""
    if _FAKE_WAGMA:
        return _FAKE_WAGMA
    n, rounds, period, lr, sleep_s = 5, 8, 4, 0.5, 0.12
    ctx, opt = fake_context(comm, n, f(RANK, -1), lr)
    algo = WAGMA(WAGMAParams(group_size=GROUP_SIZE, period=period), ctx)
    comm.barrier()
    infos, averaged, stepped, grads = [], [], [], []
    for k in range(rounds):
        if RANK == SLOW and SIZE > 1:
            time.sleep(sleep_s)
        ctx.params.fill_(f(RANK, k))
        ctx.grads.fill_(RANK + k + 1.0)  # "computed at" f(RANK, k)
        algo.after_backward(k)
        averaged.append(ctx.params.clone())
        opt.step()  # what the loop does next
        stepped.append(ctx.params.clone())
        grads.append(RANK + k + 1.0)
        infos.append(dict(algo.info, algo_staleness=algo.staleness))
    algo.finish()
    _FAKE_WAGMA.update(infos=infos, averaged=averaged, stepped=stepped, grads=grads, lr=lr,
                       sync_every=period, all_infos=WORLD.allgather(infos))
    return _FAKE_WAGMA


@check
def wagma_round_with_late_member_follows_the_rule(comm: Communicator) -> str | None:
    """Proof 2: (stale group sum + fresh own model) / (S + 1), then the step with the pre-average gradient."""
    run = fake_wagma_run(comm)
    phases = wagma_phases(RANK, SIZE, GROUP_SIZE)
    all_infos = run["all_infos"]
    for k, info in enumerate(run["infos"]):
        sync = is_sync_round(k, run["sync_every"])
        members = list(range(SIZE)) if sync else phases[k % len(phases)]
        assert info["round"] == k and info["sync"] == sync, info
        assert info["group_size"] == len(members), (k, info, members)
        assert info["algo_staleness"] == info["staleness"]
        # What member j contributed: the model it had published `staleness` rounds earlier.
        contributed = [f(j, k - all_infos[j][k]["staleness"]) for j in members]
        if sync:
            assert all(all_infos[j][k]["staleness"] == 0 for j in range(SIZE)), f"stale buffer in sync round {k}"
            want = np.float32(sum(contributed) / SIZE)
        else:
            want = np.float32((sum(contributed) + f(RANK, k)) / (len(members) + 1))
        got = run["averaged"][k].numpy()
        assert np.all(got == want), f"round {k}: averaged {got[0]!r}, rule gives {want!r} from {contributed}"
        step = np.float32(np.float64(want) - run["lr"] * run["grads"][k])
        assert np.all(run["stepped"][k].numpy() == step), f"round {k}: stepped {run['stepped'][k][0]}, want {step}"
    if SIZE > 1:
        # The late path was exercised: the slow rank's progress thread contributed a stale model
        # to a group round (all ranks see the same all_infos, so all agree).
        late = [k for k, i in enumerate(all_infos[SLOW]) if i["joined_early"] and i["staleness"] > 0]
        assert late, "rank SLOW was never late: the check did not exercise the late path"
        assert not any(all_infos[SLOW][k]["sync"] for k in late)
        return f"rank {SLOW} contributed stale models in rounds {late}"


@check
def wagma_models_identical_after_every_sync_round(comm: Communicator) -> None:
    """Proof 3 (fake context): after a synchronous round every rank holds the same model."""
    run = fake_wagma_run(comm)
    syncs = [k for k, info in enumerate(run["infos"]) if info["sync"]]
    assert syncs, "no sync round"
    for k in syncs:
        assert same_on_all_ranks(run["averaged"][k]), f"models differ after sync round {k}"


# -- real loop -----------------------------------------------------------------------------------

_DATA: dict = {}


def scenario(iterations: int, **optimizer):
    return scenario_from_dict({
        "name": "wa_checks", "ranks": SIZE, "seed": 11,
        "workload": {"model": "logreg", "dataset": "digits", "batch_size": 16, "iterations": iterations,
                     "eval_every": iterations},
        "optimizer": {"lr": 0.1, **optimizer},
        "algorithms": ["allreduce_sgd"],
    })


def dataset():
    if "digits" not in _DATA:
        _DATA["digits"] = load_dataset("digits", 11)
    return _DATA["digits"]


def run_loop(comm: Communicator, cls, params, sc, wrap=None):
    """One algorithm through the real training loop; returns (algorithm, final flat model)."""
    state = build_state(sc, RANK, dataset())
    ctx = AlgorithmContext(comm, state.params, state.grads, sc.optimizer.lr, sc.seed)
    algo = cls(params, ctx)
    if wrap is not None:
        wrap(algo)
    comm.barrier()
    train(sc, algo, comm, LocalWork(sc, state, RANK, InjectionPlan.from_scenario(sc), EVAL_COMM, algo.name), time.monotonic())
    return algo, algo.eval_params().detach().clone()


def world_mean(t: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.mean(WORLD.allgather(t.numpy()), axis=0, dtype=np.float64).astype(np.float32))


def serial_reference(sc, gradient_at: str) -> list[torch.Tensor]:
    """Every rank simulated in this process: per iteration x_i <- mean_j x_j, then OPT with g_i.

    ``gradient_at="own"``: g_i at rank i's pre-average model (WAGMA's rule, sync every round);
    ``"mean"``: g_i at the average, which is Local SGD with period 1 seen one average earlier.
    """
    w = sc.workload
    states = [build_state(sc, r, dataset()) for r in range(SIZE)]
    for t in range(w.iterations):
        mean = torch.stack([s.params for s in states]).double().mean(0).float()
        for r, s in enumerate(states):
            if gradient_at == "mean":
                s.params.copy_(mean)
            x, y = s.batch(t, w.batch_size, sc.seed, r)
            s.optimizer.zero_grad(set_to_none=False)
            torch.nn.functional.cross_entropy(s.model(x), y).backward()
            s.params.copy_(mean)
            s.optimizer.step()
    return [s.params.clone() for s in states]


TOL = {"rtol": 1e-5, "atol": 1e-6}


@check
def wagma_sync_every_round_vs_local_sgd_period_1(comm: Communicator) -> str | None:
    """Proof 1: WAGMA with every round synchronous (period 1) against Local SGD with period 1.

    WAGMA:     x_i <- OPT(mean_j x_j, g_i(x_i))        gradient at the rank's pre-average model
    Local SGD: y_i <- mean_j OPT(y_j, g_j(y_j))        average after the step
    Exact correspondence: both are "average, then step", differing only in where the gradient
    is evaluated (own pre-average model vs the average), so
      (a) after ONE iteration from the common initial model, the mean of the WAGMA models equals
          the Local SGD model, with any momentum and weight decay;
      (b) over T iterations, the real WAGMA run equals the serial reference with the gradient at
          the own model, and Local SGD equals the mean of the serial reference with the gradient
          at the mean (the reference stops before the last average);
      (c) and the two references differ after a few iterations: (a) does not extend beyond one
          iteration, since g_i(x_i) != g_i(mean x) once the models have diverged.
    """
    every_round = WAGMAParams(group_size=GROUP_SIZE, period=1)
    one, many = scenario(1), scenario(6)
    # Every collective first, every assertion after: a failure on one rank must not leave the
    # others waiting in a collective.
    _, wagma1 = run_loop(comm, WAGMA, every_round, one)
    _, local1 = run_loop(comm, LocalSGD, LocalSGDParams(period=1), one)
    wagma1_mean = world_mean(wagma1)
    wagma_algo, wagma = run_loop(comm, WAGMA, every_round, many)
    _, local = run_loop(comm, LocalSGD, LocalSGDParams(period=1), many)
    own = serial_reference(many, "own")
    at_mean = serial_reference(many, "mean")

    assert wagma_algo.sync_every == 1
    torch.testing.assert_close(wagma1_mean, local1, **TOL, msg="(a) one iteration")
    torch.testing.assert_close(wagma, own[RANK], **TOL, msg="(b) WAGMA vs the reference")
    mean_ref = torch.stack(at_mean).double().mean(0).float()
    torch.testing.assert_close(local, mean_ref, **TOL, msg="(b) Local SGD vs the reference")
    if SIZE > 1:
        gap = float((torch.stack(own).double().mean(0).float() - mean_ref).abs().max())
        assert gap > 100 * TOL["atol"], f"(c) the gradient point made no difference ({gap:.2e})"
        return (f"max |WAGMA - reference| {float((wagma - own[RANK]).abs().max()):.1e}, "
                f"max |Local SGD - reference| {float((local - mean_ref).abs().max()):.1e}, "
                f"gap between the references after 6 iterations {gap:.1e}")


@check
def wagma_models_identical_after_sync_rounds_in_the_loop(comm: Communicator) -> None:
    """Proof 3 (real loop): the averaged model right after every synchronous round is the same everywhere."""
    synced: list[torch.Tensor] = []

    def record(algo):
        inner = algo.after_backward

        def after_backward(t):
            inner(t)
            if algo.info["sync"]:
                synced.append(algo.ctx.params.clone())

        algo.after_backward = after_backward

    run_loop(comm, WAGMA, WAGMAParams(group_size=GROUP_SIZE, period=3), scenario(9), wrap=record)
    same = [same_on_all_ranks(model) for model in synced]  # the sync rounds are the same on every rank
    assert len(synced) == 3, f"expected sync rounds 2, 5, 8; saw {len(synced)}"
    assert all(same), f"models differ after sync rounds: {[3 * i + 2 for i, ok in enumerate(same) if not ok]}"


@check
def eager_sync_every_round_equals_allreduce_sgd(comm: Communicator) -> str | None:
    """eager-SGD with period 1 is Allreduce-SGD (sum of g/P vs mean of g: rounding only)."""
    sc = scenario(6)
    _, ar = run_loop(comm, AllreduceSGD, AllreduceSGDParams(), sc)
    eager = {mode: run_loop(comm, EagerSGD, EagerSGDParams(mode=mode, period=1), sc)[1]
             for mode in ("solo", "majority")}
    identical = {mode: same_on_all_ranks(model) for mode, model in eager.items()}
    for mode, model in eager.items():
        torch.testing.assert_close(model, ar, **TOL, msg=f"mode {mode}")
        assert identical[mode], f"mode {mode}: eager-SGD models differ across ranks"
    return ", ".join(f"{m}: max |eager - allreduce| {float((x - ar).abs().max()):.1e}" for m, x in eager.items())


@check
def eager_late_gradients_are_carried_not_lost(comm: Communicator) -> str | None:
    """Fake context, rank SLOW late every round, last round synchronous: every g_i/P is applied once.

    Rank j's gradient in round k is P * (j + k + 1), so g/P is an integer and sums are exact.
    Every rank applies the same sum each round (models stay identical).
    """
    if SIZE < 2:
        raise Skip("needs 2 ranks: one late")
    rounds, period = 9, 3
    outcomes = {}
    for mode in ("solo", "majority"):
        ctx, _ = fake_context(comm, 4, 0.0, 0.1)
        algo = EagerSGD(EagerSGDParams(mode=mode, period=period), ctx)
        comm.barrier()
        applied, infos = [], []
        for k in range(rounds):
            if RANK == SLOW:
                time.sleep(0.08)
            ctx.grads.fill_(SIZE * (RANK + k + 1.0))
            algo.after_backward(k)
            applied.append(ctx.grads.clone())
            infos.append(algo.info)
        algo.finish()
        outcomes[mode] = (applied, infos, [same_on_all_ranks(x) for x in applied],
                          WORLD.bcast([i["staleness"] for i in infos] if RANK == SLOW else None, root=SLOW))
    want = sum(j + k + 1.0 for j in range(SIZE) for k in range(rounds))
    for mode, (applied, infos, same, late) in outcomes.items():
        total = torch.stack(applied).double().sum(0)
        assert torch.all(total == want), f"{mode}: applied {total[0].item()}, published {want}"
        assert all(same), f"{mode}: rounds {[k for k, ok in enumerate(same) if not ok]} applied different sums"
        assert all(i["sync"] == is_sync_round(k, period) for k, i in enumerate(infos))
        if mode == "solo":
            assert max(late) > 0, f"solo: the late rank was never late ({late})"
    return "late rank's staleness per round: " + ", ".join(f"{m} {o[3]}" for m, o in outcomes.items())


def main(out_path: str) -> int:
    global EVAL_COMM
    configure_torch_threads(1)  # as the worker: deterministic, ranks outnumber cores
    comm = Communicator(WORLD)
    EVAL_COMM = Communicator(WORLD)
    only = [a for a in sys.argv[2:] if not a.startswith("-")]
    run_checks(CHECKS, out_path, WORLD, comm, only=only)
    EVAL_COMM.close()
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
