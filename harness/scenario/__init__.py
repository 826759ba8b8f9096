"""Scenario files: what to run, on how many ranks, under which injected imbalance and network.

Example::

    from harness.scenario import load_scenario
    scenario = load_scenario("scenarios/straggler.yaml", overrides={"ranks": 4})
"""

from harness.scenario.loader import (
    ScenarioError,
    load_scenario,
    load_scenario_with_notes,
    read_yaml,
    scenario_from_dict,
)
from harness.scenario.schema import Scenario

__all__ = ["Scenario", "ScenarioError", "load_scenario", "load_scenario_with_notes", "read_yaml", "scenario_from_dict"]
