"""Does an algorithm's communication depend on its model's values? Asked of your own algorithms.

Without ``simulation.train`` the simulated ranks hold stand-ins (``harness.sim.standin``): an
algorithm whose communication depends on values (``if x.norm() > c: allreduce(...)``) would be
simulated as if every value were 0, silently wrong. So before ``simulate`` predicts a scenario
that names an algorithm class of the user's, :func:`value_dependence` runs a few iterations of
it twice on the same simulated timing: once with stand-ins and once with real values (a small
model actually trained), logging every call to the communicator (``harness.comm.call_log``).
The stand-in run failing (a comparison or a truth test of a stand-in raises) or the two logs
differing in what is called, on whom, in which iteration, is reported with the first
difference; with ``--train`` the simulation holds real values and needs no such check.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.algorithms.registry import BUILT_IN, algorithm_class
from harness.comm.call_log import CallLog
from harness.scenario.loader import ScenarioError, scenario_from_dict
from harness.scenario.schema import Scenario
from harness.sim.calibration import NetworkModel
from harness.sim.engine import SimDeadlock
from harness.sim.simulate import simulate_algorithm
from harness.sim.training import SimTraining
from harness.workload import scenario_dataset

CHECK_ITERATIONS = 12
CHECK_RANKS = 8  # at most: the check's cost stays that of a few dozen training steps
_NETWORK = NetworkModel(latency_s=1e-5, bandwidth_bytes_per_s=1e9)


class _FixedTiming:
    """1 ms of local work per iteration on every rank; nothing between iterations or for
    evaluations: the same timing for both runs of the check."""

    trace_driven = False
    eval_s = 0.0

    def start_offset(self, r: int) -> float:
        return 0.0

    def compute(self, t: int, r: int) -> float:
        return 1e-3 * (1 + (r % 3) * 0.25)  # ranks not in lockstep: arrivals in some order

    def between(self, t: int, r: int) -> float:
        return 0.0


def _calls(scenario: Scenario, entry: Any, values: bool) -> list[list[tuple]]:
    """Every rank's (iteration, operation, peers) calls of ``entry`` on the check's timing."""
    logs: dict[int, CallLog] = {}

    def wrap(rank: int, comm) -> CallLog:
        logs[rank] = CallLog(comm)
        return logs[rank]

    training = SimTraining(scenario, entry, scenario_dataset(scenario), torch.device("cpu")) if values else None
    simulate_algorithm(scenario, entry, _FixedTiming(), _NETWORK, wrap_comm=wrap, training=training)
    return [[(c.iteration, c.op, c.peers) for c in logs[r].calls] for r in sorted(logs)]


def _small(scenario: Scenario) -> Scenario:
    """``scenario`` at the check's size: fewer iterations, at most :data:`CHECK_RANKS` ranks
    where the algorithms allow (else its own rank count), one evaluation at the end."""
    data = scenario.resolved_dict()
    iterations = min(scenario.workload.iterations, CHECK_ITERATIONS)
    data["workload"] = {**data["workload"], "iterations": iterations, "eval_every": iterations, "compute": "real"}
    data["workload"].pop("params", None)
    data.update(imbalance=[], faults=[], overrides=[], simulation={"train": False})
    for ranks in (min(scenario.ranks, CHECK_RANKS), scenario.ranks):
        try:
            return scenario_from_dict({**data, "ranks": ranks}, source="the value check")
        except ScenarioError:
            continue
    return scenario_from_dict(data, source="the value check")


def built_in(entry: Any) -> bool:
    """Whether ``entry`` runs one of the harness's own classes (a built-in or a variant of one),
    whose communication is known not to depend on values."""
    return algorithm_class(entry.name) in {algorithm_class(b.name) for b in BUILT_IN}


def value_dependence(scenario: Scenario, entry: Any) -> str | None:
    """Why algorithm ``entry`` of ``scenario`` cannot be simulated without values (its
    communication depends on them), or None when its calls are the same either way. Needs the
    workload's model and dataset (a scenario without them cannot be checked: None)."""
    w = scenario.workload
    if w.model is None or w.dataset is None:
        return None
    small = _small(scenario)
    entry = next(a for a in small.algorithms if a.name == entry.name)
    how = (
        "simulate it with --train (simulation.train: true, with the workload's real compute), where the "
        "simulated ranks hold real values"
    )
    try:
        without = _calls(small, entry, values=False)
    except (TypeError, ValueError) as exc:
        return (
            f"algorithm {entry.name!r} reads its model's values to decide what to do ({exc}); without values "
            f"the simulator's buffers are stand-ins that hold none: {how}"
        )
    try:
        with_values = _calls(small, entry, values=True)
    except SimDeadlock as exc:
        return (
            f"algorithm {entry.name!r}: with its model's real values its ranks do not post the same collectives "
            f"(its communication depends on the values, and differently on each rank): {exc}"
        )
    for rank, (a, b) in enumerate(zip(without, with_values)):
        for i, (x, y) in enumerate(zip(a + [None] * (len(b) - len(a)), b + [None] * (len(a) - len(b)))):
            if x != y:

                def show(call):
                    return (
                        "nothing"
                        if call is None
                        else f"{call[1]}{f' with {call[2]}' if call[2] else ''} in iteration {call[0]}"
                    )

                return (
                    f"algorithm {entry.name!r}: its communication depends on its model's values: rank {rank}'s "
                    f"call {i + 1} is {show(y)} with values and {show(x)} without (every value 0); {how}"
                )
    return None


def scenario_value_dependence(scenario: Scenario) -> str | None:
    """Why one of ``scenario``'s algorithms of the user's own cannot be simulated without values
    (:func:`value_dependence`), or None; nothing to check with values (``simulation.train``) or
    for the harness's own classes."""
    if scenario.simulation.train:
        return None
    for entry in scenario.algorithms:
        if not built_in(entry):
            problem = value_dependence(scenario, entry)
            if problem is not None:
                return problem
    return None
