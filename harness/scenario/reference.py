"""The scenario file reference page, in Markdown, generated from the models.

:func:`scenario_reference_markdown` reads everything from the scenario file's JSON Schema
(``harness.scenario.json_schema``), which pydantic makes from the models: a section per model in
the order a scenario file has them, each with the model's docstring and a table of its fields
(key, type, default, constraints, the field's docstring), and the algorithms' parameters per
algorithm, grouped by family (``registry.FAMILIES``). So a field's documentation is written once,
beside the field, and the page, the JSON Schema and editors' hovers all show it. The docs site
renders the page (``docs/gen_pages.py``, mkdocs-gen-files; headings carry ``{ #id }`` anchors,
which need the ``attr_list`` extension).

Example::

    >>> page = scenario_reference_markdown()
    >>> page.splitlines()[0]
    '# Scenario file reference'
"""

from __future__ import annotations

import json
import re
from typing import Any

from harness.algorithms import registry
from harness.scenario.json_schema import CLASS_ENTRY_DEF, OPTIMIZER_DEF, REGENERATE, scenario_json_schema

# Where each model's section is, in the order of a scenario file: definition -> (heading, anchor).
# A definition missing here still gets a section, under "Other definitions".
MODEL_SECTIONS: dict[str, tuple[str, str]] = {
    "Workload": ("`workload`", "workload"),
    "EmulatedCompute": ("`workload.compute`: emulated compute", "emulated-compute"),
    "NodeAgent": ("`workload.node`", "node"),
    "HostStaging": ("`workload.staging`", "staging"),
    OPTIMIZER_DEF: ("`optimizer`", "optimizer"),
    "SGDOptimizer": ("`sgd`", "optimizer-sgd"),
    "AdamOptimizer": ("`adam`", "optimizer-adam"),
    "AdamWOptimizer": ("`adamw`", "optimizer-adamw"),
    "ReferenceOptimizer": ("Your own optimizer", "optimizer-reference"),
    "RandomRanksSpec": ("`random_ranks`", "imbalance-random_ranks"),
    "FixedSpec": ("`fixed`", "imbalance-fixed"),
    "LinearSpec": ("`linear`", "imbalance-linear"),
    "JitterSpec": ("`jitter`", "imbalance-jitter"),
    "SlowdownSpec": ("`slowdown`", "imbalance-slowdown"),
    "Network": ("`network`", "network"),
    "LinkSettings": ("Link settings", "link"),
    "PairLink": ("`between: [a, b]`", "links-between"),
    "DirectedLink": ("`from: a, to: b`", "links-from-to"),
    "RankLinks": ("`rank: r`", "links-rank"),
    "Topology": ("`network.topology`", "topology"),
    "KillFault": ("`kill`", "faults-kill"),
    "HangFault": ("`hang`", "faults-hang"),
    "SlowStartFault": ("`slow_start`", "faults-slow_start"),
    "WatchdogSettings": ("`watchdog`", "watchdog"),
    "ResultsSettings": ("`results`", "results"),
    "SimulationSettings": ("`simulation`", "simulation"),
}

_ALGORITHM_FORMS = (
    ("a built-in algorithm's name, with its default parameters", "- sgp"),
    (
        "a mapping: `name` picks the algorithm, the other keys are its parameters (below)",
        "- {name: wagma, group_size: 4}",
    ),
    (
        (
            "a variant: a built-in algorithm (`algorithm`) under a label of its own (`name`), with that "
            "algorithm's parameters; list one algorithm several times this way"
        ),
        "- {name: wagma_g2, algorithm: wagma, group_size: 2}",
    ),
    (
        "your own algorithm class (`class`); the other keys are its `Params`' parameters",
        '- {name: post_local, class: "post_local_sgd:PostLocalSGD", period: 4}',
    ),
)


def scenario_reference_markdown() -> str:
    """The scenario file reference page (Markdown for MkDocs Material), from the models."""
    return _Page(scenario_json_schema()).render()


class _Page:
    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self.defs: dict[str, Any] = schema["$defs"]
        self.params = {entry.name: self._def_of(entry.params.__name__) for entry in registry.BUILT_IN}
        self.anchors = {name: anchor for name, (_, anchor) in MODEL_SECTIONS.items()}
        self.headings = {name: heading for name, (heading, _) in MODEL_SECTIONS.items()}
        for name, def_name in self.params.items():
            self.anchors[def_name] = f"algorithm-{name}"
            self.headings[def_name] = f"`{name}`"
            self.anchors[f"{def_name}Variant"] = "algorithm-forms"
            self.headings[f"{def_name}Variant"] = f"variant of `{name}`"
        self.anchors[CLASS_ENTRY_DEF] = "algorithm-forms"
        self.headings[CLASS_ENTRY_DEF] = "your own class"
        self.lines: list[str] = []
        self.done: set[str] = set()

    def _def_of(self, name: str) -> str:
        if name not in self.defs:
            raise KeyError(f"{name} is not a definition of the scenario file's JSON Schema")
        return name

    # -- the page ------------------------------------------------------------------------------

    def render(self) -> str:
        props = self.schema["properties"]
        self.add(
            "# Scenario file reference",
            "A scenario file is YAML: what to run, on how many ranks, under which injected imbalance, "
            "network and faults. This page lists every key a scenario file may have, in the order a "
            "file has them; it is generated from the models that validate scenario files, as is the "
            "file's JSON Schema, [`docs/scenario.schema.json`](../scenario.schema.json) "
            f"(`{REGENERATE}` rewrites it).",
            "Start a scenario file with the line below (the path relative to the file) and editors with the "
            "YAML language server complete its keys, show these descriptions and flag mistakes; "
            "`python -m harness validate FILE` checks the rest (ranks named against `ranks`, parameters "
            "against the rank count, your own code).",
            "```yaml\n# yaml-language-server: $schema=../docs/scenario.schema.json\n```",
        )
        self.section(2, "Top level", "top-level", {**self.schema, "description": self.schema["description"]})
        self.model_section(2, "Workload")
        for name in ("EmulatedCompute", "NodeAgent", "HostStaging"):
            self.model_section(3, name)
        self.optimizers(props["optimizer"])
        self.algorithms(props["algorithms"])
        self.kinds("imbalance", props["imbalance"])
        self.model_section(2, "Network")
        self.model_section(
            3,
            "LinkSettings",
            "The fields of `network.default`, `network.topology.intra` and `.nic`, and `workload.node.link`.",
        )
        self.add("### `network.links` { #links }", self.text(props["network"]["$ref"], "links"))
        for name in ("PairLink", "DirectedLink", "RankLinks"):
            self.model_section(4, name)
        self.model_section(3, "Topology")
        self.kinds("faults", props["faults"])
        self.model_section(2, "WatchdogSettings")
        self.model_section(2, "ResultsSettings")
        self.model_section(2, "SimulationSettings")
        others = [name for name in self.defs if name not in self.done]
        if others:
            self.add("## Other definitions { #other }")
            for name in others:
                self.model_section(3, name, heading=f"`{name}`", anchor=name.lower())
        return "\n\n".join(self.lines) + "\n"

    def text(self, ref: str, key: str) -> str:
        """The description of field ``key`` of the definition ``ref`` points to."""
        return self.defs[ref.rsplit("/", 1)[-1]]["properties"][key]["description"]

    def optimizers(self, field: dict[str, Any]) -> None:
        self.add(
            "## `optimizer` { #optimizer }",
            field["description"],
            self.defs[OPTIMIZER_DEF]["description"],
            "An `algorithms` entry may give its own `optimizer`, in the same forms.",
        )
        self.done.add(OPTIMIZER_DEF)
        for name in ("SGDOptimizer", "AdamOptimizer", "AdamWOptimizer", "ReferenceOptimizer"):
            self.model_section(3, name)

    def algorithms(self, field: dict[str, Any]) -> None:
        self.add("## `algorithms` { #algorithms }", field["description"])
        rows = [f"| {_cell(what)} | `{_cell(example)}` |" for what, example in _ALGORITHM_FORMS]
        self.add(
            "### Entry forms { #algorithm-forms }",
            "Each entry of `algorithms` is one of:",
            "| form | example |\n|---|---|\n" + "\n".join(rows),
            "The keys a variant and a class entry have besides the parameters:",
        )
        variant = self.defs[f"{next(iter(self.params.values()))}Variant"]["properties"]
        own = self.defs[CLASS_ENTRY_DEF]["properties"]
        self.table(
            {
                "name": own["name"]
                | {"description": variant["name"]["description"] + " A class entry's name is the same kind of label."},
                "algorithm": variant["algorithm"] | {"const": "BUILT_IN"},
                "class": own["class"],
            },
            required=("name", "algorithm", "class"),
        )
        self.done.update(name for name in self.defs if name.endswith("Variant") or name == CLASS_ENTRY_DEF)
        by_family: dict[str | None, list[str]] = {}
        for name in self.params:
            by_family.setdefault(registry.registration(name).family, []).append(name)
        for family in (*registry.FAMILIES, None):
            if family not in by_family:
                continue
            title = "Other algorithms" if family is None else f"{family.replace('_', '-').capitalize()} family"
            page = None if family is None else f"../algorithms/{family.replace('_', '-')}.md"
            intro = [] if page is None else [f"How they work: [{title}]({page})."]
            self.add(f"### {title} {{ #family-{family or 'other'} }}", *intro)
            for name in by_family[family]:
                def_name = self.params[name]
                label = registry.registration(name).label
                self.model_section(4, def_name, heading=f"{label}: `{name}`", skip=("name",))

    def kinds(self, key: str, field: dict[str, Any]) -> None:
        self.add(
            f"## `{key}` {{ #{key} }}", field["description"], "Every entry has a `kind`, which says what else it has:"
        )
        for ref in field["items"]["oneOf"]:
            self.model_section(3, ref["$ref"].rsplit("/", 1)[-1])

    # -- sections and tables -------------------------------------------------------------------

    def model_section(
        self,
        level: int,
        name: str,
        intro: str | None = None,
        heading: str | None = None,
        anchor: str | None = None,
        skip: tuple[str, ...] = (),
    ) -> None:
        self.done.add(name)
        self.section(level, heading or self.headings[name], anchor or self.anchors[name], self.defs[name], intro, skip)

    def section(
        self,
        level: int,
        heading: str,
        anchor: str,
        schema: dict[str, Any],
        intro: str | None = None,
        skip: tuple[str, ...] = (),
    ) -> None:
        parts = [f"{'#' * level} {heading} {{ #{anchor} }}"]
        if schema.get("description"):
            parts.append(schema["description"])
        if intro:
            parts.append(intro)
        self.add(*parts)
        properties = {k: v for k, v in schema.get("properties", {}).items() if k not in skip}
        if properties:
            self.table(properties, schema.get("required", ()))
        else:
            self.add("No keys of its own.")

    def table(self, properties: dict[str, Any], required: Any) -> None:
        rows = ["| key | type | default | constraints | description |", "|---|---|---|---|---|"]
        for key, field in properties.items():
            field = self.resolve(field)
            if "default" in field and field["default"] == self.defaults_of(field) is not None:
                default = "its keys' defaults"
            elif "default" in field:
                default = f"`{_cell(_flow(field['default']))}`"
            else:
                default = "required" if key in required else "optional"
            rows.append(
                f"| `{key}` | {_cell(self.type_of(field))} | {default} | "
                f"{_cell(_constraints(field))} | {_cell(field.get('description', ''))} |"
            )
        self.add("\n".join(rows))

    def defaults_of(self, field: dict[str, Any]) -> dict[str, Any] | None:
        """The defaults of the keys of the definition ``field`` refers to (None: it refers to none,
        or some key is required)."""
        ref = field.get("$ref", "")
        definition = self.defs.get(ref.rsplit("/", 1)[-1]) if ref.count("/") == 2 else None
        if definition is None or "properties" not in definition:
            return None
        properties = definition["properties"]
        if any("default" not in value for value in properties.values()):
            return None
        return {key: value["default"] for key, value in properties.items()}

    def add(self, *parts: str) -> None:
        self.lines.extend(_markdown(part) for part in parts)

    def resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        """``node`` with a ``$ref`` to a field of another definition (``#/$defs/D/properties/K``)
        replaced by that field; a ``$ref`` to a whole definition stays (it is linked)."""
        ref = node.get("$ref", "")
        parts = ref.removeprefix("#/$defs/").split("/")
        if len(parts) == 3 and parts[1] == "properties":
            return {**self.defs[parts[0]]["properties"][parts[2]], **{k: v for k, v in node.items() if k != "$ref"}}
        return node

    def type_of(self, node: dict[str, Any]) -> str:
        """What a value of ``node`` may be, in words; definitions as links to their sections."""
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            return f"[{self.headings.get(name, name)}](#{self.anchors.get(name, name.lower())})"
        if "const" in node:
            return f"`{_flow(node['const'])}`"
        if "enum" in node:
            return " | ".join(f"`{_flow(value)}`" for value in node["enum"])
        for union in ("oneOf", "anyOf"):
            if union in node:
                if {"$ref": f"#/$defs/{CLASS_ENTRY_DEF}"} in node[union]:
                    return "[algorithm entry](#algorithm-forms)"
                return " or ".join(self.type_of(option) for option in node[union])
        kind = node.get("type")
        if kind == "array":
            items = node.get("items") or {}
            return f"list of {self.type_of(items)}" if items else "list"
        if kind == "object":
            return "mapping"
        if kind == "string" and "pattern" in node:
            return '`"module:name"`' if ":" in node["pattern"] else "string"
        names: dict[Any, str] = {
            "integer": "integer",
            "number": "number",
            "boolean": "`true` | `false`",
            "string": "string",
            "null": "`null`",
        }
        return names.get(kind, "any")


_BOUNDS = (("minimum", "≥ {}"), ("exclusiveMinimum", "> {}"), ("maximum", "≤ {}"), ("exclusiveMaximum", "< {}"))


def _constraints(node: dict[str, Any]) -> str:
    """The constraints of ``node`` and of its alternatives and items, e.g. ``≥ 1``, ``2 items``."""
    found: list[str] = []

    def collect(n: dict[str, Any], prefix: str = "") -> None:
        found.extend(prefix + text.format(_number(n[key])) for key, text in _BOUNDS if key in n)
        low, high = n.get("minItems"), n.get("maxItems")
        if low is not None and low == high:
            found.append(f"{low} item{'s' * (low != 1)}")
        elif low is not None or high is not None:
            bound = f"at least {low}" if high is None else f"at most {high}" if low is None else f"{low} to {high}"
            found.append(f"{bound} item{'s' * ((high or low) != 1)}")
        if n.get("type") == "string" and "pattern" in n and ":" not in n["pattern"]:
            found.append(f"matches `{n['pattern']}`")
        if "not" in n and "enum" in n["not"]:
            found.append("not a built-in algorithm's name")
        if n.get("deprecated"):
            found.append("deprecated")
        for union in ("oneOf", "anyOf"):
            for option in n.get(union, ()):
                collect(option, prefix)
        if isinstance(n.get("items"), dict):
            collect(n["items"], "each ")

    collect(node)
    return ", ".join(found)


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _flow(value: Any) -> str:
    """``value`` as YAML flow style: ``{name: sgd, lr: 0.05}``, ``[0.9, 0.999]``, ``null``."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, str):
        return value if value and re.fullmatch(r"[A-Za-z_][\w.-]*", value) else json.dumps(value)
    return json.dumps(value)


def _cell(text: str) -> str:
    """``text`` inside a table cell: pipes escaped, paragraphs and list items as line breaks."""
    text = text.replace("|", "\\|")
    return text.replace("\n\n", "<br><br>").replace("\n", "<br>")


_CODE = re.compile(r"(```.*?```|`[^`]*`)", re.DOTALL)


def _markdown(text: str) -> str:
    """``text`` with the asterisks outside code escaped: descriptions say ``mu*m`` as arithmetic."""
    return "".join(part if part.startswith("`") else part.replace("*", "\\*") for part in _CODE.split(text))
