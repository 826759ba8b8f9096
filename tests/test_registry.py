"""The algorithm registry: one registration per algorithm, read by scenario validation, the
runner's class lookup and the figures; algorithms registered at run time count everywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import Field

from harness.algorithms import Algorithm, algorithm_class, names, params_model, register, registration
from harness.algorithms.params import AlgorithmParams, WAGMAParams
from harness.algorithms.registry import BUILT_IN, FAMILIES, SPARE_COLOURS, unregister
from harness.scenario import ScenarioError, scenario_from_dict

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = {"model": "mlp", "dataset": "digits", "batch_size": 8, "iterations": 12}


class ToyAverageParams(AlgorithmParams):
    """A test algorithm: average the models every ``every`` steps."""

    name: Literal["toy_average"] = "toy_average"
    every: Annotated[int, Field(ge=1)] = 3


class ToyAverage(Algorithm):
    name = "toy_average"

    def after_step(self, t: int) -> None:
        if (t + 1) % self.params.every == 0:
            self.ctx.comm.allreduce(self.ctx.params, op="mean")


class PlainParams(AlgorithmParams):
    """A test algorithm registered without a label or a colour."""

    name: Literal["toy_plain"] = "toy_plain"


@pytest.fixture
def toy():
    """ToyAverage registered for one test, with a label and a colour of its own, in the periodic family."""
    entry = register("toy_average", ToyAverageParams, ToyAverage, label="Toy average", colour="#123456",
                     family="periodic")
    try:
        yield entry
    finally:
        unregister("toy_average")


def _scenario(*algorithms, ranks: int = 4):
    return scenario_from_dict({"name": "reg", "ranks": ranks, "workload": WORKLOAD, "algorithms": list(algorithms)})


def test_built_ins_are_registered_in_figure_order():
    assert names() == [entry.name for entry in BUILT_IN]
    assert names()[0] == "allreduce_sgd" and len(names()) == 17
    assert {entry.family for entry in BUILT_IN} == set(FAMILIES)
    assert len({entry.colour for entry in BUILT_IN}) == len(BUILT_IN)  # every algorithm tells apart in a figure
    assert params_model("wagma") is WAGMAParams and registration("wagma").label == "WAGMA-SGD"


def test_every_built_in_class_path_names_its_algorithm():
    for entry in BUILT_IN:
        cls = algorithm_class(entry.name)
        assert issubclass(cls, Algorithm) and cls.name == entry.name, entry


@pytest.mark.subprocess
def test_listing_names_and_validating_scenarios_do_not_import_torch():
    code = ("import sys\n"
            "from harness.algorithms import names\n"
            "from harness.scenario import load_scenario\n"
            "assert len(names()) == 17\n"
            "load_scenario('scenarios/convergence.yaml')\n"
            "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_registered_algorithm_validates_in_a_scenario(toy):
    scenario = _scenario({"name": "toy_average", "every": 2}, "allreduce_sgd")
    params = scenario.algorithms[0]
    assert isinstance(params, ToyAverageParams) and params.every == 2
    assert scenario.resolved_dict()["algorithms"][0] == {"name": "toy_average", "every": 2}
    assert _scenario("toy_average").algorithms[0].every == 3  # a bare name takes the defaults


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "toy_average", "every": 0}, "algorithms[0].every: must be >= 1 (got 0)"),
        ({"name": "toy_average", "every": "2"}, "algorithms[0].every: must be an integer (got '2')"),
        ({"name": "toy_average", "evry": 2}, "algorithms[0].evry: unknown key (valid: name, every, optimizer) (got 'evry')"),
    ],
)
def test_a_registered_algorithms_params_are_checked_by_field(toy, entry, message):
    with pytest.raises(ScenarioError) as info:
        _scenario(entry)
    assert str(info.value) == f"<dict>: {message}"


def test_an_unregistered_name_is_refused_listing_the_registered_ones(toy):
    with pytest.raises(ScenarioError, match=r"algorithms\[0\]\.name: unknown algorithm \(valid: allreduce_sgd, .*"
                                            r"gossip_pga, toy_average\) \(got 'toy_plain'\)"):
        _scenario("toy_plain")
    unregister("toy_average")
    try:
        with pytest.raises(ScenarioError, match=r"unknown algorithm .* \(got 'toy_average'\)"):
            _scenario("toy_average")
    finally:
        register(toy.name, toy.params, toy.cls, toy.label, toy.colour, toy.family)  # for the fixture


def test_algorithm_class_returns_a_registered_class_object(toy):
    assert algorithm_class("toy_average") is ToyAverage
    assert names()[-1] == "toy_average" and registration("toy_average") == toy


def test_figures_take_label_colour_and_family_from_the_registration(toy):
    from harness.report import style
    from paper_figs import fig3_overlap_local_sgd as fig3

    assert (style.label("toy_average"), style.color("toy_average")) == ("Toy average", "#123456")
    assert style.ordered({"toy_average", "wagma", "sgp"}) == ["sgp", "wagma", "toy_average"]
    assert fig3.algorithms()[-1] == "toy_average" and "wagma" not in fig3.algorithms()


def test_label_and_colour_default_to_the_name_and_a_spare_colour(toy):
    from harness.report import style

    entry = register("toy_plain", PlainParams, ToyAverage)
    try:
        assert (entry.label, entry.family) == ("toy_plain", None)
        assert entry.colour == SPARE_COLOURS[0]
        assert entry.colour not in {e.colour for e in BUILT_IN} | {toy.colour}
        assert (style.label("toy_plain"), style.color("toy_plain")) == ("toy_plain", SPARE_COLOURS[0])
    finally:
        unregister("toy_plain")


def test_duplicate_names_are_refused(toy):
    with pytest.raises(ValueError, match=r"algorithm 'toy_average' is already registered \(class .*ToyAverage.*\); "
                                         "pick another name"):
        register("toy_average", ToyAverageParams, ToyAverage)
    with pytest.raises(ValueError, match=r"algorithm 'wagma' is already registered \(class "
                                         r"harness\.algorithms\.wagma:WAGMA\)"):
        register("wagma", WAGMAParams, "harness.algorithms.wagma:WAGMA")
    assert registration("toy_average") == toy


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("toy plain", PlainParams, ToyAverage), r"algorithm name must be a letter, then letters, digits and '_'"),
        (("toy_plain", dict, ToyAverage), r"'toy_plain': params must be an AlgorithmParams subclass"),
        (("toy_other", PlainParams, ToyAverage), r"'toy_other': PlainParams must declare name: Literal\['toy_other'\]"),
        (("toy_plain", PlainParams, object), r"'toy_plain': cls must be an Algorithm subclass or a 'module:Class'"),
        (("toy_plain", PlainParams, "harness.algorithms.wagma.WAGMA"), r"cls must be .* \(got 'harness\.algorithms"),
        (("toy_plain", PlainParams, ToyAverage, ""), r"'toy_plain': label must be a non-empty string \(got ''\)"),
        (("toy_plain", PlainParams, ToyAverage, None, None, "async"), r"family must be one of synchronous, "),
    ],
)
def test_bad_registrations_name_what_is_wrong(args, message):
    with pytest.raises(ValueError, match=message):
        register(*args)
    assert "toy_plain" not in names() and "toy_other" not in names()


def test_a_class_path_that_is_not_an_algorithm_fails_on_first_use():
    register("toy_plain", PlainParams, "harness.algorithms.params:WAGMAParams")
    try:
        with pytest.raises(TypeError, match=r"'toy_plain': harness\.algorithms\.params:WAGMAParams is not an "
                                            "Algorithm subclass"):
            algorithm_class("toy_plain")
    finally:
        unregister("toy_plain")


def test_unknown_names_and_built_ins_cannot_be_unregistered():
    with pytest.raises(ValueError, match=r"unknown algorithm 'toy_plain' \(registered: allreduce_sgd, "):
        unregister("toy_plain")
    with pytest.raises(ValueError, match="'wagma' is built in and cannot be unregistered"):
        unregister("wagma")
    assert names() == [entry.name for entry in BUILT_IN]
