"""A built-in algorithm under a label of its own: a scenario entry with ``algorithm:``.

A scenario lists each entry under its ``name``, which is its label everywhere the harness shows
an algorithm: summary tables and CSVs, steps, faults' ``algorithm:``, ``--only``, ``compare``,
figures. The key ``algorithm`` names the built-in algorithm the entry runs (default: the name),
so one built-in may be listed several times with different parameters::

    algorithms:
      - {name: local_sgd_p2, algorithm: local_sgd, period: 2}
      - {name: local_sgd_p8, algorithm: local_sgd, period: 8}
      - {name: wagma_g2, algorithm: wagma, group_size: 2}

Such an entry is a *variant*. :func:`entry_model` registers its label
(``harness.algorithms.registry``) with the built-in's class, family and a parameter model
derived from the built-in's: its ``name`` is the label and an ``algorithm`` field (dumped) names
the built-in, so a resolved scenario (``scenario.resolved.yaml``) lists ``algorithm:`` again and
every process that loads it (each rank, ``compare``, ``simulate``, ``figures``) registers the
same variant. Everything that reads the registry by name then knows the label: the class
(``algorithm_class``), the family (figure 3), the figure label (``"<built-in's label>
(<label>)"``, e.g. "WAGMA-SGD (wagma_g2)") and a colour of its own (:data:`COLOURS`, a palette
apart from the built-ins' and from the spare colours of algorithms registered at run time).

The registry lists a variant's registration under its label (``registry.registration``,
``registry.variants()``, ``registry.algorithm_of``) but leaves it out of
``registry.names()``: a label names an entry that says what it runs, not an algorithm that can
be listed by name alone.

Rules (each failure a :class:`~harness.errors.ParamError` at ``name`` or ``algorithm``, which
the scenario loader prefixes with ``algorithms[i].``):

- ``algorithm`` names a built-in algorithm (``registry.BUILT_IN``);
- ``{name: wagma, algorithm: wagma}`` is the plain built-in entry (the key is dropped);
- otherwise the label is a letter, then letters, digits and '_', and is not the name of a
  built-in algorithm or of another registered algorithm (a class entry's, a ``register`` call's);
- a label registered already runs the same built-in (in one process a label means one thing);
- ``algorithm`` and ``class`` together are refused (the schema checks that).

Labels are unique within a scenario like names are ("listed twice", ``Scenario``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import create_model

from harness.algorithms import registry
from harness.algorithms.params import AlgorithmParams
from harness.errors import ParamError

ALGORITHM_KEY = "algorithm"  # the scenario key naming the built-in an entry runs

# Variants' colours, taken in turn (the first no registration uses): matplotlib's tab20b, dark
# shades first. The built-ins use tab10 and tab20 shades and algorithms registered at run time
# take the rest of tab20 (``registry.SPARE_COLOURS``), so a variant looks like none of them.
COLOURS = (
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#6b6ecf",
    "#b5cf6b",
    "#e7ba52",
    "#d6616b",
    "#ce6dbd",
    "#5254a3",
    "#8ca252",
    "#bd9e39",
    "#ad494a",
    "#a55194",
    "#9c9ede",
    "#cedb9c",
    "#e7cb94",
    "#e7969c",
    "#de9ed6",
)


class VariantEntryParams(AlgorithmParams):
    """What a variant's entry has besides its built-in's parameters: the built-in it runs,
    validated and dumped as ``algorithm``."""

    algorithm: str
    """The built-in algorithm this entry runs, with the entry's parameters, under the label ``name``."""


def names_algorithm(entry: Any) -> bool:
    """Whether a raw ``algorithms`` entry says which algorithm it runs (a mapping with ``algorithm``)."""
    return isinstance(entry, dict) and ALGORITHM_KEY in entry


def built_in() -> list[str]:
    """The names an entry's ``algorithm`` may give: the built-in algorithms, in figure order."""
    return [entry.name for entry in registry.BUILT_IN]


def entry_model(name: str, algorithm: Any) -> type[AlgorithmParams]:
    """The parameter model of entry ``{name: NAME, algorithm: ALGORITHM, ...}``: the built-in's own
    when ``name == algorithm``, else the variant's, registered under ``name`` (module docstring);
    ParamError at ``algorithm`` or ``name`` otherwise."""
    valid = built_in()
    if not isinstance(algorithm, str) or algorithm not in valid:
        if isinstance(algorithm, str) and algorithm in registry.names():
            reason = f"is not built in: a variant runs a built-in algorithm (valid: {', '.join(valid)})"
        else:
            reason = f"unknown algorithm (valid: {', '.join(valid)})"
        raise ParamError(ALGORITHM_KEY, reason, algorithm)
    if name == algorithm:
        return registry.params_model(algorithm)
    if not registry.valid_name(name):
        raise ParamError("name", "must be a letter, then letters, digits and '_'", name)
    if name in valid:
        raise ParamError(
            "name",
            f"is another built-in algorithm's name; give this variant of {algorithm} a "
            f"name of its own (e.g. {algorithm}_2)",
            name,
        )
    if name in registry.names():
        raise ParamError(
            "name",
            f"names a registered algorithm (class {_describe(registry.registration(name).cls)}); "
            f"give this variant of {algorithm} a name of its own",
            name,
        )
    if name in registry.variants():
        existing = registry.registration(name)
        if existing.variant_of != algorithm:
            raise ParamError(
                "name",
                f"already names a variant of {existing.variant_of} (by an earlier entry, or a "
                "scenario loaded earlier in this process); give this one another name",
                name,
            )
        return existing.params
    base = registry.registration(algorithm)
    model = _derived_model(name, algorithm, base.params)
    registry.register(
        name,
        model,
        base.cls,
        label=f"{base.label} ({name})",
        colour=_colour(),
        family=base.family,
        variant_of=algorithm,
    )
    return model


def plain_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` without an ``algorithm`` key that only repeats its name (``{name: wagma, algorithm: wagma}``)."""
    if entry.get(ALGORITHM_KEY) == entry.get("name"):
        return {k: v for k, v in entry.items() if k != ALGORITHM_KEY}
    return entry


def _derived_model(name: str, algorithm: str, params: type[AlgorithmParams]) -> type[AlgorithmParams]:
    """``params`` with ``name: Literal[name]`` and ``algorithm: Literal[algorithm]`` (defaulting to them)."""
    # Literal of a runtime string: a type pydantic takes, not one a static checker can know
    return create_model(
        f"{params.__name__}[{name}]",
        __base__=(params, VariantEntryParams),
        __module__=params.__module__,
        __doc__=params.__doc__,
        name=(Literal[name], name),  # type: ignore[arg-type]  # (see above)
        algorithm=(Literal[algorithm], algorithm),  # type: ignore[arg-type]  # (see above)
    )


def _colour() -> str:
    """The first of :data:`COLOURS` no registration uses (they repeat past twenty variants)."""
    used = {registry.registration(label).colour for label in registry.variants()}
    free = [colour for colour in COLOURS if colour not in used]
    return free[0] if free else COLOURS[len(registry.variants()) % len(COLOURS)]


def _describe(cls: Any) -> str:
    return cls if isinstance(cls, str) else f"{cls.__module__}:{cls.__qualname__}"
