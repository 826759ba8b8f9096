"""The scenario file's JSON Schema and reference page, both made from the models.

The schema accepts what the loader accepts (every shipped and example scenario, the full
reference example, resolved scenarios) and refuses unknown keys and wrong types; the committed
``docs/scenario.schema.json`` is current; every field of every scenario model is documented, and
the reference page shows what the model says. All in-process and fast (about a second).
"""

from __future__ import annotations

import copy
import typing
from pathlib import Path

import jsonschema
import pytest
from pydantic import BaseModel

from harness.algorithms import registry
from harness.algorithms.user_class import ClassEntryParams
from harness.algorithms.variant import VariantEntryParams
from harness.cli import main
from harness.strict_model import StrictModel
from harness.field_docs import document_models
from harness.scenario import load_scenario, read_yaml
from harness.scenario.json_schema import (
    COMMITTED,
    REGENERATE,
    prose,
    scenario_json_schema,
    scenario_json_schema_text,
)
from harness.scenario.reference import scenario_reference_markdown
from harness.scenario.schema import Scenario, WatchdogSettings, Workload

# The fields' docstrings become their descriptions when documentation is made (harness.field_docs).
document_models(StrictModel)

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "scenarios").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "examples").glob("**/*.yaml"))
FULL = ROOT / "tests" / "data" / "scenarios" / "full.yaml"
MINIMAL = ROOT / "tests" / "data" / "scenarios" / "minimal.yaml"


@pytest.fixture(scope="module")
def schema() -> dict:
    return scenario_json_schema()


@pytest.fixture(scope="module", params=[jsonschema.Draft202012Validator, jsonschema.Draft7Validator],
                ids=["2020-12", "draft-07"])
def validator(request, schema) -> jsonschema.protocols.Validator:
    """The schema's own dialect, and draft-07, what the YAML language server validates with (it
    ignores what stands beside a ``$ref``, and finds ``$defs`` by JSON pointer): both must agree."""
    request.param.check_schema(schema)
    return request.param(schema)


@pytest.fixture(scope="module")
def page() -> str:
    return scenario_reference_markdown()


def _errors(validator, data) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}" for e in validator.iter_errors(data)]


def _minimal() -> dict:
    return read_yaml(MINIMAL)


# -- the schema accepts what the loader accepts ----------------------------------------------------


@pytest.mark.parametrize("path", [*SHIPPED, *EXAMPLES, FULL, MINIMAL], ids=lambda p: str(p.relative_to(ROOT)))
def test_the_schema_accepts_every_shipped_and_example_scenario(validator, path) -> None:
    assert _errors(validator, read_yaml(path)) == []


@pytest.mark.parametrize("path", [*SHIPPED, FULL], ids=lambda p: p.name)
def test_the_schema_accepts_resolved_scenarios(validator, path) -> None:
    """scenario.resolved.yaml: every default written out, variants' `algorithm` and classes' `class` kept."""
    assert _errors(validator, load_scenario(path).resolved_dict()) == []


def test_the_schema_accepts_every_form_of_an_algorithm_entry_and_of_an_optimizer(validator) -> None:
    data = _minimal()
    data["optimizer"] = "adamw"
    data["algorithms"] = [
        "sgp",
        {"name": "wagma", "group_size": 2, "optimizer": {"name": "adam", "lr": 0.01}},
        {"name": "wagma_g2", "algorithm": "wagma", "group_size": 2},
        {"name": "wagma", "algorithm": "wagma"},
        {"name": "post_local", "class": "post_local_sgd:PostLocalSGD", "switch_at": 8},
        {"name": "diloco", "optimizer": None, "inner_steps": 10},
        {"name": "eager_sgd", "sync_period": 10},  # the old spelling still loads (with a note)
    ]
    assert _errors(validator, data) == []
    data["optimizer"] = {"name": "mine:make", "lr": 0.1, "args": {"beta": 2}}
    data["network"] = {"links": [{"between": [0, 1], "latency_ms": 5}, {"from": 1, "to": 0, "bandwidth_gbps": 1}]}
    assert _errors(validator, data) == []


@pytest.mark.parametrize(("change", "where"), [
    (lambda d: d.update(batch=1), "(top level): Additional properties are not allowed ('batch' was unexpected)"),
    (lambda d: d["workload"].update(iteratons=10), "workload: Additional properties are not allowed"),
    (lambda d: d.update(ranks="eight"), "ranks: 'eight' is not of type 'integer'"),
    (lambda d: d.update(ranks=0), "ranks: 0 is less than the minimum of 1"),
    (lambda d: d["workload"].update(device="gpu"), "workload.device: 'gpu' is not one of ['cpu', 'cuda']"),
    (lambda d: d.update(name="has space"), "name: 'has space' does not match"),
    (lambda d: d.update(algorithms=["hogwild"]), "algorithms.0: 'hogwild' is not valid"),
    (lambda d: d.update(algorithms=[{"name": "local_sgd", "peroid": 2}]), "algorithms.0: "),
    (lambda d: d.update(algorithms=[{"name": "x", "algorithm": "nope"}]), "algorithms.0: "),
    (lambda d: d.update(algorithms=[{"name": "x", "algorithm": "wagma", "class": "a:B"}]), "algorithms.0: "),
    (lambda d: d.update(algorithms=[{"name": "local_sgd", "algorithm": "wagma"}]), "algorithms.0: "),
    (lambda d: d.update(algorithms=[{"name": "wagma", "period": 3, "sync_period": 2}]), "algorithms.0: "),
    (lambda d: d.update(optimizer="rmsprop"), "optimizer: 'rmsprop' is not valid"),
    (lambda d: d.update(network={"default": {"latency_us": 1, "latency_ms": 1}}), "network.default: "),
    (lambda d: d.update(network={"topology": {"ranks_per_node": 2, "placement": [0, 0, 1, 1]}}), "network.topology: "),
    (lambda d: d.update(faults=[{"kind": "kill", "rank": 0}]), "faults.0: "),
    (lambda d: d["workload"].update(params=100), "workload.params: "),  # params need emulated compute
    (lambda d: d["workload"].pop("dataset"), "workload: "),  # model without dataset
])
def test_the_schema_refuses_unknown_keys_wrong_types_and_impossible_forms(validator, change, where) -> None:
    data = copy.deepcopy(_minimal())
    change(data)
    errors = _errors(validator, data)
    assert any(e.startswith(where) for e in errors), errors


# -- the committed file and the command ------------------------------------------------------------


def test_the_committed_schema_is_current() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == scenario_json_schema_text(), (
        f"{COMMITTED.relative_to(ROOT)} is out of date with the models: run `{REGENERATE}` and commit it")


def test_python_m_harness_schema_prints_it_and_writes_it(tmp_path, capsys) -> None:
    assert main(["schema"]) == 0
    assert capsys.readouterr().out == scenario_json_schema_text()
    out = tmp_path / "scenario.schema.json"
    assert main(["schema", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == scenario_json_schema_text()
    assert main(["schema", "--out", str(tmp_path / "missing" / "x.json")]) == 2
    assert "cannot write" in capsys.readouterr().err


@pytest.mark.parametrize("path", [*SHIPPED, *EXAMPLES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_scenario_names_the_committed_schema_on_its_first_line(path) -> None:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    prefix = "# yaml-language-server: $schema="
    assert first.startswith(prefix), f"{path}: first line must be {prefix}<path to docs/scenario.schema.json>"
    assert (path.parent / first.removeprefix(prefix)).resolve() == COMMITTED


# -- every field documented, and the page shows the model's words ---------------------------------


def _models_under(model: type[BaseModel], seen: dict[str, type[BaseModel]]) -> None:
    if model.__name__ in seen:
        return
    seen[model.__name__] = model
    for field in model.model_fields.values():
        pending = [field.annotation]
        while pending:
            hint = pending.pop()
            if isinstance(hint, type) and issubclass(hint, BaseModel):
                _models_under(hint, seen)
            pending.extend(a for a in typing.get_args(hint) if a is not None)


def _scenario_models() -> dict[str, type[BaseModel]]:
    seen: dict[str, type[BaseModel]] = {}
    for model in (Scenario, *(entry.params for entry in registry.BUILT_IN), VariantEntryParams, ClassEntryParams):
        _models_under(model, seen)
    return seen


def test_every_field_of_every_scenario_model_has_a_description() -> None:
    models = _scenario_models()
    assert {"Workload", "EmulatedCompute", "SGDOptimizer", "ReferenceOptimizer", "RandomRanksSpec", "PairLink",
            "Topology", "KillFault", "WatchdogSettings", "ResultsSettings", "WAGMAParams", "DiLoCoParams"} <= set(models)
    missing = [f"{name}.{key}" for name, model in models.items() for key, field in model.model_fields.items()
               if not (field.description or "").strip()]
    assert missing == [], f"give these fields a docstring (the line after the field): {', '.join(missing)}"


def test_every_key_in_the_schema_has_a_description(schema) -> None:
    """Also the keys the models' json_schema_extra add (latency_ms, sync_period) and the entry forms."""
    missing = []
    for name, definition in [("(top level)", schema), *schema["$defs"].items()]:
        for key, field in definition.get("properties", {}).items():
            if "$ref" not in field and not field.get("description"):
                missing.append(f"{name}.{key}")
    assert missing == []


def _row(page: str, section: str, key: str) -> str:
    part = page.split(section, 1)[1] if section else page
    return next(line for line in part.splitlines() if line.startswith(f"| `{key}` |"))


def test_the_reference_page_shows_each_field_as_its_model_states_it(page) -> None:
    iterations = Workload.model_fields["iterations"]
    row = _row(page, "{ #workload }", "iterations")
    assert prose(iterations.description) in row and "| required |" in row and "≥ 1" in row
    factor = WatchdogSettings.model_fields["factor"]
    row = _row(page, "{ #watchdog }", "factor")
    assert f"| `{factor.default}` |" in row and prose(factor.description) in row and "≥ 1" in row
    # An algorithm's parameter, under its family.
    period = registry.params_model("wagma").model_fields["period"]
    wait_avoiding = page.split("{ #family-wait_avoiding }", 1)[1].split("{ #family-", 1)[0]
    assert "{ #algorithm-wagma }" in wait_avoiding and prose(period.description) in _row(wait_avoiding, "", "period")


def test_the_reference_page_has_a_section_for_every_model_and_algorithm(page, schema) -> None:
    assert "{ #other }" not in page, "a model without a place on the page: add it to reference.MODEL_SECTIONS"
    for entry in registry.BUILT_IN:
        assert f"{{ #algorithm-{entry.name} }}" in page
    for heading in ("workload", "optimizer", "algorithms", "imbalance", "network", "topology", "faults", "watchdog",
                    "results"):
        assert f"{{ #{heading} }}" in page
    assert page.index("{ #workload }") < page.index("{ #algorithms }") < page.index("{ #network }")
    assert "\\|" in page and "||" not in page.replace("|---|", "")  # pipes in cells escaped
