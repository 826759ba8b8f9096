"""Multi-rank checks of the gossip family (SGP, OSGP, D-PSGD), run once per rank count under mpiexec.

Each check drives an algorithm's hooks directly, in the training loop's order, on a small fake
context (flat float32 tensors, no model, no optimizer: the "optimizer step" is a known update
applied by the check), so every expected value can be computed exactly. Rank 0 writes
``{name: {"status": ..., "detail": ...}}`` as JSON to the path given on the command line.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from mpi4py import MPI

from checklib import Checks, Skip, run_checks
from harness.algorithms.base import AlgorithmContext
from harness.algorithms.dpsgd import DPSGD
from harness.schedules import mixing_row, osgp_rounds_due
from harness.algorithms.osgp import OSGP
from harness.algorithms.params import DPSGDParams, OSGPParams, SGPParams
from harness.algorithms.sgp import SGP
from harness.comm import Communicator

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
N = 33
CHECKS = check = Checks()





def rank_vector(seed: int, rank: int = RANK, n: int = N) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng([seed, rank]).standard_normal(n).astype(np.float32))


def world_sum(a: torch.Tensor | float) -> np.ndarray:
    return WORLD.allreduce(np.asarray(a, dtype=np.float64), op=MPI.SUM)


def context(comm: Communicator, x0: torch.Tensor, iterations: int) -> AlgorithmContext:
    return AlgorithmContext(comm, x0.clone(), torch.zeros_like(x0), 0.0, 0)


def drive(alg, iterations: int, update=None, sleep_s: float = 0.0, on_iteration=None) -> None:
    """Run the loop's hook sequence; ``update(t, params_at_forward)`` returns what the step subtracts."""
    ctx = alg.ctx
    for t in range(iterations):
        alg.before_forward(t)
        at_forward = ctx.params.clone()
        if sleep_s:
            time.sleep(sleep_s)
        if update is not None:
            ctx.grads.copy_(update(t, at_forward))
        alg.after_backward(t)
        if update is not None:
            ctx.params.sub_(ctx.grads)
        alg.after_step(t)
        alg.end_iteration(t)
        if on_iteration is not None:
            on_iteration(t, at_forward)
    alg.finish()


def push_sum_peer_counts() -> list[int]:
    return list(range(1, min(3, SIZE - 1) + 1)) or [1]


@check
def sgp_conserves_mass_and_weight(comm: Communicator) -> None:
    """After finish: sum_i w_i = P and sum_i x_i = sum_i x_i(0) - everything the steps subtracted."""
    iterations = 9
    problems = []
    for peers in push_sum_peer_counts():
        x0 = rank_vector(1)
        alg = SGP(SGPParams(peers=peers), context(comm, x0, iterations))
        subtracted = torch.zeros(N, dtype=torch.float64)

        def update(t, at_forward):
            d = torch.full((N,), 0.01 * (RANK + 1) * (t + 1), dtype=torch.float32)
            subtracted.add_(d.double())
            return d

        def on_iteration(t, at_forward):
            if alg.peers and alg.received != alg.expected:
                problems.append(f"t={t}: {alg.received} messages absorbed, rounds 0..{t} addressed {alg.expected}")
            if alg.staleness != (0 if alg.peers else -1):
                problems.append(f"t={t}: staleness {alg.staleness}")

        time.sleep(0.002 * RANK)
        drive(alg, iterations, update, sleep_s=0.001 * ((RANK + 1) % 3), on_iteration=on_iteration)
        w_total = world_sum(alg.weight)
        x_total = world_sum(alg.ctx.params)
        want = world_sum(x0) - world_sum(subtracted)
        if abs(w_total - SIZE) > 1e-5:
            problems.append(f"peers={peers}: weights sum to {w_total}, not {SIZE}")
        if not np.allclose(x_total, want, rtol=1e-5, atol=1e-5):
            problems.append(f"peers={peers}: mass not conserved: {x_total[:3]} vs {want[:3]}")
        if alg.peers and alg.received != peers * iterations:  # no self-addressed share below 5 ranks
            problems.append(f"peers={peers}: absorbed {alg.received} messages, {peers * iterations} were sent")
    # Asserted after every collective: a failing rank must not strand the others in one.
    assert not problems, problems


@check
def sgp_is_bit_reproducible_whatever_the_timing(comm: Communicator) -> None:
    """Two SGP runs from the same start with the same updates but different random sleeps (so
    messages arrive in other orders and in-peers run ahead differently) end bit-identical."""
    if SIZE < 3:
        raise Skip("needs 3 ranks: with 2 each round has one message, order cannot matter")
    iterations, peers = 10, min(2, SIZE - 1)
    finals = []
    for attempt in range(2):
        sleeps = np.random.default_rng([attempt, RANK]).uniform(0.0, 0.004, iterations)
        alg = SGP(SGPParams(peers=peers), context(comm, rank_vector(7), iterations))

        def update(t, at_forward):  # a "gradient" that depends on the de-biased model it is taken at
            time.sleep(sleeps[t])
            return 0.05 * at_forward + 0.01 * (RANK + 1)

        drive(alg, iterations, update)
        finals.append((alg.ctx.params.clone(), alg.weight))
        comm.barrier()
    (x0, w0), (x1, w1) = finals
    same = WORLD.allgather(bool(torch.equal(x0, x1) and w0 == w1))
    assert all(same), f"ranks whose models differ between the two runs: {[r for r, ok in enumerate(same) if not ok]}"


@check
def sgp_evaluates_the_gradient_at_the_debiased_model(comm: Communicator) -> None:
    """Forward/backward see z = x / w; the step sees the exact numerator; eval_params is z."""
    for cls, params in ((SGP, SGPParams()), (OSGP, OSGPParams())):
        alg = cls(params, context(comm, rank_vector(2), 4))
        # Synchronous push-sum over permutations keeps every w at 1; start from w != 1 so the
        # de-biasing is visible (mass invariants are not checked here).
        alg.weight = 1.0 + 0.25 * RANK
        problems = []
        for t in range(4):
            x, w = alg.ctx.params.clone(), alg.weight
            if not torch.allclose(alg.eval_params(), x / w, rtol=1e-6, atol=1e-7):
                problems.append(f"t={t}: eval_params is not x / w")
            alg.before_forward(t)
            if not torch.allclose(alg.ctx.params, x / w, rtol=1e-6, atol=1e-7):
                problems.append(f"t={t}: forward saw x, not x / w (w = {w})")
            alg.after_backward(t)
            if not torch.equal(alg.ctx.params, x):
                problems.append(f"t={t}: the numerator was not restored exactly before the step")
            alg.after_step(t)
            alg.end_iteration(t)
        alg.finish()
        if not torch.allclose(alg.eval_params(), alg.ctx.params / alg.weight):
            problems.append("eval_params after finish is not x / w")
        assert not problems, (cls.name, problems)


@check
def sgp_debiased_models_reach_the_average(comm: Communicator) -> None:
    """No updates: every z_i converges to the plain average of the initial models."""
    x0 = rank_vector(3)
    mean = world_sum(x0) / SIZE
    alg = SGP(SGPParams(), context(comm, x0, 40))
    drive(alg, 40)
    err = float(np.max(np.abs(alg.eval_params().numpy() - mean)))
    errs = WORLD.allgather(err)
    assert max(errs) < 1e-4, f"|z_i - mean| per rank: {errs}"


@check
def osgp_conserves_mass_and_keeps_its_round_schedule(comm: Communicator) -> None:
    """Rank 0 slow, a mid-run barrier like the loop's evaluation: no deadlock, mass conserved."""
    iterations = 12
    problems = []
    for synch_freq in (0, 2, 5):
        x0 = rank_vector(4)
        alg = OSGP(OSGPParams(synch_freq=synch_freq), context(comm, x0, iterations))
        subtracted = torch.zeros(N, dtype=torch.float64)
        stale = []

        def update(t, at_forward):
            d = torch.full((N,), 0.02 * (RANK + 1), dtype=torch.float32)
            subtracted.add_(d.double())
            return d

        def on_iteration(t, _):
            stale.append(alg.staleness)
            if alg.peers and not osgp_rounds_due(t, synch_freq) <= alg.rounds <= t + 1:
                problems.append(f"s={synch_freq} t={t}: {alg.rounds} rounds pushed")
            if t == 5:
                comm.barrier()  # what the loop's collective evaluation does between iterations

        drive(alg, iterations, update, sleep_s=0.015 if RANK == 0 else 0.0, on_iteration=on_iteration)
        rounds = alg.rounds
        w_total = world_sum(alg.weight)
        x_total = world_sum(alg.ctx.params)
        want = world_sum(x0) - world_sum(subtracted)
        all_rounds = WORLD.allgather(rounds)
        if abs(w_total - SIZE) > 1e-5:
            problems.append(f"s={synch_freq}: weights sum to {w_total} (rounds per rank {all_rounds})")
        if not np.allclose(x_total, want, rtol=1e-5, atol=1e-5):
            problems.append(f"s={synch_freq}: mass not conserved: {x_total[:3]} vs {want[:3]}")
        due = osgp_rounds_due(iterations - 1, synch_freq)
        if SIZE > 1 and not (1 <= min(stale) and due <= rounds <= iterations):
            problems.append(f"s={synch_freq}: staleness {stale}, {rounds} rounds")
        if SIZE == 1 and (stale != [-1] * iterations or rounds):
            problems.append(f"single rank: staleness {stale}, {rounds} rounds")
    assert not problems, problems


@check
def osgp_synch_freq_0_is_one_iteration_stale(comm: Communicator) -> None:
    """1-OSGP: every iteration mixes in gossip (staleness 1), at least one message per round so far."""
    if SIZE < 2:
        raise Skip("needs 2 ranks")
    stale, short = [], []

    def on_iteration(t, _):
        stale.append(alg.staleness)
        if alg.received < t:
            short.append((t, alg.received))

    alg = OSGP(OSGPParams(synch_freq=0), context(comm, rank_vector(5), 8))
    drive(alg, 8, sleep_s=0.01 if RANK == SIZE - 1 else 0.0, on_iteration=on_iteration)
    assert stale == [1] * 8, stale
    assert not short, f"(iteration, messages absorbed) below one per earlier round: {short}"
    assert alg.rounds == 8 and alg.received == 8, (alg.rounds, alg.received)


def dpsgd_graphs() -> list[str]:
    return ["ring"] + (["bipartite_exponential"] if SIZE % 2 == 0 or SIZE == 1 else [])


@check
def dpsgd_mixes_with_the_doubly_stochastic_matrix(comm: Communicator) -> None:
    """x_i(t+1) = sum_j W_ij(t) x_j(t) - 0.1 x_i(t): mix by W, gradient taken at the pre-mix model."""
    for graph in dpsgd_graphs():
        alg = DPSGD(DPSGDParams(graph=graph), context(comm, rank_vector(6), 6))
        problems = []
        for t in range(6):
            before = np.stack(WORLD.allgather(alg.ctx.params.numpy().copy()))
            w = np.zeros((SIZE, SIZE))
            for i in range(SIZE):
                for j, wij in mixing_row(i, SIZE, t, graph).items():
                    w[i, j] += wij
            if not (np.allclose(w.sum(0), 1) and np.allclose(w.sum(1), 1)):
                problems.append(f"{graph} t={t}: W not doubly stochastic")
            alg.before_forward(t)
            alg.ctx.grads.copy_(0.1 * alg.ctx.params)  # the "gradient" at the model the forward saw
            alg.after_backward(t)
            alg.ctx.params.sub_(alg.ctx.grads)
            alg.after_step(t)
            alg.end_iteration(t)
            want = (w @ before.astype(np.float64))[RANK] - 0.1 * before[RANK]
            if not np.allclose(alg.ctx.params.numpy(), want, rtol=1e-5, atol=1e-6):
                problems.append(f"{graph}, P={SIZE}, t={t}: got {alg.ctx.params[:3].tolist()}, W gives {want[:3]}")
        alg.finish()
        assert not problems, problems


def main(out_path: str) -> int:
    comm = Communicator(WORLD)
    run_checks(CHECKS, out_path, WORLD, comm)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
