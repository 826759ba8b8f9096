"""Training algorithms: one class per file behind ``Algorithm``, each registered once by name.

``harness.algorithms.registry`` holds the registrations (scenario name, parameter model,
class, figure label and colour); parameters are validated by each algorithm's model in
``harness.algorithms.params``. Classes are imported on use, so listing names stays cheap.

A module with an algorithm of the user's own imports what it needs from here alone (the
contract is in ``harness.algorithms.base``)::

    from harness.algorithms import Algorithm, AlgorithmContext, AlgorithmParams, PositiveInt
"""

from __future__ import annotations

from typing import Any

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.params import AlgorithmParams
from harness.algorithms.registry import Registration, algorithm_class, names, params_model, register, registration
from harness.errors import ParamError
from harness.strict_model import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

__all__ = [
    "Algorithm",
    "AlgorithmContext",
    "AlgorithmParams",
    "NonNegativeFloat",
    "NonNegativeInt",
    "ParamError",
    "PositiveFloat",
    "PositiveInt",
    "Registration",
    "algorithm_class",
    "names",
    "params_model",
    "register",
    "registration",
    "scenario_facts",
    "scenario_notes",
]


def scenario_notes(scenario: Any) -> list[str]:
    """Every algorithm's notes about itself at the scenario's rank count (``AlgorithmParams.notes``)."""
    return [note for p in scenario.algorithms for note in p.notes(scenario.ranks)]


def scenario_facts(scenario: Any) -> dict[str, Any]:
    """run.json keys from every algorithm's ``run_facts``: ``{key: {algorithm: value}}``."""
    facts: dict[str, dict[str, Any]] = {}
    for p in scenario.algorithms:
        for key, value in p.run_facts(scenario.ranks).items():
            facts.setdefault(key, {})[p.name] = value
    return facts
