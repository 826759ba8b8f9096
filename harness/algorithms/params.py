"""Parameters of every algorithm: one frozen model each, validated by the algorithm's own rules.

Each model carries a ``name`` literal, which is how a scenario file spells the algorithm;
``harness.algorithms.registry`` maps each name to its model, and a scenario's ``algorithms``
entries are validated by the model their ``name`` picks. Defaults are the reference settings
listed in docs/algorithms/index.md ("Parameters at a glance"); checks that need the rank count live
in ``check(ranks)``.

``period`` means one thing wherever it appears: the algorithm synchronizes all ranks at the end
of every ``period``-th iteration (``t % period == period - 1``).

Example::

    >>> WAGMAParams(group_size=4)
    WAGMAParams(name='wagma', group_size=4, period=11)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_serializer, model_validator

from harness.errors import ParamError
from harness.optimizer_spec import AdamWOptimizer, OptimizerSpec
from harness.strict_model import NonNegativeInt, PositiveFloat, PositiveInt, StrictModel

Fraction = Annotated[float, Field(ge=0.0, lt=1.0)]  # momentum-like: 1.0 would never forget
Rate = Annotated[float, Field(gt=0.0, le=1.0)]  # moving / pull rate: 0 would never move

# Periodic averaging shares one default period: the reference setting of the Overlap Local SGD
# paper is tau = 2, and comparing the family is only fair on one schedule.
DEFAULT_PERIOD = 2


class AlgorithmParams(StrictModel):
    """Base of every parameter model; ``name`` is the discriminator a scenario file uses.

    ``optimizer``: this algorithm's local optimizer, in the forms of the scenario's ``optimizer:``
    (``harness.optimizer_spec``); None (the default of most algorithms) means the scenario's.
    A model may default it to its paper's choice (the DiLoCo family: AdamW). It is left out of
    dumps while None, so resolved scenarios of algorithms without one read as before.
    """

    name: str
    """The algorithm's name in a scenario file (its label in results and figures)."""
    optimizer: OptimizerSpec | None = Field(default=None, repr=False)
    """This algorithm's own local optimizer, in any form of the scenario's ``optimizer``; null:
    the scenario's."""
    listed_last: ClassVar[tuple[str, ...]] = ("optimizer",)  # an algorithm's own parameters first

    @model_serializer(mode="wrap")
    def _optimizer_when_given(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        # Only where None is the default: a DiLoCo entry's `optimizer: null` must load back as null.
        if data.get("optimizer", 0) is None and type(self).model_fields["optimizer"].default is None:
            del data["optimizer"]
        return data

    def check(self, ranks: int) -> None:
        """Raise ParamError if the parameters cannot work with ``ranks`` ranks."""

    def notes(self, ranks: int) -> list[str]:
        """Lines ``validate``, ``run`` and ``simulate`` print as ``note:`` (e.g. groups that are not
        what a parameter asks for at this rank count)."""
        return []

    def run_facts(self, ranks: int) -> dict[str, Any]:
        """Facts about this algorithm at ``ranks`` ranks for run.json, as ``{key: value}``; run.json
        gets ``{key: {algorithm: value}}`` (``harness.algorithms.scenario_facts``)."""
        return {}

    def _fail(self, field: str, reason: str) -> ParamError:
        note = "" if field in self.model_fields_set else "the default"
        return ParamError(field, reason, getattr(self, field), note)


class AllreduceSGDParams(AlgorithmParams):
    """Allreduce-SGD, the synchronous baseline (Goyal et al., 2017; the SGP paper's AR-SGD)."""

    name: Literal["allreduce_sgd"] = "allreduce_sgd"
    """``allreduce_sgd``."""


class LocalSGDParams(AlgorithmParams):
    """Local SGD: average the models every ``period`` steps (Lin et al., ICLR 2020)."""

    name: Literal["local_sgd"] = "local_sgd"
    """``local_sgd``."""
    period: PositiveInt = DEFAULT_PERIOD
    """Average all ranks' models at the end of every ``period``-th iteration."""


class OverlapLocalSGDParams(AlgorithmParams):
    """Overlap Local SGD with anchor pull ``alpha`` and anchor momentum ``beta`` (Wang et al., ICASSP 2020)."""

    name: Literal["overlap_local_sgd"] = "overlap_local_sgd"
    """``overlap_local_sgd``."""
    period: PositiveInt = DEFAULT_PERIOD
    """Sync at the end of every ``period``-th iteration; the next anchor's allreduce then runs
    during the following ``period`` iterations."""
    alpha: Rate = 0.6
    """Anchor pull: at a sync each rank moves this fraction of the way to the anchor model."""
    beta: Fraction = 0.7
    """Anchor momentum: the anchor's updates keep this fraction of the previous one (0: the anchor
    is the plain average)."""


class EASGDParams(AlgorithmParams):
    """Elastic averaging SGD with moving rate ``alpha`` (Zhang, Choromanska, LeCun, NeurIPS 2015)."""

    name: Literal["easgd"] = "easgd"
    """``easgd``."""
    period: PositiveInt = DEFAULT_PERIOD
    """Iterations between two elastic updates."""
    alpha: Rate = 0.2
    """Moving rate: each worker moves this fraction of its difference to the center, and the
    center the sum of these; must be < 2 / (ranks + 1), or the center diverges (0.9 / ranks is a
    safe choice)."""
    overlap: bool = False
    """true: the center's allreduce runs during the next ``period`` iterations and the center
    update is applied at the next sync (same iterates, less time blocked); false: wait for it at once."""

    def check(self, ranks: int) -> None:
        # At each sync the gap between the mean worker and the center is multiplied by
        # 1 - (P + 1) * alpha: it only shrinks when alpha < 2 / (P + 1) (the paper uses ~0.9/P).
        if ranks > 1 and self.alpha * (ranks + 1) >= 2:
            raise self._fail(
                "alpha",
                f"must be < 2 / (ranks + 1) = {2 / (ranks + 1):.4g} with {ranks} ranks, "
                "or the center diverges (0.9 / ranks is a safe choice)",
            )


class CoCoDSGDParams(AlgorithmParams):
    """CoCoD-SGD: computation and communication decoupled (Shen et al., IJCAI 2019)."""

    name: Literal["cocod_sgd"] = "cocod_sgd"
    """``cocod_sgd``."""
    period: PositiveInt = DEFAULT_PERIOD
    """Sync at the end of every ``period``-th iteration; the average then runs during the following
    ``period`` iterations, and the next sync applies it."""


class BMUFParams(AlgorithmParams):
    """Blockwise model-update filtering (Chen and Huo, ICASSP 2016), i.e. SlowMo with slow lr 1.

    ``block_momentum`` defaults to Overlap Local SGD's anchor momentum so the two anchor methods
    compare on equal terms; the BMUF paper suggests 1 - 1/P.
    """

    name: Literal["bmuf"] = "bmuf"
    """``bmuf``."""
    period: PositiveInt = DEFAULT_PERIOD
    """Iterations per block: the models are averaged and filtered at the end of every block."""
    block_momentum: Fraction = 0.7
    """Momentum of the block-level update (the BMUF paper suggests 1 - 1/ranks)."""
    block_lr: PositiveFloat = 1.0
    """Block learning rate, a multiple of the local optimizer's ``lr`` (1: no extra scaling)."""


class SGPParams(AlgorithmParams):
    """Stochastic gradient push over a directed exponential graph (Assran et al., ICML 2019)."""

    name: Literal["sgp"] = "sgp"
    """``sgp``."""
    peers: PositiveInt = 1
    """Out-peers each rank pushes to every iteration (<= ranks - 1)."""
    graph: Literal["exponential"] = "exponential"
    """The directed graph the peers are taken from (only ``exponential``: with one peer, rank i
    pushes to i + 1, i + 2, i + 4, ... in turn)."""

    def check(self, ranks: int) -> None:
        if ranks > 1 and self.peers > ranks - 1:
            raise self._fail("peers", f"must be <= ranks - 1 ({ranks - 1}), the other ranks there are to push to")


class OSGPParams(SGPParams):
    """Overlap SGP: a push overlaps the next iteration; block after ``synch_freq`` silent ones (SGP paper).

    Assran, Loizou, Ballas, Rabbat: Stochastic Gradient Push for Distributed Deep Learning, ICML 2019.
    """

    name: Literal["osgp"] = "osgp"  # type: ignore[assignment]  # its own name: the scenario's discriminator
    """``osgp``."""
    synch_freq: NonNegativeInt = 0
    """Iterations a gossip round may stay in flight without being waited for: a rank takes at most
    ``synch_freq`` + 1 iterations per round (0: 1-OSGP, each push overlaps one iteration)."""


def _need_even(params: AlgorithmParams, ranks: int, what: str) -> None:
    # A bipartite pairing with odd offsets only closes when P is even.
    if ranks > 1 and ranks % 2:
        raise ParamError("name", f"{what} needs an even number of ranks (ranks is {ranks})", params.name)


class DPSGDParams(AlgorithmParams):
    """Decentralized parallel SGD, symmetric blocking gossip (Lian et al., NeurIPS 2017)."""

    name: Literal["dpsgd"] = "dpsgd"
    """``dpsgd``."""
    graph: Literal["ring", "bipartite_exponential"] = "ring"
    """Who mixes with whom: ``ring`` (both ring neighbours every iteration) or
    ``bipartite_exponential`` (one peer per iteration at an odd distance that changes every
    iteration, so models travel between even and odd ranks; needs an even number of ranks)."""

    def check(self, ranks: int) -> None:
        if self.graph == "bipartite_exponential":
            _need_even(self, ranks, "graph bipartite_exponential")


class ADPSGDParams(AlgorithmParams):
    """Asynchronous decentralized parallel SGD on a bipartite graph (Lian et al., ICML 2018)."""

    name: Literal["adpsgd"] = "adpsgd"
    """``adpsgd`` (needs an even number of ranks)."""

    def check(self, ranks: int) -> None:
        _need_even(self, ranks, "adpsgd")


class RenamedParameterWarning(FutureWarning):
    """A scenario used the old spelling of a parameter: it still works, the message gives the new one.

    A FutureWarning rather than a DeprecationWarning: it is for whoever wrote the scenario file,
    and Python shows FutureWarning by default. ``validate``, ``run`` and ``simulate`` print it as a
    ``note:`` line instead (``harness.scenario.load_scenario_with_notes``).
    """


def _renamed_sync_period(data: Any, name: str, extra_rounds: int) -> Any:
    """Read the old ``sync_period: S`` as ``period: S + extra_rounds``, warning that it is renamed.

    WAGMA-SGD's ``sync_period`` counted the group rounds between two synchronous ones (a
    synchronous round every S + 1 rounds); eager-SGD's already was the period.
    """
    if not isinstance(data, dict) or "sync_period" not in data:
        return data
    old = data["sync_period"]
    if "period" in data:
        raise ParamError("sync_period", "give period only (sync_period is its old spelling)", old).to_pydantic()
    lowest = 1 - extra_rounds  # what makes period >= 1
    if type(old) is not int or old < lowest:
        raise ParamError("sync_period", f"must be an integer >= {lowest}", old).to_pydantic()
    period = old + extra_rounds
    warnings.warn(
        f"{name}: sync_period: {old} is the old spelling of period: {period} (a synchronous "
        f"round every {period} rounds); write period: {period}",
        RenamedParameterWarning,
        stacklevel=2,
    )
    return {**{key: value for key, value in data.items() if key != "sync_period"}, "period": period}


def _sync_period_schema(extra_rounds: int) -> Callable[[dict[str, Any]], None]:
    """The JSON Schema of the old spelling ``sync_period`` (what ``_renamed_sync_period`` reads):
    deprecated, and not together with ``period``."""
    meaning = f"period: S + {extra_rounds}" if extra_rounds else "period: S"

    def add(schema: dict[str, Any]) -> None:
        schema["properties"]["sync_period"] = {
            "type": "integer",
            "minimum": 1 - extra_rounds,
            "deprecated": True,
            "description": f"Old spelling: sync_period: S is read as {meaning} (write period instead).",
        }
        schema["not"] = {"required": ["period", "sync_period"]}

    return add


class WAGMAParams(AlgorithmParams):
    """WAGMA-SGD: wait-avoiding group model averaging (Li et al., IEEE TPDS 2021).

    ``period``: rounds t with ``t % period == period - 1`` average all ranks' fresh models; the
    others are group rounds. The paper's tau (group rounds between two global ones) is
    ``period - 1``; the old spelling ``sync_period: tau`` is read as ``period: tau + 1``.
    """

    model_config = ConfigDict(json_schema_extra=_sync_period_schema(extra_rounds=1))

    name: Literal["wagma"] = "wagma"
    """``wagma``."""
    group_size: PositiveInt = 8
    """Ranks per group of a group round (2 <= group_size <= ranks; groups change every round;
    where it does not divide the rank count the groups are mixed-radix, and ``validate`` says so)."""
    period: PositiveInt = 11
    """Every ``period``-th round averages all ranks' fresh models; the others are group rounds
    (the paper's tau is period - 1; the old spelling ``sync_period: tau`` still reads)."""

    @model_validator(mode="before")
    @classmethod
    def _old_spelling(cls, data: Any) -> Any:
        return _renamed_sync_period(data, "wagma", extra_rounds=1)

    def check(self, ranks: int) -> None:
        if self.group_size > ranks:
            raise self._fail("group_size", f"must be <= ranks ({ranks})")
        if self.group_size == 1 and ranks > 1:
            # Groups of one never mix, and a radix-1 decomposition of P does not exist.
            raise self._fail("group_size", "must be >= 2 when ranks > 1")

    def notes(self, ranks: int) -> list[str]:
        from harness.algorithms import wagma_groups  # noqa: PLC0415  (it imports this module)

        if not wagma_groups.differs(ranks, self.group_size):
            return []
        return [wagma_groups.group_note(self.name, ranks, self.group_size)]

    def run_facts(self, ranks: int) -> dict[str, Any]:
        from harness.schedules import wagma_radices  # noqa: PLC0415  (numpy: not for importing the registry)

        return {"wagma_group_sizes": list(wagma_radices(ranks, self.group_size))}


class EagerSGDParams(AlgorithmParams):
    """eager-SGD: solo or majority partial allreduce of gradients (Li et al., PPoPP 2020).

    ``period``: rounds t with ``t % period == period - 1`` are synchronous allreduces of fresh
    gradients; the old spelling ``sync_period`` meant the same and is read as ``period``.
    """

    model_config = ConfigDict(json_schema_extra=_sync_period_schema(extra_rounds=0))

    name: Literal["eager_sgd"] = "eager_sgd"
    """``eager_sgd``."""
    mode: Literal["solo", "majority"] = "solo"
    """Who triggers a round: ``solo`` the first rank to arrive; ``majority`` a seeded initiator, so
    on average half the ranks have arrived (late gradients pile up less under heavy imbalance)."""
    period: PositiveInt = 33
    """Every ``period``-th round is a synchronous allreduce of fresh gradients (the old spelling
    ``sync_period`` still reads)."""

    @model_validator(mode="before")
    @classmethod
    def _old_spelling(cls, data: Any) -> Any:
        return _renamed_sync_period(data, "eager_sgd", extra_rounds=0)


# ---------------------------------------------------------------------------------------------
# The low-communication family (docs/algorithms/low-communication.md)

# The DiLoCo papers' inner optimizer: AdamW (torch's defaults here; the papers tune lr and weight
# decay for language models with a warm-up and cosine schedule, which the harness does not have).
INNER_ADAMW = AdamWOptimizer(name="adamw")
InnerOptimizer = Annotated[OptimizerSpec | None, Field(repr=False)]


class _OuterStep(AlgorithmParams):
    """The outer optimizer every DiLoCo variant shares: Nesterov SGD on the pseudo-gradient."""

    optimizer: InnerOptimizer = INNER_ADAMW
    """The inner (local) optimizer, in any form of the scenario's ``optimizer``; default AdamW with
    torch's defaults (lr 0.001), the papers' choice; null: the scenario's."""
    outer_lr: PositiveFloat = 0.7
    """Learning rate of the outer Nesterov step on the averaged pseudo-gradient."""
    outer_momentum: Fraction = 0.9
    """Nesterov momentum of the outer step."""


class DiLoCoParams(_OuterStep):
    """DiLoCo: ``inner_steps`` local AdamW steps, then a Nesterov outer step on the averaged
    pseudo-gradient (Douillard et al., 2023: H = 500, outer lr 0.7, momentum 0.9)."""

    name: Literal["diloco"] = "diloco"
    """``diloco``."""
    inner_steps: PositiveInt = 500
    """H: local steps between two outer steps."""


class StreamingDiLoCoParams(_OuterStep):
    """Streaming DiLoCo: ``fragments`` slices of the model synchronized on a staggered schedule,
    each outer allreduce overlapping ``overlap`` inner steps, merged with weight ``alpha`` on the
    local fragment (Douillard et al., 2025: H = 100, alpha 0.5). ``precision``: the format the
    outer gradients are rounded to before they are summed (emulated,
    docs/algorithms/low-communication.md)."""

    name: Literal["streaming_diloco"] = "streaming_diloco"
    """``streaming_diloco``."""
    inner_steps: PositiveInt = 100
    """H: local steps between two outer steps of one fragment."""
    fragments: PositiveInt = 2
    """F: contiguous slices of the model, synchronized on a staggered schedule (<= ``inner_steps``)."""
    overlap: NonNegativeInt = 1
    """tau: inner steps that run while a fragment's outer allreduce is in flight (< ``inner_steps``)."""
    alpha: Fraction = 0.5
    """Merge weight of the local fragment: x <- alpha x + (1 - alpha) theta (0: take the global
    fragment as it is, DiLoCo's restart)."""
    precision: Literal["float32", "bfloat16", "float8_e4m3"] = "float32"
    """The format each rank's outer gradient is rounded to before the allreduce (emulated: the sum
    and the wire stay float32)."""

    def check(self, ranks: int) -> None:
        if self.fragments > self.inner_steps:
            raise self._fail(
                "fragments",
                f"must be <= inner_steps ({self.inner_steps}): each fragment needs "
                "its own iteration of the staggered schedule",
            )
        if self.overlap >= self.inner_steps:
            raise self._fail(
                "overlap",
                f"must be < inner_steps ({self.inner_steps}): a fragment's outer "
                "allreduce must land before the fragment's next one starts",
            )


class QuorumDiLoCoParams(_OuterStep):
    """DiLoCo whose outer step waits only for a ``quorum`` (a fraction of the ranks); late
    pseudo-gradients join the next outer step with their own weight (the harness's variant)."""

    name: Literal["quorum_diloco"] = "quorum_diloco"
    """``quorum_diloco``."""
    inner_steps: PositiveInt = 500
    """H: local steps between two outer steps."""
    quorum: Annotated[float, Field(gt=0.0, le=1.0)] = 0.5
    """Fraction of the ranks an outer step waits for: ceil(quorum * ranks), at least 1 (1.0: every
    rank, which is DiLoCo)."""
    # The measurements behind the default: docs/algorithms/low-communication.md, "Quorum DiLoCo".
    outer_momentum: Fraction = 0.5
    """Nesterov momentum of the outer step. Not DiLoCo's 0.9: about half a round's pseudo-gradients
    arrive a round late, and momentum 0.9 on them oscillates (79.9% against 93.0% with 0.5 on the
    convergence scenario)."""

    def quorum_ranks(self, ranks: int) -> int:
        """Ranks an outer step waits for: ceil(quorum * ranks), at least 1."""
        return max(1, min(ranks, math.ceil(self.quorum * ranks - 1e-9)))

    def notes(self, ranks: int) -> list[str]:
        return [f"{self.name}: an outer step waits for {self.quorum_ranks(ranks)} of {ranks} ranks"]

    def run_facts(self, ranks: int) -> dict[str, Any]:
        return {"quorum_ranks": self.quorum_ranks(ranks)}


class SlowMoParams(AlgorithmParams):
    """SlowMo: a base algorithm (``local_sgd``: local steps; ``sgp``: push-sum gossip), every
    ``period`` steps an exact average and a slow-momentum step (Wang, Tantia, Ballas, Rabbat,
    ICLR 2020; defaults those of fairscale's SlowMo: period 48, slow momentum 0.5, slow lr 1)."""

    name: Literal["slowmo"] = "slowmo"
    """``slowmo``."""
    base: Literal["local_sgd", "sgp"] = "local_sgd"
    """The base algorithm of every iteration: ``local_sgd`` (local steps only) or ``sgp`` (one
    push-sum gossip round per iteration, SGP's defaults)."""
    period: PositiveInt = 48
    """Average all ranks' models exactly and take the slow-momentum step every ``period`` iterations."""
    slow_momentum: Fraction = 0.5
    """Momentum of the slow update."""
    slow_lr: PositiveFloat = 1.0
    """Slow learning rate, a multiple of the local optimizer's ``lr`` (1 with momentum 0: the plain
    average)."""


class GossipPGAParams(AlgorithmParams):
    """Gossip-PGA: D-PSGD gossip with a global average every ``period`` iterations (Chen, Yuan,
    Zhang, Pan, Xu, Yin, ICML 2021)."""

    name: Literal["gossip_pga"] = "gossip_pga"
    """``gossip_pga``."""
    graph: Literal["ring", "bipartite_exponential"] = "ring"
    """The D-PSGD gossip graph: ``ring`` or ``bipartite_exponential`` (needs an even number of ranks)."""
    period: PositiveInt = 4
    """Average all ranks' models exactly (instead of gossiping) every ``period`` iterations."""

    def check(self, ranks: int) -> None:
        if self.graph == "bipartite_exponential":
            _need_even(self, ranks, "graph bipartite_exponential")
