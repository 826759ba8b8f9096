"""``KEY=VALUE`` overrides of any scenario field, typed on the command line after the file.

The grammar is Hydra's override syntax (``hydra-core``'s parser, not ours): ``KEY=VALUE`` sets
a field, ``~KEY`` removes it (back to its default), values are YAML-like (``200``, ``1e-3``,
``true``, ``null``, ``'a b'``, ``[1, 2]``, ``{latency_ms: 2}``), and a sweep lists several
(``KEY=0,160,320``, ``KEY=range(0,641,160)``, ``KEY=choice(a,b)``). A KEY is a dotted path
into the scenario: mapping keys, list indices (``imbalance.0.delay_ms``), and in a list of named
entries (``algorithms``) an entry's name (``algorithms.wagma_g2.period``; an entry given as a
bare name becomes ``{name: ...}``). Missing mappings on the way are created
(``network.topology.preset=ethernet_10g`` in a file without ``network``).

Overrides apply to the parsed file before validation, so an override is checked exactly like
the file; an error names the override as it was typed (``harness.scenario.loader``). The
scenario records them in ``overrides`` (``scenario.resolved.yaml``).

Example::

    >>> from harness.scenario.overrides import parse_override, apply_override
    >>> o = parse_override("algorithms.wagma_g2.period=6")
    >>> data = {"algorithms": [{"name": "sgp"}, {"name": "wagma_g2", "algorithm": "wagma"}]}
    >>> data, o = apply_override(data, o)
    >>> data["algorithms"][1]
    {'name': 'wagma_g2', 'algorithm': 'wagma', 'period': 6}
    >>> o.location
    ('algorithms', 1, 'period')
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from typing import Any

from harness.errors import HarnessError

DELETE = object()
"""The value of a ``~KEY`` override: remove the field."""


class OverrideError(HarnessError):
    """An override that cannot be parsed or applied; the message names it as it was typed."""


@dataclass(frozen=True)
class Override:
    """One ``KEY=VALUE`` (or ``~KEY``): ``text`` as typed, ``keys`` the dotted path's parts,
    ``value`` parsed (:data:`DELETE` for ``~KEY``); ``location``, filled in by
    :func:`apply_override`: the path with list entries as indices, as validation errors give it."""

    text: str
    keys: tuple[str, ...]
    value: Any
    location: tuple[Any, ...] = ()
    scope: tuple[Any, ...] = ()  # what it wrote: its location, or the first mapping it had to create

    def wrote(self, path: tuple[Any, ...]) -> bool:
        """Whether ``path`` (a validation error's) is what this override set, inside it, or around it."""
        n = min(len(path), len(self.location))
        return (n > 0 and path[:n] == self.location[:n]) or (bool(self.scope) and path[: len(self.scope)] == self.scope)

    @property
    def key(self) -> str:
        return ".".join(self.keys)


def _parser():
    # Hydra loads in about 0.3 s: only when an override is given, not for every command's --help.
    from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: PLC0415

    return OverridesParser.create()


def _parse(text: str):
    """Hydra's parse of ``text``; OverrideError naming it otherwise."""
    from hydra.errors import HydraException  # noqa: PLC0415  (Hydra: only when an override is given)

    if not isinstance(text, str) or not text.strip():
        raise OverrideError(f"override {text!r}: empty")
    try:
        return _parser().parse_override(text)
    except HydraException as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "cannot parse"
        raise OverrideError(f"override {text!r}: {reason} (write KEY=VALUE, e.g. workload.iterations=200)") from None


def _keys(text: str, key: str) -> tuple[str, ...]:
    if "@" in key:  # Hydra's config-group package syntax: nothing a scenario has
        raise OverrideError(f"override {text!r}: {key!r} is not a scenario field path")
    keys = tuple(key.split("."))
    if any(not part for part in keys):
        raise OverrideError(f"override {text!r}: empty part in the key {key!r}")
    return keys


def _plain(value: Any) -> Any:
    """Hydra's values as plain YAML data (its lists and dicts are plain already; quoted strings
    come back as str)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def parse_override(text: str) -> Override:
    """One override as typed; a sweep (several values) is refused: that is ``--sweep``'s."""
    parsed = _parse(text)
    keys = _keys(text, parsed.key_or_group)
    if parsed.is_delete():
        return Override(text, keys, DELETE)
    if parsed.is_sweep_override():
        raise OverrideError(f"override {text!r}: several values make a sweep: give it with --sweep {text}")
    return Override(text, keys, _plain(parsed.value()))


def parse_sweep(text: str) -> tuple[str, list[Override]]:
    """``KEY=V1,V2,...`` (or ``range(...)``, ``choice(...)``, or one value): the key and one
    override per value, in order, each with the text ``KEY=VALUE`` of its value."""
    parsed = _parse(text)
    keys = _keys(text, parsed.key_or_group)
    if parsed.is_delete():
        raise OverrideError(f"--sweep {text!r}: a sweep gives values (KEY=V1,V2,...), not ~KEY")
    values = [_plain(v) for v in parsed.sweep_iterator()] if parsed.is_sweep_override() else [_plain(parsed.value())]
    if not values:
        raise OverrideError(f"--sweep {text!r}: no values")
    key = ".".join(keys)
    return key, [Override(f"{key}={format_value(v)}", keys, v) for v in values]


def format_value(value: Any) -> str:
    """A value as an override writes it, in Hydra's syntax (it parses back to the same value)."""
    if isinstance(value, str):
        return value if value and _parses_as_string(value) else json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{format_value(str(k))}: {format_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)  # numbers, true/false, null


def _parses_as_string(value: str) -> bool:
    try:
        parsed = _parser().parse_override(f"k={value}")
    except Exception:  # noqa: BLE001 - anything Hydra refuses gets quoted
        return False
    return not parsed.is_sweep_override() and parsed.value() == value


def apply_override(data: dict[str, Any], override: Override) -> tuple[dict[str, Any], Override]:
    """(a copy of the raw scenario ``data`` with ``override`` applied, the override with its
    ``location``); OverrideError when its path runs into something that is not a mapping or
    list, an index out of range, or a name no entry has."""
    out = copy.deepcopy(data)
    location, scope = _walk(out, override)
    return out, replace(override, location=location, scope=scope)


def _walk(data: dict[str, Any], override: Override) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Apply ``override`` to ``data`` in place: (its location, its scope)."""
    node: Any = data
    location: list[Any] = []
    created: tuple[Any, ...] | None = None
    keys = override.keys
    for depth, key in enumerate(keys):
        last = depth == len(keys) - 1
        where = ".".join(keys[:depth]) or "the scenario"
        if isinstance(node, dict):
            if last:
                if override.value is DELETE:
                    if key not in node:
                        raise OverrideError(f"override {override.text!r}: {where} has no {key!r} to remove")
                    del node[key]
                else:
                    node[key] = override.value
                location.append(key)
                break
            if key not in node or node[key] is None:
                node[key] = {}
                if created is None:
                    created = (*location, key)
            node = node[key]
            location.append(key)
        elif isinstance(node, list):
            index = _entry_index(node, key, override, where)
            location.append(index)
            if last:
                if override.value is DELETE:
                    del node[index]
                else:
                    node[index] = override.value
                break
            if isinstance(node[index], str):  # an algorithm given by its bare name: {name: NAME}
                node[index] = {"name": node[index]}
            node = node[index]
        else:
            raise OverrideError(
                f"override {override.text!r}: {where} is {_show(node)}, not a mapping or list: it has no {key!r}"
            )
    return tuple(location), created if created is not None else tuple(location)


def _entry_index(entries: list[Any], key: str, override: Override, where: str) -> int:
    """The index ``key`` names in a list: a number, or the ``name`` of one of its entries."""
    if key.lstrip("-").isdigit():
        index = int(key)
        if not 0 <= index < len(entries):
            raise OverrideError(
                f"override {override.text!r}: {where} has {len(entries)} entries "
                f"(indices 0 to {len(entries) - 1}), no {index}"
            )
        return index
    names = [e.get("name") if isinstance(e, dict) else e if isinstance(e, str) else None for e in entries]
    if key in names:
        return names.index(key)
    named = [str(n) for n in names if n is not None]
    hint = f"names: {', '.join(named)}" if named else "its entries have no names: use an index"
    raise OverrideError(f"override {override.text!r}: {where} has no entry named {key!r} ({hint})")


def _show(value: Any) -> str:
    return "null" if value is None else repr(value)
