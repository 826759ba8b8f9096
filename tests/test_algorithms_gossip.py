"""The gossip family: SGP, Overlap-SGP and D-PSGD (docs/algorithms.md, "Gossip family").

What is proven here:
- the schedules they use are the reference code's graphs (SGP's k-peer exponential graph and
  D-PSGD's bipartite exponential graph, restated independently from how the reference's graph
  manager builds and rotates its phone book, P = 2..16); each exponential-graph round is k
  permutations, each AD-PSGD bipartite round a perfect matching between even and odd ranks;
- D-PSGD's mixing matrix is doubly stochastic for every P (ring, also symmetric: P = 1..9, with
  the P = 2 and P = 3 edge cases; bipartite exponential, a shift: even P);
- blocking SGP is bit-reproducible run to run (3, 4 and 6 ranks);
- under real mpiexec (tests/mpi/gossip_checks.py, 1-4 ranks): push-sum conserves mass and
  weight at quiescent points, gradients are taken at the de-biased model, OSGP's staleness stays
  within synch_freq + 1 and its end of run is deadlock-free, and D-PSGD's actual mixing is W;
- end to end (``python -m harness run``): wait avoidance under a straggler, accuracy on digits
  next to Allreduce-SGD, emulated compute, and parameter validation.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from conftest import mpi_check_suite
from harness.schedules import mixing_row
from harness.schedules import (
    bipartite_exponential_shift,
    bipartite_peer,
    exponential_in_peers,
    exponential_levels,
    exponential_out_peers,
    ring_neighbors,
)
from test_run import only_run_dir

# --------------------------------------------------------------------------------------------
# schedules and mixing matrices (pure)


@pytest.mark.parametrize("ranks", range(2, 18))
def test_exponential_rounds_are_permutations(ranks):
    assert exponential_levels(ranks) == int(np.floor(np.log2(ranks - 1))) + 1
    for peers in range(1, ranks):
        levels = exponential_levels(ranks, peers)
        for t in range(2 * levels + 1):
            out = [exponential_out_peers(r, ranks, t, peers) for r in range(ranks)]
            for j in range(peers):
                targets = [o[j] for o in out]
                assert sorted(targets) == list(range(ranks)), f"P={ranks} t={t} peer {j}: not a permutation"
            for r in range(ranks):
                senders = sorted(s for s in range(ranks) for o in out[s] if o == r)
                assert senders == sorted(exponential_in_peers(r, ranks, t, peers))


def reference_phone_book_peers(ranks: int, peers: int, t: int, distances: list[int]) -> list[tuple[list, list]]:
    """Out- and in-peers of every rank at iteration ``t``, restated from how the SGP reference code's
    graph manager works: each rank's phone book is ``rank + d`` for the listed distances, in
    order and with repeats; iteration 0 reads entries 0..k-1 and every later iteration moves each
    index on by k (mod the phone book's length); in-peers of a slot are the ranks whose entry
    at that index is this rank."""
    book = [[(r + d) % ranks for d in distances] for r in range(ranks)]
    slots = [(j + t * peers) % len(distances) for j in range(peers)]
    return [([book[r][s] for s in slots], [q for s in slots for q in range(ranks) if q != r and book[q][s] == r])
            for r in range(ranks)]


def reference_exponential_distances(ranks: int, peers: int) -> list[int]:
    # j * (k+1)^i for i = 0 .. floor(log_{k+1}(P-1)), j = 1 .. k (float log as the reference takes it)
    top = int(np.floor(np.log(ranks - 1) / np.log(peers + 1) + 1e-12))
    return [j * (peers + 1) ** i for i in range(top + 1) for j in range(1, peers + 1)]


@pytest.mark.parametrize("ranks", range(2, 17))
def test_exponential_graph_is_the_reference_graph(ranks):
    """SGP's k-peer graph follows the reference's NPeerDynamicDirectedExponentialGraph, P = 2..16."""
    for peers in range(1, ranks):
        distances = reference_exponential_distances(ranks, peers)
        for t in range(3 * len(distances) // peers + 1):
            for r, (out, inn) in enumerate(reference_phone_book_peers(ranks, peers, t, distances)):
                assert exponential_out_peers(r, ranks, t, peers) == out, (ranks, peers, t, r)
                # the reference skips a self-edge among in-peers; the harness keeps that share itself
                assert sorted(p for p in exponential_in_peers(r, ranks, t, peers) if p != r) == sorted(inn)


@pytest.mark.parametrize(
    "ranks, peers, t, rank, out, inn",
    [
        (4, 2, 0, 0, [1, 2], [3, 2]),
        (4, 2, 1, 0, [3, 2], [1, 2]),  # the first place the old graph differed ([2, 1] and [2, 3])
        (8, 1, 2, 5, [1], [1]),
        (8, 2, 1, 0, [3, 6], [5, 2]),
        (6, 2, 1, 0, [3, 0], [3, 0]),  # hop 6 is a multiple of P: rank 0 keeps that share
        (8, 3, 1, 2, [6, 2, 6], [6, 2, 6]),  # hops 4, 8, 12: two shares to rank 6, one kept
        (16, 3, 1, 1, [5, 9, 13], [13, 9, 5]),
    ],
)
def test_exponential_graph_table(ranks, peers, t, rank, out, inn):
    assert exponential_out_peers(rank, ranks, t, peers) == out
    assert exponential_in_peers(rank, ranks, t, peers) == inn


def test_exponential_hops_follow_the_spec():
    # r + 2^(t mod (floor(log2(P-1)) + 1)) mod P; P = 8: hops 1, 2, 4.
    assert [exponential_out_peers(5, 8, t) for t in range(4)] == [[6], [7], [1], [6]]
    assert exponential_out_peers(0, 1, 3) == [] and exponential_levels(2) == 1
    assert exponential_levels(244, 2) == 6  # 3^5 = 243 <= 243: exact, where float log says 4.999...
    with pytest.raises(ValueError, match=r"peers must be in \[1, 3\]"):
        exponential_out_peers(0, 4, 0, peers=4)


@pytest.mark.parametrize("ranks", range(2, 21, 2))
def test_bipartite_rounds_are_perfect_matchings(ranks):
    for t in range(12):
        partner = [bipartite_peer(r, ranks, t) for r in range(ranks)]
        assert sorted(partner) == list(range(ranks))
        for r, p in enumerate(partner):
            assert partner[p] == r and p != r, f"P={ranks} t={t}: {r} -> {p} -> {partner[p]}"
            assert (r - p) % 2 == 1, "partners must be one even, one odd rank"


def reference_bipartite_distances(ranks: int) -> list[int]:
    # DynamicBipartiteExponentialGraph, even P: offsets 1, then 1 + 2^i, each forward then backward
    top = int(np.floor(np.log2(ranks - 1) + 1e-12))
    offsets = [1] + [1 + 2**i for i in range(1, top + 1)]
    return [d for o in offsets for d in (o, -o)]


@pytest.mark.parametrize("ranks", range(2, 17, 2))
def test_bipartite_exponential_is_the_reference_graph(ranks):
    """D-PSGD bipartite_exponential: the reference's one-peer bipartite exponential graph, P = 2..16."""
    distances = reference_bipartite_distances(ranks)
    for t in range(2 * len(distances) + 1):
        shift = bipartite_exponential_shift(ranks, t)
        for r, (out, inn) in enumerate(reference_phone_book_peers(ranks, 1, t, distances)):
            assert [(r + shift) % ranks] == out, (ranks, t, r)
            assert [(r - shift) % ranks] == inn, (ranks, t, r)
            assert (out[0] - r) % 2 == 1, "bipartite: even ranks talk to odd ones only"
            # the mixing row averages with the rank it receives from
            assert mixing_row(r, ranks, t, "bipartite_exponential") == {r: 0.5, inn[0]: 0.5}
    assert [bipartite_exponential_shift(4, t) for t in range(4)] == [1, -1, 3, -3]  # rank 0: to 1, from 3


class _RecordingChannel:
    """Stands in for the push channel in a single process: records what SGP pushes."""

    def __init__(self) -> None:
        self.sent: list[tuple[list[int], int, torch.Tensor]] = []

    def send(self, buf, peers, round):
        self.sent.append((list(peers), round, buf.clone()))
        return None


class _Comm:
    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.channel = _RecordingChannel()

    def push_channel(self, count: int):
        return self.channel


@pytest.mark.parametrize(
    "ranks, peers, t, kept_shares, sent_to",
    [(6, 2, 1, 2, [3]), (8, 3, 1, 2, [4, 4]), (5, 2, 0, 1, [1, 2]), (8, 3, 0, 1, [1, 2, 3])],
)
def test_sgp_keeps_self_addressed_shares(ranks, peers, t, kept_shares, sent_to):
    """Where the graph names the rank itself it keeps that 1/(k+1) share; a rank named twice gets
    two messages; kept plus sent is exactly what the rank had (weight alike)."""
    from harness.algorithms.base import AlgorithmContext
    from harness.algorithms.params import SGPParams
    from harness.algorithms.sgp import SGP

    comm = _Comm(rank=0, size=ranks)
    x = torch.tensor([3.0, -1.5, 0.25, 7.0])
    alg = SGP(SGPParams(peers=peers), AlgorithmContext(comm, x.clone(), torch.zeros(4), 0.0, 0))
    alg.rounds = t
    assert alg.push() == len(sent_to)
    (peers_sent, round_sent, message), = comm.channel.sent
    assert peers_sent == sent_to and round_sent == t and alg.expected == len(sent_to)
    share = 1.0 / (peers + 1)
    torch.testing.assert_close(alg.ctx.params, x * (kept_shares * share), rtol=0, atol=0)
    assert alg.weight == kept_shares * share and float(message[4]) == pytest.approx(share)
    torch.testing.assert_close(message[:4], x * share, rtol=0, atol=0)
    total = alg.ctx.params.double() + len(sent_to) * message[:4].double()
    torch.testing.assert_close(total, x.double(), rtol=1e-7, atol=0)


def mixing_matrix(ranks: int, t: int, graph: str) -> np.ndarray:
    w = np.zeros((ranks, ranks))
    for i in range(ranks):
        for j, wij in mixing_row(i, ranks, t, graph).items():
            w[i, j] += wij
    return w


def assert_doubly_stochastic(w: np.ndarray, symmetric: bool = True) -> None:
    assert (w >= 0).all()
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)
    if symmetric:
        np.testing.assert_allclose(w, w.T, atol=1e-12)


@pytest.mark.parametrize("ranks", range(1, 10))
def test_ring_mixing_is_doubly_stochastic(ranks):
    w = mixing_matrix(ranks, 0, "ring")
    assert_doubly_stochastic(w)
    for i in range(ranks):  # the support is exactly self plus the ring neighbours of the schedule
        assert set(np.flatnonzero(w[i])) == {i, *ring_neighbors(i, ranks)}
    if ranks >= 3:
        np.testing.assert_allclose(w[w > 0], 1 / 3)
    expected_small = {1: [[1.0]], 2: [[0.5, 0.5], [0.5, 0.5]], 3: np.full((3, 3), 1 / 3)}
    if ranks in expected_small:
        np.testing.assert_allclose(w, expected_small[ranks])


@pytest.mark.parametrize("ranks", [1, 2, 4, 6, 8, 16])
def test_bipartite_mixing_is_doubly_stochastic(ranks):
    for t in range(8):
        w = mixing_matrix(ranks, t, "bipartite_exponential")
        assert_doubly_stochastic(w, symmetric=ranks <= 2)  # a shift: symmetric only when P = 2
        if ranks > 1:
            assert set(np.unique(w[w > 0])) == {0.5}
            for i in range(ranks):
                assert w[i, (i - bipartite_exponential_shift(ranks, t)) % ranks] == 0.5


def test_unknown_graph_is_refused():
    with pytest.raises(ValueError, match="valid: ring, bipartite_exponential"):
        mixing_row(0, 4, 0, "star")


# --------------------------------------------------------------------------------------------
# multi-rank checks on the hooks (tests/mpi/gossip_checks.py)

RANK_COUNTS = (1, 2, 3, 4)


TestGossipChecks = mpi_check_suite("gossip_checks.py", RANK_COUNTS, checks=7)


# --------------------------------------------------------------------------------------------
# end to end


def _scenario(tmp_path: Path, name: str, **fields) -> Path:
    data = {"name": name, "seed": 7, "optimizer": {"lr": 0.05}, **fields}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _harness_run(scenario: Path, out: Path, timeout: float = 280) -> subprocess.CompletedProcess:
    """``python -m harness run``; on timeout SIGINT it, so that it takes its mpiexec job down too."""
    cmd = [sys.executable, "-m", "harness", "run", str(scenario), "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the launcher kills the ranks' process group on Ctrl+C
        try:
            stdout, stderr = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"{scenario.name} did not finish in {timeout} s (a deadlock?)\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _run(tmp_path: Path, name: str, **fields):
    proc = _harness_run(_scenario(tmp_path, name, **fields), tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = only_run_dir(tmp_path / "out", name)
    return run, pd.read_csv(run / "steps.csv"), pd.read_csv(run / "evals.csv")


DELAY_S = 0.2
SLOW = 3
SYNCH_FREQ = 4


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory):
    """4 ranks, rank 3 sleeps 200 ms every iteration; logreg on digits, 20 iterations."""
    return _run(
        tmp_path_factory.mktemp("straggler"), "gossip_straggler", ranks=4,
        workload={"model": "logreg", "dataset": "digits", "batch_size": 16, "iterations": 20, "eval_every": 20},
        algorithms=[{"name": "osgp", "synch_freq": SYNCH_FREQ}, "sgp", "dpsgd"],
        imbalance=[{"kind": "fixed", "ranks": [SLOW], "delay_ms": DELAY_S * 1000}],
    )


def _iteration_s(steps, algorithm):
    s = steps[steps.algorithm == algorithm]
    return s.assign(duration=s.end_s - s.start_s)


@pytest.mark.mpi
@pytest.mark.slow
def test_osgp_fast_ranks_do_not_wait_for_the_straggler(straggler_run):
    # OSGP blocks only when a rank has pushed fewer than t // (s+1) + 1 rounds by iteration t
    # and its round in flight is incomplete. Rounds complete by message count, so the fast
    # in-peers' messages keep the fast ranks' rounds going (the straggler's mass is absorbed
    # whenever it arrives): with synch_freq 4 a fast rank blocks in at most one iteration out
    # of 5, its median iteration stays far below the straggler's (which sleeps the delay in each),
    # and it finishes its 20 iterations long before the straggler finishes its own. Both are
    # measured against the straggler in the same run, so a slower machine slows both sides.
    _, steps, _ = straggler_run
    osgp = _iteration_s(steps, "osgp")
    fast = osgp[osgp["rank"] != SLOW]
    slow_median = osgp[osgp["rank"] == SLOW].duration.median()
    for rank, d in fast.groupby("rank"):
        assert d.duration.median() < slow_median - 0.5 * DELAY_S, \
            f"osgp rank {rank}: median {d.duration.median():.3f} s, the straggler's {slow_median:.3f} s"
    slow_end = osgp[osgp["rank"] == SLOW].end_s.max()
    assert fast.end_s.max() < 0.6 * slow_end, (fast.end_s.max(), slow_end)
    # Staleness: iterations since the last completed round + 1; fast ranks run ahead of their
    # gossip, but in the steady state by no more than synch_freq + 1.
    assert (osgp.staleness >= 1).all()
    assert fast.staleness.max() >= 2 and fast.staleness.median() <= SYNCH_FREQ + 1, fast.staleness.tolist()


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["dpsgd", "sgp"])
def test_synchronous_gossip_follows_the_straggler(straggler_run, algorithm):
    # D-PSGD (ring) and SGP block every iteration for this iteration's messages, so a rank can
    # lead the straggler by at most its distance from it in the graph (ring on 4 ranks: 2
    # iterations; exponential graph: about as many). So *every* rank, not only the straggler's
    # neighbours, runs at the straggler's pace: its mean iteration time is close to the delay.
    # The mean, not the median: a rank that is not the straggler's in-peer may alternate short
    # and double-length iterations (SGP rank 2 hears from ranks 1 and 0 in turn and waits two
    # straggler iterations every other iteration). D-PSGD's ring neighbours of the straggler
    # wait in every iteration: their median is close to the delay and spent blocked in comm.
    _, steps, _ = straggler_run
    s = _iteration_s(steps, algorithm)
    for rank, d in s[s["rank"] != SLOW].groupby("rank"):
        assert d.duration.mean() >= 0.5 * DELAY_S, f"{algorithm} rank {rank}: mean {d.duration.mean():.3f} s"
    if algorithm == "dpsgd":
        neighbours = s[s["rank"].isin(ring_neighbors(SLOW, 4))]
        for rank, d in neighbours.groupby("rank"):
            assert d.duration.median() >= 0.5 * DELAY_S, f"rank {rank}: median {d.duration.median():.3f} s"
            assert d.comm_blocked_s.median() >= 0.5 * DELAY_S, f"rank {rank}: blocked {d.comm_blocked_s.median():.3f} s"


# The second parameter set of each gossip method, run under a label of its own (a variant) in the
# same run as the defaults: one launch instead of two.
VARIANTS = {"sgp": {"name": "sgp_peers2", "algorithm": "sgp", "peers": 2},
            "osgp": {"name": "osgp_synch2", "algorithm": "osgp", "synch_freq": 2},
            "dpsgd": {"name": "dpsgd_bipartite", "algorithm": "dpsgd", "graph": "bipartite_exponential"}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """4 ranks, logreg on digits, 60 iterations, one run: the baseline, the three gossip methods
    with their defaults (scenario 0) and with the parameters of ``VARIANTS`` (scenario 1)."""
    workload = {"model": "logreg", "dataset": "digits", "batch_size": 16, "iterations": 60, "eval_every": 30}
    return _run(tmp_path_factory.mktemp("train"), "gossip_train", ranks=4, workload=workload,
                algorithms=["allreduce_sgd", "sgp", "osgp", "dpsgd", *VARIANTS.values()])


def _final_average_accuracy(evals, algorithm) -> float:
    e = evals[(evals.algorithm == algorithm) & (evals.model == "average")]
    return float(e[e.iteration == e.iteration.max()].test_accuracy.iloc[0])


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("scenario", [0, 1])
@pytest.mark.parametrize("algorithm", ["sgp", "osgp", "dpsgd"])
def test_gossip_methods_train_like_allreduce(trained, scenario, algorithm):
    run, steps, evals = trained
    label = algorithm if scenario == 0 else VARIANTS[algorithm]["name"]
    baseline = _final_average_accuracy(evals, "allreduce_sgd")
    acc = _final_average_accuracy(evals, label)
    assert acc > 0.80, f"{label}: {acc:.3f}"
    assert acc >= baseline - 0.04, f"{label}: {acc:.3f} vs allreduce_sgd {baseline:.3f}"
    finals = torch.load(run / "provenance" / f"final_models_{label}.pt")
    assert finals.shape[0] == 4 and torch.isfinite(finals).all()
    # Gossip keeps the deployable models close but not identical. OSGP's arrivals depend on
    # timing, so its spread varies from run to run: 0.25 typically, 0.52 and 0.69 seen with
    # synch_freq 2 on a machine whose cores other jobs were using; its bound says only that the
    # models stayed of one kind (the accuracy checks above say they are good).
    spread = float((finals - finals.mean(0)).norm(dim=1).max() / finals.mean(0).norm())
    assert spread < (1.0 if algorithm == "osgp" else 0.5), spread


@pytest.mark.mpi
def test_emulated_compute_runs(tmp_path):
    run, steps, _ = _run(tmp_path, "gossip_emulated", ranks=3,
                         workload={"model": "logreg", "dataset": "digits", "batch_size": 8, "iterations": 6,
                                   "eval_every": 6, "compute": {"emulate_ms": 2}, "params": 1000},
                         algorithms=[{"name": "sgp", "peers": 2}, {"name": "osgp", "synch_freq": 1}, "dpsgd"],
                         results={"provenance": "full"})  # emulated compute keeps none by default
    assert len(steps) == 3 * 3 * 6
    assert (steps.groupby("algorithm").bytes_sent.sum() > 0).all()
    for algorithm in ("sgp", "osgp", "dpsgd"):
        finals = torch.load(run / "provenance" / f"final_models_{algorithm}.pt")
        assert finals.shape == (3, 1000) and torch.isfinite(finals).all()


# --------------------------------------------------------------------------------------------
# parameters


@pytest.mark.parametrize(
    "ranks, entry, message",
    [
        (4, {"name": "sgp", "peers": 4}, "algorithms[0].peers"),
        (4, {"name": "osgp", "synch_freq": -1}, "algorithms[0].synch_freq"),
        (3, {"name": "dpsgd", "graph": "bipartite_exponential"}, "even number of ranks"),
        (4, {"name": "dpsgd", "graph": "star"}, "algorithms[0].graph"),
    ],
)
@pytest.mark.subprocess
def test_bad_params_exit_2(tmp_path, ranks, entry, message):
    path = _scenario(tmp_path, "bad", ranks=ranks, algorithms=[entry],
                     workload={"model": "logreg", "dataset": "digits", "batch_size": 8, "iterations": 4})
    proc = subprocess.run([sys.executable, "-m", "harness", "validate", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and proc.stderr.startswith("error:"), proc.stderr


# --------------------------------------------------------------------------------------------
# determinism


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("ranks, peers", [(6, 2)])
def test_sgp_is_bit_reproducible(tmp_path, ranks, peers):
    """Blocking SGP mixes exactly round t's messages in iteration t, added in source order, so two
    runs of one scenario give bit-identical final models however the ranks' timing differed (a
    random straggler makes in-peers run ahead; at 6 ranks with 2 peers a rank keeps its own share
    in every other round). At 3 and 4 ranks the hooks are checked the same way, with random
    sleeps that differ between the two runs (gossip_checks.py, sgp_is_bit_reproducible_...)."""
    fields = dict(
        ranks=ranks,
        workload={"model": "logreg", "dataset": "digits", "batch_size": 8, "iterations": 24, "eval_every": 24},
        algorithms=[{"name": "sgp", "peers": peers}],
        imbalance=[{"kind": "random_ranks", "count": 1, "delay_ms": 15}],
        results={"provenance": "full"},
    )
    finals = []
    for attempt in range(2):
        (tmp_path / str(attempt)).mkdir()
        run, steps, _ = _run(tmp_path / str(attempt), "sgp_repeat", **fields)
        finals.append(torch.load(run / "provenance" / "final_models_sgp.pt"))
    assert finals[0].shape[0] == ranks and torch.isfinite(finals[0]).all()
    assert torch.equal(finals[0], finals[1]), float((finals[0] - finals[1]).abs().max())
