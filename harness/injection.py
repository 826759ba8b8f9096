"""Injected imbalance: per-iteration sleeps and compute-time factors, the same on every rank.

Every value is a pure function of (seed, injector index, iteration, rank): random injectors draw
from ``SeedSequence([seed, index, iteration])``, so every rank, every algorithm, a re-run and the
simulator see the same stragglers without communicating.

Example::

    plan = InjectionPlan.from_scenario(scenario)
    delay_s, compute_factor = plan.at(iteration)
    time.sleep(delay_s[rank])  # before the forward pass
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import TypeAdapter

from harness.scenario.schema import (
    AnyInjectorSpec,
    FixedSpec,
    InjectorSpec,
    JitterSpec,
    LinearSpec,
    RandomRanksSpec,
    Scenario,
    SlowdownSpec,
)


class Injector(ABC):
    """One imbalance entry at run time: adds its delays and multiplies its compute factors."""

    kind: ClassVar[str]
    random: ClassVar[bool] = False  # True: apply() needs the per-iteration generator

    def __init__(self, spec: InjectorSpec, ranks: int) -> None:
        spec.check(ranks)
        self.spec = spec
        self.ranks = ranks

    def active(self, iteration: int) -> bool:
        """Whether ``iteration`` lies in the entry's [start, stop) window."""
        stop = self.spec.stop
        return self.spec.start <= iteration and (stop is None or iteration < stop)

    @abstractmethod
    def apply(self, delay_s: np.ndarray, factor: np.ndarray, rng: np.random.Generator | None) -> None:
        """Add this entry's sleeps to ``delay_s`` and multiply its factors into ``factor``, in place."""


def _at_ranks(ranks: int, listed: list[int], value: float, fill: float) -> np.ndarray:
    vector = np.full(ranks, fill)
    vector[listed] = value
    return vector


class RandomRanks(Injector):
    """``count`` distinct ranks, drawn per iteration, sleep ``delay_ms`` (WAGMA-SGD, eager-SGD runs)."""

    kind = "random_ranks"
    random = True
    spec: RandomRanksSpec

    def apply(self, delay_s: np.ndarray, factor: np.ndarray, rng: np.random.Generator | None) -> None:
        assert rng is not None
        delay_s[rng.choice(self.ranks, size=self.spec.count, replace=False)] += self.spec.delay_ms / 1e3


class Fixed(Injector):
    """The listed ranks sleep ``delay_ms`` every iteration."""

    kind = "fixed"
    spec: FixedSpec

    def __init__(self, spec: FixedSpec, ranks: int) -> None:
        super().__init__(spec, ranks)
        self._delay_s = _at_ranks(ranks, spec.ranks, spec.delay_ms / 1e3, 0.0)

    def apply(self, delay_s: np.ndarray, factor: np.ndarray, rng: np.random.Generator | None) -> None:
        delay_s += self._delay_s


class Linear(Injector):
    """Rank i sleeps i * ``offset_ms`` (the papers' usleep(rank * 1 ms) skew)."""

    kind = "linear"
    spec: LinearSpec

    def __init__(self, spec: LinearSpec, ranks: int) -> None:
        super().__init__(spec, ranks)
        self._delay_s = np.arange(ranks) * (spec.offset_ms / 1e3)

    def apply(self, delay_s: np.ndarray, factor: np.ndarray, rng: np.random.Generator | None) -> None:
        delay_s += self._delay_s


class Jitter(Injector):
    """Every rank's compute time is multiplied by exp(N(0, ``sigma``)), per rank and iteration."""

    kind = "jitter"
    random = True
    spec: JitterSpec

    def apply(self, delay_s: np.ndarray, factor: np.ndarray, rng: np.random.Generator | None) -> None:
        assert rng is not None
        factor *= np.exp(rng.normal(0.0, self.spec.sigma, self.ranks))


class Slowdown(Injector):
    """Compute of the listed ranks takes ``factor`` times as long."""

    kind = "slowdown"
    spec: SlowdownSpec

    def __init__(self, spec: SlowdownSpec, ranks: int) -> None:
        super().__init__(spec, ranks)
        self._factor = _at_ranks(ranks, spec.ranks, spec.factor, 1.0)

    def apply(self, delay_s: np.ndarray, factor: np.ndarray, rng: np.random.Generator | None) -> None:
        factor *= self._factor


INJECTORS: dict[str, type[Injector]] = {cls.kind: cls for cls in (RandomRanks, Fixed, Linear, Jitter, Slowdown)}
"""Imbalance kind -> run-time class."""

_SPEC = TypeAdapter(AnyInjectorSpec)


class InjectionPlan:
    """All imbalance entries of a scenario, queried per iteration.

    ``injectors`` are the scenario's ``imbalance`` entries, as specs or as plain mappings.
    """

    def __init__(self, seed: int, injectors: Sequence[InjectorSpec | Mapping[str, Any]], ranks: int) -> None:
        if ranks < 1:
            raise ValueError(f"ranks must be >= 1 (got {ranks})")
        self.seed = seed
        self.ranks = ranks
        specs = [s if isinstance(s, InjectorSpec) else _SPEC.validate_python(s) for s in injectors]
        self.injectors = [INJECTORS[spec.kind](spec, ranks) for spec in specs]

    @classmethod
    def from_scenario(cls, scenario: Scenario) -> InjectionPlan:
        """The plan of ``scenario``'s seed, imbalance entries and rank count."""
        return cls(scenario.seed, scenario.imbalance, scenario.ranks)

    def at(self, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        """Sleep in seconds and compute-time factor of every rank at ``iteration`` (fresh arrays).

        Sleeps of all entries add up; compute factors multiply.
        """
        if iteration < 0:
            raise ValueError(f"iteration must be >= 0 (got {iteration})")
        delay_s = np.zeros(self.ranks)
        factor = np.ones(self.ranks)
        for index, injector in enumerate(self.injectors):
            if not injector.active(iteration):
                continue
            rng = None
            if injector.random:
                rng = np.random.default_rng(np.random.SeedSequence([self.seed, index, iteration]))
            injector.apply(delay_s, factor, rng)
        return delay_s, factor
