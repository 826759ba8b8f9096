"""The scenario's ``imbalance`` entries: who is delayed or slowed, when and by how much (each
entry's ``at(t, ranks, rng)`` is what ``harness.injection`` plays, in the real run and the
simulator alike)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_serializer, model_validator

from harness.errors import ParamError
from harness.scenario.ranks import Rank, check_ranks
from harness.strict_model import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, StrictModel


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
        check_ranks("ranks", self.ranks, ranks)

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
        check_ranks("ranks", self.ranks, ranks)

    def effect(self, ranks: int, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(ranks), _at_ranks(ranks, self.ranks, self.factor, 1.0)


AnyInjectorSpec = Annotated[
    RandomRanksSpec | FixedSpec | LinearSpec | JitterSpec | SlowdownSpec, Field(discriminator="kind")
]
