"""Parameters of every algorithm: one frozen model each, validated by the algorithm's own rules.

Each model carries a ``name`` literal, which is how a scenario file spells the algorithm, so a
scenario's ``algorithms`` list is a union discriminated on ``name``. Defaults are the reference
settings listed in docs/algorithms.md ("Parameters at a glance"); checks that need the rank
count live in ``check(ranks)``.

Example::

    >>> resolve_algorithm_params("wagma", {"group_size": 4}, ranks=8)
    {'group_size': 4, 'sync_period': 10}
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

PositiveInt = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(ge=0.0, lt=1.0)]  # momentum-like: 1.0 would never forget
Rate = Annotated[float, Field(gt=0.0, le=1.0)]  # moving / pull rate: 0 would never move

# Periodic averaging shares one default period: the reference setting of the Overlap Local SGD
# paper is tau = 2, and comparing the family is only fair on one schedule.
DEFAULT_PERIOD = 2


class ParamError(ValueError):
    """A value is impossible: carries the field path (relative), a reason and the bad value."""

    def __init__(self, path: str | tuple[str | int, ...], reason: str, value: Any, note: str = "") -> None:
        self.path = (path,) if isinstance(path, str) else tuple(path)
        self.reason = reason
        self.value = value
        self.note = note  # said after the value, e.g. "the default"
        where = ".".join(str(p) for p in self.path)
        super().__init__(f"{where}: {reason} (got {value!r}{', ' + note if note else ''})")

    def within(self, *prefix: str | int) -> ParamError:
        """The same error seen from a containing object: its path gets ``prefix`` in front."""
        return ParamError((*prefix, *self.path), self.reason, self.value, self.note)

    def to_pydantic(self) -> PydanticCustomError:
        """The same error raised inside a validator: the scenario loader reads path, value and note back."""
        ctx = {"reason": self.reason, "path": self.path, "value": self.value, "note": self.note}
        return PydanticCustomError("field", "{reason}", ctx)


class StrictModel(BaseModel):
    """Base of every configuration model: frozen, strict types, unknown keys refused by name.

    ``input_only_keys`` lists keys a before-validator consumes (e.g. ``latency_ms``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
    input_only_keys: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, data: Any) -> Any:
        # extra="forbid" alone says "Extra inputs are not permitted"; say which keys would do.
        if isinstance(data, dict):
            valid = [f.alias or name for name, f in cls.model_fields.items()] + list(cls.input_only_keys)
            for key in data:
                if key not in valid:
                    raise ParamError(
                        (key,) if isinstance(key, (str, int)) else (repr(key),),
                        f"unknown key (valid: {', '.join(valid)})",
                        key,
                    ).to_pydantic()
        return data


class AlgorithmParams(StrictModel):
    """Base of every parameter model; ``name`` is the discriminator a scenario file uses."""

    name: str

    def check(self, ranks: int) -> None:
        """Raise ParamError if the parameters cannot work with ``ranks`` ranks."""

    def _fail(self, field: str, reason: str) -> ParamError:
        note = "" if field in self.model_fields_set else "the default"
        return ParamError(field, reason, getattr(self, field), note)


class AllreduceSGDParams(AlgorithmParams):
    """Allreduce-SGD, the synchronous baseline (Goyal et al., 2017; the SGP paper's AR-SGD)."""

    name: Literal["allreduce_sgd"] = "allreduce_sgd"


class LocalSGDParams(AlgorithmParams):
    """Local SGD: average the models every ``period`` steps (Lin et al., ICLR 2020)."""

    name: Literal["local_sgd"] = "local_sgd"
    period: PositiveInt = DEFAULT_PERIOD


class OverlapLocalSGDParams(AlgorithmParams):
    """Overlap Local SGD with anchor pull ``alpha`` and anchor momentum ``beta`` (Wang et al., ICASSP 2020)."""

    name: Literal["overlap_local_sgd"] = "overlap_local_sgd"
    period: PositiveInt = DEFAULT_PERIOD
    alpha: Rate = 0.6
    beta: Fraction = 0.7


class EASGDParams(AlgorithmParams):
    """Elastic averaging SGD with moving rate ``alpha`` (Zhang, Choromanska, LeCun, NeurIPS 2015)."""

    name: Literal["easgd"] = "easgd"
    period: PositiveInt = DEFAULT_PERIOD
    alpha: Rate = 0.2
    overlap: bool = False  # True: the center is one round stale and its update is overlapped

    def check(self, ranks: int) -> None:
        # At each sync the gap between the mean worker and the center is multiplied by
        # 1 - (P + 1) * alpha: it only shrinks when alpha < 2 / (P + 1) (the paper uses ~0.9/P).
        if ranks > 1 and self.alpha * (ranks + 1) >= 2:
            raise self._fail("alpha", f"must be < 2 / (ranks + 1) = {2 / (ranks + 1):.4g} with {ranks} ranks, "
                             "or the center diverges (0.9 / ranks is a safe choice)")


class CoCoDSGDParams(AlgorithmParams):
    """CoCoD-SGD: computation and communication decoupled (Shen et al., IJCAI 2019)."""

    name: Literal["cocod_sgd"] = "cocod_sgd"
    period: PositiveInt = DEFAULT_PERIOD


class BMUFParams(AlgorithmParams):
    """Blockwise model-update filtering (Chen and Huo, ICASSP 2016), i.e. SlowMo with slow lr 1.

    ``block_momentum`` defaults to Overlap Local SGD's anchor momentum so the two anchor methods
    compare on equal terms; the BMUF paper suggests 1 - 1/P.
    """

    name: Literal["bmuf"] = "bmuf"
    period: PositiveInt = DEFAULT_PERIOD
    block_momentum: Fraction = 0.7
    block_lr: Annotated[float, Field(gt=0.0)] = 1.0


class SGPParams(AlgorithmParams):
    """Stochastic gradient push over a directed exponential graph (Assran et al., ICML 2019)."""

    name: Literal["sgp"] = "sgp"
    peers: PositiveInt = 1
    graph: Literal["exponential"] = "exponential"

    def check(self, ranks: int) -> None:
        if ranks > 1 and self.peers > ranks - 1:
            raise self._fail("peers", f"must be <= ranks - 1 ({ranks - 1}), the other ranks there are to push to")


class OSGPParams(SGPParams):
    """Overlap SGP: a push overlaps the next iteration; block after ``synch_freq`` silent ones (SGP paper).

    Assran, Loizou, Ballas, Rabbat: Stochastic Gradient Push for Distributed Deep Learning, ICML 2019.
    """

    name: Literal["osgp"] = "osgp"  # type: ignore[assignment]
    synch_freq: Annotated[int, Field(ge=0)] = 0


def _need_even(params: AlgorithmParams, ranks: int, what: str) -> None:
    # A bipartite pairing with odd offsets only closes when P is even.
    if ranks > 1 and ranks % 2:
        raise ParamError("name", f"{what} needs an even number of ranks (ranks is {ranks})", params.name)


class DPSGDParams(AlgorithmParams):
    """Decentralized parallel SGD, symmetric blocking gossip (Lian et al., NeurIPS 2017)."""

    name: Literal["dpsgd"] = "dpsgd"
    graph: Literal["ring", "bipartite_exponential"] = "ring"

    def check(self, ranks: int) -> None:
        if self.graph == "bipartite_exponential":
            _need_even(self, ranks, "graph bipartite_exponential")


class ADPSGDParams(AlgorithmParams):
    """Asynchronous decentralized parallel SGD on a bipartite graph (Lian et al., ICML 2018)."""

    name: Literal["adpsgd"] = "adpsgd"

    def check(self, ranks: int) -> None:
        _need_even(self, ranks, "adpsgd")


class WAGMAParams(AlgorithmParams):
    """WAGMA-SGD: wait-avoiding group model averaging (Li et al., IEEE TPDS 2021)."""

    name: Literal["wagma"] = "wagma"
    group_size: PositiveInt = 8
    sync_period: PositiveInt = 10

    def check(self, ranks: int) -> None:
        if self.group_size > ranks:
            raise self._fail("group_size", f"must be <= ranks ({ranks})")
        if self.group_size == 1 and ranks > 1:
            # Groups of one never mix, and a radix-1 decomposition of P does not exist.
            raise self._fail("group_size", "must be >= 2 when ranks > 1")


class EagerSGDParams(AlgorithmParams):
    """eager-SGD: solo or majority partial allreduce of gradients (Li et al., PPoPP 2020)."""

    name: Literal["eager_sgd"] = "eager_sgd"
    mode: Literal["solo", "majority"] = "solo"
    sync_period: PositiveInt = 33


AnyAlgorithmParams = Annotated[
    Union[
        AllreduceSGDParams,
        LocalSGDParams,
        OverlapLocalSGDParams,
        EASGDParams,
        CoCoDSGDParams,
        BMUFParams,
        SGPParams,
        OSGPParams,
        DPSGDParams,
        ADPSGDParams,
        WAGMAParams,
        EagerSGDParams,
    ],
    Field(discriminator="name"),
]
"""One scenario ``algorithms`` entry, chosen by its ``name``."""

ALGORITHM_PARAMS: dict[str, type[AlgorithmParams]] = {
    cls.model_fields["name"].default: cls for cls in get_args(get_args(AnyAlgorithmParams)[0])
}
"""Scenario name -> parameter model."""


def resolve_algorithm_params(name: str, raw: dict[str, Any], ranks: int) -> dict[str, Any]:
    """Validate ``raw`` parameters of algorithm ``name`` for ``ranks`` ranks; return them with defaults.

    Raises ParamError (a ValueError) naming the parameter and its value, or listing the valid
    names for an unknown algorithm.
    """
    cls = ALGORITHM_PARAMS.get(name)
    if cls is None:
        raise ParamError("name", f"unknown algorithm (valid: {', '.join(ALGORITHM_PARAMS)})", name)
    try:
        params = cls.model_validate({**raw, "name": name})
    except ValidationError as exc:
        err = exc.errors()[0]
        if err["type"] == "field":  # raised by StrictModel, already phrased
            raise ParamError(err["ctx"]["path"], err["ctx"]["reason"], err["ctx"]["value"]) from None
        raise ParamError(err["loc"], err["msg"], err["input"]) from None
    params.check(ranks)
    return params.model_dump(exclude={"name"})
