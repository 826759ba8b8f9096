"""harness.api inside a plain PyTorch loop, on every rank of one launch (any rank count).

Usage (tests/test_api.py): mpiexec -n P python tests/mpi/api_checks.py REPORT.json [-v]
Each check opens its own Run (results under a temporary directory) and closes it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from mpi4py import MPI

from checklib import Checks, Skip, run_checks
from harness.api import DistributedOptimizer, Run, ScriptError
from harness.scenario import ScenarioError

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
# The runs' results beside the report (in the test's own temporary directory, which pytest removes).
OUT = Path(sys.argv[1]).resolve().parent / "api-checks-runs"
if RANK == 0:
    OUT.mkdir(exist_ok=True)
WORLD.Barrier()
CHECKS = check = Checks()

X = torch.randn(256, 12, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] + X[:, 1] > 0).long()


def net(width: int = 16) -> torch.nn.Module:
    torch.manual_seed(100 + RANK)  # a different initial model on every rank: the wrapper broadcasts rank 0's
    return torch.nn.Sequential(torch.nn.Linear(12, width), torch.nn.BatchNorm1d(width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 2))


def batch(t: int, size: int = 16):
    g = torch.Generator().manual_seed(1000 * RANK + t)
    idx = torch.randint(0, len(Y), (size,), generator=g)
    return X[idx], Y[idx]


def train(opt, model, steps: int, clip: float | None = None, sync: bool = False, schedule=None) -> list[float]:
    """Train ``steps`` steps; the learning rate of each step."""
    lrs = []
    for t in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        x, y = batch(t)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if sync:
            opt.synchronize()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step(loss=loss)
        if schedule is not None:
            schedule.step()
    return lrs


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_everywhere(tensor: torch.Tensor) -> bool:
    everyone = WORLD.allgather(tensor.numpy().copy())
    return all((e == everyone[0]).all() for e in everyone)


def expect_error(fn, *words: str) -> str:
    try:
        fn()
    except (ScriptError, ScenarioError) as exc:
        text = str(exc)
        missing = [w for w in words if w not in text]
        assert not missing, f"error {text!r} lacks {missing}"
        return text
    raise AssertionError(f"no error (expected one saying {words})")


def open_run(name: str, algorithm: str = "allreduce_sgd", iterations: int = 6, **kw) -> Run:
    return Run(algorithm=algorithm, iterations=iterations, batch_size=16, name=name, out=OUT, **kw)


@check
def allreduce_keeps_one_model_with_adamw_schedule_clipping():
    with open_run("allreduce") as run:
        model = net()
        opt = DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2), model)
        assert same_everywhere(flat(model)), "rank 0's initial model was not broadcast"
        buffers = [b.clone() for b in model.buffers() if b.is_floating_point()]
        assert all(same_everywhere(b) for b in buffers), "rank 0's buffers were not broadcast"
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=run.iterations)
        lrs = train(opt, model, run.iterations, clip=0.5, sync=True, schedule=schedule)
        assert same_everywhere(flat(model)), "Allreduce-SGD left the ranks with different models"
        assert opt.param_groups[0]["lr"] < 1e-3, "the scheduler did not reach the wrapped optimizer"
        assert opt.ctx.lr == lrs[-1] < lrs[0], "the algorithms' ctx.lr does not follow the schedule"
        if SIZE > 1:
            running = [b for b in model.buffers() if b.is_floating_point()][0]
            spread = WORLD.allgather(float(running.sum()))
            assert len(set(spread)) > 1, "BatchNorm statistics were averaged; they must stay local"
        opt.evaluate(lambda m: (0.5, 0.75))
        path = run.path
    if RANK == 0:
        steps = pd.read_csv(path / "steps.csv")
        assert len(steps) == SIZE * 6 and steps["loss"].notna().all(), steps
        if SIZE > 1:  # one allreduce of the gradient per step: synchronize() did not make step() send again
            assert steps.groupby("rank")["bytes_sent"].nunique().eq(1).all(), steps
            ops = pd.read_csv(path / "comm_ops.csv")
            assert ops.groupby("rank")["op"].count().eq(6).all(), ops
        evals = pd.read_csv(path / "evals.csv")
        assert set(evals["model"]) == {"average", "rank0"} and (evals["test_accuracy"] == 0.75).all(), evals
        assert (path / "trace.json").is_file() and (path / "summary.csv").is_file()
    return f"models equal on {SIZE} ranks"


@check
def staged_like_a_gpu_run_gives_the_same_model():
    """The device path (host staging of the flat buffers) on the CPU: bit for bit the unstaged run."""
    finals = []
    for staged in ("0", "1"):
        os.environ["HARNESS_STAGE_ON_CPU"] = staged
        try:
            with open_run(f"staged{staged}", algorithm="local_sgd", period=2) as run:
                model = net()
                opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model)
                assert opt.staging.staged == (staged == "1")
                train(opt, model, run.iterations)
            finals.append(flat(model))
        finally:
            os.environ.pop("HARNESS_STAGE_ON_CPU")
    assert torch.equal(finals[0], finals[1]), (finals[0] - finals[1]).abs().max()


@check
def a_scripts_iterations_pay_the_local_costs():
    """workload.node and workload.staging reach a user's loop: every iteration sleeps
    harness.local_costs' time (here two copies of 50 ms latency each: 0.1 s) on top of its own
    work, recorded in steps.csv (a lower bound load cannot break)."""
    doc = {"name": "costs", "ranks": SIZE, "workload": {"batch_size": 16, "iterations": 3,
                                                         "staging": {"bandwidth_gbps": 1e6, "latency_us": 50_000}},
           "algorithms": ["allreduce_sgd"]}
    with Run(doc, out=OUT) as run:
        model = net()
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        assert opt._overhead_s >= 0.1
        train(opt, model, run.iterations)
        path = run.path
    if RANK == 0:
        steps = pd.read_csv(path / "steps.csv")
        assert ((steps["end_s"] - steps["start_s"]) >= 0.1).all(), steps


@check
def gossip_finish_leaves_the_deployable_model():
    with open_run("sgp", algorithm="sgp") as run:
        model = net()
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model)
        train(opt, model, run.iterations)
        opt.finish()
        assert torch.equal(flat(model), opt.algorithm.eval_params().reshape(-1)), "the model is not the de-biased one"


@check
def mistakes_are_named():
    with open_run("mistakes") as run:
        model = net()
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
        opt = DistributedOptimizer(inner, model)
        expect_error(lambda: DistributedOptimizer(opt, model), "already", "wrap it once")
        expect_error(lambda: DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model), "already")
        expect_error(lambda: Run(algorithm="sgp", iterations=2, batch_size=1), "already open")
        expect_error(opt.step, "without a forward pass")
        x, y = batch(0)
        F.cross_entropy(model(x), y)  # forward, no backward
        expect_error(opt.step, "without a backward pass", "loss.backward()")
        expect_error(lambda: opt.evaluate(lambda m: (0, 0)), "inside iteration")
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()  # now fine
        assert run.optimizer is opt
    expect_error(lambda: DistributedOptimizer(torch.optim.SGD(net().parameters(), lr=0.1), net()), "no harness.api.Run")
    expect_error(lambda: Run(iterations=2, batch_size=1), "algorithm=")


@check
def optimizer_must_cover_the_model():
    with open_run("cover"):
        model = net()
        expect_error(lambda: DistributedOptimizer(torch.optim.SGD(list(model.parameters())[:1], lr=0.1), model),
                     "leaves", "model.parameters()")
    with open_run("frozen") as run:  # frozen parameters (fine-tuning) need not be in the optimizer
        model = net()
        model[0].requires_grad_(False)
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = DistributedOptimizer(torch.optim.SGD(trainable, lr=0.1), model)
        frozen = model[0].weight.detach().clone()  # rank 0's, broadcast
        train(opt, model, run.iterations)
        assert torch.equal(model[0].weight.detach(), frozen) and same_everywhere(flat(model))


@check
def different_models_across_ranks_are_named():
    if SIZE < 2:
        raise Skip("needs two ranks")
    with open_run("shapes"):
        model = net(16 if RANK != SIZE - 1 else 17)
        expect_error(lambda: DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model),
                     "different models", f"rank {SIZE - 1}", "0.weight")


@check
def even_only_algorithm_on_odd_ranks_is_refused():
    if SIZE % 2 == 0 or SIZE == 1:
        raise Skip("needs an odd rank count above 1")
    expect_error(lambda: open_run("odd", algorithm="adpsgd"), "even number of ranks")


if __name__ == "__main__":
    sys.exit(run_checks(CHECKS, sys.argv[1], WORLD))
