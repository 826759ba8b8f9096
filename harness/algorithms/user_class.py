"""An algorithm class of the user's own, named in a scenario entry by ``class: "module:Class"``.

A scenario entry such as::

    algorithms:
      - {name: post_local, class: "post_local_sgd:PostLocalSGD", period: 4}

names a subclass of :class:`harness.algorithms.Algorithm` in the user's module (looked up in the
scenario's ``python_path`` first, ``harness.user_code``). The class declares its parameters as a
class attribute ``Params``, a subclass of :class:`harness.algorithms.AlgorithmParams` without a
``name`` field of its own (``class Params(AlgorithmParams): pass`` when there are none). It may
set ``label`` (figures; default: the entry's name) and ``colour`` (default: a spare one).

:func:`entry_model` checks the class and registers it under the entry's name
(``harness.algorithms.registry``), so everything that reads the registry (runner, simulator,
figures) knows it. The parameter model registered is derived from ``Params``: its ``name`` is
the entry's name, and a ``class`` field carries the reference, so one class may be listed under
two names with different parameters, and a resolved scenario (``scenario.resolved.yaml``) names
the class again: every process that loads it (each rank, ``compare``, ``figures``) registers
the same class. Registering a name again with the same class is a no-op; with another class it
is an error, as is a built-in algorithm's name.

Every failure is a :class:`~harness.errors.ParamError` at ``name`` or ``class`` (the scenario
loader puts ``algorithms[i].`` in front).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal

from pydantic import ConfigDict, Field, create_model

from harness.algorithms import registry
from harness.algorithms.base import Algorithm
from harness.algorithms.params import AlgorithmParams
from harness.errors import ParamError
from harness.user_code import UserCodeError, load_reference

CLASS_KEY: Final = "class"  # the scenario key naming the class


class ClassEntryParams(AlgorithmParams):
    """What an entry naming a class has besides the class's own parameters: the reference it was
    given as, validated and dumped as ``class`` (``serialize_by_alias``: also where the caller
    dumps without aliases, e.g. ``validate``'s summary)."""

    model_config = ConfigDict(serialize_by_alias=True)

    class_reference: str = Field(alias=CLASS_KEY)
    """Your algorithm class as ``"module:Class"`` (a subclass of ``harness.algorithms.Algorithm``
    with a ``Params`` model), looked up in the scenario's ``python_path`` first; the entry's other
    keys are its parameters."""


def names_class(entry: Any) -> bool:
    """Whether a raw ``algorithms`` entry names a class of the user's (a mapping with ``class``)."""
    return isinstance(entry, dict) and CLASS_KEY in entry


def entry_model(name: str, reference: Any, search_path: Sequence[str]) -> type[AlgorithmParams]:
    """The parameter model of entry ``{name: NAME, class: REFERENCE, ...}``, the class registered
    under ``name`` (see the module docstring); ParamError at ``name`` or ``class`` otherwise."""
    if not registry.valid_name(name):
        raise ParamError("name", "must be a letter, then letters, digits and '_'", name)
    if name in {entry.name for entry in registry.BUILT_IN}:
        raise ParamError("name", "is a built-in algorithm's name; give your class a name of its own", name)
    if name in registry.variants():  # harness.algorithms.variant
        raise ParamError(
            "name",
            f"already names a variant of {registry.algorithm_of(name)} (by an earlier entry, or a "
            "scenario loaded earlier in this process); give your class a name of its own",
            name,
        )
    cls = load_class(reference, search_path)
    if name in registry.names():
        existing = registry.registration(name)
        if existing.cls is not cls:
            raise ParamError(
                "name",
                f"already names another algorithm class ({_describe(existing.cls)}); give this one a name of its own",
                name,
            )
        if not issubclass(existing.params, ClassEntryParams):  # registered by code, with its own model
            raise ParamError(
                "name", "is registered by code already (harness.algorithms.register); list it without `class`", name
            )
        return existing.params
    model = _derived_model(name, reference, cls)
    registry.register(name, model, cls, label=_label(cls, name), colour=cls.colour)
    return model


def load_class(reference: Any, search_path: Sequence[str]) -> type[Algorithm]:
    """The Algorithm subclass ``reference`` names, with a ``Params`` model; ParamError at ``class``."""
    if not isinstance(reference, str):
        raise ParamError(CLASS_KEY, "must be a string 'module:Class'", reference)
    try:
        cls = load_reference(reference, search_path)
    except UserCodeError as exc:
        raise ParamError(CLASS_KEY, str(exc), reference) from None
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        kind = f"class {cls.__name__}" if isinstance(cls, type) else f"a {type(cls).__name__}"
        raise ParamError(CLASS_KEY, f"is {kind}, not a subclass of harness.algorithms.Algorithm", reference)
    params = getattr(cls, "Params", None)
    if params is None:
        raise ParamError(
            CLASS_KEY,
            f"{cls.__name__} has no parameter model: give it a class attribute Params, "
            "a subclass of harness.algorithms.AlgorithmParams",
            reference,
        )
    if not (isinstance(params, type) and issubclass(params, AlgorithmParams)):
        raise ParamError(
            CLASS_KEY,
            f"{cls.__name__}.Params is {params!r}, not a subclass of harness.algorithms.AlgorithmParams",
            reference,
        )
    for attribute in ("label", "colour"):
        value = getattr(cls, attribute)
        if value is not None and not (isinstance(value, str) and value):
            raise ParamError(
                CLASS_KEY, f"{cls.__name__}.{attribute} must be a non-empty string or None, not {value!r}", reference
            )
    if any((f.alias or key) == CLASS_KEY for key, f in params.model_fields.items()):
        raise ParamError(
            CLASS_KEY,
            f"{cls.__name__}.Params declares a parameter {CLASS_KEY!r}, which names "
            "the class in a scenario entry; rename it",
            reference,
        )
    return cls


def _derived_model(name: str, reference: str, cls: type[Algorithm]) -> type[AlgorithmParams]:
    """``cls.Params`` with ``name: Literal[name]`` and the ``class`` field (defaulting to ``reference``)."""
    params: type[AlgorithmParams] = cls.Params  # type: ignore[attr-defined]  # a user class's own (checked)
    # Literal of a runtime string: a type pydantic takes, not one a static checker can know
    return create_model(
        f"{params.__name__}[{name}]",
        __base__=(params, ClassEntryParams),
        __module__=params.__module__,
        __doc__=params.__doc__,
        name=(Literal[name], name),  # type: ignore[arg-type]  # (see above)
        class_reference=(str, Field(reference, alias=CLASS_KEY)),
    )


def _label(cls: type[Algorithm], name: str) -> str:
    """The class's ``label``, else ``name``; a label another algorithm already shows gets the name
    added (one class listed under two names draws as two series)."""
    label = cls.label
    if label is None:
        return name
    taken = {registry.registration(other).label for other in registry.names()}
    return f"{label} ({name})" if label in taken else label


def _describe(cls: Any) -> str:
    return cls if isinstance(cls, str) else f"{cls.__module__}:{cls.__qualname__}"
