"""The JSON Schema (draft 2020-12) of a scenario file, from the models that validate one.

Everything comes from the models: ``Scenario`` and the models under it
(``harness.scenario.schema``, ``harness.optimizer_spec``) and the built-in algorithms' parameter
models (``harness.algorithms.registry.BUILT_IN``), through pydantic's ``model_json_schema``: their
fields' types, defaults, constraints, ``Literal`` choices and descriptions (each field's
docstring), and what their ``json_schema_extra`` adds about keys a validator reads before the
fields (``latency_ms``, ``sync_period``, the default of ``eval_every``). This module adds what a
validator decides and pydantic cannot see:

- an ``algorithms`` entry is one of: a built-in algorithm's name; a mapping validated by the
  parameter model its ``name`` picks; a variant ``{name: LABEL, algorithm: BUILT_IN, ...}`` with
  that built-in's parameters; or an entry naming your own class ``{name: NAME, class:
  "module:Class", ...}``, whose parameters only ``validate`` can check;
- an optimizer may be a bare built-in name (``optimizer: adamw``), and your own optimizer's
  ``name`` is an import reference;
- ``workload.model`` and ``workload.dataset`` are built-in names or import references.

The schema is looser than the loader where a check needs more than one value (rank indices
against ``ranks``, an algorithm's parameters against the rank count, a fault's ``algorithm``
against the entries): ``python -m harness validate`` checks those. It is committed as
``docs/scenario.schema.json`` (:data:`COMMITTED`), which scenario files name on their first
line for editors with the YAML language server; ``python -m harness schema --out
docs/scenario.schema.json`` rewrites it, and ``tests/test_schema.py`` checks that it is current.

Example::

    >>> schema = scenario_json_schema()
    >>> schema["properties"]["ranks"]["minimum"], schema["required"][:2]
    (1, ['name', 'ranks'])
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, models_json_schema

from harness.algorithms import registry
from harness.algorithms.params import AlgorithmParams
from harness.algorithms.user_class import CLASS_KEY, ClassEntryParams
from harness.algorithms.variant import ALGORITHM_KEY, VariantEntryParams
from harness.field_docs import document_models
from harness.optimizer_spec import BUILT_IN_OPTIMIZERS, ReferenceOptimizer, SGDOptimizer
from harness.scenario.schema import (
    _NAME as SCENARIO_NAME,  # what Scenario._name_chars accepts
)
from harness.scenario.schema import Scenario
from harness.strict_model import StrictModel
from harness.user_code import REFERENCE
from harness.workload.names import DATASETS, MODELS

DIALECT = "https://json-schema.org/draft/2020-12/schema"
COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "scenario.schema.json"
REGENERATE = "python -m harness schema --out docs/scenario.schema.json"
"""The command that rewrites :data:`COMMITTED` (from the repository's root)."""

# Regular expressions in JSON Schema are ECMA-262's, where \w is ASCII only; spell it out.
_REFERENCE_PATTERN = "^" + REFERENCE.pattern.replace(r"\w", "[A-Za-z0-9_]") + "$"
_LABEL_PATTERN = "^[A-Za-z][A-Za-z0-9_]*$"  # registry.valid_name
OPTIMIZER_DEF = "Optimizer"
CLASS_ENTRY_DEF = "AlgorithmClassEntry"


class _Generator(GenerateJsonSchema):
    """pydantic's generator without the titles it makes up for fields ("Batch Size"): a field's
    key and description say more. Models keep their titles (their class names)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def scenario_json_schema() -> dict[str, Any]:
    """The JSON Schema of a scenario file (a fresh dict; the same every call)."""
    document_models(StrictModel)  # the fields' docstrings as their descriptions
    built_in = registry.BUILT_IN
    models: list[tuple[type[BaseModel], Literal["validation"]]] = [
        (Scenario, "validation"),
        *((entry.params, "validation") for entry in built_in),
    ]
    keys, document = models_json_schema(models, ref_template="#/$defs/{model}", schema_generator=_Generator)
    defs: dict[str, Any] = document["$defs"]
    root = defs.pop(_def_name(keys[(Scenario, "validation")]))
    params_defs = {entry.name: _def_name(keys[(entry.params, "validation")]) for entry in built_in}

    root["properties"]["name"]["pattern"] = f"^{SCENARIO_NAME.pattern}$"
    _optimizer_forms(defs, root)
    _workload_names(defs["Workload"])
    for name, def_name in params_defs.items():
        params = defs[def_name]
        params.setdefault("required", []).insert(0, "name")  # the loader needs it to pick the model
        # As the models' messages list them: the algorithm's own parameters first, the optimizer last.
        last = AlgorithmParams.listed_last
        params["properties"] = dict(sorted(params["properties"].items(), key=lambda item: item[0] in last))
        defs[f"{def_name}Variant"] = _variant(name, def_name, params, params_defs)
    defs[CLASS_ENTRY_DEF] = _class_entry(params_defs)
    root["properties"]["algorithms"]["items"] = {
        "oneOf": [
            {
                "type": "string",
                "enum": list(params_defs),
                "description": "A built-in algorithm with its default parameters.",
            },
            *({"$ref": f"#/$defs/{def_name}"} for def_name in params_defs.values()),
            *({"$ref": f"#/$defs/{def_name}Variant"} for def_name in params_defs.values()),
            {"$ref": f"#/$defs/{CLASS_ENTRY_DEF}"},
        ],
    }
    schema = {
        "$schema": DIALECT,
        "$comment": f"Generated from the harness's models by `{REGENERATE}`; do not edit.",
        "title": "Scenario file",
        "description": (Scenario.__doc__ or "").strip() + "\n\nRead by `python -m harness run`, `simulate`, "
        "`validate` and `launch`; `validate` also checks what a schema cannot (ranks named against `ranks`, "
        "parameters against the rank count, your own code).",
        **{key: value for key, value in root.items() if key not in ("title", "description")},
        "$defs": dict(sorted(defs.items())),
    }
    return _markdown_descriptions(schema)


def scenario_json_schema_text() -> str:
    """:func:`scenario_json_schema` as the file holds it: JSON indented by 2, ending in a newline."""
    return json.dumps(scenario_json_schema(), indent=2, ensure_ascii=False) + "\n"


def _def_name(ref: dict[str, str]) -> str:
    return ref["$ref"].rsplit("/", 1)[-1]


def _optimizer_forms(defs: dict[str, Any], root: dict[str, Any]) -> None:
    """One ``Optimizer`` definition for every optimizer field: a bare built-in name, or a mapping
    in one of the models' forms (pydantic writes their union where each field is)."""
    forms = None

    def replace(node: Any) -> None:
        nonlocal forms
        if isinstance(node, dict):
            union = node.get("oneOf")
            if union and {_def_name(r) for r in union if "$ref" in r} >= {
                SGDOptimizer.__name__,
                ReferenceOptimizer.__name__,
            }:
                forms = node.pop("oneOf")
                node["$ref"] = f"#/$defs/{OPTIMIZER_DEF}"
            for value in node.values():
                replace(value)
        elif isinstance(node, list):
            for value in node:
                replace(value)

    replace(root)
    replace(defs)
    assert forms is not None, "no optimizer union found in the scenario's schema"
    defs[OPTIMIZER_DEF] = {
        "title": "Optimizer",
        "description": "A local optimizer: a built-in name with its defaults, or a mapping with `name` (default "
        '`sgd`) and the optimizer\'s parameters; `name: "module:callable"` is your own.',
        "oneOf": [
            {
                "type": "string",
                "enum": list(BUILT_IN_OPTIMIZERS),
                "description": "A built-in optimizer with its default parameters.",
            },
            *forms,
        ],
    }
    defs[ReferenceOptimizer.__name__]["properties"]["name"]["pattern"] = _REFERENCE_PATTERN


def _workload_names(workload: dict[str, Any]) -> None:
    """``model`` and ``dataset``: a built-in name, an import reference, or null."""
    for key, table in (("model", MODELS), ("dataset", DATASETS)):
        field = workload["properties"][key]
        field["anyOf"] = [
            {"type": "string", "enum": list(table)},
            {"type": "string", "pattern": _REFERENCE_PATTERN},
            {"type": "null"},
        ]


def _label(others: list[str], description: str) -> dict[str, Any]:
    """The ``name`` of an entry that is not a built-in algorithm: a label none of ``others`` has."""
    return {"type": "string", "pattern": _LABEL_PATTERN, "not": {"enum": others}, "description": description}


def _variant(name: str, def_name: str, params: dict[str, Any], params_defs: dict[str, str]) -> dict[str, Any]:
    """The schema of a variant of built-in ``name``: its parameters under a label of its own."""
    label = registry.registration(name).label
    others = [other for other in params_defs if other != name]
    properties: dict[str, Any] = {
        "name": _label(
            others,
            "This entry's label (letters, digits and '_', starting with a letter), which "
            "results, figures and faults name it by; not another built-in algorithm's name.",
        ),
        ALGORITHM_KEY: {"const": name, "description": VariantEntryParams.model_fields[ALGORITHM_KEY].description},
    }
    for key in params["properties"]:
        if key != "name":
            properties[key] = {"$ref": f"#/$defs/{def_name}/properties/{key}"}
    variant = {
        "title": f"{def_name} variant",
        "description": f"{label} (`{name}`) under a label of its own: `{{name: LABEL, algorithm: {name}, ...}}` "
        f"with {name}'s parameters.",
        "type": "object",
        "properties": properties,
        "required": ["name", ALGORITHM_KEY, *(k for k in params.get("required", []) if k != "name")],
        "additionalProperties": False,
    }
    if "not" in params:
        variant["not"] = params["not"]
    return variant


def _class_entry(params_defs: dict[str, str]) -> dict[str, Any]:
    """The schema of an entry naming the user's class: its parameters are the class's own."""
    base = next(iter(params_defs.values()))
    return {
        "title": "Your own algorithm class",
        "description": 'An algorithm class of your own, `{name: NAME, class: "module:Class", ...}`; the '
        "entry's other keys are its Params model's parameters (python -m harness validate checks them).",
        "type": "object",
        "properties": {
            "name": _label(
                list(params_defs),
                "The entry's name (letters, digits and '_', starting with a "
                "letter), which results, figures and faults name it by; not a built-in algorithm's.",
            ),
            CLASS_KEY: {
                "type": "string",
                "pattern": _REFERENCE_PATTERN,
                "description": ClassEntryParams.model_fields["class_reference"].description,
            },
            "optimizer": {"$ref": f"#/$defs/{base}/properties/optimizer"},
        },
        "required": ["name", CLASS_KEY],
        "not": {"required": [ALGORITHM_KEY]},
        "additionalProperties": True,
    }


# ---------------------------------------------------------------------------------------------
# docstrings -> Markdown

_ROLE = re.compile(r":(?:class|func|meth|data|attr|mod|obj|exc):`(~?)([^`]+)`")
# Keys whose values are schemas, or maps or lists of schemas (not data such as default or enum).
_SCHEMA = ("items", "not", "additionalProperties", "if", "then", "else", "contains", "propertyNames")
_SCHEMA_MAPS = ("properties", "$defs", "patternProperties", "dependentSchemas")
_SCHEMA_LISTS = ("oneOf", "anyOf", "allOf", "prefixItems")


def prose(text: str) -> str:
    """A docstring's text as Markdown: ``code`` as `code`, Sphinx roles as code (``~`` keeping
    the last name), paragraphs and list items kept, the lines within each joined."""
    text = _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)
    text = text.replace("``", "`")
    blocks = []
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        items: list[str] = []
        for line in paragraph.splitlines():
            line = line.strip()
            if not items or line.startswith("- "):
                items.append(line)
            else:
                items[-1] += " " + line
        blocks.append("\n".join(items))
    return "\n\n".join(blocks)


def _markdown_descriptions(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the ``description`` of it and of every schema in it run through
    :func:`prose` (in place)."""
    if isinstance(schema.get("description"), str):
        schema["description"] = prose(schema["description"])
    for key, value in schema.items():
        if key in _SCHEMA and isinstance(value, dict):
            _markdown_descriptions(value)
        elif key in _SCHEMA_MAPS:
            for child in value.values():
                _markdown_descriptions(child)
        elif key in _SCHEMA_LISTS:
            for child in value:
                _markdown_descriptions(child)
    return schema
