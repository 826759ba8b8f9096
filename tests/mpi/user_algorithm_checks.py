"""What examples/own_algorithm's Gossip-PGA computes, driven hook by hook under mpiexec.

The class is found the way a run finds it: a scenario entry ``{name: pga, class:
"gossip_pga:GossipPGA", ...}`` with the example's directory as ``python_path`` registers it in
each rank's process. A fake loop (the real ``Communicator``, a flat float32 model that differs
per rank, a synthetic gradient per rank and iteration, a plain SGD step where the loop steps)
runs it, and every rank's model is compared after each iteration with the rule written out
independently in float64 from models gathered with mpi4py. Rank 0 writes the JSON report
(``checklib``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from checklib import Checks, Skip, run_checks
from harness.algorithms import algorithm_class
from harness.algorithms.base import AlgorithmContext
from harness.comm import Communicator
from harness.scenario import scenario_from_dict

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_algorithm"
WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
N, ITERATIONS, LR = 37, 6, 0.1
CHECKS = check = Checks()


def gossip_pga(comm: Communicator, period: int):
    """The example's class with ``period``, built from a scenario entry as a run builds it."""
    scenario = scenario_from_dict({
        "name": "pga_checks", "ranks": SIZE, "python_path": [str(EXAMPLE)],
        "workload": {"model": "logreg", "dataset": "digits", "batch_size": 4, "iterations": ITERATIONS},
        "algorithms": [{"name": "pga", "class": "gossip_pga:GossipPGA", "graph": "ring", "period": period}],
    })
    params = scenario.algorithms[0]
    x = torch.from_numpy(np.random.default_rng([1, RANK]).standard_normal(N).astype(np.float32))
    return algorithm_class(params.name)(params, AlgorithmContext(comm, x, torch.zeros_like(x), LR, 0))


def gradient(t: int) -> np.ndarray:
    return np.random.default_rng([2, RANK, t]).standard_normal(N).astype(np.float32)


def models(x: torch.Tensor) -> np.ndarray:
    """Every rank's copy of ``x``, (P, N) in float64, on every rank."""
    return np.stack(WORLD.allgather(x.numpy().copy())).astype(np.float64)


def agree(ok: bool, message: str) -> None:
    """``assert ok`` on every rank at once, so no rank goes on into a collective alone."""
    failed = [f"rank {r}: {m}" for r, m in enumerate(WORLD.allgather(None if ok else message)) if m is not None]
    if failed:
        raise AssertionError("\n".join(failed))


def drive(alg, expect) -> None:
    """The loop's hook order; ``expect(t, before, after)`` checks the models around iteration t
    (``before``: all models at its start, ``after``: at its end; rows are ranks)."""
    x, g = alg.ctx.params, alg.ctx.grads
    for t in range(ITERATIONS):
        before = models(x)
        alg.before_forward(t)
        g.copy_(torch.from_numpy(gradient(t)))
        alg.after_backward(t)
        x.sub_(LR * g)  # the optimizer step
        alg.after_step(t)
        alg.end_iteration(t)
        expect(t, before, models(x))
    alg.finish()


def stepped(before: np.ndarray, t: int) -> np.ndarray:
    """Every rank's model after its own SGD step from ``before`` (no mixing)."""
    grads = np.stack(WORLD.allgather(gradient(t))).astype(np.float64)
    return before - LR * grads


@check
def period_1_averages_all_models_after_every_iteration(comm):
    alg = gossip_pga(comm, period=1)
    agree(alg.name == "pga", f"the instance is named {alg.name!r}, not the scenario's 'pga'")

    def expect(t, before, after):
        mean = stepped(before, t).mean(axis=0)  # Allreduce of the stepped models
        spread = float(np.abs(after - after[0]).max())
        agree(spread < 1e-6, f"iteration {t}: the ranks' models differ by {spread:g}")
        error = float(np.abs(after - mean).max())
        agree(error < 1e-5, f"iteration {t}: models are {error:g} from the mean of the stepped models")

    drive(alg, expect)


@check
def other_iterations_are_d_psgd_ring_gossip(comm):
    if SIZE < 2:
        raise Skip("one rank has no one to gossip with")
    alg = gossip_pga(comm, period=3)
    ring = [sorted({(i - 1) % SIZE, i, (i + 1) % SIZE}) for i in range(SIZE)]

    def expect(t, before, after):
        if (t + 1) % 3 == 0:  # global round: the mean of the stepped models everywhere
            want = np.tile(stepped(before, t).mean(axis=0), (SIZE, 1))
        else:  # D-PSGD: the uniform mean over self and ring neighbours, then the own gradient step
            mixed = np.stack([before[members].mean(axis=0) for members in ring])
            want = stepped(mixed, t)
            spread = float(np.abs(after - after[0]).max())
            agree(spread > 1e-3, f"iteration {t}: a gossip round left all models equal")
        error = float(np.abs(after - want).max())
        agree(error < 1e-5, f"iteration {t} ({'global' if (t + 1) % 3 == 0 else 'gossip'}): off by {error:g}")

    drive(alg, expect)


def main(out_path: str) -> int:
    comm = Communicator(WORLD)
    run_checks(CHECKS, out_path, WORLD, comm)
    comm.close()
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main(sys.argv[1]))
