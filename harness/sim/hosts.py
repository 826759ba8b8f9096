"""Where a run's ranks ran, and the simulated network of a run that spanned several hosts.

A real run records the host name of every rank (``rank_hosts`` in run.json; older runs lack
it); ``python -m harness calibrate`` records the same for its ranks and, across hosts, measures
an intra-host and an inter-host pair (``harness.sim.calibration``). :func:`simulated_topology`
is the one rule ``simulate`` and ``compare`` use to turn both into the simulated network:

1. a scenario with ``network.topology`` keeps it: that topology is what the run emulated;
2. otherwise ranks on more than one host become a topology of the hosts as nodes
   (:func:`hosts_topology`): ``placement`` is the host index of every rank, hosts numbered in
   order of first appearance; messages between hosts cross the source host's and the
   destination host's NIC, each shared by the host's ranks, ``nic`` = the calibration's
   inter-host link (:func:`nic_link`); ``intra`` is left unlimited because the calibrated base
   network (``CalibrationEntry.network``) already is the intra-host link, and every message
   pays it;
3. otherwise (one host, or the hosts unknown) no topology: every pair gets the base network.

Why the NIC is the difference of the two measured links, not the inter-host link itself: the
simulator charges every message the base network and, on a topology path, the path's resources
on top (``harness.sim.network``). The base is what a message costs on one host (under training
load, as fitted); what crossing hosts adds is the inter-host link's latency and per-byte time
beyond the intra-host one's. A message between hosts then costs about the measured inter-host
time when the NIC is idle, and queues behind the other ranks' messages when it is not.

Example::

    chosen = simulated_topology(scenario, entry, run_rank_hosts(meta, scenario.ranks))
    for note in chosen.notes:
        print(f"note: {note}")
    frames, stats = predict(scenario, entry, hosts=chosen.hosts)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.scenario.network import NodeTopology
from harness.scenario.network_fields import LinkSettings, Topology
from harness.scenario.schema import Scenario
from harness.sim.calibration import CalibrationEntry, NetworkModel


def host_placement(rank_hosts: Sequence[str]) -> tuple[list[str], list[int]]:
    """(the distinct hosts in order of first appearance, the host index of every rank)."""
    hosts = list(dict.fromkeys(rank_hosts))
    index = {host: i for i, host in enumerate(hosts)}
    return hosts, [index[host] for host in rank_hosts]


def nic_link(intra: NetworkModel | None, inter: NetworkModel | None) -> LinkSettings | None:
    """What crossing hosts adds to a message, as a topology's ``nic``: the inter-host link's
    alpha and per-byte time minus the intra-host link's (a calibration entry's
    ``inter_host_network`` minus its ``p2p_network``), each floored at 0 (no per-byte excess:
    no bandwidth limit). None without an inter-host link (calibrated on one host, or with no two
    ranks on one host)."""
    if inter is None or intra is None:
        return None
    latency_s = max(0.0, inter.latency_s - intra.latency_s)
    per_byte = 1.0 / inter.bandwidth_bytes_per_s - 1.0 / intra.bandwidth_bytes_per_s
    return LinkSettings(latency_us=latency_s * 1e6, bandwidth_gbps=8.0 / per_byte / 1e9 if per_byte > 0 else None)


def hosts_topology(rank_hosts: Sequence[str], nic: LinkSettings) -> NodeTopology:
    """The hosts of ``rank_hosts`` as the nodes of a topology (flat allreduce, as a run without a
    scenario topology does), their NICs ``nic``, nothing added inside a host."""
    _, placement = host_placement(rank_hosts)
    topology = Topology(placement=placement, nic=nic, intra=LinkSettings())
    topology.check(len(placement))
    return NodeTopology.of(topology, len(placement))


def run_rank_hosts(meta: Mapping[str, Any] | None, ranks: int) -> tuple[list[str] | None, list[str]]:
    """The host name of every rank from a run's run.json ``meta``, read defensively, and notes.

    None (with a note saying why, where that matters) when the run did not record them: older
    runs, a value that is not one host name per rank of the ``ranks`` simulated, or a run.json
    that is not an object.
    """
    if not isinstance(meta, Mapping):
        return None, []
    hosts = meta.get("rank_hosts")
    if hosts is None:
        count = meta.get("hosts")
        if isinstance(count, int) and count > 1:
            return None, [
                (
                    f"the run ran on {count} hosts but its run.json does not say which rank ran where "
                    "(no rank_hosts): simulating every pair of ranks on the calibrated network, without "
                    "the hosts' NICs"
                )
            ]
        return None, []
    if not (isinstance(hosts, list) and all(isinstance(h, str) and h for h in hosts)):
        return None, [f"run.json rank_hosts is not a list of host names ({hosts!r:.80}): ignored"]
    if len(hosts) != ranks:
        return None, [f"run.json rank_hosts names the hosts of {len(hosts)} ranks, the simulation has {ranks}: ignored"]
    return list(hosts), []


@dataclass(frozen=True)
class SimTopology:
    """The topology a simulation uses and why.

    ``source``: ``scenario`` (the scenario's own ``network.topology``, emulated in the run),
    ``hosts`` (the run's hosts as nodes; ``hosts`` is their topology, for ``SimNetwork(hosts=)``)
    or ``none``. ``rank_hosts``: the run's, when known. ``description``: one line saying which,
    for the commands to print; ``notes``: what the user should know about the choice."""

    source: str
    hosts: NodeTopology | None = None
    rank_hosts: tuple[str, ...] | None = None
    description: str = "no topology: every pair of ranks on the calibrated network"
    notes: tuple[str, ...] = ()

    @property
    def worth_recording(self) -> bool:
        """Whether there was a choice to make: a topology, or hosts the simulation could not use."""
        return self.source != "none" or bool(self.notes)

    def record(self) -> dict[str, Any]:
        """What a simulated run's run.json says about it (``network_topology``)."""
        out: dict[str, Any] = {"source": self.source, "description": self.description}
        if self.rank_hosts is not None:
            out["rank_hosts"] = list(self.rank_hosts)
        if self.hosts is not None:
            out["placement"] = list(self.hosts.node_of)
            out["nic_latency_s"] = self.hosts.nic_latency_s
            out["nic_bandwidth_bytes_per_s"] = self.hosts.nic_bandwidth_bytes_per_s
        return out


def _hosts_text(rank_hosts: Sequence[str]) -> str:
    hosts, placement = host_placement(rank_hosts)
    return ", ".join(f"{host} ({placement.count(i)} ranks)" for i, host in enumerate(hosts))


def simulated_topology(
    scenario: Scenario, entry: CalibrationEntry | None, rank_hosts: Sequence[str] | None
) -> SimTopology:
    """The topology to simulate ``scenario`` with, by the module's rule, for a run whose ranks ran
    on ``rank_hosts`` (None: unknown or not a run) with calibration ``entry`` (None: the default
    network, which has no inter-host link)."""
    named: Sequence[str] = rank_hosts if rank_hosts is not None else ()
    hosts = list(dict.fromkeys(named))
    known = tuple(rank_hosts) if rank_hosts is not None else None
    if scenario.network.topology is not None:
        notes: tuple[str, ...] = ()
        if len(hosts) > 1:
            notes = (
                (
                    f"the run's ranks ran on {len(hosts)} hosts ({_hosts_text(named)}), but the scenario "
                    "declares network.topology: simulating that topology, which is what the run emulated"
                ),
            )
        nodes = NodeTopology.of(scenario.network.topology, scenario.ranks).nodes
        return SimTopology(
            "scenario",
            rank_hosts=known,
            notes=notes,
            description=f"the scenario's network.topology ({nodes} nodes, emulated in the run)",
        )
    if len(hosts) <= 1:
        return SimTopology("none", rank_hosts=known)
    nic = nic_link(entry.p2p_network, entry.inter_host_network) if entry is not None else None
    if nic is None:
        if entry is None:
            why = "there is no calibration (the default network)"
        elif len(entry.hosts) > 1:
            why = (
                f"the calibration of {entry.ranks} ranks ran on {len(entry.hosts)} hosts with no two ranks on "
                "one host, so it has no intra-host link to tell the inter-host one from"
            )
        else:
            why = f"the calibration of {entry.ranks} ranks was measured on one host: it has no inter-host link"
        note = (
            f"the run's ranks ran on {len(hosts)} hosts ({_hosts_text(named)}), but {why}; simulating "
            "every pair of ranks on the calibrated network, without the hosts' NICs (calibrate with the "
            "run's --hosts FILE to measure them)"
        )
        return SimTopology(
            "none",
            rank_hosts=known,
            notes=(note,),
            description=f"no topology: {len(hosts)} hosts, but no inter-host link calibrated",
        )
    topology = hosts_topology(named, nic)
    bandwidth = "unlimited" if nic.bandwidth_gbps is None else f"{nic.bandwidth_gbps:.3g} Gb/s"
    return SimTopology(
        "hosts",
        topology,
        known,
        description=(
            f"the run's {len(hosts)} hosts as nodes ({_hosts_text(named)}); each host's NIC adds "
            f"{nic.latency_us:.1f} us and {bandwidth} (the calibration's inter-host link beyond its intra-host one)"
        ),
    )
