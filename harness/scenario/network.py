"""The emulated network of a scenario: a table of directed links and the topology of nodes.

Example::

    for link in link_table(scenario):
        print(link.src, link.dst, link.latency_s, link.bandwidth_bytes_per_s)
    nodes = node_topology(scenario)  # None without network.topology
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.emulated_link import EmulatedLink
from harness.scenario.network_fields import Topology
from harness.scenario.schema import Scenario


def link_table(scenario: Scenario) -> list[EmulatedLink]:
    """Every ordered link that differs from "no delay", sorted by (src, dst).

    Starts from ``network.default`` for each pair src != dst, then applies ``network.links`` in
    file order; an entry overrides only the fields it sets.
    """
    ranks, network = scenario.ranks, scenario.network
    default = (network.default.latency_s, network.default.bandwidth_bytes_per_s)
    named: dict[tuple[int, int], tuple[float, float | None]] = {}  # links some entry touches
    for rule in network.links:
        sets_latency = "latency_us" in rule.model_fields_set
        sets_bandwidth = "bandwidth_gbps" in rule.model_fields_set
        for pair in zip(*rule.pairs(ranks)):
            latency, bandwidth = named.get(pair, default)
            named[pair] = (
                rule.latency_s if sets_latency else latency,
                rule.bandwidth_bytes_per_s if sets_bandwidth else bandwidth,
            )
    pairs = (  # with a default, every pair is emulated: the table is ranks * (ranks - 1) long
        [(s, d) for s in range(ranks) for d in range(ranks) if s != d] if default != (0.0, None) else sorted(named)
    )
    links = (EmulatedLink(s, d, *named.get((s, d), default)) for s, d in pairs)
    return [link for link in links if link.latency_s > 0 or link.bandwidth_bytes_per_s is not None]


@dataclass(frozen=True)
class NodeTopology:
    """``network.topology`` in seconds and bytes per second (None: no emulated limit), with the
    node of every rank resolved. The native layer (``Communicator.set_topology``) and the
    simulator (``SimNetwork``) both take this."""

    node_of: tuple[int, ...]
    intra_latency_s: float
    intra_bandwidth_bytes_per_s: float | None
    nic_latency_s: float
    nic_bandwidth_bytes_per_s: float | None
    fabric_bandwidth_bytes_per_s: float | None

    @property
    def nodes(self) -> int:
        return max(self.node_of) + 1

    @classmethod
    def of(cls, topology: Topology, ranks: int) -> NodeTopology:
        """A checked ``network.topology`` (``Topology.check(ranks)`` passed) for ``ranks`` ranks."""
        bisection = None if topology.bisection_gbps is None else topology.bisection_gbps * 1e9 / 8
        return cls(
            node_of=tuple(topology.node_of(ranks)),
            intra_latency_s=topology.intra.latency_s,
            intra_bandwidth_bytes_per_s=topology.intra.bandwidth_bytes_per_s,
            nic_latency_s=topology.nic.latency_s,
            nic_bandwidth_bytes_per_s=topology.nic.bandwidth_bytes_per_s,
            fabric_bandwidth_bytes_per_s=bisection,
        )


def node_topology(scenario: Scenario) -> NodeTopology | None:
    """The scenario's nodes, or None when it has no ``network.topology``."""
    topology = scenario.network.topology
    return None if topology is None else NodeTopology.of(topology, scenario.ranks)
