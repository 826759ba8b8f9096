"""The SimPy model: exact event times on cases small enough to compute by hand.

Network in these tests: alpha = 1 ms, 1 MB/s, so a message of b bytes takes 1 ms + b us.
Emulated compute (sleep ``emulate_ms``, no jitter) gives exact local work; the predictive
timing adds the calibrated loop overhead (0 here).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

import harness.algorithms.sgp
import harness.schedules
import harness.sim
from harness.emulated_link import EmulatedLink
from harness.scenario.loader import scenario_from_dict
from harness.schedules import RING_THRESHOLD_BYTES, TREE_CHUNK_BYTES
from harness.sim.calibration import CalibrationEntry, NetworkModel
from harness.sim.collective_timing import run_program
from harness.sim.network import SimNetwork
from harness.sim.runs import predict
from harness.sim.step_programs import FLOAT_BYTES, RingProgram, allreduce_program, tree_chunks, tree_shape

ALPHA, BANDWIDTH = 1e-3, 1e6
NET = NetworkModel(latency_s=ALPHA, bandwidth_bytes_per_s=BANDWIDTH)


def msg(nbytes: float) -> float:
    return ALPHA + nbytes / BANDWIDTH


def scenario(ranks: int, algorithms: list, iterations: int = 2, emulate_ms: float = 10.0, params: int = 250,
             imbalance: list | None = None, links: list | None = None):
    data = {
        "name": "hand",
        "ranks": ranks,
        "seed": 7,
        "workload": {"model": "mlp", "dataset": "mnist5k", "batch_size": 4, "iterations": iterations,
                     "eval_every": 1000, "compute": {"emulate_ms": emulate_ms}, "params": params},
        "algorithms": algorithms,
        "imbalance": imbalance or [],
    }
    if links:
        data["network"] = {"links": links}
    return scenario_from_dict(data, source="test")


def simulate(sc):
    frames, _ = predict(sc, CalibrationEntry(ranks=sc.ranks, network=NET))
    return {name: frame.set_index(["iteration", "rank"]) for name, frame in frames.items()}


# --- network -------------------------------------------------------------------------------

def test_base_message_is_alpha_plus_size_over_bandwidth() -> None:
    net = SimNetwork(2, NET)
    assert net.message(0, 1, 1000, post=2.0) == (2.0, pytest.approx(2.0 + msg(1000)))


def test_emulated_link_serialises_like_the_native_emulator() -> None:
    # 5 ms latency, 1 kB/ms: two 1 kB messages posted together; the second starts when the
    # first has left the link (1 ms later), then both need the progress delay and the base cost.
    base = NetworkModel(latency_s=ALPHA, bandwidth_bytes_per_s=BANDWIDTH, progress_s=0.5e-3)
    net = SimNetwork(2, base, [EmulatedLink(0, 1, 5e-3, 1e6)])
    first = net.message(0, 1, 1000, post=0.0)
    second = net.message(0, 1, 1000, post=0.0)
    assert first[0] == pytest.approx(1e-3 + 5e-3 + 0.5e-3)
    assert second[0] == pytest.approx(2e-3 + 5e-3 + 0.5e-3)
    assert second[1] == pytest.approx(second[0] + msg(1000))
    assert net.message(1, 0, 1000, post=0.0)[0] == 0.0  # the reverse link is not emulated


def test_emulated_link_slots_go_by_post_time_not_by_computation_order() -> None:
    # The simulator may compute a message posted in the future first (a collective's later
    # steps); one posted earlier but computed afterwards takes the gap before it.
    net = SimNetwork(2, NET, [EmulatedLink(0, 1, 0.0, 1e6)])  # 1 kB occupies the link for 1 ms
    assert net.message(0, 1, 1000, post=0.010)[0] == pytest.approx(0.011)
    assert net.message(0, 1, 1000, post=0.0)[0] == pytest.approx(0.001)
    assert net.message(0, 1, 1000, post=0.0095)[0] == pytest.approx(0.012)  # no gap fits before 11 ms


def test_two_member_allreduce_waits_for_the_later_join() -> None:
    net = SimNetwork(2, NET)
    schedule = allreduce_program(2, 100)  # recursive doubling: one exchange of 400 bytes
    done = run_program(schedule, [0, 1], [0.0, 0.010], net)
    assert done == pytest.approx([0.010 + msg(400), max(0.010, msg(400))])


def test_three_member_recursive_doubling_folds_the_extra_rank() -> None:
    # p=3: member 0 folds into 1; 1 and 2 exchange; 1 unfolds to 0 (kernels/step_program.cpp).
    net = SimNetwork(3, NET)
    c = msg(400)
    assert run_program(allreduce_program(3, 100), [0, 1, 2], [0.0] * 3, net) == pytest.approx([2 * c, c, 2 * c])


def test_ring_is_chosen_and_sends_what_the_native_ring_sends() -> None:
    # 118,282 floats over 8 ranks: the byte counts the native layer recorded in a real run.
    schedule = allreduce_program(8, 118_282, 64 * 1024)
    assert schedule.steps == 14
    assert schedule.bytes_sent[0] == 827_972 and schedule.bytes_sent[1] == 827_976
    assert schedule.bytes_sent[7] == 827_968
    assert allreduce_program(8, 100, 64 * 1024).steps == 3  # small: recursive doubling


def _member_steps(schedule, me: int) -> list[tuple[list, list]]:
    """Member ``me``'s part of the simulator's aligned schedule, as the native layer lists it:
    its non-empty rounds (one native step each; a round of several steps, as the tree's, lists
    their messages in step order), each as (sends, receives) of (member, floats)."""
    schedule = getattr(schedule, "steps_program", schedule)  # a ring keeps its table for whoever asks
    out = []
    for steps in schedule.rounds:
        sends, recvs = [], []
        for i in steps:
            to, frm = int(schedule.send_to[i, me]), int(schedule.recv_from[i, me])
            if to >= 0:
                sends.append((to, int(schedule.send_bytes[i, me]) // FLOAT_BYTES))
            if frm >= 0:
                recvs.append((frm, int(schedule.send_bytes[i, frm]) // FLOAT_BYTES))
        if sends or recvs:
            out.append((sends, recvs))
    return out


# Sizes around every case of the choice: empty, fewer floats than members, and both sides of the
# ring threshold (64 KiB = 16,384 floats), with remainders that make the ring's chunks unequal.
_COUNTS = (0, 1, 3, 100, 16_383, 16_384, 16_385, 50_001)


@pytest.mark.parametrize("algorithm", ["auto", "ring", "recursive_doubling", "reduce_broadcast", "tree"])
@pytest.mark.parametrize("p", [*range(1, 18), 31, 64])
def test_allreduce_schedule_is_the_native_layers(p: int, algorithm: str) -> None:
    """The simulator's decomposition against the native layer's own step builder (exported from
    _core), member by member, for every network.allreduce but hierarchical (tests/test_topology.py;
    the tree through nodes: test_tree_schedule_is_the_native_layers):
    same peers, same sizes, same order, odd p and the fold included."""
    from harness import _core as core

    for count in _COUNTS:
        schedule = allreduce_program(p, count, RING_THRESHOLD_BYTES, algorithm)
        for me in range(p):
            native = [([tuple(x) for x in sends], [tuple(x) for x in recvs])
                      for sends, recvs in core.allreduce_steps(p, me, count, RING_THRESHOLD_BYTES, [], algorithm,
                                                               tree_chunk_bytes=TREE_CHUNK_BYTES)]
            assert _member_steps(schedule, me) == native, (p, count, me)


def test_whole_buffer_algorithms_take_log_steps_of_the_whole_buffer() -> None:
    """What network.allreduce chooses, in steps and bytes for 1 MB over 8 and over 6 members:
    the ring 2(p-1) steps of 1/p, recursive doubling log2(p) exchanges of all of it (plus the
    fold and unfold beyond a power of two), reduce + broadcast 2 ceil(log2 p) steps, the root
    sending its whole buffer ceil(log2 p) times."""
    count = 250_000
    ring = allreduce_program(8, count, RING_THRESHOLD_BYTES, "ring")
    rd = allreduce_program(8, count, RING_THRESHOLD_BYTES, "recursive_doubling")
    rb = allreduce_program(8, count, RING_THRESHOLD_BYTES, "reduce_broadcast")
    assert (ring.steps, rd.steps, rb.steps) == (14, 3, 6)
    assert max(ring.bytes_sent) == 2 * 7 * count // 8 * FLOAT_BYTES
    assert list(rd.bytes_sent) == [3 * count * FLOAT_BYTES] * 8
    assert rb.bytes_sent[0] == 3 * count * FLOAT_BYTES  # the root broadcasts to 3 members
    assert allreduce_program(6, count, RING_THRESHOLD_BYTES, "recursive_doubling").steps == 4  # fold, 2, unfold
    assert allreduce_program(6, count, RING_THRESHOLD_BYTES, "reduce_broadcast").steps == 6
    assert allreduce_program(2, count, RING_THRESHOLD_BYTES, "ring").steps == 1  # no ring of 2: an exchange
    with pytest.raises(ValueError, match="unknown allreduce algorithm"):
        allreduce_program(4, count, RING_THRESHOLD_BYTES, "butterfly")


# Trees: every member its own node (a binary tree), nodes of 4, uneven and interleaved nodes, one node.
_TREES = [(p, ()) for p in (1, 2, 3, 5, 8, 16)] + [
    (len(nodes), nodes) for nodes in [(0, 0, 0, 0, 1, 1, 1, 1), tuple(r // 4 for r in range(16)),
                                      (0, 0, 0, 1, 1, 2, 2, 2, 2, 3), (3, 3, 1, 0, 0, 1, 2, 2, 2), (0, 1, 0, 1, 0),
                                      (0, 0, 0, 0, 0)]]


@pytest.mark.parametrize("p,nodes", _TREES)
def test_tree_schedule_is_the_native_layers(p: int, nodes: tuple[int, ...]) -> None:
    """The simulator's tree allreduce against the native builder, member by member: below one
    chunk, several chunks (small chunks, and the default's 1 MiB with a remainder), fewer floats
    than members and than chunks."""
    from harness import _core as core

    for count, chunk in [(0, TREE_CHUNK_BYTES), (1, TREE_CHUNK_BYTES), (3, TREE_CHUNK_BYTES), (100, TREE_CHUNK_BYTES),
                         (100, 64), (1001, 400), (7, 4), (3, 8), (600_001, TREE_CHUNK_BYTES)]:
        schedule = allreduce_program(p, count, RING_THRESHOLD_BYTES, "tree", nodes, chunk)
        for me in range(p):
            native = [([tuple(x) for x in sends], [tuple(x) for x in recvs])
                      for sends, recvs in core.allreduce_steps(p, me, count, RING_THRESHOLD_BYTES, list(nodes), "tree",
                                                               tree_chunk_bytes=chunk)]
            assert _member_steps(schedule, me) == native, (nodes, count, chunk, me)


def test_tree_crosses_between_nodes_with_the_buffer_once_each_way() -> None:
    """2 nodes of 8, 10 MB in 1 MiB chunks: the tree's messages between the nodes carry the
    buffer exactly once each way (up the tree, then down), where the ring's carry 2(p-1)/p of it
    each way; every member sends and receives at most one message per step (a round of several
    steps moves chunks on all of a member's edges at once), and ends with every chunk (the
    broadcast's chunks reach every member but the root once)."""
    p, count = 16, 2_500_000
    nodes = tuple(r // 8 for r in range(p))
    tree = allreduce_program(p, count, RING_THRESHOLD_BYTES, "tree", nodes)
    k = tree_chunks(count)
    assert k == 10

    def crossing(schedule, src_node: int) -> float:
        total = 0.0
        for i in range(schedule.steps):
            for m in range(p):
                to = schedule.send_to[i, m]
                if to >= 0 and nodes[m] == src_node and nodes[to] != src_node:
                    total += schedule.send_bytes[i, m]
        return total

    nbytes = count * FLOAT_BYTES
    assert crossing(tree, 0) == crossing(tree, 1) == nbytes
    ring = allreduce_program(p, count, RING_THRESHOLD_BYTES, "ring").steps_program
    assert crossing(ring, 0) == crossing(ring, 1) == 2 * (p - 1) * nbytes // p
    for i in range(tree.steps):  # receivers name their senders, and a member talks to one peer per step
        for m in range(p):
            src = tree.recv_from[i, m]
            if src >= 0:
                assert tree.send_to[i, src] == m
                assert tree.send_to[i, m] in (-1, src)
    # Every member but the root receives K chunks down and, but the leaves, K chunks from each child.
    received = np.where(tree.recv_from >= 0, 1, 0).sum(axis=0)
    shape = tree_shape(nodes)
    assert list(received) == [k * (len(shape.children[m]) + (m != 0)) for m in range(p)]
    # Pipelined, every edge busy in every round: the last chunk leaves the far chain's tail in
    # round K - 1, then climbs 8 edges and comes down 8, one a round; a round is a step per colour.
    assert len(tree.rounds) == k + 2 * 8 - 1
    assert tree.steps <= 2 * len(tree.rounds)
    mid = tree.rounds[k]  # the second node's head, mid-pipeline: both edges, both ways, in one round
    assert sorted(int(tree.send_to[i, 8]) for i in mid) == sorted(int(tree.recv_from[i, 8]) for i in mid) == [0, 9]


def test_a_tree_round_posts_on_all_of_a_members_edges_at_once() -> None:
    """3 members, no nodes: the root's children 1 and 2 on edges of two colours, 100 floats in
    one chunk, every pair's link taking 1 ms for it (the base network free). Round 0: 1 sends
    up; round 1: 2 (after its earlier sibling); round 2: the root sends down to both at once,
    on both links together (by colours, one after the other, the second would end at 3 ms)."""
    free = NetworkModel(latency_s=0.0, bandwidth_bytes_per_s=1e30)
    links = [EmulatedLink(a, b, 0.0, 400 / 1e-3) for a in range(3) for b in range(3) if a != b]
    schedule = allreduce_program(3, 100, RING_THRESHOLD_BYTES, "tree")
    assert [list(r) for r in schedule.rounds] == [[0], [1], [2, 3]]
    assert run_program(schedule, [0, 1, 2], [0.0] * 3, SimNetwork(3, free, links)) == pytest.approx([2e-3] * 3)


@pytest.mark.parametrize("p", [5, 9, 16])
def test_tree_rounds_time_alike_in_python_and_numpy(p: int) -> None:
    """The tree's rounds of several steps through both paths of run_program (the vectorised one
    by an emulated link that adds nothing), 11 chunks, members joining at different times."""
    rng = random.Random(p)
    joins = [rng.uniform(0, 0.01) for _ in range(p)]
    schedule = allreduce_program(p, 1001, RING_THRESHOLD_BYTES, "tree", (), 400)
    assert schedule.continues_round is not None
    fast = run_program(schedule, list(range(p)), joins, SimNetwork(p, NET))
    slow = run_program(schedule, list(range(p)), joins, SimNetwork(p, NET, [EmulatedLink(0, 1, 0.0, 1e30)]))
    assert fast == pytest.approx(slow, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("p,count", [(5, 10), (6, 70_000), (40, 100), (40, 70_000)])
def test_python_and_numpy_paths_agree(p: int, count: int) -> None:
    rng = random.Random(p)
    joins = [rng.uniform(0, 0.01) for _ in range(p)]
    net = SimNetwork(p, NET)
    schedule = allreduce_program(p, count)
    fast = run_program(schedule, list(range(p)), joins, net)
    # The same schedule through the vectorised path: an emulated link that adds nothing.
    slow_net = SimNetwork(p, NET, [EmulatedLink(0, 1, 0.0, 1e30)])
    slow = run_program(schedule, list(range(p)), joins, slow_net)
    # A ring on the base network takes its closed form with the largest chunk's cost: within one
    # float's transfer per step of the step-by-step times.
    slack = schedule.steps * FLOAT_BYTES / BANDWIDTH if isinstance(schedule, RingProgram) else 0.0
    assert fast == pytest.approx(slow, rel=1e-9, abs=slack + 1e-12)
    assert all(f >= s - 1e-12 for f, s in zip(fast, slow))  # a bound, never early


@pytest.mark.parametrize("p", [3, 4, 5, 7, 16, 33, 100])
def test_ring_closed_form_equals_the_steps(p: int) -> None:
    # Equal chunks (count a multiple of p): the closed form is exact, whatever the join times.
    rng = random.Random(p)
    for _ in range(5):
        joins = [rng.choice([0.0, rng.uniform(0, 0.2)]) for _ in range(p)]
        schedule = allreduce_program(p, 50_000 * p)
        closed = run_program(schedule, list(range(p)), joins, SimNetwork(p, NET))
        steps = run_program(schedule, list(range(p)), joins, SimNetwork(p, NET, [EmulatedLink(0, 1, 0.0, 1e30)]))
        assert closed == pytest.approx(steps, rel=1e-12, abs=1e-12)


# --- algorithms ------------------------------------------------------------------------------

def test_blocking_allreduce_waits_for_the_straggler() -> None:
    # Rank 1 sleeps 20 ms in iteration 0; both compute 10 ms; 250 floats = 1 kB.
    sc = scenario(2, ["allreduce_sgd"], imbalance=[{"kind": "fixed", "ranks": [1], "delay_ms": 20, "stop": 1}])
    steps = simulate(sc)["allreduce_sgd"]
    c = msg(1000)
    # Iteration 0: rank 0 waits for the straggler's message; the straggler finds rank 0's there.
    assert steps.loc[(0, 0), "end_s"] == pytest.approx(0.030 + c)
    assert steps.loc[(0, 0), "comm_blocked_s"] == pytest.approx(0.020 + c)
    assert steps.loc[(0, 1), "end_s"] == pytest.approx(0.030)
    assert steps.loc[(0, 1), "comm_blocked_s"] == pytest.approx(0.0)
    # Iteration 1: rank 1 now starts 2 ms earlier and waits for rank 0's message.
    assert steps.loc[(1, 0), "end_s"] == pytest.approx(0.040 + c)
    assert steps.loc[(1, 1), "end_s"] == pytest.approx(0.040 + c + c)
    assert steps.loc[(0, 0), "bytes_sent"] == 1000


def test_wagma_late_member_contributes_stale_and_does_not_wait() -> None:
    # Two ranks, one group of 2, no synchronous round within 2 iterations (period 6).
    # Rank 0 arrives at 10 ms and activates round 0; the activation (8 bytes) reaches rank 1's
    # progress thread at 10 ms + msg(8), which joins with its stale buffer; the group sum is done
    # for rank 0 one exchange later. Rank 1 arrives at 30 ms and takes the finished sum at once.
    sc = scenario(2, [{"name": "wagma", "group_size": 2, "period": 6}],
                  imbalance=[{"kind": "fixed", "ranks": [1], "delay_ms": 20, "stop": 1}])
    steps = simulate(sc)["wagma"]
    join1 = 0.010 + msg(8)
    assert steps.loc[(0, 0), "end_s"] == pytest.approx(join1 + msg(1000))
    assert steps.loc[(0, 0), "staleness"] == 0
    assert steps.loc[(0, 1), "end_s"] == pytest.approx(0.030)
    assert steps.loc[(0, 1), "comm_blocked_s"] == pytest.approx(0.0)
    assert steps.loc[(0, 1), "staleness"] == 1
    assert steps.loc[(0, 0), "bytes_sent"] == 1000  # as the native op counts: activations not included


def test_push_sum_waits_for_the_in_peer_push() -> None:
    # SGP on 2 ranks: each pushes 251 floats (model + weight) and waits for the other's push.
    sc = scenario(2, ["sgp"], iterations=1, imbalance=[{"kind": "fixed", "ranks": [1], "delay_ms": 20}])
    steps = simulate(sc)["sgp"]
    push = msg(251 * 4)
    assert steps.loc[(0, 0), "end_s"] == pytest.approx(0.030 + push)
    assert steps.loc[(0, 0), "comm_blocked_s"] == pytest.approx(0.020 + push)
    # Rank 1's own push must complete (arrive) before... it only waits for rank 0's, long there.
    assert steps.loc[(0, 1), "end_s"] == pytest.approx(0.030)
    assert steps.loc[(0, 0), "bytes_sent"] == 251 * 4


def test_overlapped_allreduce_is_waited_for_one_period_later() -> None:
    # CoCoD-SGD, period 1: the allreduce started after iteration 0 is waited for after iteration 1.
    sc = scenario(2, [{"name": "cocod_sgd", "period": 1}], iterations=2)
    steps = simulate(sc)["cocod_sgd"]
    assert steps.loc[(0, 0), "comm_blocked_s"] == pytest.approx(0.0)
    assert steps.loc[(1, 0), "end_s"] == pytest.approx(0.020)  # msg(1000) = 2 ms < 10 ms of compute
    assert steps.loc[(1, 0), "comm_blocked_s"] == pytest.approx(0.0)


def test_adpsgd_passive_ranks_never_wait() -> None:
    sc = scenario(4, ["adpsgd"], iterations=3, imbalance=[{"kind": "fixed", "ranks": [1, 3], "delay_ms": 30}])
    steps = simulate(sc)["adpsgd"]
    passive = steps.xs(1, level="rank")
    assert (passive["comm_blocked_s"] == 0).all()
    active = steps.loc[(0, 0)]
    assert active["comm_blocked_s"] == pytest.approx(0.0)  # request and reply (2 x 2 ms) fit in 10 ms


def test_adpsgd_passive_agent_serves_one_request_at_a_time() -> None:
    """Active ranks 0 and 2 ask passive rank 1 at the same moment; its replies cross private
    25 MB/s links (1 MB: 40 ms). As the native listener (tests/mpi/comm_checks.py), the agent
    takes the second request only when the first reply has left: the two end 40 ms apart."""
    from harness.sim.comm import SimFabric
    from harness.sim.engine import SimEngine
    from harness.sim.standin import StandIn

    engine = SimEngine()
    links = [EmulatedLink(1, dst, 0.0, 25e6) for dst in (0, 2, 3)]
    fabric = SimFabric(engine, SimNetwork(4, NetworkModel(latency_s=0.0, bandwidth_bytes_per_s=1e15), links), 4)
    ended = {}

    def body(comm):
        def run():
            avg = comm.pairwise_averager(StandIn(250_000))
            if comm.rank in (0, 2):
                avg.irequest(StandIn(250_000), StandIn(250_000), 1).wait()
                ended[comm.rank] = engine.env.now
            avg.close()
        return run

    for comm in fabric.communicators():
        engine.spawn(comm.rank, body(comm))
    engine.run()
    assert sorted(ended.values()) == pytest.approx([0.04, 0.08])


# --- one source of truth -------------------------------------------------------------------

def test_the_simulator_holds_no_algorithm() -> None:
    # The simulator runs the algorithms' own classes: no algorithm name in harness/sim/.
    import pathlib

    from harness.algorithms import registry

    sim = pathlib.Path(harness.sim.__file__).parent
    text = "\n".join(p.read_text() for p in sim.glob("*.py"))
    for name in registry.names():
        assert f'"{name}"' not in text and f"'{name}'" not in text, name


def test_sgp_model_takes_its_peers_from_the_schedule(monkeypatch) -> None:
    calls = []
    real = harness.schedules.exponential_out_peers

    def spy(rank, ranks, t, peers=1):
        calls.append((rank, ranks, t, peers))
        return real(rank, ranks, t, peers)

    monkeypatch.setattr(harness.algorithms.sgp, "exponential_out_peers", spy)  # the real algorithm's module
    simulate(scenario(4, ["sgp"], iterations=3))
    assert sorted(calls) == sorted((r, 4, t, 1) for r in range(4) for t in range(3))


# --- every algorithm at several rank counts ---------------------------------------------------

ALL = ["allreduce_sgd", {"name": "local_sgd", "period": 2}, {"name": "overlap_local_sgd", "period": 2},
       {"name": "easgd", "period": 2, "alpha": 0.1}, {"name": "easgd", "period": 2, "alpha": 0.1, "overlap": True},
       {"name": "cocod_sgd", "period": 2}, {"name": "bmuf", "period": 2}, "sgp", "osgp", "dpsgd",
       {"name": "wagma", "group_size": 2, "period": 3}, {"name": "eager_sgd", "mode": "solo"},
       {"name": "eager_sgd", "mode": "majority"}]


@pytest.mark.parametrize("ranks", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("entry", ALL, ids=lambda e: e if isinstance(e, str) else "-".join(map(str, e.values())))
def test_every_model_finishes_with_complete_records(ranks: int, entry) -> None:
    if isinstance(entry, dict) and entry["name"] == "easgd" and entry["alpha"] >= 2 / (ranks + 1):
        entry = {**entry, "alpha": 1 / (ranks + 2)}
    if isinstance(entry, dict) and entry["name"] == "wagma":
        entry = {**entry, "group_size": min(entry["group_size"], ranks)}
    sc = scenario(ranks, [entry], iterations=12,
                  imbalance=[{"kind": "random_ranks", "count": 1, "delay_ms": 15}])
    (steps,) = simulate(sc).values()
    assert len(steps) == ranks * 12
    durations = steps["end_s"] - steps["start_s"]
    assert (durations >= steps["compute_s"] + steps["injected_delay_s"] - 1e-12).all()
    assert (steps["comm_blocked_s"] >= -1e-12).all()
    assert not math.isnan(steps["end_s"].max())


def test_adpsgd_even_rank_counts() -> None:
    for ranks in (2, 4, 6):
        (steps,) = simulate(scenario(ranks, ["adpsgd"], iterations=10)).values()
        assert len(steps) == ranks * 10


def test_a_thousand_ranks() -> None:
    sc = scenario(1024, [{"name": "wagma", "group_size": 8, "period": 3}], iterations=4,
                  imbalance=[{"kind": "random_ranks", "count": 2, "delay_ms": 50}])
    (steps,) = simulate(sc).values()
    assert len(steps) == 1024 * 4
    assert steps["end_s"].max() > 0.05
