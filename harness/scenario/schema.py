"""The scenario file's schema: frozen, strict models; every default of a scenario lives here.

Checks that need the rank count (rank indices, ``count``, ``group_size``) run in ``Scenario``,
the only model that knows ``ranks``; they raise errors that carry the field path, which the
loader turns into one line per error.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    SerializeAsAny,
    Tag,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from harness.algorithms import user_class, variant
from harness.algorithms.params import AlgorithmParams
from harness.algorithms.registry import names, params_model
from harness.config import NonNegativeFloat, NonNegativeInt, ParamError, PositiveFloat, PositiveInt, StrictModel
from harness.optimizer_spec import (  # noqa: F401  (re-exported: scenario code imports them from here)
    BUILT_IN_OPTIMIZERS,
    AdamOptimizer,
    AdamWOptimizer,
    OptimizerSpec,
    ReferenceOptimizer,
    SGDOptimizer,
)
from harness.user_code import UserCodeError, check_reference, is_reference
from harness.workload.names import unknown_name

Device = Literal["cpu", "cuda"]  # cuda: each rank takes the GPU of its local rank (harness/device.py)

Rank = NonNegativeInt  # "< ranks" is checked by Scenario, which knows ranks
MAX_RANKS = 1 << 16  # far beyond any run here; stops a typo from allocating per-rank tables

_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _check_rank(path: str | tuple[str | int, ...], rank: int, ranks: int) -> None:
    """Raise ParamError at ``path`` unless ``rank`` exists."""
    if rank >= ranks:
        raise ParamError(path, f"rank must be < ranks ({ranks})", rank)


def _check_ranks(field: str, values: list[int], ranks: int) -> None:
    """Raise ParamError at ``field[j]`` for a rank that does not exist or is listed twice."""
    for j, rank in enumerate(values):
        _check_rank((field, j), rank, ranks)
        if rank in values[:j]:
            raise ParamError((field, j), "rank listed twice", rank)


def _check_each(items: list[Any], ranks: int, *prefix: str) -> None:
    """Run ``check(ranks)`` on every item; an error's path gets ``prefix`` and the item index."""
    for i, item in enumerate(items):
        try:
            item.check(ranks)
        except ParamError as exc:
            raise exc.within(*prefix, i) from None


# ---------------------------------------------------------------------------------------------
# workload


class EmulatedCompute(StrictModel):
    """Emulated compute (``workload.compute: {emulate_ms: MS, jitter: SIGMA}``): every iteration each
    rank sleeps instead of computing a forward and backward pass, and still communicates a buffer
    of ``workload.params`` floats (nothing is trained, so there is no accuracy to speak of)."""

    emulate_ms: NonNegativeFloat
    """One iteration's compute time in milliseconds; injected compute factors (``imbalance``
    kinds ``jitter``, ``slowdown``) multiply it."""
    jitter: NonNegativeFloat = 0.0
    """Sigma of a lognormal factor exp(N(0, sigma)) drawn per rank and iteration (from the
    scenario's ``seed``) on ``emulate_ms``; 0: every iteration takes exactly ``emulate_ms``."""


def _compute_form(value: Any) -> str | None:
    if isinstance(value, str):
        return "(real)"
    if isinstance(value, (dict, EmulatedCompute)):
        return "(emulated)"
    return None


Compute = Annotated[
    Union[Annotated[Literal["real"], Tag("(real)")], Annotated[EmulatedCompute, Tag("(emulated)")]],
    Discriminator(
        _compute_form,
        custom_error_type="compute_form",
        custom_error_message="must be 'real' or a mapping {emulate_ms: MS, jitter: SIGMA}",
    ),
]


def _workload_schema(schema: dict[str, Any]) -> None:
    """What the validators below add to the JSON Schema: ``eval_every`` may be left out (its
    default depends on ``iterations``); ``model`` and ``dataset`` come together; ``params`` only
    with emulated compute."""
    schema["required"].remove("eval_every")
    given = {"model": {"type": "string"}, "dataset": {"type": "string"}}
    schema["allOf"] = [
        *({"if": {"properties": {a: given[a]}, "required": [a]}, "then": {"properties": {b: given[b]}, "required": [b]}}
          for a, b in (("model", "dataset"), ("dataset", "model"))),
        {"if": {"properties": {"compute": {"const": "real"}}}, "then": {"properties": {"params": {"type": "null"}}}},
    ]


class Workload(StrictModel):
    """What each rank trains: model, data, batch, iterations per algorithm, real or emulated compute.

    Without ``model`` and ``dataset`` the workload is a training script's own (``harness.api``):
    ``python -m harness run`` refuses such a scenario, ``python -m harness launch`` runs it.
    """

    model_config = ConfigDict(json_schema_extra=_workload_schema)

    # harness.workload.names states the contract of the user's callables; harness.scenario.checks
    # checks them.
    model: str | None = None
    """The model: a built-in name or your own callable as ``"module:callable"``, called as
    ``callable(input_shape=(C, H, W), num_classes=K, **model_args)``. Give ``model`` and ``dataset``
    together, or neither (a training script's own workload, run by ``python -m harness launch``)."""
    dataset: str | None = None
    """The data: a built-in name or your own callable as ``"module:callable"``, called as
    ``callable(seed=SEED, **dataset_args)``, plus ``ranks=RANKS`` when it has a parameter named
    ``ranks`` (``teacher`` does: 256 training samples per rank by default); the training set is
    sharded across the ranks."""
    model_args: dict[str, Any] = {}
    """Keyword arguments of the model callable."""
    dataset_args: dict[str, Any] = {}
    """Keyword arguments of the dataset callable."""
    num_classes: PositiveInt | None = None
    """The model's number of outputs; null: 1 + the dataset's largest label."""
    batch_size: PositiveInt
    """Samples per rank and iteration (so the global batch is ``ranks`` times this)."""
    iterations: PositiveInt
    """Training iterations of each algorithm (every algorithm runs this many, in turn)."""
    compute: Compute = "real"
    """``real``: forward and backward passes of the model; or ``{emulate_ms: MS, jitter:
    SIGMA}``: sleep instead (emulated compute)."""
    params: PositiveInt | None = None
    """Emulated compute only: the number of float32 values communicated (e.g. ``25.6e6`` for a
    ResNet-50); null: the model's own parameter count."""
    eval_every: PositiveInt  # the default is filled in by _default_eval_every
    """Evaluate the averaged model on the test set every this many iterations (and after the
    last). Default: max(1, iterations // 6)."""
    device: Device = "cpu"
    """Where each rank computes: ``cpu``, or ``cuda`` (each rank takes the GPU of its local rank;
    no index)."""
    node: NodeAgent | None = None
    """Make every rank stand for a node of several GPUs driven by one process (``{gpus: N, link:
    ...}``); null: a rank is one worker."""
    staging: HostStaging | None = None
    """Make the ranks communicate from host memory: the communicated buffer crosses PCIe every
    iteration (``{bandwidth_gbps: B, latency_us: L}``); null: no staging."""

    @model_validator(mode="before")
    @classmethod
    def _default_eval_every(cls, data: Any) -> Any:
        if isinstance(data, dict) and "eval_every" not in data:
            iterations = data.get("iterations")
            # A bad `iterations` is reported on its own; 1 only keeps this field quiet meanwhile.
            every = max(1, iterations // 6) if type(iterations) is int else 1
            data = {**data, "eval_every": every}
        return data

    @field_validator("model", "dataset")
    @classmethod
    def _known_or_reference(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        reason = unknown_name(info.field_name, value)
        if reason is None and is_reference(value):
            try:
                check_reference(value)
            except UserCodeError as exc:
                reason = str(exc)
        if reason is not None:
            raise ParamError((), reason, value).to_pydantic()
        return value

    @field_validator("params", mode="before")
    @classmethod
    def _integral_float(cls, value: Any) -> Any:
        # YAML has no integer exponent notation: `params: 25.6e6` arrives as a float.
        if type(value) is float and value.is_integer():
            return int(value)
        return value

    @field_validator("device", mode="before")
    @classmethod
    def _no_device_index(cls, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("cuda:"):
            reason = "give 'cuda' without an index: each rank takes the GPU of its local rank"
            raise ParamError((), reason, value).to_pydantic()
        return value

    @property
    def of_script(self) -> bool:
        """Whether this is a training script's own workload (no model or dataset named here)."""
        return self.model is None

    @model_validator(mode="after")
    def _model_and_dataset(self) -> Workload:
        if (self.model is None) != (self.dataset is None):
            missing, given = ("model", "dataset") if self.model is None else ("dataset", "model")
            reason = f"required when {given} is given (leave out both for a training script's own workload)"
            raise ParamError(missing, reason, None).to_pydantic()
        return self

    @model_validator(mode="after")
    def _params_need_emulation(self) -> Workload:
        if self.params is not None and self.compute == "real":
            raise ParamError(
                "params", "only with emulated compute; real compute communicates the model itself", self.params
            ).to_pydantic()
        return self


# ---------------------------------------------------------------------------------------------
# imbalance


class InjectorSpec(StrictModel):
    """One imbalance entry; it acts on iterations in [start, stop) (stop None: to the end).

    Each kind says in :meth:`effect` what it does to the ranks at one iteration;
    ``harness.injection.InjectionPlan`` combines a scenario's entries and seeds the random ones.
    """

    # True: effect() draws from the generator it is given (one per seed, entry and iteration).
    random: ClassVar[bool] = False

    kind: str
    """Which imbalance this entry injects."""
    start: NonNegativeInt = 0
    """First iteration the entry acts on (counted from 0 in every algorithm's run)."""
    stop: PositiveInt | None = None
    """Iteration at which the entry stops acting (excluded; > ``start``); null: the last iteration."""

    @model_serializer(mode="wrap")
    def _window_last(self, handler: Any) -> dict[str, Any]:
        data = handler(self)  # base fields come first; the kind's own parameters read better there
        return {k: data[k] for k in sorted(data, key=lambda k: k in ("start", "stop"))}

    @model_validator(mode="after")
    def _window(self) -> InjectorSpec:
        if self.stop is not None and self.stop <= self.start:
            raise ParamError("stop", f"must be > start ({self.start})", self.stop).to_pydantic()
        return self

    def check(self, ranks: int) -> None:
        """Raise ParamError if the entry names a rank that does not exist."""

    def active(self, iteration: int) -> bool:
        """Whether ``iteration`` lies in the entry's [start, stop) window."""
        return self.start <= iteration and (self.stop is None or iteration < self.stop)

    def effect(self, ranks: int, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        """Sleep in seconds and compute-time factor of each of ``ranks`` ranks at one iteration
        in the window (fresh arrays); ``rng`` is the generator to draw from when ``random``."""
        raise NotImplementedError


def _at_ranks(ranks: int, listed: list[int], value: float, fill: float) -> np.ndarray:
    vector = np.full(ranks, fill)
    vector[listed] = value
    return vector


def _generator(kind: str, rng: np.random.Generator | None) -> np.random.Generator:
    if rng is None:
        raise ValueError(f"imbalance kind {kind!r} draws at random: pass its generator")
    return rng


class RandomRanksSpec(InjectorSpec):
    """Every iteration ``count`` ranks drawn at random (same draw everywhere) sleep ``delay_ms``
    before their forward pass.

    ``replace: false`` (the default) draws ``count`` different ranks. ``replace: true`` makes
    ``count`` independent draws, as the WAGMA-SGD and eager-SGD code does (``randint(P)`` twice
    per step): when draws coincide fewer ranks sleep (with 2 draws, one rank in 1/P of the
    iterations). That code seeds NumPy with the step counter on every rank but skips the second
    draw on the rank the first one picked (Python's ``or``), after which the ranks' draws no
    longer agree; the harness keeps one draw for all ranks, which is what the code intends.
    """

    random: ClassVar[bool] = True

    kind: Literal["random_ranks"]
    """``random_ranks``."""
    count: PositiveInt
    """How many ranks are drawn every iteration (<= ``ranks``)."""
    delay_ms: NonNegativeFloat
    """How long each drawn rank sleeps, in milliseconds."""
    replace: bool = False
    """false: ``count`` different ranks; true: ``count`` independent draws, so coinciding draws
    make fewer ranks sleep (as the WAGMA-SGD and eager-SGD code draws)."""

    def check(self, ranks: int) -> None:
        if self.count > ranks:
            raise ParamError("count", f"must be <= ranks ({ranks})", self.count)

    def effect(self, ranks: int, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        delay_s = np.zeros(ranks)
        delay_s[_generator(self.kind, rng).choice(ranks, size=self.count, replace=self.replace)] = self.delay_ms / 1e3
        return delay_s, np.ones(ranks)


class FixedSpec(InjectorSpec):
    """The listed ranks sleep ``delay_ms`` every iteration, before their forward pass."""

    kind: Literal["fixed"]
    """``fixed``."""
    ranks: Annotated[list[Rank], Field(min_length=1)]
    """The ranks that sleep (each < ``ranks``, none twice)."""
    delay_ms: NonNegativeFloat
    """How long each of them sleeps every iteration, in milliseconds."""

    def check(self, ranks: int) -> None:
        _check_ranks("ranks", self.ranks, ranks)

    def effect(self, ranks: int, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        return _at_ranks(ranks, self.ranks, self.delay_ms / 1e3, 0.0), np.ones(ranks)


class LinearSpec(InjectorSpec):
    """Rank i sleeps i * ``offset_ms`` every iteration (the papers' usleep(rank * 1 ms) skew)."""

    kind: Literal["linear"]
    """``linear``."""
    offset_ms: NonNegativeFloat
    """Rank i sleeps i times this many milliseconds every iteration."""

    def effect(self, ranks: int, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        return np.arange(ranks) * (self.offset_ms / 1e3), np.ones(ranks)


class JitterSpec(InjectorSpec):
    """Compute time of every rank is multiplied by exp(N(0, ``sigma``)), drawn per rank and iteration."""

    random: ClassVar[bool] = True

    kind: Literal["jitter"]
    """``jitter``."""
    sigma: NonNegativeFloat
    """Sigma of the lognormal compute-time factor exp(N(0, sigma))."""

    def effect(self, ranks: int, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(ranks), np.exp(_generator(self.kind, rng).normal(0.0, self.sigma, ranks))


class SlowdownSpec(InjectorSpec):
    """Compute of the listed ranks takes ``factor`` times as long."""

    kind: Literal["slowdown"]
    """``slowdown``."""
    ranks: Annotated[list[Rank], Field(min_length=1)]
    """The slowed ranks (each < ``ranks``, none twice)."""
    factor: PositiveFloat
    """Their compute time is multiplied by this: real compute sleeps factor - 1 times its duration
    after the step (a factor below 1 changes nothing), emulated compute sleeps that much longer."""

    def check(self, ranks: int) -> None:
        _check_ranks("ranks", self.ranks, ranks)

    def effect(self, ranks: int, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(ranks), _at_ranks(ranks, self.ranks, self.factor, 1.0)


AnyInjectorSpec = Annotated[
    Union[RandomRanksSpec, FixedSpec, LinearSpec, JitterSpec, SlowdownSpec], Field(discriminator="kind")
]


# ---------------------------------------------------------------------------------------------
# network


def _latency_ms_schema(schema: dict[str, Any]) -> None:
    """The JSON Schema of ``latency_ms``, the input-only key ``LinkSettings._latency_ms`` reads,
    right after ``latency_us``; the two exclude each other."""
    latency_ms = {"type": "number", "minimum": 0,
                  "description": "The latency in milliseconds instead: kept as latency_us = 1000 * latency_ms "
                  "(give one of the two)."}
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
        _check_ranks("between", self.between, ranks)

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
        _check_rank("from", self.src, ranks)
        _check_rank("to", self.dst, ranks)
        if self.src == self.dst:
            raise ParamError("to", "must differ from `from`", self.dst)

    def pairs(self, ranks: int) -> tuple[list[int], list[int]]:
        return [self.src], [self.dst]


class RankLinks(LinkRule):
    """``rank: r``: every link into and out of r."""

    rank: Rank
    """The rank whose links (to and from every other rank) the rule sets."""

    def check(self, ranks: int) -> None:
        _check_rank("rank", self.rank, ranks)

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
    Union[
        Annotated[PairLink, Tag("(between)")],
        Annotated[DirectedLink, Tag("(from/to)")],
        Annotated[RankLinks, Tag("(rank)")],
    ],
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

    presets = "; ".join(f"{name}: NIC {link(p['nic'])}, intra-node {link(p['intra'])}"
                        for name, p in TOPOLOGY_PRESETS.items())
    return f"A named network that fills the nic and intra fields (or parts of them) left out ({presets}); null: none."


def _one_placement_schema(schema: dict[str, Any]) -> None:
    """``ranks_per_node`` or ``placement``, exactly one of them (``Topology._one_placement``)."""
    schema["oneOf"] = [{"properties": {key: {"not": {"type": "null"}}}, "required": [key]}
                       for key in ("ranks_per_node", "placement")]


class Topology(StrictModel):
    """Ranks grouped into nodes: pairs inside a node use the ``intra`` link; messages between
    nodes leave through the source node's NIC, cross the fabric (``bisection_gbps``, if limited)
    and enter through the destination node's NIC. NICs and fabric are shared and full duplex,
    and carry messages in the order they reach them; ``network.default`` and ``network.links``
    still apply, as a first link in front. See docs/guides/topology.md."""

    model_config = ConfigDict(json_schema_extra=_one_placement_schema)

    preset: Literal["ethernet_1g", "ethernet_10g", "infiniband_100g"] | None = Field(None, description=_preset_text())
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
            raise ParamError("allreduce", "moved: write `network.allreduce: hierarchical` (or another "
                             "algorithm) instead of network.topology.allreduce", data["allreduce"]).to_pydantic()
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
            raise ParamError("ranks_per_node", "give ranks_per_node or placement (the node of every rank), one of them",
                             self.ranks_per_node).to_pydantic()
        return self

    def check(self, ranks: int) -> None:
        if self.placement is not None:
            if len(self.placement) != ranks:
                raise ParamError("placement", f"must name the node of each of the {ranks} ranks", self.placement)
            used = set(self.placement)
            for node in range(max(self.placement) + 1):
                if node not in used:
                    raise ParamError("placement", f"node {node} has no ranks (number nodes 0, 1, 2, ...)",
                                     self.placement)
        elif ranks % self.ranks_per_node:
            raise ParamError("ranks_per_node", f"must divide ranks ({ranks}); give a placement for uneven nodes",
                             self.ranks_per_node)

    def node_of(self, ranks: int) -> list[int]:
        """The node of every rank (``ranks_per_node`` fills nodes in rank order)."""
        if self.placement is not None:
            return list(self.placement)
        return [r // self.ranks_per_node for r in range(ranks)]


AllreduceAlgorithm = Literal["auto", "ring", "recursive_doubling", "reduce_broadcast", "hierarchical"]
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
  leaders (``auto``), back inside each node.
"""


class Network(StrictModel):
    """Emulated links: ``default`` for every ordered pair, then ``links`` in file order;
    optionally a ``topology`` of nodes whose shared NICs the messages between nodes cross; and how
    allreduces are built (``allreduce``)."""

    default: LinkSettings = LinkSettings()
    """The link of every ordered pair of ranks (default: none emulated)."""
    links: list[AnyLinkRule] = []
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
    (inside each node to its first rank, ``auto`` among those, back inside; needs ``topology``)."""

    def check(self, ranks: int) -> None:
        if self.allreduce == "hierarchical" and self.topology is None:
            raise ParamError("allreduce", "hierarchical needs network.topology (the nodes it goes through)",
                             self.allreduce)
        _check_each(self.links, ranks, "links")
        if self.topology is not None:
            try:
                self.topology.check(ranks)
            except ParamError as exc:
                raise exc.within("topology") from None


# ---------------------------------------------------------------------------------------------
# faults and the watchdog


class FaultSpec(StrictModel):
    """One injected fault of one rank (see docs/guides/faults.md); the simulator ignores faults."""

    kind: str
    """Which fault."""
    rank: Rank
    """The rank it strikes (< ``ranks``)."""

    def check(self, ranks: int) -> None:
        _check_rank("rank", self.rank, ranks)


FaultPoint = Literal["iteration", "communication", "evaluation", "finish"]
"""Where in an algorithm's run a ``kill`` or ``hang`` strikes (``IterationFault.during``)."""


def _at_iteration_schema(schema: dict[str, Any]) -> None:
    """``at_iteration`` is required, except with ``during: finish``, where it is left out
    (``IterationFault._iteration_where_it_is_needed``)."""
    schema["if"] = {"properties": {"during": {"const": "finish"}}, "required": ["during"]}
    schema["then"] = {"properties": {"at_iteration": {"type": "null"}}}
    schema["else"] = {"properties": {"at_iteration": {"type": "integer"}}, "required": ["at_iteration"]}


class IterationFault(FaultSpec):
    """A fault that strikes in ``algorithm`` (None: the first algorithm the run trains), at the
    point ``during`` names:

    - ``iteration`` (the default): at the start of iteration ``at_iteration``, before its forward
      pass;
    - ``communication``: just after the rank posts its first communication operation at or after
      the start of iteration ``at_iteration``, while the operation is in flight (its peers wait
      inside it). The algorithm decides what that operation is: a blocking allreduce, a
      wait-avoiding round, a push-sum push, an AD-PSGD pair request (on a passive AD-PSGD rank,
      which posts none, its publish or drain while the active ranks' requests to it are in
      flight), the DiLoCo family's outer step (at a synchronizing iteration);
    - ``evaluation``: at the start of the first evaluation after iteration ``at_iteration``;
    - ``finish``: at the start of the algorithm's ``finish()``, after its last iteration
      (``at_iteration`` is then left out).
    """

    model_config = ConfigDict(json_schema_extra=_at_iteration_schema)

    at_iteration: NonNegativeInt | None = None
    """The iteration it strikes at (< ``workload.iterations``); required unless ``during: finish``,
    where it is left out."""
    algorithm: str | None = None
    """The name of the algorithm entry in whose run it strikes; null: the first algorithm run."""
    during: FaultPoint = "iteration"
    """Where it strikes: ``iteration`` (at the start of iteration ``at_iteration``), ``communication``
    (while the rank's first communication at or after that iteration is in flight),
    ``evaluation`` (at the start of the first evaluation after it) or ``finish`` (at the start of
    the algorithm's finish, after its last iteration)."""

    @model_validator(mode="after")
    def _iteration_where_it_is_needed(self) -> IterationFault:
        if self.during == "finish" and self.at_iteration is not None:
            raise ParamError("at_iteration", "must be left out with during: finish (it strikes after the last "
                             "iteration)", self.at_iteration).to_pydantic()
        if self.during != "finish" and self.at_iteration is None:
            raise ParamError("at_iteration", f"is required with during: {self.during}", None).to_pydantic()
        return self


class KillFault(IterationFault):
    """The rank's process dies (SIGKILL, as an out-of-memory kill or a node failure would)."""

    kind: Literal["kill"]
    """``kill``."""


class HangFault(IterationFault):
    """The rank's training loop stops making progress (its process stays alive)."""

    kind: Literal["hang"]
    """``hang``."""


class SlowStartFault(FaultSpec):
    """The rank starts ``delay_s`` late: it sleeps before it reports in and joins the first barrier."""

    kind: Literal["slow_start"]
    """``slow_start``."""
    delay_s: NonNegativeFloat
    """How late the rank starts, in seconds (one ``slow_start`` per rank)."""


AnyFaultSpec = Annotated[Union[KillFault, HangFault, SlowStartFault], Field(discriminator="kind")]


class Watchdog(StrictModel):
    """When ``python -m harness run`` declares the job stuck and stops it.

    A rank is stuck when it has made no progress (started an iteration or a phase) for longer
    than its timeout. In training iterations the timeout is ``stall_timeout_s``, or, when that
    is None, ``factor`` times the slowest iteration any rank has finished so far (at least
    ``min_timeout_s``). Start-up, per-algorithm set-up, evaluation and writing results, and
    iterations before any has finished, get ``startup_timeout_s`` (or the iteration timeout if
    that is longer).
    """

    stall_timeout_s: PositiveFloat | None = None
    """Seconds without progress in training iterations after which a rank is stuck; null: the
    timeout follows the iteration times (``factor``, ``min_timeout_s``)."""
    factor: Annotated[float, Field(ge=1.0)] = 20.0
    """Without ``stall_timeout_s``: the timeout is this many times the slowest iteration any rank
    has finished so far."""
    min_timeout_s: PositiveFloat = 10.0
    """Without ``stall_timeout_s``: the timeout is at least this many seconds."""
    startup_timeout_s: PositiveFloat = 120.0
    """Seconds allowed for start-up, each algorithm's set-up, evaluations, writing results and the
    iterations before any has finished (or the iteration timeout, if longer)."""


ProvenanceSetting = Literal["auto", "full", "final", "none"]


class ResultsSettings(StrictModel):
    """What a run keeps and how its summary judges the algorithms (``results/README.md`` describes
    the files; ``harness/results/provenance.py`` writes ``provenance/``)."""

    provenance: ProvenanceSetting = "auto"
    """What ``provenance/`` keeps: ``final`` the initial model, the data shards and per algorithm
    the average of the ranks' final models (the model ``final_accuracy`` was measured on);
    ``full`` also every rank's final model of each algorithm; ``none`` nothing; ``auto`` is
    ``full`` with real compute and ``none`` with emulated compute. ``run --provenance``
    overrides it."""
    target_accuracy: Annotated[float, Field(gt=0.0, le=1.0)] = 0.9
    """A test accuracy (a fraction): summary.csv's ``time_to_target_s`` is the training time
    (evaluations excluded) until an evaluation of the averaged model first reached it."""
    target_loss: Annotated[float, Field(allow_inf_nan=False)] | None = None
    """A test loss: summary.csv's ``time_to_target_loss_s`` is the training time (evaluations
    excluded) until an evaluation of the averaged model first had a test loss at or below it (a
    ``torch.distributed`` script's evaluations: ``harness.dist.record(..., evaluation=True)``);
    null: no loss target."""
    comm_calls: bool = False
    """Also write ``comm_calls.csv``: every call each rank's algorithm made to its communicator,
    per iteration (real and simulated runs alike)."""


class SimulationSettings(StrictModel):
    """How ``python -m harness simulate`` and ``compare`` run this scenario (a real run ignores it)."""

    train: bool = False
    """Simulated ranks train for real (``simulate --train``): every simulated rank holds its own
    model replica and optimizer, trains on its shard in its batch order, and every simulated
    message carries real values, combined when the simulated network delivers it. The summary's
    accuracy columns are then filled at any rank count. Needs a model and dataset (real compute);
    costs about one training step per rank and iteration, and memory for every rank's replica
    (the commands refuse a run that would not fit)."""


# ---------------------------------------------------------------------------------------------
# scenario


def _fit_ranks(value: Any, info: ValidationInfo) -> Any:
    """Check a list of entries (or one object) against the already validated ``ranks``."""
    ranks = info.data.get("ranks")
    if ranks is not None:
        try:
            if isinstance(value, list):
                _check_each(value, ranks)
            else:
                value.check(ranks)
        except ParamError as exc:
            raise exc.to_pydantic() from None
    return value


class _Named(BaseModel):
    """What an ``algorithms`` entry needs before its parameter model can be picked: a string ``name``."""

    model_config = ConfigDict(strict=True, extra="ignore")
    name: str


def _algorithm_entry(value: Any, info: ValidationInfo) -> AlgorithmParams:
    """A bare algorithm name or a mapping with ``name``, validated by that algorithm's registered
    parameter model (``harness.algorithms.registry``), so algorithms registered at run time count.
    A mapping with ``class: "module:Class"`` names the user's class, imported from the scenario's
    ``python_path`` and registered under ``name`` first (``harness.algorithms.user_class``); one
    with ``algorithm: BUILT_IN`` runs that built-in under the label ``name``, registered first
    (``harness.algorithms.variant``)."""
    if isinstance(value, AlgorithmParams) and isinstance(value, params_model(value.name)):
        return value
    if isinstance(value, str):
        value = {"name": value}
    name = _Named.model_validate(value).name
    if user_class.names_class(value):
        if variant.names_algorithm(value):
            raise ParamError(variant.ALGORITHM_KEY, "give `algorithm` (a built-in algorithm to run) or `class` "
                             "(your own), not both", value[variant.ALGORITHM_KEY]).to_pydantic()
        try:
            user_class.entry_model(name, value[user_class.CLASS_KEY], info.data.get("python_path", []))
        except ParamError as exc:
            raise exc.to_pydantic() from None
    elif variant.names_algorithm(value):
        try:
            model = variant.entry_model(name, value[variant.ALGORITHM_KEY])
        except ParamError as exc:
            raise exc.to_pydantic() from None
        return model.model_validate(variant.plain_entry(value))
    elif name not in names():
        raise ParamError("name", f"unknown algorithm (valid: {', '.join(names())})", name).to_pydantic()
    # A ValidationError raised here reaches the scenario's errors with this entry's path in front.
    return params_model(name).model_validate(value)


def _names_user_code(data: dict[str, Any]) -> bool:
    """Whether raw scenario data names the user's code: an import reference as model, dataset or
    optimizer, or an algorithm entry with a ``class``."""
    workload, optimizer = data.get("workload"), data.get("optimizer")
    values = [workload.get(k) for k in ("model", "dataset")] if isinstance(workload, dict) else []
    values.append(optimizer.get("name") if isinstance(optimizer, dict) else optimizer)
    entries = data.get("algorithms") if isinstance(data.get("algorithms"), list) else []
    return any(is_reference(v) for v in values) or any(user_class.names_class(e) for e in entries)


# SerializeAsAny: dump each entry with its own model's fields, not only AlgorithmParams' `name`.
AlgorithmEntry = Annotated[SerializeAsAny[AlgorithmParams], PlainValidator(_algorithm_entry)]


class Scenario(StrictModel):
    """A whole experiment: ranks, workload, algorithms run in turn, injected imbalance, network,
    injected faults and the watchdog's settings."""

    name: str
    """The scenario's name: letters, digits, ``-`` and ``_``; a run's results go to
    ``results/NAME/`` (under ``--out``)."""
    description: str = ""
    """A line saying what the scenario is for (kept with the results, in scenario.resolved.yaml)."""
    ranks: Annotated[int, Field(ge=1, le=MAX_RANKS)]
    """Number of ranks (processes, each one worker or one node) that train."""
    seed: NonNegativeInt = 0
    """Seed of everything random: initial model, data shards and order, injected imbalance."""
    # harness.user_code searches them; the validator below makes them absolute.
    python_path: list[str] = []
    """Directories searched first for the modules of ``"module:callable"`` references, relative to
    the scenario file's directory; default: that directory, when the scenario names code of yours."""
    workload: Workload
    """What each rank trains, for how many iterations, and how it computes."""
    optimizer: OptimizerSpec = SGDOptimizer()
    """The local optimizer of every algorithm (an ``algorithms`` entry may give its own): ``sgd``
    (momentum SGD, the default), ``adam``, ``adamw`` or your own ``"module:callable"``; a bare name
    or a mapping with ``name`` and its parameters. Its ``lr`` is the algorithms' learning rate."""
    algorithms: list[AlgorithmEntry] = []
    """The algorithms to run, one after the other, each from the same initial model under the same
    injections: a built-in name, a mapping ``{name: NAME, PARAMETER: VALUE, ...}``, a variant
    ``{name: LABEL, algorithm: BUILT_IN, ...}`` (a built-in under a label of its own), or your own
    class ``{name: NAME, class: "module:Class", ...}``. Names are unique. At least one, except for
    a training script's own workload (no ``workload.model``): a ``torch.distributed`` script that
    ``python -m harness launch --scenario`` runs is the algorithm itself and lists none."""
    imbalance: list[AnyInjectorSpec] = []
    """Injected imbalance, one entry per ``kind``: ``random_ranks``, ``fixed``, ``linear``,
    ``jitter``, ``slowdown``. Entries combine: sleeps add up, compute factors multiply."""
    network: Network = Network()
    """Emulated links, nodes and the allreduce algorithm (default: no emulated network)."""
    faults: list[AnyFaultSpec] = []
    """Injected faults: ``kill``, ``hang``, ``slow_start`` (real runs only; the simulator ignores them)."""
    watchdog: Watchdog = Watchdog()
    """When ``python -m harness run`` declares the job stuck and stops it."""
    results: ResultsSettings = ResultsSettings()
    """What a run keeps and how its summary judges the algorithms."""
    simulation: SimulationSettings = SimulationSettings()
    """How the simulator runs the scenario: whether its simulated ranks train real models."""
    # The commands record the KEY=VALUE overrides here (harness.scenario.overrides), so
    # scenario.resolved.yaml says how it differs from the file.
    overrides: list[str] = []
    """The ``KEY=VALUE`` overrides the scenario was loaded with, in order; the commands fill it in
    (a scenario file leaves it out)."""

    @model_validator(mode="before")
    @classmethod
    def _absolute_python_path(cls, data: Any, info: ValidationInfo) -> Any:
        """Make ``python_path`` absolute against the scenario file's directory (the loader passes it
        as the validation context's ``base_dir``; the working directory without one), and default
        it to that directory when the scenario names the user's code."""
        if not isinstance(data, dict):
            return data
        base = Path((info.context or {}).get("base_dir") or ".").absolute()
        given = data.get("python_path")
        if given is None and _names_user_code(data):
            given = ["."]
        if isinstance(given, list) and all(isinstance(d, str) for d in given):
            data = {**data, "python_path": [os.path.normpath(base / d) for d in given]}
        return data

    @field_validator("name")
    @classmethod
    def _name_chars(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ParamError((), "must be letters, digits, '-' and '_' only", value).to_pydantic()
        return value

    # The validators below see `ranks` in info.data only when it was valid (fields validate in
    # order); otherwise its own error is reported and the rank checks are skipped.

    @field_validator("algorithms")
    @classmethod
    def _algorithms_fit(cls, value: list[Any], info: ValidationInfo) -> list[Any]:
        first: dict[str, int] = {}
        for i, params in enumerate(value):
            if params.name in first:
                reason = f"listed twice (first at algorithms[{first[params.name]}])"
                raise ParamError((i, "name"), reason, params.name).to_pydantic()
            first[params.name] = i
        return _fit_ranks(value, info)

    @field_validator("imbalance", "network", "faults")
    @classmethod
    def _parts_fit(cls, value: Any, info: ValidationInfo) -> Any:
        return _fit_ranks(value, info)

    @model_validator(mode="after")
    def _some_algorithm(self) -> Scenario:
        if not self.algorithms and not self.workload.of_script:
            reason = ("at least one is required (only a training script's own workload, without workload.model, "
                      "may list none: `python -m harness launch --scenario` runs a torch.distributed script as "
                      "the algorithm)")
            raise ParamError(("algorithms",), reason, []).to_pydantic()
        return self

    @model_validator(mode="after")
    def _trains_a_model(self) -> Scenario:
        if self.simulation.train and self.workload.compute != "real":
            what = "a training script's workload" if self.workload.of_script else "emulated compute"
            reason = (f"the simulated ranks train the workload's model on its dataset; {what} has none (give "
                      "workload.model and workload.dataset with real compute, or leave simulation.train out)")
            raise ParamError(("simulation", "train"), reason, True).to_pydantic()
        return self

    @model_validator(mode="after")
    def _faults_fit(self) -> Scenario:
        names = [a.name for a in self.algorithms]
        slow_start: dict[int, int] = {}
        for i, fault in enumerate(self.faults):
            if isinstance(fault, SlowStartFault):
                if fault.rank in slow_start:
                    reason = f"rank already has a slow_start (faults[{slow_start[fault.rank]}])"
                    raise ParamError(("faults", i, "rank"), reason, fault.rank).to_pydantic()
                slow_start[fault.rank] = i
                continue
            if fault.algorithm is not None and fault.algorithm not in names:
                reason = f"not one of the algorithms run ({', '.join(names)})"
                raise ParamError(("faults", i, "algorithm"), reason, fault.algorithm).to_pydantic()
            if fault.at_iteration is not None and fault.at_iteration >= self.workload.iterations:
                reason = f"must be < workload.iterations ({self.workload.iterations})"
                raise ParamError(("faults", i, "at_iteration"), reason, fault.at_iteration).to_pydantic()
        return self

    def optimizer_of(self, algorithm: AlgorithmParams) -> Any:
        """The local optimizer spec ``algorithm`` trains with: its entry's ``optimizer`` (or its
        model's default), else the scenario's. Its ``lr`` is the algorithm's ``ctx.lr``."""
        return self.optimizer if algorithm.optimizer is None else algorithm.optimizer

    def resolved_dict(self) -> dict[str, Any]:
        """Plain data with every default filled in; ``yaml.safe_dump`` it, load it back, get an equal Scenario."""
        return self.model_dump(mode="json", by_alias=True)
