"""Messages through shared NICs, under ``mpiexec`` (``bench agreement``'s ``nic_messages`` case and
``tests/mpi/topology_checks.py``): 8 ranks as 2 nodes of 4, each exchanging 1 MiB with its partner
on the other node through emulated 1 Gb/s NICs, posted 3 ms apart; every exchange's real time
against what the simulator's network says.

The ranks of the benchmark's case run :mod:`harness.bench.nic_exchange_worker`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.scenario.network import NodeTopology
from harness.sim.calibration import FIXED_NETWORK, NetworkModel
from harness.sim.network import SimNetwork

NIC_RANKS = 8
NIC_GBPS = 1.0
NIC_FLOATS = 256 * 1024  # 1 MiB
NIC_GAP_S = 3e-3  # between the posts of one node's ranks


def nic_topology(node_of: Sequence[int], nic_gbps: float | None = None) -> NodeTopology:
    """Nodes ``node_of`` whose NICs (if ``nic_gbps``) are the only emulated resource."""
    nic = None if nic_gbps is None else nic_gbps * 1e9 / 8
    return NodeTopology(tuple(node_of), 0.0, None, 0.0, nic, None)


@dataclass
class NicExchange:
    """Every rank's exchange with its partner on the other node, as (start, end) on the shared
    CLOCK_MONOTONIC: ``spans`` through the NICs, ``control`` the same exchanges posted the same
    way without any emulated resource (what MPI and the machine add by themselves)."""

    spans: list[tuple[float, float]]
    control: list[tuple[float, float]]
    received_right: list[bool] = field(default_factory=list)

    @property
    def ranks(self) -> int:
        return len(self.spans)


def exchange_through_nics(
    world: Any, nic_gbps: float = NIC_GBPS, count: int = NIC_FLOATS, gap_s: float = NIC_GAP_S
) -> NicExchange:
    """On every rank of ``world`` (mpi4py; an even size >= 4, all on one host): the two halves of
    the ranks are two nodes; rank r of node 0 and its partner r + P/2 exchange ``count`` floats,
    the k-th rank of a node posting ``k * gap_s`` after the first. Every rank gets every span."""
    from harness.comm import Communicator  # noqa: PLC0415  (loads MPI and the native layer: ranks only)

    size, rank = world.Get_size(), world.Get_rank()
    half = size // 2
    node_of = [r // half for r in range(size)]
    send = np.full(count, rank, dtype=np.float32)
    peer = (rank + half) % size
    gathered, right = {}, True
    for label, topology in (("control", None), ("nics", nic_topology(node_of, nic_gbps))):
        recv = np.zeros(count, dtype=np.float32)
        comm = Communicator(world)
        try:
            if topology is not None:
                comm.set_topology(topology)
            world.Barrier()
            t0 = world.bcast(time.monotonic() + 0.05, root=0)  # the ranks share CLOCK_MONOTONIC
            time.sleep(max(0.0, t0 + (rank % half) * gap_s - time.monotonic()))
            comm.drain_records()
            comm.exchange(send, recv, peer)
            (record,) = [r for r in comm.drain_records() if r.op == "exchange"]
        finally:
            comm.close()
        right = right and bool(recv[0] == peer and recv[-1] == peer)
        gathered[label] = world.allgather((record.start_s, record.end_s))
    return NicExchange(gathered["nics"], gathered["control"], world.allgather(right))


def simulated_exchange_ends(
    posts: Sequence[float], base: Any = None, nic_gbps: float = NIC_GBPS, count: int = NIC_FLOATS
) -> list[float]:
    """When the simulator's network says each rank's exchange of :func:`exchange_through_nics`
    ends: the same messages, posted at ``posts``, in that order, through the same NICs, each
    then paying ``base`` (a ``NetworkModel``: what MPI and the machine add to a message once the
    emulated NIC releases it; None: nothing)."""
    size = len(posts)
    half = size // 2
    node_of = [r // half for r in range(size)]
    base = base or NetworkModel(latency_s=0.0, bandwidth_bytes_per_s=1e15)
    net = SimNetwork(size, base, topology=nic_topology(node_of, nic_gbps))
    release, arrival = {}, {}
    for r in sorted(range(size), key=lambda r: posts[r]):
        release[r], arrival[(r + half) % size] = net.message(r, (r + half) % size, count * 4, posts[r])
    return [max(release[r], arrival[r]) for r in range(size)]


def nic_comparisons(exchange: NicExchange) -> list[tuple[str, float, float, str]]:
    """Each rank's exchange against the simulator, as (name, real s, simulated s, mode), in two modes:

    - ``trace``: posted when it was, each message paying after its release what an exchange of
      the same size cost the same ranks just before without the NICs (the median of the control
      exchanges: MPI's own copy of 1 MiB on shared cores and the progress threads' wake-ups);
    - ``predictive``: posted when the worker meant to post it (``k * NIC_GAP_S`` after the first
      rank of its node), each paying the fixed calibration's message cost
      (``save_fixed_calibration``: 0.3 ms + bytes at 1 GB/s), nothing taken from the run.

    A simulated time runs from the simulated post: in ``predictive`` mode a rank whose real post
    came late (a loaded machine) would otherwise get a simulated end before its real start.
    """
    control = statistics.median(end - start for start, end in exchange.control)
    half = exchange.ranks // 2
    first = min(start for start, _ in exchange.spans)
    planned = [first + (r % half) * NIC_GAP_S for r in range(exchange.ranks)]
    modes = (
        ("trace", [s for s, _ in exchange.spans], NetworkModel(latency_s=control, bandwidth_bytes_per_s=1e15)),
        ("predictive", planned, FIXED_NETWORK),
    )
    items = []
    for mode, posts, base in modes:
        predicted = simulated_exchange_ends(posts, base)
        items += [
            (f"rank {r} exchange ({mode})", end - start, predicted[r] - posts[r], mode)
            for r, (start, end) in enumerate(exchange.spans)
        ]
    return items
