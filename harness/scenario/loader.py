"""Read a scenario: YAML, then overrides, then validation; every failure is a short ScenarioError.

Example::

    scenario = load_scenario("scenarios/straggler.yaml", overrides={"ranks": 4, "only": ["local_sgd"]},
                             assignments=["workload.iterations=200", "imbalance.0.delay_ms=160"])
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from harness.algorithms.params import RenamedParameterWarning
from harness.errors import HarnessError
from harness.scenario.overrides import Override, OverrideError, apply_override, parse_override
from harness.scenario.schema import Scenario

MAX_ERROR_LINES = 10
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")
OVERRIDES = ("ranks", "iterations", "only")


class ScenarioError(HarnessError):
    """A scenario cannot be used; the message names the file, the field path and the bad value."""


class _Loader(yaml.SafeLoader):
    """Safe YAML with YAML 1.2 floats (``1e-4``, ``25.6e6``) and duplicate keys refused."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # PyYAML's scalar constructors leak plain exceptions for bad values of a known tag
        # (`2020-02-30`, `!!int abc`, `!!bool x`, `!!float ''`, an int of over 4300 digits).
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            problem = f"cannot read this {node.tag.rsplit(':', 1)[-1]} ({exc})"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):  # `!!set [1]`: the base class reports it
            return super().construct_mapping(node, deep=deep)
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (list, dict)):
                continue  # unhashable: the base class reports it
            if key in seen:
                problem = f"found duplicate key {key!r}"
                context = "while constructing a mapping"
                raise yaml.constructor.ConstructorError(context, node.start_mark, problem, key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# PyYAML follows YAML 1.1, where a float needs a dot and a signed exponent, so `1e-4` would be a
# string; strict validation would then reject a perfectly good number.
_YAML12_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789."))
# The other way round, yaml.safe_dump would write the *string* "1e-4" (a scenario name, a user's
# optimizer argument) unquoted, and this loader would read it back as a float: the safe dumper
# learns the same pattern, so it quotes such strings (scenario.resolved.yaml must load back equal).
yaml.SafeDumper.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789."))


def load_scenario(
    path: str | Path, overrides: Mapping[str, Any] | None = None, assignments: Sequence[str | Override] = ()
) -> Scenario:
    """Load and validate the scenario file at ``path``, applying ``assignments`` and ``overrides`` first.

    ``assignments`` are ``KEY=VALUE`` overrides of any field (``harness.scenario.overrides``).
    ``overrides`` may set ``ranks``, ``iterations`` (of the workload) and ``only`` (a subset of the
    file's algorithm names, kept in file order); they apply before validation, so the rank checks
    see the overridden rank count. Raises ScenarioError.
    """
    return scenario_from_dict(
        read_yaml(path), source=str(path), overrides=overrides, base_dir=Path(path).parent, assignments=assignments
    )


def load_scenario_with_notes(
    path: str | Path, overrides: Mapping[str, Any] | None = None, assignments: Sequence[str | Override] = ()
) -> tuple[Scenario, list[str]]:
    """:func:`load_scenario`, plus one note per old parameter spelling the file uses.

    The notes (``FILE: wagma: sync_period: 10 is the old spelling of period: 11 ...``) are the
    RenamedParameterWarnings of the validation, taken here instead of shown; the commands print
    them as ``note:`` lines. Other warnings go on as usual.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RenamedParameterWarning)
        scenario = load_scenario(path, overrides, assignments)
    notes = []
    for warning in caught:
        if issubclass(warning.category, RenamedParameterWarning):
            notes.append(f"{path}: {warning.message}")
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return scenario, notes


def read_yaml(path: str | Path) -> Any:
    """Parse a scenario file the way the loader does (YAML 1.2 floats, no duplicate keys)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        raise ScenarioError(f"{path}: {_yaml_problem(exc)}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: invalid YAML: {exc}") from None
    except RecursionError:  # PyYAML's composer recurses once per nesting level
        raise ScenarioError(f"{path}: invalid YAML: nested too deeply") from None


def _yaml_problem(exc: yaml.MarkedYAMLError) -> str:
    """``line L, column C: invalid YAML: problem (context at line K)``."""
    mark = exc.problem_mark or exc.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    text = f"{where}invalid YAML: {exc.problem or exc.context}"
    if exc.problem and exc.context and exc.context_mark:
        text += f" ({exc.context} at line {exc.context_mark.line + 1})"
    return text


def scenario_from_dict(
    data: Any,
    source: str = "<dict>",
    overrides: Mapping[str, Any] | None = None,
    base_dir: str | Path | None = None,
    assignments: Sequence[str | Override] = (),
) -> Scenario:
    """Validate already parsed scenario data; ``source`` names it in error messages, ``base_dir``
    (default: the working directory) is what a relative ``python_path`` is relative to.
    ``assignments``: ``KEY=VALUE`` overrides (``harness.scenario.overrides``), applied first and
    recorded in the scenario's ``overrides``; then ``overrides`` (ranks, iterations, only)."""
    if data is None:
        raise ScenarioError(f"{source}: empty scenario")
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: must be a mapping of scenario fields (got {_show(data)})")
    located: list[Override] = []
    try:
        for assignment in assignments:
            override = parse_override(assignment) if isinstance(assignment, str) else assignment
            data, override = apply_override(data, override)
            located.append(override)
    except OverrideError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    if located:
        recorded = data.get("overrides") if isinstance(data.get("overrides"), list) else []
        data = {**data, "overrides": [*recorded, *(o.text for o in located)]}
    data = _apply_overrides(data, overrides or {}, source)
    huge = _unprintable_int(data, (), set())
    if huge is not None:  # pydantic-core would print "Exception ignored" tracebacks failing to repr() it
        where = _path_text(huge) or "(top level)"
        raise ScenarioError(f"{source}: {where}: integer too large (over {sys.get_int_max_str_digits()} digits)")
    try:
        return Scenario.model_validate(data, context={"base_dir": str(base_dir) if base_dir is not None else None})
    except ValidationError as exc:
        raise ScenarioError(_format(exc, data, source, located)) from None


def _apply_overrides(data: dict[str, Any], overrides: Mapping[str, Any], source: str) -> dict[str, Any]:
    unknown = sorted(set(overrides) - set(OVERRIDES))
    if unknown:
        raise ValueError(f"unknown scenario override {unknown[0]!r} (valid: {', '.join(OVERRIDES)})")
    data = dict(data)
    if overrides.get("ranks") is not None:
        data["ranks"] = overrides["ranks"]
    if overrides.get("iterations") is not None and isinstance(data.get("workload"), dict):
        data["workload"] = {**data["workload"], "iterations": overrides["iterations"]}
    if overrides.get("only") is not None and isinstance(data.get("algorithms"), list):
        entries = data["algorithms"]
        names = [_entry_name(e) for e in entries]
        missing = [n for n in overrides["only"] if n not in names]
        if missing:
            available = ", ".join(str(n) for n in names)
            absent = ", ".join(repr(n) for n in missing)
            verb = "is" if len(missing) == 1 else "are"
            reason = f"{absent} {verb} not among the scenario's algorithms (available: {available})"
            raise ScenarioError(f"{source}: --only: {reason}")
        data["algorithms"] = [e for e, n in zip(entries, names) if n in overrides["only"]]
    return data


def _unprintable_int(node: Any, path: tuple[Any, ...], seen: set[int]) -> tuple[Any, ...] | None:
    """The path of the first int (value or key) that repr() refuses: over sys.get_int_max_str_digits()."""
    if isinstance(node, int):
        try:
            repr(node)
        except ValueError:
            return path
        return None
    if not isinstance(node, (dict, list)) or id(node) in seen:  # YAML anchors can make cycles
        return None
    seen.add(id(node))
    for key, child in node.items() if isinstance(node, dict) else enumerate(node):
        if isinstance(key, int) and _unprintable_int(key, path, seen) is not None:
            return path
        found = _unprintable_int(child, (*path, key), seen)
        if found is not None:
            return found
    return None


def _entry_name(entry: Any) -> Any:
    return entry.get("name") if isinstance(entry, dict) else entry


# ---------------------------------------------------------------------------------------------
# pydantic's error list -> "file: path: reason (got value)" lines


def _format(exc: ValidationError, data: dict[str, Any], source: str, located: Sequence[Override] = ()) -> str:
    errors = exc.errors(include_url=False)
    lines = []
    for err in errors[:MAX_ERROR_LINES]:
        path, text = _describe(err, data)
        lines.append(f"{source}: {_blame(path, located)}{text}")
    if len(errors) > MAX_ERROR_LINES:
        lines.append(f"{source}: ... and {len(errors) - MAX_ERROR_LINES} more errors")
    return "\n".join(lines)


_REASONS = {
    "missing": "required field missing",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "less_than": "must be < {lt}",
    "literal_error": "must be {expected}",
    "too_short": "must have at least {min_length} item(s)",
    "too_long": "must have at most {max_length} item(s)",
    "union_tag_invalid": "unknown {discriminator} (valid: {expected_tags})",
    "union_tag_not_found": "required field missing",
}


def _blame(path: tuple[Any, ...], located: Sequence[Override]) -> str:
    """``override 'TEXT': `` for the last override that wrote ``path`` or around or inside it."""
    for override in reversed(located):
        if override.wrote(path):
            return f"override {override.text!r}: "
    return ""


def _describe(err: ErrorDetails, data: dict[str, Any]) -> tuple[tuple[Any, ...], str]:
    """One error: (its path, ``path: reason (got value)``)."""
    kind, ctx = err["type"], err.get("ctx", {})
    path = _input_path(err["loc"], data, kind == "missing")
    values: tuple[Any, ...] = (err["input"],)  # empty: say nothing about the value
    note = ""
    if kind == "field":  # a ParamError raised in a validator: it knows the rest of the path
        path += tuple(ctx["path"])
        reason, values, note = ctx["reason"], (ctx["value"],), ctx["note"]
    else:
        reason = _REASONS[kind].format(**_plain(ctx)) if kind in _REASONS else _lower_first(err["msg"])
    if kind == "missing":
        values = ()
    elif kind.startswith("union_tag_"):  # the discriminator key is not in pydantic's loc
        path += (_plain(ctx)["discriminator"],)
        values = (ctx["tag"],) if kind == "union_tag_invalid" else ()
    got = f" (got {_show(values[0])}{', ' + note if note else ''})" if values else ""
    return path, f"{_path_text(path) or '(top level)'}: {reason}{got}"


def _input_path(loc: tuple[Any, ...], data: Any, missing: bool) -> tuple[Any, ...]:
    """The part of pydantic's ``loc`` that indexes the input; union tags and validator names go.

    A missing field is not in the input, so the last element is kept for ``missing`` errors.
    """
    path: list[Any] = []
    node, tag = data, None
    for i, part in enumerate(loc):
        if part == tag:  # a list entry's discriminator value comes first, even if also a key
            tag = None
            continue
        if (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        ):
            node = node[part]
        elif not (missing and i == len(loc) - 1):
            continue
        path.append(part)
        tag = _discriminator_value(node) if isinstance(part, int) else None
    return tuple(path)


def _discriminator_value(entry: Any) -> Any:
    """What pydantic puts into ``loc`` after the index of a list entry of a union discriminated on
    ``kind`` (imbalance, faults). Algorithm entries pick their model by ``name`` in a validator of
    their own, which adds nothing to ``loc``."""
    return entry.get("kind") if isinstance(entry, dict) else None


def _plain(ctx: dict[str, Any]) -> dict[str, Any]:
    """Context values as a person writes them: ``0`` not ``0.0``, ``kind`` not ``'kind'``."""
    out = dict(ctx)
    for key, value in ctx.items():
        if type(value) is float and value.is_integer():
            out[key] = int(value)
    if "discriminator" in ctx:
        out["discriminator"] = ctx["discriminator"].strip("'")
    return out


def _path_text(path: tuple[Any, ...]) -> str:
    text = ""
    for part in path:
        if isinstance(part, str) and _PLAIN_KEY.fullmatch(part):
            text += f".{part}" if text else part
        else:  # an index, or a key that needs quoting to stay on one line and be unambiguous
            text += f"[{part!r}]"
    return text


def _show(value: Any, limit: int = 60) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int beyond sys.get_int_max_str_digits() (4300 digits)
        text = f"<{type(value).__name__} too large to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
