"""Variants: a built-in algorithm listed under a label of its own (``algorithm:``,
``harness.algorithms.variant``), validated, run, simulated, compared and drawn under the label."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import harness_cli, run_scenario
from harness.algorithms import registry
from harness.algorithms.registry import BUILT_IN
from harness.scenario import ScenarioError, load_scenario, scenario_from_dict
from harness.sim.calibration import save_fixed_calibration

WORKLOAD = {"model": "logreg", "dataset": "digits", "batch_size": 16, "iterations": 4, "eval_every": 2}
PERIODS = [{"name": "local_sgd_p2", "algorithm": "local_sgd", "period": 2},
           {"name": "local_sgd_p8", "algorithm": "local_sgd", "period": 8}]


def scenario(algorithms: list, ranks: int = 8, **fields) -> dict:
    return {"name": "variants", "ranks": ranks, "seed": 3, "workload": WORKLOAD, "algorithms": algorithms, **fields}


@pytest.fixture
def registrations():
    """Forget the variants a test registered in this process (other tests list the registry)."""
    before = set(registry.variants())
    yield
    for label in registry.variants():
        if label not in before:
            registry.unregister(label)


@pytest.mark.parametrize("name", [entry.name for entry in BUILT_IN])
def test_every_built_in_loads_as_a_variant_and_round_trips(registrations, name):
    label = f"{name}_v"
    loaded = scenario_from_dict(scenario([{"name": label, "algorithm": name}]))
    (params,) = loaded.algorithms
    assert params.name == label and params.algorithm == name
    assert isinstance(params, registry.params_model(name))  # the built-in's parameters, defaults included
    resolved = loaded.resolved_dict()
    assert resolved["algorithms"][0]["algorithm"] == name
    again = scenario_from_dict(yaml.safe_load(yaml.safe_dump(resolved)))
    assert again == loaded and again.resolved_dict() == resolved
    assert registry.algorithm_class(label) is registry.algorithm_class(name)
    entry, built_in = registry.registration(label), registry.registration(name)
    assert (entry.variant_of, entry.family, entry.label) == (name, built_in.family, f"{built_in.label} ({label})")
    assert label not in registry.names() and registry.algorithm_of(label) == name


def test_the_built_in_name_as_its_own_algorithm_is_the_plain_entry(registrations):
    loaded = scenario_from_dict(scenario([{"name": "wagma", "algorithm": "wagma", "group_size": 2}]))
    assert type(loaded.algorithms[0]) is registry.params_model("wagma")
    assert loaded.resolved_dict()["algorithms"] == [{"name": "wagma", "group_size": 2, "period": 11}]
    assert "wagma" not in registry.variants()


BAD = {
    "another built-in's name": ({"name": "sgp", "algorithm": "wagma"},
                                "algorithms[1].name: is another built-in algorithm's name; give this variant of "
                                "wagma a name of its own (e.g. wagma_2) (got 'sgp')"),
    "unknown algorithm": ({"name": "mine", "algorithm": "wagmaa"}, "algorithms[1].algorithm: unknown algorithm "
                          f"(valid: {', '.join(e.name for e in BUILT_IN)}) (got 'wagmaa')"),
    "with class": ({"name": "mine", "algorithm": "wagma", "class": "x:Y"}, "algorithms[1].algorithm: give "
                   "`algorithm` (a built-in algorithm to run) or `class` (your own), not both (got 'wagma')"),
    "label listed twice": ({"name": "allreduce_sgd_v", "algorithm": "allreduce_sgd"},
                           "algorithms[1].name: listed twice (first at algorithms[0]) (got 'allreduce_sgd_v')"),
    "label of two algorithms": ({"name": "allreduce_sgd_v", "algorithm": "local_sgd"},
                                "algorithms[1].name: already names a variant of allreduce_sgd (by an earlier entry, "
                                "or a scenario loaded earlier in this process); give this one another name"),
    "a label without its algorithm": ({"name": "mine"}, "algorithms[1].name: unknown algorithm (valid: "),
    "bad parameter": ({"name": "mine", "algorithm": "local_sgd", "period": 0},
                      "algorithms[1].period: must be >= 1 (got 0)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_entries_are_refused_at_their_field(registrations, case):
    entry, message = BAD[case]
    first = {"name": "allreduce_sgd_v", "algorithm": "allreduce_sgd"} if case.startswith("label") else "allreduce_sgd"
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(scenario([first, entry]))
    assert message in str(err.value)


def test_faults_name_the_label(registrations):
    fault = {"kind": "kill", "rank": 1, "at_iteration": 2}
    loaded = scenario_from_dict(scenario(PERIODS, faults=[{**fault, "algorithm": "local_sgd_p8"}]))
    assert loaded.faults[0].algorithm == "local_sgd_p8"
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(scenario(PERIODS, faults=[{**fault, "algorithm": "local_sgd"}]))
    assert ("faults[0].algorithm: not one of the algorithms run (local_sgd_p2, local_sgd_p8) (got 'local_sgd')"
            in str(err.value))


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("variants")
    return run_scenario(tmp, scenario(PERIODS, ranks=2, results={"provenance": "none"}), timeout=240)


@pytest.mark.mpi
def test_two_periods_of_local_sgd_run_under_their_labels(real_run):
    summary = pd.read_csv(real_run / "summary.csv")
    assert list(summary["algorithm"]) == ["local_sgd_p2", "local_sgd_p8"] and summary["complete"].all()
    assert set(pd.read_csv(real_run / "steps.csv")["algorithm"]) == {"local_sgd_p2", "local_sgd_p8"}
    assert json.loads((real_run / "run.json").read_text())["finished_algorithms"] == ["local_sgd_p2", "local_sgd_p8"]
    resolved = yaml.safe_load((real_run / "scenario.resolved.yaml").read_text())
    assert resolved["algorithms"] == PERIODS


@pytest.mark.mpi
def test_simulate_compare_and_figures_know_the_labels(real_run, tmp_path, registrations):
    calibration = save_fixed_calibration(tmp_path / "calibration.json", 2, [("logreg", "digits", 16, 0.001)])
    path = tmp_path / "variants.yaml"
    path.write_text((real_run / "scenario.resolved.yaml").read_text())
    proc = harness_cli("simulate", str(path), "--only", "local_sgd_p8", "--calibration", str(calibration),
                       "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sim,) = (tmp_path / "out" / "variants").iterdir()
    assert list(pd.read_csv(sim / "summary.csv")["algorithm"]) == ["local_sgd_p8"]

    proc = harness_cli("compare", str(real_run), "--calibration", str(calibration), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(pd.read_csv(real_run / "compare.csv")["algorithm"]) == {"local_sgd_p2", "local_sgd_p8"}

    from harness.report import style
    from paper_figs import fig3_overlap_local_sgd as fig3

    load_scenario(real_run / "scenario.resolved.yaml")  # as every process reading the run does
    looks = {label: (style.label(label), style.color(label)) for label in ("local_sgd_p2", "local_sgd_p8")}
    assert looks["local_sgd_p2"][0] == "Local SGD (local_sgd_p2)"
    colours = [colour for _, colour in looks.values()]
    assert len(set(colours)) == 2
    assert not set(colours) & ({entry.colour for entry in BUILT_IN} | {style.UNKNOWN_COLOUR})
    assert style.ordered({"local_sgd_p8", "sgp", "local_sgd_p2", "local_sgd"}) == [
        "local_sgd", "local_sgd_p2", "local_sgd_p8", "sgp"]
    table = fig3.table(real_run)  # the periodic family, by the algorithm each label runs
    assert list(dict.fromkeys(table["algorithm"])) == ["local_sgd_p2", "local_sgd_p8"]
    assert set(table["series"]) == {"Local SGD (local_sgd_p2)", "Local SGD (local_sgd_p8)"}
