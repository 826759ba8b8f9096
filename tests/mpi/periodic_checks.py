"""Multi-rank checks of the periodic model averaging family, driven hook by hook under mpiexec.

Each algorithm gets a fake training loop: the real ``Communicator``, a flat float32 model, no
optimizer, and a synthetic local step ``x <- x - eta * (x - c_r) + noise(r, t)`` (a gradient step
on a rank-specific quadratic), called where the loop runs the optimizer step. Rank 0 replays
every rank in float64 with the rules of docs/algorithms.md ("Periodic family") written out
independently below and compares. Rank 0 writes ``{name: {"status": ..., "detail": ...}}``
as JSON to the path given on the command line (the format of comm_checks.py).
"""

from __future__ import annotations

import hashlib
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

from checklib import Checks, Skip, agree, agree_that, run_checks
from harness.algorithms import algorithm_class, params_model
from harness.algorithms.base import AlgorithmContext
from harness.schedules import periodic_sync
from harness.comm import Communicator, EmulatedLink

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
LR = 0.1  # ctx.lr: the BMUF and Overlap Local SGD momentum is in units of lr
ETA = 0.3  # synthetic step size
LENGTHS = (7, 20_003)  # recursive doubling and ring allreduce
CHECKS = check = Checks()





# -- the fake loop ------------------------------------------------------------------------------


def x0(n: int) -> np.ndarray:
    return np.random.default_rng([11, n]).standard_normal(n).astype(np.float32)


def target(r: int, n: int) -> np.ndarray:
    return np.random.default_rng([12, r, n]).standard_normal(n).astype(np.float32) * 3


def noise(r: int, t: int, n: int) -> np.ndarray:
    return np.random.default_rng([13, r, t, n]).standard_normal(n).astype(np.float32) * 0.1


def local_step(x, r: int, t: int):
    """The same rule for a float32 torch tensor (in place) and a float64 numpy array (returned)."""
    n = x.shape[-1]
    if isinstance(x, torch.Tensor):
        x.sub_(ETA * (x - torch.from_numpy(target(r, n)))).add_(torch.from_numpy(noise(r, t, n)))
        return x
    return x - ETA * (x - target(r, n)) + noise(r, t, n)


def make(comm: Communicator, name: str, n: int, iterations: int, **params):
    x = torch.from_numpy(x0(n).copy())
    ctx = AlgorithmContext(comm, x, torch.zeros_like(x), LR, 0)
    return algorithm_class(name)(params_model(name).model_validate({"name": name, **params}), ctx)


def drive(alg, iterations: int, before_sync=None, after_sync=None, compute_s: float = 0.0):
    """The training loop's hook order; the callbacks see the algorithm around each after_step."""
    for t in range(iterations):
        alg.before_forward(t)
        if compute_s:
            time.sleep(compute_s)
        alg.after_backward(t)
        local_step(alg.ctx.params, RANK, t)
        if before_sync:
            before_sync(t, alg)
        alg.after_step(t)
        if after_sync:
            after_sync(t, alg)
        alg.end_iteration(t)
    alg.finish()
    return alg


def gathered(x: torch.Tensor) -> np.ndarray | None:
    """Every rank's copy of ``x`` as a (P, n) float64 array on rank 0 (None elsewhere)."""
    rows = WORLD.gather(x.detach().numpy().copy(), root=0)
    return None if rows is None else np.stack(rows).astype(np.float64)


def same_on_all_ranks(x: torch.Tensor) -> bool:
    return len(set(WORLD.allgather(hashlib.sha1(x.detach().numpy().tobytes()).hexdigest()))) == 1


def assert_close(got, want, what: str, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """Compare on rank 0 (where ``got`` and ``want`` live); every rank raises if it differs."""
    agree(lambda: RANK != 0 or np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what))


# -- the rules of docs/algorithms.md ("Periodic family"), every rank at once, in float64 ----------


def reference(name: str, n: int, iterations: int, **p) -> dict[str, np.ndarray]:
    """Final models of all ranks (``models``, P x n) and the final anchor / center / global model (``z``)."""
    P = SIZE
    X = np.tile(x0(n).astype(np.float64), (P, 1))
    z = X[0].copy()  # anchor / center / global model
    U = np.zeros_like(X)  # Overlap Local SGD: per-rank anchor momentum
    u = np.zeros(n)  # BMUF: block momentum
    A = X.copy()  # CoCoD-SGD: local bases
    pending = None
    period, local = p.get("period", 2), 0

    def olsgd_sync():
        nonlocal z, X, U, pending, local
        if pending is not None:
            z, pending = pending, None
        X = (1 - p["alpha"]) * X + p["alpha"] * z
        U = p["beta"] * U + (z - X) / LR
        pending, local = (z - LR * U).mean(0), 0

    for t in range(iterations):
        X = np.stack([local_step(X[r], r, t) for r in range(P)])
        local += 1
        if not periodic_sync(t, period):
            continue
        if name == "local_sgd":
            X[:] = X.mean(0)
        elif name == "bmuf":
            u = p["block_momentum"] * u + (z - X.mean(0)) / LR
            z = z - p["block_lr"] * LR * u
            X[:] = z
        elif name == "overlap_local_sgd":
            olsgd_sync()
        elif name == "easgd":
            D = X - z
            X = X - p["alpha"] * D
            z = z + p["alpha"] * D.sum(0)
        elif name == "cocod_sgd":
            if pending is not None:
                z, pending = pending, None
            X = z + X - A
            A = X.copy()
            pending = X.mean(0)
    if name == "overlap_local_sgd":
        if local:
            olsgd_sync()
        z = pending
        X[:] = z
    if name == "cocod_sgd" and pending is not None:
        z = pending
        X = z + X - A
    return {"models": X, "z": z}


CASES = {  # name -> parameters; each runs with iterations a multiple of the period and not
    "local_sgd": {"period": 3},
    "bmuf": {"period": 3, "block_momentum": 0.7, "block_lr": 1.5},
    "overlap_local_sgd": {"period": 3, "alpha": 0.6, "beta": 0.7},
    "easgd": {"period": 3, "alpha": 0.2},
    "easgd_overlap": {"period": 3, "alpha": 0.2, "overlap": True},
    "cocod_sgd": {"period": 3},
}
STATE = {"bmuf": "anchor", "overlap_local_sgd": "anchor", "easgd": "center", "cocod_sgd": "global_model"}


def _matches_reference(comm: Communicator, case: str) -> None:
    params = CASES[case]
    name = case.removesuffix("_overlap")
    for n in LENGTHS:
        for iterations in (12, 14, 2):  # 2: fewer steps than the period, finish does everything
            alg = drive(make(comm, name, n, iterations, **params), iterations)
            want = reference(name, n, iterations, **{k: v for k, v in params.items() if k != "overlap"})
            what = f"{case} n={n} iterations={iterations}"
            assert_close(gathered(alg.ctx.params), want["models"], f"{what}: final models")
            if name in STATE:
                state = getattr(alg, STATE[name])
                assert same_on_all_ranks(state), f"{what}: {STATE[name]} differs across ranks"
                states = gathered(state)
                assert_close(None if states is None else states[0], want["z"], f"{what}: {STATE[name]}")


@check
def local_sgd_matches_reference(comm: Communicator) -> None:
    _matches_reference(comm, "local_sgd")


@check
def bmuf_matches_reference(comm: Communicator) -> None:
    _matches_reference(comm, "bmuf")


@check
def overlap_local_sgd_matches_reference(comm: Communicator) -> None:
    _matches_reference(comm, "overlap_local_sgd")


@check
def easgd_matches_reference(comm: Communicator) -> None:
    _matches_reference(comm, "easgd")


@check
def easgd_overlap_matches_reference(comm: Communicator) -> None:
    _matches_reference(comm, "easgd_overlap")


@check
def cocod_sgd_matches_reference(comm: Communicator) -> None:
    _matches_reference(comm, "cocod_sgd")


# -- properties -----------------------------------------------------------------------------------


@check
def bmuf_without_momentum_is_local_sgd(comm: Communicator) -> None:
    for n in LENGTHS:
        local = drive(make(comm, "local_sgd", n, 12, period=3), 12).ctx.params
        bmuf = drive(make(comm, "bmuf", n, 12, period=3, block_momentum=0.0, block_lr=1.0), 12).ctx.params
        agree(lambda: torch.testing.assert_close(bmuf, local, rtol=1e-5, atol=1e-6))


@check
def models_identical_after_every_sync(comm: Communicator) -> None:
    """Local SGD, BMUF: every model equal after each sync; overlap variants: the anchor / global model."""
    for name, attr in (("local_sgd", None), ("bmuf", None), ("overlap_local_sgd", "anchor"),
                       ("cocod_sgd", "global_model")):
        syncs = []

        def after_sync(t, alg, attr=attr, syncs=syncs):
            if periodic_sync(t, alg.params.period):
                syncs.append(t)
                buf = alg.ctx.params if attr is None else getattr(alg, attr)
                assert same_on_all_ranks(buf), f"{alg.name}: differs across ranks after the sync of iteration {t}"

        alg = drive(make(comm, name, 1000, 12, period=3), 12, after_sync=after_sync)
        assert syncs == [2, 5, 8, 11], syncs
        # Every variant ends with one model on every rank when the iterations are a multiple of the period.
        assert same_on_all_ranks(alg.ctx.params), f"{name}: final models differ"


@check
def easgd_center_identical_and_workers_pulled(comm: Communicator) -> None:
    """Center equal on all ranks; each worker's distance to it shrinks by exactly 1 - alpha."""
    alpha = 0.2
    finals = {}
    for overlap in (False, True):
        seen = {}

        def before_sync(t, alg, seen=seen):
            seen["x"], seen["z"] = alg.ctx.params.clone(), alg.center.clone()

        def after_sync(t, alg, seen=seen, overlap=overlap):
            if not periodic_sync(t, alg.params.period):
                return
            # Blocking: the center pulled toward is the one before the sync. Overlap: the previous
            # round lands first, then the pull; the center is not moved again until the next sync.
            z = alg.center if overlap else seen["z"]
            assert same_on_all_ranks(alg.center), f"overlap={overlap}: center differs after iteration {t}"
            pulled, before = alg.ctx.params - z, seen["x"] - z
            agree(lambda: torch.testing.assert_close(pulled, (1 - alpha) * before, rtol=1e-5, atol=1e-6))
            if SIZE > 1:
                assert not same_on_all_ranks(alg.ctx.params), "workers should stay elastic, not identical"

        alg = drive(make(comm, "easgd", 1000, 12, period=3, alpha=alpha, overlap=overlap), 12,
                    before_sync=before_sync, after_sync=after_sync)
        assert same_on_all_ranks(alg.center)
        finals[overlap] = (alg.ctx.params.clone(), alg.center.clone())
    # Both variants compute the same iterates: only the waiting moves.
    same = all(torch.equal(a, b) for a, b in zip(finals[False], finals[True]))
    agree_that(same, "overlapped EASGD should compute exactly the blocking iterates")


@check
def overlap_local_sgd_beta0_anchor_is_mean_of_pulled_models(comm: Communicator) -> None:
    pulled = []  # rank 0: mean of the pulled models at each sync

    def after_sync(t, alg):
        if periodic_sync(t, alg.params.period):
            if pulled:  # the anchor completed at this sync is the previous round's mean
                assert_close(alg.anchor.numpy(), pulled[-1], f"anchor at iteration {t}", rtol=1e-6, atol=1e-6)
            models = gathered(alg.ctx.params)
            pulled.append(models.mean(0) if RANK == 0 else None)

    alg = drive(make(comm, "overlap_local_sgd", 1000, 12, period=3, alpha=0.6, beta=0.0), 12, after_sync=after_sync)
    assert len(pulled) == 4
    assert_close(alg.anchor.numpy(), pulled[-1], "anchor after finish", rtol=1e-6, atol=1e-6)
    deployed = torch.equal(alg.ctx.params, alg.anchor)
    agree_that(deployed, "finish should deploy the anchor")


@check
def overlap_variants_do_not_wait_at_sync_points(comm: Communicator) -> None:
    """With 100 ms links into and out of rank 0, blocking syncs wait, overlapped ones do not.

    A blocking sync is an allreduce: every rank's result needs data that crossed a 100 ms link
    after its sender entered the sync. So the last rank to leave leaves at least one latency
    after the last rank to enter. An overlapped sync blocks for less than 0.3 of the shortest
    such wait measured in the same launch. One rank alone may wait less: it may enter late (the ranks
    leave the previous sync at different times, and the hypervisor may pause a process) and find
    its data already on the way. All ranks share one machine, so ``time.monotonic`` is one clock.
    """
    if SIZE < 2:
        raise Skip("needs 2 ranks: one rank sends no messages")
    slow = Communicator(WORLD)
    latency = 0.1
    slow.set_links([EmulatedLink(0, r, latency) for r in range(1, SIZE)] + [EmulatedLink(r, 0, latency) for r in range(1, SIZE)])
    blocking_waits = []  # measured first, in this launch: what an overlapped sync is held against
    try:
        for name, params, blocking in (
            ("local_sgd", {}, True),
            ("easgd", {}, True),
            ("overlap_local_sgd", {}, False),
            ("cocod_sgd", {}, False),
            ("easgd", {"overlap": True}, False),
        ):
            entered, left = {}, {}

            def before_sync(t, alg, entered=entered):
                entered[t] = time.monotonic()

            def after_sync(t, alg, left=left):
                left[t] = time.monotonic()

            # 4 steps of 0.15 s between syncs: enough for a few 100 ms hops to finish in the background.
            drive(make(slow, name, 1000, 8, period=4, **params), 8, before_sync=before_sync, after_sync=after_sync,
                  compute_s=0.15)
            label = f"{name} {params}"
            for t in (3, 7):
                if blocking:
                    spans = WORLD.allgather((entered[t], left[t]))
                    last_in = max(e for e, _ in spans)
                    waited = max(x for _, x in spans) - last_in
                    relative = [(round(e - last_in, 4), round(x - last_in, 4)) for e, x in spans]
                    agree_that(waited >= 0.9 * latency,
                               f"{label}: the sync after iteration {t} ended {waited:.4f} s after the last rank "
                               f"entered it (entered, left per rank, from the last entry: {relative})")
                    blocking_waits.append(waited)
                else:
                    # Against the blocking syncs of this launch, not a fixed time: a slower
                    # machine lengthens both.
                    took = left[t] - entered[t]
                    agree_that(took < 0.3 * min(blocking_waits),
                               f"{label}: overlapped sync after iteration {t} blocked {took:.4f} s, a blocking one "
                               f"{min(blocking_waits):.4f} s")
    finally:
        slow.close()


def main(out_path: str) -> int:
    comm = Communicator(WORLD)
    run_checks(CHECKS, out_path, WORLD, comm)
    comm.close()
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main(sys.argv[1]))
