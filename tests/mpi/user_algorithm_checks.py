"""What examples/own_algorithm's Post-local SGD computes, driven hook by hook under mpiexec.

The class is found the way a run finds it: a scenario entry ``{name: post_local, class:
"post_local_sgd:PostLocalSGD", ...}`` with the example's directory as ``python_path`` registers
it in each rank's process. A fake loop (the real ``Communicator``, a flat float32 model that
differs per rank, a synthetic gradient per rank and iteration, a plain SGD step where the loop
steps) runs it, and every rank's model is compared after each iteration with the rule written
out independently in float64 from models gathered with mpi4py, and, where the class should be a
built-in algorithm, with that built-in's models from the same start, bit for bit. Rank 0 writes
the JSON report (``checklib``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from checklib import Checks, agree_that, run_checks
from harness.algorithms import algorithm_class
from harness.algorithms.base import AlgorithmContext
from harness.comm import Communicator
from harness.scenario import scenario_from_dict

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_algorithm"
WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
N, ITERATIONS, LR = 37, 6, 0.1
CHECKS = check = Checks()


def build(comm: Communicator, entry: dict | str):
    """The algorithm of scenario entry ``entry``, built as a run builds it, on this rank's model."""
    scenario = scenario_from_dict({
        "name": "post_local_checks", "ranks": SIZE, "python_path": [str(EXAMPLE)],
        "workload": {"model": "logreg", "dataset": "digits", "batch_size": 4, "iterations": ITERATIONS},
        "algorithms": [entry],
    })
    params = scenario.algorithms[0]
    x = torch.from_numpy(np.random.default_rng([1, RANK]).standard_normal(N).astype(np.float32))
    return algorithm_class(params.name)(params, AlgorithmContext(comm, x, torch.zeros_like(x), LR, 0))


def post_local(comm: Communicator, switch_at: int, period: int):
    """The example's class with these parameters."""
    alg = build(comm, {"name": "post_local", "class": "post_local_sgd:PostLocalSGD", "switch_at": switch_at,
                       "period": period})
    agree_that(alg.name == "post_local", f"the instance is named {alg.name!r}, not the scenario's 'post_local'")
    return alg


def gradient(t: int) -> np.ndarray:
    return np.random.default_rng([2, RANK, t]).standard_normal(N).astype(np.float32)


def models(x: torch.Tensor) -> np.ndarray:
    """Every rank's copy of ``x``, (P, N) in float64, on every rank."""
    return np.stack(WORLD.allgather(x.numpy().copy())).astype(np.float64)


def drive(alg, expect=None) -> list[np.ndarray]:
    """The loop's hook order; ``expect(t, before, after)`` checks the models around iteration t
    (``before``: all models at its start, ``after``: at its end; rows are ranks). Returns this
    rank's float32 model after each iteration."""
    x, g = alg.ctx.params, alg.ctx.grads
    own = []
    for t in range(ITERATIONS):
        before = models(x)
        alg.before_forward(t)
        g.copy_(torch.from_numpy(gradient(t)))
        alg.after_backward(t)
        x.sub_(LR * g)  # the optimizer step
        alg.after_step(t)
        alg.end_iteration(t)
        own.append(x.numpy().copy())
        if expect is not None:
            expect(t, before, models(x))
    alg.finish()
    return own


def stepped(before: np.ndarray, t: int) -> np.ndarray:
    """Every rank's model after its own SGD step from ``before`` (no communication)."""
    grads = np.stack(WORLD.allgather(gradient(t))).astype(np.float64)
    return before - LR * grads


def gradient_averaged(before: np.ndarray, t: int) -> np.ndarray:
    """Every rank's model after an SGD step with the mean of the ranks' gradients (Allreduce-SGD)."""
    grads = np.stack(WORLD.allgather(gradient(t))).astype(np.float64)
    return before - LR * grads.mean(axis=0)


def close_to(t: int, after: np.ndarray, want: np.ndarray, what: str) -> None:
    error = float(np.abs(after - want).max())
    agree_that(error < 1e-5, f"iteration {t} ({what}): off by {error:g}")


def spread(after: np.ndarray) -> float:
    return float(np.abs(after - after[0]).max())


def same_as(mine: list[np.ndarray], builtin: list[np.ndarray], name: str) -> None:
    differ = [t for t, (a, b) in enumerate(zip(mine, builtin, strict=True)) if not np.array_equal(a, b)]
    agree_that(not differ, f"the models differ from {name}'s (bit for bit) after iterations {differ}")


@check
def switch_at_past_the_last_iteration_is_allreduce_sgd(comm):
    alg = post_local(comm, switch_at=ITERATIONS, period=2)

    def expect(t, before, after):
        # The models started different per rank and stay so: gradients are averaged, not models.
        close_to(t, after, gradient_averaged(before, t), "gradient average")
        if SIZE > 1:
            agree_that(spread(after) > 1e-3, f"iteration {t}: the ranks' models became equal (a model average?)")

    mine = drive(alg, expect)
    same_as(mine, drive(build(comm, "allreduce_sgd")), "allreduce_sgd")


@check
def switch_at_0_is_local_sgd_with_the_same_period(comm):
    alg = post_local(comm, switch_at=0, period=3)

    def expect(t, before, after):
        if (t + 1) % 3 == 0:  # the mean of the stepped models everywhere
            close_to(t, after, np.tile(stepped(before, t).mean(axis=0), (SIZE, 1)), "model average")
        else:  # a local step, nothing communicated
            close_to(t, after, stepped(before, t), "local step")

    mine = drive(alg, expect)
    same_as(mine, drive(build(comm, {"name": "local_sgd", "period": 3})), "local_sgd with period 3")


@check
def gradient_averages_up_to_the_switch_then_model_averages_every_period_from_it(comm):
    switch_at, period = 2, 3  # iterations 0-1 average gradients, 4 ends with a model average

    def expect(t, before, after):
        if t < switch_at:
            close_to(t, after, gradient_averaged(before, t), "gradient average")
        elif (t - switch_at + 1) % period == 0:
            close_to(t, after, np.tile(stepped(before, t).mean(axis=0), (SIZE, 1)), "model average")
        else:
            close_to(t, after, stepped(before, t), "local step")

    drive(post_local(comm, switch_at, period), expect)


def main(out_path: str) -> int:
    comm = Communicator(WORLD)
    run_checks(CHECKS, out_path, WORLD, comm)
    comm.close()
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main(sys.argv[1]))
