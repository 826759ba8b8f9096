"""The scenario's ``network`` section: link settings and rules, node agents, host staging and
the topology of nodes (``harness.scenario.network`` turns them into a table of links)."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, model_serializer, model_validator

from harness.errors import ParamError
from harness.scenario.ranks import Rank, check_each, check_rank, check_ranks
from harness.strict_model import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, StrictModel


def _latency_ms_schema(schema: dict[str, Any]) -> None:
    """The JSON Schema of ``latency_ms``, the input-only key ``LinkSettings._latency_ms`` reads,
    right after ``latency_us``; the two exclude each other."""
    latency_ms = {
        "type": "number",
        "minimum": 0,
        "description": "The latency in milliseconds instead: kept as latency_us = 1000 * latency_ms "
        "(give one of the two).",
    }
    properties = schema["properties"]
    schema["properties"] = {}
    for key, value in properties.items():
        schema["properties"][key] = value
        if key == "latency_us":
            schema["properties"]["latency_ms"] = latency_ms
    schema["not"] = {"required": ["latency_us", "latency_ms"]}


class LinkSettings(StrictModel):
    """Latency and bandwidth of an emulated link: a message of B bytes is delivered latency + 8 B /
    (1e9 bandwidth_gbps) seconds after it is sent, behind the messages sent before it on the link.
    ``latency_ms`` may be given instead of ``latency_us``."""

    model_config = ConfigDict(json_schema_extra=_latency_ms_schema)
    input_only_keys: ClassVar[tuple[str, ...]] = ("latency_ms",)

    latency_us: NonNegativeFloat = 0.0
    """One-way latency of every message on the link, in microseconds."""
    bandwidth_gbps: PositiveFloat | None = None
    """Bandwidth in gigabits per second (1e9 bits); null: no emulated limit."""

    @model_validator(mode="before")
    @classmethod
    def _latency_ms(cls, data: Any) -> Any:
        if not (isinstance(data, dict) and "latency_ms" in data):
            return data
        data = dict(data)
        ms = data.pop("latency_ms")
        if "latency_us" in data:
            raise ParamError("latency_ms", "give latency_us or latency_ms, not both", ms).to_pydantic()
        try:  # an int too large for a float overflows; a huge float gives inf
            finite = type(ms) in (int, float) and math.isfinite(ms * 1000.0)
        except OverflowError:
            finite = False
        if not finite or ms < 0:
            raise ParamError("latency_ms", "must be a number >= 0", ms).to_pydantic()
        data["latency_us"] = ms * 1000.0
        return data

    @property
    def latency_s(self) -> float:
        return self.latency_us / 1e6

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        return None if self.bandwidth_gbps is None else self.bandwidth_gbps * 1e9 / 8


# An NVLink-class link between a node's GPUs (V100 DGX-1, as in the SGP paper: about 150 GB/s
# per GPU and direction, a few us per message): the intra-node link of the cluster presets and a
# node agent's default.
_NVLINK = {"latency_us": 3.0, "bandwidth_gbps": 1200.0}


class NodeAgent(StrictModel):
    """``workload.node``: every rank stands for a node of ``gpus`` GPUs driven by one process, as
    in the SGP paper's runs. ``batch_size`` and the compute are the node's; each iteration the
    node also reduces its GPUs' gradients to one GPU and broadcasts the parameters back over
    ``link`` (default: the topology presets' NVLink-class link), which
    ``harness.local_costs.node_combine_s`` times."""

    gpus: PositiveInt
    """GPUs per node (1: no combining cost)."""
    link: LinkSettings = Field(default_factory=lambda: LinkSettings(**_NVLINK))
    """The link between the node's GPUs; each iteration costs 2 ((gpus - 1) latency + bytes /
    bandwidth) for the reduce and the broadcast, pipelined chains over it. Default: NVLink-class."""


class HostStaging(StrictModel):
    """``workload.staging``: the ranks communicate from host memory, so every iteration the
    communicated buffer crosses PCIe from the GPU to the host before communication and back after
    it (``harness.local_costs.staging_s``): 2 (latency + bytes / bandwidth) per iteration. On a real
    GPU run (``device: cuda``) the copies are real, and this emulated cost is left out."""

    bandwidth_gbps: PositiveFloat
    """Copy bandwidth of one direction, in gigabits per second."""
    latency_us: NonNegativeFloat = 0.0
    """Fixed cost of one copy, in microseconds."""


def _rule_schema(schema: dict[str, Any]) -> None:
    """A rule's link fields as :class:`LinkSettings` has them, without defaults: a field the rule
    leaves out keeps what ``network.default`` and earlier rules say."""
    _latency_ms_schema(schema)
    for key in ("latency_us", "bandwidth_gbps"):
        schema["properties"][key].pop("default", None)
        schema["properties"][key]["description"] += " Left out: as network.default and earlier rules say."


class LinkRule(LinkSettings):
    """A ``network.links`` entry: overrides only the fields it sets, on the links it names."""

    model_config = ConfigDict(json_schema_extra=_rule_schema)

    @model_serializer(mode="wrap")
    def _only_set_fields(self, handler: Any) -> dict[str, Any]:
        # An unset field means "keep what earlier entries said"; writing the default would override.
        data = handler(self)
        settings = LinkSettings.model_fields
        keys = sorted(data, key=lambda k: k in settings)  # the selector (between/from/rank) first
        return {k: data[k] for k in keys if k not in settings or k in self.model_fields_set}

    def pairs(self, ranks: int) -> tuple[list[int], list[int]]:
        """The ordered (src, dst) links this entry names, as parallel lists."""
        raise NotImplementedError


class PairLink(LinkRule):
    """``between: [a, b]``: both directions between a and b."""

    between: Annotated[list[Rank], Field(min_length=2, max_length=2)]
    """The two ranks whose links (both directions) the rule sets."""

    def check(self, ranks: int) -> None:
        check_ranks("between", self.between, ranks)

    def pairs(self, ranks: int) -> tuple[list[int], list[int]]:
        a, b = self.between
        return [a, b], [b, a]


class DirectedLink(LinkRule):
    """``from: a, to: b``: the one direction a -> b."""

    src: Rank = Field(alias="from")
    """The sending rank of the one link the rule sets."""
    dst: Rank = Field(alias="to")
    """The receiving rank (not ``from``)."""

    def check(self, ranks: int) -> None:
        check_rank("from", self.src, ranks)
        check_rank("to", self.dst, ranks)
        if self.src == self.dst:
            raise ParamError("to", "must differ from `from`", self.dst)

    def pairs(self, ranks: int) -> tuple[list[int], list[int]]:
        return [self.src], [self.dst]


class RankLinks(LinkRule):
    """``rank: r``: every link into and out of r."""

    rank: Rank
    """The rank whose links (to and from every other rank) the rule sets."""

    def check(self, ranks: int) -> None:
        check_rank("rank", self.rank, ranks)

    def pairs(self, ranks: int) -> tuple[list[int], list[int]]:
        others = [r for r in range(ranks) if r != self.rank]
        return [self.rank] * len(others) + others, others + [self.rank] * len(others)


# Union tags show up in pydantic's error locations; in parentheses they cannot be mistaken for
# input keys when the loader walks the input to recover the field path.
_LINK_FORMS = {"(between)": ("between",), "(from/to)": ("from", "to"), "(rank)": ("rank",)}
_LINK_TAGS = {PairLink: "(between)", DirectedLink: "(from/to)", RankLinks: "(rank)"}


def _link_form(value: Any) -> str | None:
    if isinstance(value, LinkRule):
        return _LINK_TAGS[type(value)]
    if not isinstance(value, dict):
        return None
    forms = [tag for tag, keys in _LINK_FORMS.items() if any(k in value for k in keys)]
    return forms[0] if len(forms) == 1 else None


AnyLinkRule = Annotated[
    Annotated[PairLink, Tag("(between)")]
    | Annotated[DirectedLink, Tag("(from/to)")]
    | Annotated[RankLinks, Tag("(rank)")],
    Discriminator(
        _link_form,
        custom_error_type="link_form",
        custom_error_message="needs exactly one of `between: [a, b]`, `from: a, to: b` or `rank: r`",
    ),
]


# The papers' networks, by name (``network.topology.preset``); docs/guides/topology.md shows
# them. NIC latencies are typical one-way small-message MPI latencies between nodes: about 20 us
# through the kernel's TCP stack on Ethernet, about 2 us with RDMA on InfiniBand; bandwidths are
# line rates. The intra-node link is NVLink-class (_NVLINK) for the cluster presets.
TOPOLOGY_PRESETS: dict[str, dict[str, dict[str, float]]] = {
    "ethernet_1g": {"nic": {"latency_us": 50.0, "bandwidth_gbps": 1.0}, "intra": _NVLINK},
    "ethernet_10g": {"nic": {"latency_us": 20.0, "bandwidth_gbps": 10.0}, "intra": _NVLINK},
    "infiniband_100g": {"nic": {"latency_us": 2.0, "bandwidth_gbps": 100.0}, "intra": _NVLINK},
}


def _preset_text() -> str:
    """``preset``'s description, from :data:`TOPOLOGY_PRESETS`."""

    def link(values: dict[str, float]) -> str:
        return f"{values['latency_us']:g} us, {values['bandwidth_gbps']:g} Gb/s"

    presets = "; ".join(
        f"{name}: NIC {link(p['nic'])}, intra-node {link(p['intra'])}" for name, p in TOPOLOGY_PRESETS.items()
    )
    return f"A named network that fills the nic and intra fields (or parts of them) left out ({presets}); null: none."


def _one_placement_schema(schema: dict[str, Any]) -> None:
    """``ranks_per_node`` or ``placement``, exactly one of them (``Topology._one_placement``)."""
    schema["oneOf"] = [
        {"properties": {key: {"not": {"type": "null"}}}, "required": [key]} for key in ("ranks_per_node", "placement")
    ]


class Topology(StrictModel):
    """Ranks grouped into nodes: pairs inside a node use the ``intra`` link; messages between
    nodes leave through the source node's NIC, cross the fabric (``bisection_gbps``, if limited)
    and enter through the destination node's NIC. NICs and fabric are shared and full duplex,
    and carry messages in the order they reach them; ``network.default`` and ``network.links``
    still apply, as a first link in front. See docs/guides/topology.md."""

    model_config = ConfigDict(json_schema_extra=_one_placement_schema)

    preset: Literal["ethernet_1g", "ethernet_10g", "infiniband_100g"] | None = Field(
        default=None, description=_preset_text()
    )
    ranks_per_node: PositiveInt | None = None
    """Ranks per node, nodes filled in rank order; must divide ``ranks``. Give this or ``placement``."""
    placement: list[NonNegativeInt] | None = None
    """The node of every rank (``ranks`` entries; nodes numbered 0, 1, 2, ... with none empty), for
    uneven nodes. Give this or ``ranks_per_node``."""
    intra: LinkSettings = LinkSettings()
    """The link between two ranks of one node (each pair has a private one)."""
    nic: LinkSettings = LinkSettings()
    """Each node's network interface, shared by its ranks and full duplex: a message between nodes
    crosses the sending node's NIC and the receiving node's NIC."""
    bisection_gbps: PositiveFloat | None = None
    """Bandwidth of the fabric between the nodes, in gigabits per second, shared by all traffic
    between nodes; null: unlimited."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        """A preset fills the ``intra`` and ``nic`` fields the scenario leaves out."""
        if isinstance(data, dict) and "allreduce" in data:  # where it was before network.allreduce
            raise ParamError(
                "allreduce",
                "moved: write `network.allreduce: hierarchical` (or another "
                "algorithm) instead of network.topology.allreduce",
                data["allreduce"],
            ).to_pydantic()
        if not (isinstance(data, dict) and isinstance(data.get("preset"), str)):
            return data
        preset = TOPOLOGY_PRESETS.get(data["preset"])
        if preset is None:
            return data  # the Literal names the allowed presets
        data = dict(data)
        for part, values in preset.items():
            given = data.get(part, {})
            if isinstance(given, dict):
                has_latency = "latency_us" in given or "latency_ms" in given
                data[part] = {**{k: v for k, v in values.items() if k != "latency_us" or not has_latency}, **given}
        return data

    @model_validator(mode="after")
    def _one_placement(self) -> Topology:
        if (self.ranks_per_node is None) == (self.placement is None):
            raise ParamError(
                "ranks_per_node",
                "give ranks_per_node or placement (the node of every rank), one of them",
                self.ranks_per_node,
            ).to_pydantic()
        return self

    def check(self, ranks: int) -> None:
        if self.placement is not None:
            if len(self.placement) != ranks:
                raise ParamError("placement", f"must name the node of each of the {ranks} ranks", self.placement)
            used = set(self.placement)
            for node in range(max(self.placement) + 1):
                if node not in used:
                    raise ParamError(
                        "placement", f"node {node} has no ranks (number nodes 0, 1, 2, ...)", self.placement
                    )
            return
        assert self.ranks_per_node is not None  # _one_placement: the placement or ranks_per_node
        if ranks % self.ranks_per_node:
            raise ParamError(
                "ranks_per_node", f"must divide ranks ({ranks}); give a placement for uneven nodes", self.ranks_per_node
            )

    def node_of(self, ranks: int) -> list[int]:
        """The node of every rank (``ranks_per_node`` fills nodes in rank order)."""
        if self.placement is not None:
            return list(self.placement)
        per_node = self.ranks_per_node
        assert per_node is not None  # _one_placement: the placement or ranks_per_node
        return [r // per_node for r in range(ranks)]


AllreduceAlgorithm = Literal["auto", "ring", "recursive_doubling", "reduce_broadcast", "hierarchical", "tree"]
"""How allreduces run (``network.allreduce``), in the native layer and the simulator alike:

- ``auto``: ring above ``harness.schedules.RING_THRESHOLD_BYTES`` per rank (and more than 2
  ranks), recursive doubling below (as MPI libraries choose);
- ``ring``: reduce-scatter + allgather around a ring, 2(p-1) steps of 1/p of the buffer (recursive
  doubling for 2 ranks or fewer floats than ranks);
- ``recursive_doubling``: log2(p) steps that each exchange the whole buffer (the ranks beyond a
  power of two fold in first and out last); what PyTorch's THD TCP backend ran in 2018;
- ``reduce_broadcast``: a binomial reduce to rank 0 then a binomial broadcast from it,
  2 ceil(log2 p) steps of the whole buffer (THD's TCP backend before it had recursive doubling);
- ``hierarchical``: inside each node of ``network.topology`` to its first rank, among those
  leaders (``auto``), back inside each node;
- ``tree``: NCCL's pipelined tree: a chain through each node's ranks, a binary tree across the
  nodes' first ranks (without a topology every rank is a node), the buffer in chunks of
  ``harness.schedules.TREE_CHUNK_BYTES`` reduced up and broadcast down at once, so every link
  carries it once each way (one tree, where NCCL splits it over two complementary ones).
"""


class Network(StrictModel):
    """Emulated links: ``default`` for every ordered pair, then ``links`` in file order;
    optionally a ``topology`` of nodes whose shared NICs the messages between nodes cross; and how
    allreduces are built (``allreduce``)."""

    default: LinkSettings = LinkSettings()
    """The link of every ordered pair of ranks (default: none emulated)."""
    links: list[AnyLinkRule] = []  # noqa: RUF012  (a pydantic field: each model copies its default)
    """Rules over ``default``, applied in file order: each names links (``between: [a, b]``, ``from:
    a, to: b`` or ``rank: r``) and sets the fields it gives on them; a later rule overrides an
    earlier one."""
    topology: Topology | None = None
    """Ranks grouped into nodes that share a NIC; null: every pair of ranks has a link of its own."""
    allreduce: AllreduceAlgorithm = "auto"
    """How every allreduce is built, in real and simulated runs alike: ``auto`` (``ring`` from 64 KiB
    per rank with more than 2 ranks, ``recursive_doubling`` below); ``ring`` (reduce-scatter and
    allgather, 2(p-1) steps of 1/p of the buffer); ``recursive_doubling`` (log2 p exchanges of the
    whole buffer); ``reduce_broadcast`` (binomial reduce to rank 0, then broadcast); ``hierarchical``
    (inside each node to its first rank, ``auto`` among those, back inside; needs ``topology``);
    ``tree`` (NCCL's pipelined tree: a chain inside each node, a binary tree across nodes, 1 MiB
    chunks reduced up and broadcast down at once; every rank its own node without ``topology``)."""

    def check(self, ranks: int) -> None:
        if self.allreduce == "hierarchical" and self.topology is None:
            raise ParamError(
                "allreduce", "hierarchical needs network.topology (the nodes it goes through)", self.allreduce
            )
        check_each(self.links, ranks, "links")
        if self.topology is not None:
            try:
                self.topology.check(ranks)
            except ParamError as exc:
                raise exc.within("topology") from None
