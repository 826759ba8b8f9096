"""Multi-rank checks of the low-communication family, driven hook by hook under mpiexec.

The fake training loop of ``periodic_checks.py`` (the real ``Communicator``, a flat float32
model, a synthetic local step on a rank-specific quadratic, no optimizer) drives DiLoCo,
Streaming DiLoCo, quorum DiLoCo, SlowMo and Gossip-PGA. Checked:

- the reductions, bit for bit: SlowMo over Local SGD without slow momentum is Local SGD, with
  BMUF's settings it is BMUF; Gossip-PGA with period 1 is Local SGD with period 1; Streaming
  DiLoCo with one fragment, no overlap and alpha 0 is DiLoCo;
- DiLoCo and Streaming DiLoCo against their rules (docs/algorithms.md, "Low-communication
  family") written out again below and replayed for every rank in float64 on rank 0;
- SlowMo over SGP: every rank holds the same model, with push-sum weight 1, after a slow step;
- quorum DiLoCo, with one rank late for some outer rounds: every rank holds the same global
  model after every round, every pseudo-gradient is counted exactly once (the round sums add up
  to what was published, less what the last round left in late ranks' buffers: a rank s rounds
  behind at the last round leaves its last s), and the ranks that are on time do not wait for
  the late one.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from mpi4py import MPI

from checklib import Checks, Skip, agree_that, run_checks
from harness.comm import Communicator
from harness.schedules import fragment_sync, periodic_sync
from periodic_checks import LENGTHS, assert_close, drive, gathered, local_step, make, x0

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
CHECKS = check = Checks()
OUTER = {"outer_lr": 0.7, "outer_momentum": 0.9}


def _bitwise(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    agree_that(torch.equal(a, b), f"{what}: max |difference| {float((a - b).abs().max()):.3g}")


def _pair(comm: Communicator, first: tuple[str, dict], second: tuple[str, dict], iterations: int) -> None:
    """Run two algorithms from the same start on the same local steps; their models must be equal."""
    for n in LENGTHS:
        a = drive(make(comm, first[0], n, iterations, **first[1]), iterations).ctx.params
        b = drive(make(comm, second[0], n, iterations, **second[1]), iterations).ctx.params
        _bitwise(a, b, f"{first[0]} vs {second[0]}, n={n}")


@check
def slowmo_without_slow_momentum_is_local_sgd(comm):
    _pair(comm, ("slowmo", {"base": "local_sgd", "period": 3, "slow_momentum": 0.0, "slow_lr": 1.0}),
          ("local_sgd", {"period": 3}), iterations=10)


@check
def slowmo_with_bmuf_settings_is_bmuf(comm):
    _pair(comm, ("slowmo", {"base": "local_sgd", "period": 3, "slow_momentum": 0.6, "slow_lr": 1.3}),
          ("bmuf", {"period": 3, "block_momentum": 0.6, "block_lr": 1.3}), iterations=10)


@check
def gossip_pga_with_period_1_is_local_sgd_with_period_1(comm):
    _pair(comm, ("gossip_pga", {"period": 1}), ("local_sgd", {"period": 1}), iterations=5)


@check
def streaming_diloco_with_one_fragment_is_diloco(comm):
    _pair(comm, ("streaming_diloco", {"inner_steps": 4, "fragments": 1, "overlap": 0, "alpha": 0.0, **OUTER}),
          ("diloco", {"inner_steps": 4, **OUTER}), iterations=10)


# -- the rules, every rank at once, in float64 ------------------------------------------------------


def nesterov(theta, m, delta, lr, mu):
    """torch.optim.SGD(nesterov=True)'s update of theta along delta; returns (theta, m)."""
    m = mu * m + delta
    return theta - lr * (delta + mu * m), m


def diloco_reference(n: int, iterations: int, H: int, lr: float, mu: float) -> np.ndarray:
    X = np.tile(x0(n).astype(np.float64), (SIZE, 1))
    theta, m, local = X[0].copy(), np.zeros(n), 0

    def outer():
        nonlocal theta, m, X, local
        theta, m = nesterov(theta, m, (theta - X).mean(0), lr, mu)
        X[:] = theta
        local = 0

    for t in range(iterations):
        X = np.stack([local_step(X[r], r, t) for r in range(SIZE)])
        local += 1
        if (t + 1) % H == 0:
            outer()
    if local:
        outer()  # finish(): the leftover local steps get their outer step
    return X


def streaming_reference(n: int, iterations: int, H: int, F: int, tau: int, alpha: float, lr: float,
                        mu: float) -> np.ndarray:
    X = np.tile(x0(n).astype(np.float64), (SIZE, 1))
    theta, m = X[0].copy(), np.zeros(n)
    edges = [p * n // F for p in range(F + 1)]
    flying: dict[int, tuple[np.ndarray, int]] = {}  # fragment -> (mean pseudo-gradient, due)

    def merge(p):
        delta, _ = flying.pop(p)
        s = slice(edges[p], edges[p + 1])
        theta[s], m[s] = nesterov(theta[s], m[s], delta, lr, mu)
        X[:, s] = alpha * X[:, s] + (1 - alpha) * theta[s]

    for t in range(iterations):
        X = np.stack([local_step(X[r], r, t) for r in range(SIZE)])
        for p in range(F):
            first = (p + 1) * H // F  # fragment p's first outer step comes after this many steps
            if t + 1 >= first and (t + 1 - first) % H == 0:
                s = slice(edges[p], edges[p + 1])
                flying[p] = ((theta[s] - X[:, s]).mean(0), t + tau)
        for p in [p for p, (_, due) in flying.items() if due <= t]:
            merge(p)
    for p in list(flying):
        merge(p)
    for p in range(F):  # finish(): fragments with local steps since their last outer step
        first = (p + 1) * H // F
        last = max((t for t in range(iterations) if t + 1 >= first and (t + 1 - first) % H == 0), default=-1)
        if last != iterations - 1:
            s = slice(edges[p], edges[p + 1])
            flying[p] = ((theta[s] - X[:, s]).mean(0), iterations - 1)
            merge(p)
    return X


@check
def diloco_matches_its_rule(comm):
    for n in LENGTHS:
        for iterations in (12, 14):  # 14: two leftover steps, folded in by finish()
            alg = drive(make(comm, "diloco", n, iterations, inner_steps=4, **OUTER), iterations)
            want = diloco_reference(n, iterations, 4, lr=0.7, mu=0.9)
            assert_close(gathered(alg.ctx.params), want if RANK == 0 else None, f"diloco n={n} T={iterations}",
                         rtol=1e-4, atol=1e-4)


@check
def streaming_diloco_matches_its_rule(comm):
    for n in LENGTHS:
        for fragments, overlap, alpha in ((3, 1, 0.5), (2, 0, 0.0), (4, 3, 0.25)):
            params = {"inner_steps": 6, "fragments": fragments, "overlap": overlap, "alpha": alpha, **OUTER}
            alg = drive(make(comm, "streaming_diloco", n, 17, **params), 17)
            want = streaming_reference(n, 17, 6, fragments, overlap, alpha, 0.7, 0.9)
            assert_close(gathered(alg.ctx.params), want if RANK == 0 else None,
                         f"streaming n={n} F={fragments} tau={overlap} alpha={alpha}", rtol=1e-4, atol=1e-4)


@check
def streaming_schedule_staggers_fragments(comm):
    H, F = 8, 4
    starts = [[t for t in range(40) if fragment_sync(t, p, F, H)] for p in range(F)]
    assert starts[-1] == [t for t in range(40) if periodic_sync(t, H)], starts
    assert all(b - a == H for s in starts for a, b in zip(s, s[1:])), starts
    assert len({t for s in starts for t in s}) == sum(len(s) for s in starts), f"two fragments at once: {starts}"


@check
def slowmo_over_sgp_restarts_every_rank_from_one_model(comm):
    if SIZE < 2:
        raise Skip("gossip needs two ranks")
    seen = []

    def after_sync(t, alg):
        if periodic_sync(t, 3):
            digest = alg.ctx.params.numpy().tobytes()
            seen.append((len(set(WORLD.allgather(digest))) == 1, alg.base.weight))

    drive(make(comm, "slowmo", 20_003, 9, base="sgp", period=3, slow_momentum=0.5), 9, after_sync=after_sync)
    agree_that(seen == [(True, 1.0)] * 3, f"after the slow steps (same model?, weight): {seen}")


# -- quorum DiLoCo --------------------------------------------------------------------------------

LATE_ROUNDS = {1, 2, 4}  # outer rounds the last rank is late for
LATE_S = 0.4


def _quorum_run(comm: Communicator, n: int, rounds: int, quorum: float) -> dict:
    """One outer round per iteration (inner_steps 1); the last rank sleeps before LATE_ROUNDS.

    Rank r's local step sets its pseudo-gradient for round k to a distinct value, so a sum that
    lost or doubled one would show it. Returns what this rank saw, round by round.
    """
    alg = make(comm, "quorum_diloco", n, rounds, inner_steps=1, quorum=quorum, **OUTER)
    seen = {"published": [], "sums": [], "weights": [], "models": [], "info": [], "round_at": []}
    op = alg._op

    class Tap:
        """The op, with each round's [S, W] copied before the outer step divides and reuses it."""

        def round(self, buf, out, may_activate=True):
            info = op.round(buf, out, may_activate)
            seen["sums"].append(out[:n].double().numpy().copy())
            seen["weights"].append(float(out[n]))
            return info

        def close(self):
            op.close()

    alg._op = Tap()
    for k in range(rounds):
        alg.before_forward(k)
        if RANK == SIZE - 1 and k in LATE_ROUNDS:
            time.sleep(LATE_S)
        alg.after_backward(k)
        alg.ctx.params.copy_(alg.global_model).sub_(float((RANK + 1) * 10 + k) / 64)  # theta - c_{r,k}
        start = time.monotonic()
        alg.after_step(k)  # the outer round
        seen["round_at"].append((start, time.monotonic()))  # one clock for all ranks of this machine
        seen["published"].append(alg.message[:n].double().numpy().copy())
        seen["models"].append(alg.global_model.numpy().tobytes())
        seen["info"].append(dict(alg.info))
        alg.end_iteration(k)
    alg.finish()  # no local steps left: closes the op
    return seen


@check
def quorum_diloco_counts_every_pseudo_gradient_once_and_agrees(comm):
    if SIZE < 3:
        raise Skip("a quorum below all ranks needs three ranks")
    n, rounds = 1001, 7
    seen = _quorum_run(comm, n, rounds, quorum=0.5)
    every = WORLD.allgather(seen)
    for k in range(rounds):
        agree_that(len({s["models"][k] for s in every}) == 1, f"round {k}: the global models differ")
        agree_that(len({s["weights"][k] for s in every}) == 1, f"round {k}: the weights differ")
    # The last round took what a rank had published up to round (rounds - 1 - staleness): a rank
    # that was late for it (joined early, staleness s) leaves its last s pseudo-gradients behind.
    behind = [int(s["info"][-1]["staleness"]) for s in every]
    left = [sum(s["published"][rounds - b:], np.zeros(n)) for s, b in zip(every, behind)]
    published = sum(p for s in every for p in s["published"])
    weights = sum(seen["weights"])
    expected = SIZE * rounds - sum(behind)
    agree_that(weights == expected, f"weights over all rounds {weights}, expected {expected}")
    counted = sum(seen["sums"])
    np.testing.assert_allclose(counted, published - sum(left), rtol=1e-5, atol=1e-3)
    late = every[-1]
    agree_that(all(late["info"][k]["joined_early"] for k in LATE_ROUNDS),
               f"the late rank was not joined early for rounds {sorted(LATE_ROUNDS)}: {late['info']}")
    quorum = -(-SIZE // 2)
    agree_that(all(w >= quorum for w in seen["weights"]), f"a round held fewer than {quorum}: {seen['weights']}")
    # The others went on without it: none of their late-round waits is anywhere near how late it
    # was (measured in the same run: from its previous round's end to this round's start, its
    # sleep and its local step; a slower machine lengthens both).
    late_by = min(late["round_at"][k][0] - late["round_at"][k - 1][1] for k in LATE_ROUNDS)
    if RANK != SIZE - 1:
        waits = [round(seen["round_at"][k][1] - seen["round_at"][k][0], 4) for k in LATE_ROUNDS]
        agree_that(max(waits) < 0.5 * late_by, f"rank {RANK} waited {waits} s for the late rank ({late_by:.3f} s late)")
    else:
        agree_that(True, "")


@check
def quorum_of_everyone_waits_for_the_late_rank(comm):
    if SIZE < 2:
        raise Skip("nobody to wait for")
    seen = _quorum_run(comm, 7, 3, quorum=1.0)
    every = WORLD.allgather(seen)
    agree_that(all(w == SIZE for w in seen["weights"]), f"weights {seen['weights']}")
    agree_that(len({s["models"][-1] for s in every}) == 1, "the final global models differ")
    # Round 1 needs the late rank's pseudo-gradient: nobody leaves it before the late rank,
    # done sleeping, entered it. (Not "each rank waited about LATE_S": a rank that a hypervisor
    # pause held up would wait less, rightly.)
    late_entered = every[-1]["round_at"][1][0]
    left = seen["round_at"][1][1]
    agree_that(left >= late_entered, f"rank {RANK} left round 1 {late_entered - left:.4f} s before the late rank entered it")


def main(out_path: str) -> int:
    comm = Communicator(WORLD)
    run_checks(CHECKS, out_path, WORLD, comm)
    comm.close()
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main(sys.argv[1]))
