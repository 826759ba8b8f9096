"""Nodes sharing NICs: one contention rule in the native emulator and in the simulator, the
hierarchical allreduce in both, and the checks under mpiexec (tests/mpi/topology_checks.py)."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
from conftest import mpi_check_suite, save_test_calibration

from harness import _core as core
from harness.emulated_link import EmulatedLink
from harness.scenario import scenario_from_dict
from harness.scenario.network import NodeTopology, node_topology
from harness.scenario.network_fields import LinkSettings
from harness.schedules import RING_THRESHOLD_BYTES
from harness.sim.calibration import NetworkModel
from harness.sim.collective_timing import run_program
from harness.sim.hosts import hosts_topology
from harness.sim.network import SimNetwork
from harness.sim.step_programs import hierarchical_program
from harness.testing.real_runs import run_and_compare
from harness.testing.scenarios import NIC_RUN_COMPUTE, NIC_RUN_LEAST_S, NIC_RUN_SCENARIO

INF = float("inf")
FREE_BASE = NetworkModel(latency_s=0.0, bandwidth_bytes_per_s=1e300)  # only the emulated path counts


def _topology(node_of, nic=(20e-6, 1.25e8), intra=(1e-6, 5e9), fabric=None) -> NodeTopology:
    return NodeTopology(tuple(node_of), intra[0], intra[1], nic[0], nic[1], fabric)


def _native_releases(ranks, links, topo: NodeTopology, messages) -> list[float]:
    def bw(b):
        return INF if b is None else b

    pair_links = [(l.src, l.dst, l.latency_s, bw(l.bandwidth_bytes_per_s)) for l in links]
    return core.emulated_releases(
        ranks, pair_links, list(topo.node_of), (topo.intra_latency_s, bw(topo.intra_bandwidth_bytes_per_s)),
        (topo.nic_latency_s, bw(topo.nic_bandwidth_bytes_per_s)), bw(topo.fabric_bandwidth_bytes_per_s), messages)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fabric", [None, 2e8])
def test_simulator_holds_messages_as_the_native_emulator(seed: int, fabric: float | None) -> None:
    """Random messages, posted in time order, between 7 ranks on 3 uneven nodes with slow NICs,
    a pair link rule on top and (or not) a fabric limit: the simulator releases each message at
    the time the native emulator (its C++ code, without MPI) does."""
    rng = random.Random(seed)
    node_of = [0, 0, 0, 1, 1, 2, 2]
    topo = _topology(node_of, fabric=fabric)
    links = [EmulatedLink(0, 3, 1e-3, 1e7), EmulatedLink(4, 5, 0.0, 5e6)]  # one between nodes, one inside node 1
    t, messages = 0.0, []
    for _ in range(200):
        t += rng.choice([0.0, rng.expovariate(2000.0)])
        src, dst = rng.sample(range(7), 2)
        messages.append((src, dst, float(rng.choice([0, 100, 40_000, 1_000_000])), t))
    native = _native_releases(7, links, topo, messages)
    net = SimNetwork(7, FREE_BASE, links, topology=topo)
    simulated = [net.message(s, d, b, post)[0] for s, d, b, post in messages]
    assert simulated == pytest.approx(native, rel=1e-12, abs=1e-12)


def test_two_nodes_sharing_a_nic_queue_their_messages() -> None:
    """8 ranks as 2 nodes of 4, each sending 1 MB to the other node at once through 1 Gb/s NICs:
    node 0's NIC carries the four messages one after another (8 ms each), while messages inside
    a node do not wait for it."""
    topo = _topology([r // 4 for r in range(8)], nic=(0.0, 1.25e8), intra=(0.0, None))
    net = SimNetwork(8, FREE_BASE, topology=topo)
    mb = 1_000_000
    releases = sorted(net.message(r, r + 4, mb, 0.0)[0] for r in range(4))
    assert releases == pytest.approx([0.008, 0.016, 0.024, 0.032])
    assert net.message(5, 4, mb, 0.0)[0] == 0.0  # inside node 1: the intra link is free
    assert net.message(4, 0, mb, 0.0)[0] == pytest.approx(0.008)  # the other direction: full duplex
    native = _native_releases(8, [], topo, [(r, r + 4, mb, 0.0) for r in range(4)])
    assert sorted(native) == pytest.approx(releases)


@pytest.mark.parametrize("node_of", [
    (0, 0, 0, 0, 1, 1, 1, 1), (0, 0, 1, 1, 2), (0, 1, 0, 1, 0, 1, 0), (0, 0, 0), (0, 1, 2, 3, 4), (3, 3, 1, 0, 0, 1, 2, 2, 2),
])
def test_hierarchical_schedule_is_the_native_layers(node_of: tuple[int, ...]) -> None:
    """The simulator's hierarchical allreduce against the native builder, member by member."""
    from test_sim_model import _COUNTS, _member_steps

    p = len(node_of)
    for threshold in (RING_THRESHOLD_BYTES, 0):
        for count in _COUNTS:
            schedule = hierarchical_program(node_of, count, threshold)
            for me in range(p):
                native = [([tuple(x) for x in sends], [tuple(x) for x in recvs])
                          for sends, recvs in core.allreduce_steps(p, me, count, threshold, list(node_of), "hierarchical")]
                assert _member_steps(schedule, me) == native, (node_of, threshold, count, me)


def test_hierarchical_allreduce_wins_on_a_slow_nic() -> None:
    """2 nodes of 4 behind 1 Gb/s NICs with a fast intra-node link, 4 MB per rank: the flat ring
    sends every chunk between nodes at two places of the ring; hierarchical crosses the NICs with
    one leader per node. On one node (no NIC at all) the flat ring is the faster."""
    count = 1_000_000

    def allreduce_time(node_of, hierarchical: bool) -> float:
        topo = _topology(node_of, nic=(20e-6, 1.25e8), intra=(3e-6, 1.5e11))
        net = SimNetwork(len(node_of), FREE_BASE, topology=topo, allreduce="hierarchical" if hierarchical else "auto")
        members = range(len(node_of))
        return max(run_program(net.allreduce_program(members, count), members, [0.0] * len(node_of), net))

    two_nodes = [r // 4 for r in range(8)]
    flat, hier = allreduce_time(two_nodes, False), allreduce_time(two_nodes, True)
    assert hier < 0.8 * flat, (flat, hier)
    one_node = [0] * 8
    assert allreduce_time(one_node, False) < allreduce_time(one_node, True)


def test_tree_allreduce_crosses_a_nic_once_each_way_where_the_ring_does_almost_twice() -> None:
    """NCCL's measurement on two AWS p3dn nodes (8 V100 each behind one 100 Gb/s NIC; 1 GB: ring
    268 ms, tree 134 ms), at 100 MB on the simulated NICs: the ring puts 2(p-1)/p of the buffer
    through each NIC direction (15.6 ms), the tree the buffer once (its bound: 8 ms), pipelined in
    1 MiB chunks, all edges and both directions at once: 10.2 ms, the rest being each round
    waiting for the NIC's 20 us (96 rounds of a chunk) and the pipeline filling and draining."""
    from harness.sim.step_programs import allreduce_program

    p, count = 16, 25_000_000
    node_of = tuple(r // 8 for r in range(p))
    topo = _topology(node_of, nic=(20e-6, 1.25e10), intra=(3e-6, 1.5e11))

    def allreduce_time(algorithm: str) -> float:
        schedule = allreduce_program(p, count, RING_THRESHOLD_BYTES, algorithm, node_of if algorithm == "tree" else ())
        net = SimNetwork(p, FREE_BASE, topology=topo)
        return max(run_program(schedule, range(p), [0.0] * p, net))

    once = count * 4 / 1.25e10  # the buffer through one NIC direction
    ring, tree = allreduce_time("ring"), allreduce_time("tree")
    assert ring > 2 * (p - 1) / p * once
    assert once < tree < 1.5 * once, (tree, once)
    assert tree < 0.8 * ring, (tree, ring)


def test_scenario_topology_reaches_both_sides() -> None:
    doc = {"name": "t", "ranks": 6, "workload": {"model": "tiny_cnn", "dataset": "synthetic", "batch_size": 8,
                                                 "iterations": 2},
           "algorithms": ["allreduce_sgd"],
           "network": {"topology": {"preset": "ethernet_1g", "placement": [0, 0, 0, 1, 1, 2],
                                    "bisection_gbps": 2}, "allreduce": "hierarchical"}}
    scenario = scenario_from_dict(doc)
    topo = node_topology(scenario)
    assert topo.node_of == (0, 0, 0, 1, 1, 2) and topo.nodes == 3 and scenario.network.allreduce == "hierarchical"
    assert (topo.nic_latency_s, topo.nic_bandwidth_bytes_per_s) == (50e-6, 1.25e8)
    assert topo.fabric_bandwidth_bytes_per_s == 2.5e8
    assert topo.intra_bandwidth_bytes_per_s == 1.5e11


# -- the hosts of a multi-host run as nodes (harness.sim.hosts) ------------------------------------

def test_hosts_nics_queue_like_emulated_ones_but_need_no_wake_up() -> None:
    """5 ranks on hosts a, b, a, b, b; the calibration's NIC excess 50 us and 0.8 Gb/s (1e8 B/s).
    A message between hosts is held on the two NICs by the emulator's rule and released when its
    bytes have crossed, plus the NIC latency; inside a host it goes at once. Unlike an emulated
    topology, a real NIC needs no progress thread to release the message: no ``progress_s``."""
    base = NetworkModel(latency_s=100e-6, bandwidth_bytes_per_s=1e9, progress_s=1e-3)
    hosts = hosts_topology(["a", "b", "a", "b", "b"], LinkSettings(latency_us=50, bandwidth_gbps=0.8))
    assert hosts.node_of == (0, 1, 0, 1, 1)
    assert (hosts.intra_latency_s, hosts.intra_bandwidth_bytes_per_s) == (0.0, None)  # the base is the intra link
    mb = 1_000_000
    net = SimNetwork(5, base, hosts=hosts)
    release, arrival = net.message(0, 2, mb, 0.0)  # both on host a
    assert release == 0.0 and arrival == pytest.approx(100e-6 + 1e-3)
    release, arrival = net.message(0, 1, mb, 0.0)  # a -> b: 10 ms on each NIC, cut through
    assert release == pytest.approx(0.010 + 50e-6)
    assert arrival == pytest.approx(release + 100e-6 + 1e-3)
    assert net.message(2, 4, mb, 0.0)[0] == pytest.approx(0.020 + 50e-6)  # queued behind it on a's NIC
    emulated = SimNetwork(5, base, topology=hosts)  # the same nodes, emulated by the native layer
    assert emulated.message(0, 1, mb, 0.0)[0] == pytest.approx(0.010 + 50e-6 + 1e-3)
    with pytest.raises(ValueError, match="not both"):
        SimNetwork(5, base, topology=hosts, hosts=hosts)


def test_an_allreduce_across_hosts_is_slower_by_the_nic() -> None:
    """The same 3+2 ranks, a 4 MB ring allreduce: on one host it costs the base network only;
    on two hosts the ring crosses each NIC, and the predicted time grows by at least the bytes
    a NIC carries at its bandwidth; the allreduce fit on hosts recovers the base from such times."""
    from harness.sim.collective_timing import predict_allreduce_s
    from harness.sim.fit import ALPHAS, BANDWIDTHS, fit_allreduce_on_hosts

    truth = NetworkModel(latency_s=float(ALPHAS[5]), bandwidth_bytes_per_s=float(BANDWIDTHS[5]))
    hosts = hosts_topology(["a", "a", "a", "b", "b"], LinkSettings(latency_us=50, bandwidth_gbps=0.8))
    one_host = predict_allreduce_s(5, 4 << 20, truth)
    two_hosts = predict_allreduce_s(5, 4 << 20, truth, hosts=hosts)
    chunk = (4 << 20) / 5
    assert two_hosts >= one_host + 2 * chunk / 1e8  # at least one chunk in each direction of the ring, twice
    points = [(5, size, predict_allreduce_s(5, size, truth, hosts=hosts)) for size in (4, 65536, 1 << 20, 4 << 20)]
    fitted, error = fit_allreduce_on_hosts(points, hosts)
    assert (fitted.latency_s, fitted.bandwidth_bytes_per_s) == pytest.approx((truth.latency_s, truth.bandwidth_bytes_per_s))
    assert error == pytest.approx(0.0, abs=1e-9)


# -- a whole run ----------------------------------------------------------------------------------

@pytest.mark.mpi
def test_a_run_on_two_emulated_nodes_pays_for_the_nic_and_its_simulation_is_within_a_factor_of_two(tmp_path) -> None:
    """`harness run` with a topology: 4 ranks as 2 nodes of 2 behind 0.2 Gb/s NICs, a 1 MB buffer.
    Every allreduce (a flat ring) puts 1.5 MB through each NIC: at 25 MB/s at least 60 ms per
    iteration against 10 ms of compute (a bound load cannot break: the emulator holds every
    message until its bytes have crossed). The trace-driven simulation of the same run, queueing
    on the same NICs, is within a factor of 2 of it: a coarse check that catches a broken model
    (a NIC not shared, bits taken for bytes); how close they are is `python -m harness bench
    agreement --only nic_run` (about 10% here). (The hierarchical allreduce under mpiexec:
    tests/test_bench.py and tests/mpi/topology_checks.py.)"""
    cal = save_test_calibration(tmp_path / "cal.json", 4, NIC_RUN_COMPUTE)
    compared = run_and_compare(NIC_RUN_SCENARIO, tmp_path, cal, mode="trace")
    steps = pd.read_csv(compared.run / "steps.csv")
    median = (steps["end_s"] - steps["start_s"]).groupby(steps["iteration"]).max().median()
    assert median > NIC_RUN_LEAST_S, median
    (row,) = compared.table.itertuples()
    assert row.predicted_iter_s > NIC_RUN_LEAST_S, compared.output
    assert 0.5 < row.measured_iter_s / row.predicted_iter_s < 2.0, compared.output


# -- under mpiexec ------------------------------------------------------------------------------

RANK_COUNTS = (3, 5, 8)


# timing: nic_contention_is_what_the_simulator_says_within_a_factor_of_two compares measured times (one launch for all)
TestTopologyChecks = mpi_check_suite("topology_checks.py", RANK_COUNTS, checks=4, marks=[pytest.mark.timing])


def _tree_input(rank: int, n: int, dtype) -> np.ndarray:
    """tests/mpi/topology_checks.py's tree_input: what ``rank`` contributes."""
    return (np.random.default_rng([rank, n]).standard_normal(n) * 10.0 ** (rank % 3)).astype(dtype)


def _uneven_nodes(size: int) -> tuple[int, ...]:
    """tests/mpi/topology_checks.py's uneven_nodes: nodes of 3, 2, 3, 2, ... ranks."""
    return tuple(j for j in range(size) for _ in range(3 if j % 2 == 0 else 2))[:size]


@pytest.mark.mpi
@pytest.mark.timing  # shares TestTopologyChecks' launches
@pytest.mark.parametrize("ranks", RANK_COUNTS)
def test_tree_allreduce_under_mpi_is_the_simulated_sum(tmp_path_factory, ranks: int) -> None:
    """The native tree allreduce's sums under mpiexec (topology_checks.py's tree_allreduce_matches_mpi,
    which also checks them against MPI's and across ranks) are bit for bit the simulator's:
    harness.sim.sums.native_sum of the tree schedule over the same inputs and nodes, for every
    rank's float32 sums and a group's float64 ones (its sum does not depend on the chunks)."""
    import hashlib

    import torch

    from harness.sim.step_programs import allreduce_program
    from harness.sim.sums import native_sum

    result = TestTopologyChecks.reports(ranks, tmp_path_factory)["tree_allreduce_matches_mpi"]
    assert result["status"] == "pass", result["detail"]
    placements = {"none": None, "uneven": _uneven_nodes(ranks), "round_robin": tuple(r % 2 for r in range(ranks))}
    lines = result["detail"].splitlines()
    assert len(lines) == 3 * 2 * (4 + (2 if ranks >= 3 else 0)), lines  # placements x chunks x (sums, group sums)
    plain_differs = 0  # lines whose plain sum differs: the comparison can tell orders apart
    for line in lines:
        kind, name, chunk, n, digest = line.split()
        members = list(range(ranks)) if kind == "sum" else [r for r in range(ranks) if r != 1]
        dtype = np.float32 if kind == "sum" else np.float64
        xs = [torch.from_numpy(_tree_input(r, int(n), dtype)) for r in members]
        nodes = () if placements[name] is None else tuple(placements[name][r] for r in members)
        schedule = allreduce_program(len(members), int(n), RING_THRESHOLD_BYTES, "tree", nodes, int(chunk))
        total = native_sum(xs, schedule).numpy()
        assert hashlib.sha1(total.tobytes()).hexdigest() == digest, line
        plain_differs += hashlib.sha1(torch.stack(xs).sum(0).numpy().tobytes()).hexdigest() != digest
    assert plain_differs > 0
