"""Injected imbalance: per-iteration sleeps and compute-time factors, the same on every rank.

What each kind of entry does lives with its spec (``harness.scenario.schema``, ``effect``);
the plan here combines a scenario's entries and seeds the random ones. Every value is a pure
function of (seed, entry index, iteration, rank): random entries draw from
``SeedSequence([seed, index, iteration])``, so every rank, every algorithm, a re-run and the
simulator see the same stragglers without communicating.

Example::

    plan = InjectionPlan.from_scenario(scenario)
    delay_s, compute_factor = plan.at(iteration)
    time.sleep(delay_s[rank])  # before the forward pass
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import TypeAdapter

from harness.scenario.imbalance_fields import AnyInjectorSpec, InjectorSpec
from harness.scenario.schema import Scenario

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
        self.specs = [s if isinstance(s, InjectorSpec) else _SPEC.validate_python(s) for s in injectors]
        # A Scenario has checked its entries against its ranks; entries given here directly have not.
        for spec in self.specs:
            spec.check(ranks)

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
        for index, spec in enumerate(self.specs):
            if not spec.active(iteration):
                continue
            rng = None
            if spec.random:
                # Seeded by the entry's index too, so two random entries never draw alike.
                rng = np.random.default_rng(np.random.SeedSequence([self.seed, index, iteration]))
            entry_delay_s, entry_factor = spec.effect(self.ranks, rng)
            delay_s += entry_delay_s
            factor *= entry_factor
        return delay_s, factor
