"""Checks of the user's code a scenario names, run before anything is written or launched.

Loading a scenario checks its form only (the launcher reads scenarios without torch); whether
the user's callables import, take their arguments and return what the contract asks is found
out by calling them. ``python -m harness validate``, ``run`` (once, in the launcher, before
any rank starts) and ``simulate`` call :func:`check_user_code` right after loading.

Each check looks at its part of the scenario and returns at once, importing nothing, when that
part names only built-ins (they are tested); a failure is a ParamError naming the field.

Example::

    scenario = load_scenario("examples/own_model_data/scenario.yaml")
    check_user_code(scenario, "examples/own_model_data/scenario.yaml")  # ScenarioError if not usable
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.errors import ParamError
from harness.scenario.loader import ScenarioError
from harness.user_code import is_reference
from harness.workload.names import WorkloadCodeError, is_plain, resolve


def check_workload(scenario: Any) -> None:
    """The model and dataset callables: the dataset loads and passes the dataset checks, has a
    training sample for every rank, and the model builds with float32 parameters and maps two
    training samples to ``(2, num_classes)`` outputs. ParamError at ``workload.<field>``."""
    w = scenario.workload
    if w.model is None or is_plain(w):  # a training script's own workload, or built-ins only
        return
    from harness.workload import check_model, scenario_dataset, scenario_model  # noqa: PLC0415  (torch: the loader imports without it)

    try:
        # Both resolve before either is called: a module that does not import is reported on
        # the field that names it, in the file's order.
        resolve("model", w.model, scenario.python_path)
        resolve("dataset", w.dataset, scenario.python_path)
        dataset = scenario_dataset(scenario)
        if dataset.num_train < scenario.ranks:
            raise WorkloadCodeError(
                "dataset",
                f"{w.dataset} has {dataset.num_train} training samples, fewer than "
                f"the {scenario.ranks} ranks that each train on a shard of them",
            )
        model = scenario_model(scenario, dataset)
        check_model(model, w.model, dataset.train_x[:2], dataset.num_classes)
    except WorkloadCodeError as exc:
        raise ParamError(("workload", exc.field), str(exc), getattr(w, exc.field)) from None


def check_optimizer(scenario: Any) -> None:
    """The optimizer callable (``optimizer: {name: "module:callable"}``): built over a small model's
    parameters, one step taken (``harness.runner.optimizers.check_optimizer``); an algorithm entry's
    own too. ParamError at ``optimizer.name`` (``algorithms.I.optimizer.name``)."""
    specs = [scenario.optimizer, *(a.optimizer for a in scenario.algorithms if a.optimizer is not None)]
    if not any(is_reference(spec.name) for spec in specs):  # sgd, adam, adamw
        return
    from harness.runner.optimizers import check_optimizer as try_optimizer  # noqa: PLC0415  (torch: the loader imports without it)

    try_optimizer(scenario)


# Every check of the user's code, in order; each takes the scenario and raises ParamError.
CHECKS: list[Callable[[Any], None]] = [
    check_workload,
    check_optimizer,
]


def check_user_code(scenario: Any, source: str | None = None) -> None:
    """Run :data:`CHECKS` on ``scenario``; ScenarioError ``SOURCE: FIELD: reason (got value)``
    (as the loader reports a bad field) on the first failure. ``source`` names the file."""
    for check in CHECKS:
        try:
            check(scenario)
        except ParamError as exc:
            raise ScenarioError(f"{source}: {exc}" if source else str(exc)) from None
