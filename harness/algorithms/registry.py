"""The one place an algorithm is registered: scenario name, parameter model, class and figure look.

A new algorithm is one module (its ``Algorithm`` subclass; its ``AlgorithmParams`` model in
``params.py`` or beside the class) plus one entry in :data:`BUILT_IN`, or one :func:`register`
call at run time. Everything else reads from here: scenario validation
(``harness.scenario.schema``), :func:`algorithm_class` (the runner), the figures' labels and
colours (``paper_figs.style``) and the families figure 3 draws (``family``).

Classes given as ``"module:Class"`` are imported on first use, so listing names and validating
scenarios never import torch. A registration made at run time lives in the process that made
it: ``python -m harness run`` starts its ranks as new processes, which know the built-in table
and whatever the modules they import register. A scenario entry naming the user's class
(``{name: post_local, class: "post_local_sgd:PostLocalSGD"}``,
``harness.algorithms.user_class``) registers it in every process that loads the scenario, the
ranks included. So does an entry that runs a built-in algorithm under a label of its own
(``{name: wagma_g2, algorithm: wagma, group_size: 2}``, ``harness.algorithms.variant``): a
*variant*, registered with ``variant_of`` set. A variant's registration is found by
:func:`registration` like any other, but :func:`names` leaves it out: it names an entry, not an
algorithm one may list by name alone.

Example::

    >>> from harness.algorithms.registry import names, register, unregister
    >>> names()[:3]
    ['allreduce_sgd', 'local_sgd', 'overlap_local_sgd']
    >>> from harness.algorithms.allreduce_sgd import AllreduceSGD
    >>> from harness.algorithms.params import AlgorithmParams
    >>> from typing import Literal
    >>> class MineParams(AlgorithmParams):
    ...     '''My variant of Allreduce-SGD.'''
    ...     name: Literal["mine"] = "mine"
    >>> register("mine", MineParams, AllreduceSGD).colour   # no colour given: the first spare one
    '#9467bd'
    >>> unregister("mine")
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from harness.algorithms.base import Algorithm
from harness.algorithms.params import (
    ADPSGDParams,
    AlgorithmParams,
    AllreduceSGDParams,
    BMUFParams,
    CoCoDSGDParams,
    DiLoCoParams,
    DPSGDParams,
    EagerSGDParams,
    EASGDParams,
    GossipPGAParams,
    LocalSGDParams,
    OSGPParams,
    OverlapLocalSGDParams,
    ParamError,
    QuorumDiLoCoParams,
    SGPParams,
    SlowMoParams,
    StreamingDiLoCoParams,
    WAGMAParams,
)

# The sections of docs/algorithms.md; figure 3 draws the synchronous and periodic ones.
FAMILIES = ("synchronous", "periodic", "gossip", "wait_avoiding", "low_communication")

# Colours for a registration that names none: tab20 shades no built-in uses, taken in turn.
SPARE_COLOURS = ("#9467bd", "#e377c2", "#ff9896", "#c5b0d5", "#f7b6d2", "#dbdb8d", "#c7c7c7")

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_CLASS_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


@dataclass(frozen=True)
class Registration:
    """Everything the harness knows about one algorithm.

    ``name``: how a scenario spells it (``algorithms: [{name: ...}]``) and its key in results.
    ``params``: its parameter model; the model's ``name`` field defaults to ``name``.
    ``cls``: its ``Algorithm`` subclass, or that class's ``"module:Class"`` path.
    ``label``, ``colour``: its display name and colour (any matplotlib colour) in figures.
    ``family``: its section of docs/algorithms.md (one of :data:`FAMILIES`), or None.
    ``variant_of``: for a variant (``harness.algorithms.variant``), the built-in algorithm it
    runs (its class and its parameters); None for an algorithm of its own.
    """

    name: str
    params: type[AlgorithmParams]
    cls: str | type
    label: str
    colour: str
    family: str | None = None
    variant_of: str | None = None


BUILT_IN = (
    Registration(
        "allreduce_sgd",
        AllreduceSGDParams,
        "harness.algorithms.allreduce_sgd:AllreduceSGD",
        "Allreduce-SGD",
        "#000000",
        "synchronous",
    ),
    Registration(
        "local_sgd", LocalSGDParams, "harness.algorithms.local_sgd:LocalSGD", "Local SGD", "#1f77b4", "periodic"
    ),
    Registration(
        "overlap_local_sgd",
        OverlapLocalSGDParams,
        "harness.algorithms.overlap_local_sgd:OverlapLocalSGD",
        "Overlap Local SGD",
        "#aec7e8",
        "periodic",
    ),
    Registration("easgd", EASGDParams, "harness.algorithms.easgd:EASGD", "EASGD", "#17becf", "periodic"),
    Registration(
        "cocod_sgd", CoCoDSGDParams, "harness.algorithms.cocod_sgd:CoCoDSGD", "CoCoD-SGD", "#9edae5", "periodic"
    ),
    Registration("bmuf", BMUFParams, "harness.algorithms.bmuf:BMUF", "BMUF", "#7f7f7f", "periodic"),
    Registration("sgp", SGPParams, "harness.algorithms.sgp:SGP", "SGP", "#2ca02c", "gossip"),
    Registration("osgp", OSGPParams, "harness.algorithms.osgp:OSGP", "1-OSGP", "#98df8a", "gossip"),
    Registration("dpsgd", DPSGDParams, "harness.algorithms.dpsgd:DPSGD", "D-PSGD", "#8c564b", "gossip"),
    Registration("adpsgd", ADPSGDParams, "harness.algorithms.adpsgd:ADPSGD", "AD-PSGD", "#c49c94", "gossip"),
    Registration("wagma", WAGMAParams, "harness.algorithms.wagma:WAGMA", "WAGMA-SGD", "#d62728", "wait_avoiding"),
    Registration(
        "eager_sgd", EagerSGDParams, "harness.algorithms.eager_sgd:EagerSGD", "eager-SGD", "#ff7f0e", "wait_avoiding"
    ),
    Registration("diloco", DiLoCoParams, "harness.algorithms.diloco:DiLoCo", "DiLoCo", "#6a3d9a", "low_communication"),
    Registration(
        "streaming_diloco",
        StreamingDiLoCoParams,
        "harness.algorithms.streaming_diloco:StreamingDiLoCo",
        "Streaming DiLoCo",
        "#b15928",
        "low_communication",
    ),
    Registration(
        "quorum_diloco",
        QuorumDiLoCoParams,
        "harness.algorithms.quorum_diloco:QuorumDiLoCo",
        "Quorum DiLoCo",
        "#cab2d6",
        "low_communication",
    ),
    Registration("slowmo", SlowMoParams, "harness.algorithms.slowmo:SlowMo", "SlowMo", "#bcbd22", "low_communication"),
    Registration(
        "gossip_pga",
        GossipPGAParams,
        "harness.algorithms.gossip_pga:GossipPGA",
        "Gossip-PGA",
        "#fdbf6f",
        "low_communication",
    ),
)
"""The seventeen algorithms of the harness, in the order figures list them."""

_REGISTRATIONS: dict[str, Registration] = {}


def register(
    name: str,
    params: type[AlgorithmParams],
    cls: str | type,
    label: str | None = None,
    colour: str | None = None,
    family: str | None = None,
    variant_of: str | None = None,
) -> Registration:
    """Register algorithm ``name``; return its registration.

    ``label`` defaults to ``name``; ``colour`` to the first of :data:`SPARE_COLOURS` no
    registration uses. ``variant_of``: see :class:`Registration` (``harness.algorithms.variant``
    registers variants). Raises ValueError naming the bad argument, e.g. for a name that is
    already registered.
    """
    entry = Registration(
        name,
        params,
        cls,
        label=name if label is None else label,
        colour=_spare_colour() if colour is None else colour,
        family=family,
        variant_of=variant_of,
    )
    _add(entry)
    return entry


def unregister(name: str) -> None:
    """Forget the run-time registration ``name`` (built-in ones stay: the docs and tests pin them)."""
    if name in {entry.name for entry in BUILT_IN}:
        raise ValueError(f"algorithm {name!r} is built in and cannot be unregistered")
    registration(name)  # unknown: say so
    del _REGISTRATIONS[name]


def names() -> list[str]:
    """Every registered algorithm's name: the built-in ones in :data:`BUILT_IN` order, then the others
    (variants left out: :func:`variants`)."""
    return [name for name, entry in _REGISTRATIONS.items() if entry.variant_of is None]


def variants(of: str | None = None) -> list[str]:
    """The labels of the registered variants (of algorithm ``of``; None: of any), in the order
    they were registered."""
    return [
        name
        for name, entry in _REGISTRATIONS.items()
        if entry.variant_of is not None and (of is None or entry.variant_of == of)
    ]


def algorithm_of(name: str) -> str:
    """The algorithm registration ``name`` runs: a variant's built-in algorithm, else ``name``."""
    return registration(name).variant_of or name


def valid_name(name: object) -> bool:
    """Whether ``name`` can name an algorithm: a letter, then letters, digits and '_'."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def registration(name: str) -> Registration:
    """The registration of ``name``; the error lists the registered names."""
    entry = _REGISTRATIONS.get(name)
    if entry is None:
        raise ValueError(f"unknown algorithm {name!r} (registered: {', '.join(_REGISTRATIONS)})")
    return entry


def params_model(name: str) -> type[AlgorithmParams]:
    """The parameter model of algorithm ``name``."""
    return registration(name).params


def algorithm_class(name: str) -> type[Algorithm]:
    """The class implementing algorithm ``name``, imported now if it was registered by path."""
    target = registration(name).cls
    if not isinstance(target, str):
        return target
    module, attr = target.split(":")
    cls = getattr(importlib.import_module(module), attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(f"algorithm {name!r}: {target} is not an Algorithm subclass (got {cls!r})")
    return cls


def resolve_algorithm_params(name: str, raw: dict[str, Any], ranks: int) -> dict[str, Any]:
    """Validate ``raw`` parameters of algorithm ``name`` for ``ranks`` ranks; return them with defaults.

    Raises ParamError (a ValueError) naming the parameter and its value, or listing the valid
    names for an unknown algorithm.

    >>> resolve_algorithm_params("wagma", {"group_size": 4}, ranks=8)
    {'group_size': 4, 'period': 11}
    """
    entry = _REGISTRATIONS.get(name)
    if entry is None:
        raise ParamError("name", f"unknown algorithm (valid: {', '.join(_REGISTRATIONS)})", name)
    try:
        params = entry.params.model_validate({**raw, "name": name})
    except ValidationError as exc:
        err = exc.errors()[0]
        # Union tags ("(adamw)") are pydantic's, not the user's: leave them out of the path.
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("(")))
        if err["type"] == "field":  # raised by StrictModel, already phrased
            raise ParamError((*loc, *err["ctx"]["path"]), err["ctx"]["reason"], err["ctx"]["value"]) from None
        raise ParamError(loc, err["msg"], err["input"]) from None
    params.check(ranks)
    return params.model_dump(exclude={"name"})


def _spare_colour() -> str:
    used = {entry.colour for entry in _REGISTRATIONS.values()}
    free = [colour for colour in SPARE_COLOURS if colour not in used]
    return free[0] if free else SPARE_COLOURS[len(_REGISTRATIONS) % len(SPARE_COLOURS)]


def _add(entry: Registration) -> None:
    """Check ``entry`` (a ValueError names the bad field) and store it."""
    name = entry.name
    if not valid_name(name):
        raise ValueError(f"algorithm name must be a letter, then letters, digits and '_' (got {name!r})")
    if name in _REGISTRATIONS:
        raise ValueError(
            f"algorithm {name!r} is already registered (class {_REGISTRATIONS[name].cls}); pick another name"
        )
    if not (isinstance(entry.params, type) and issubclass(entry.params, AlgorithmParams)):
        raise ValueError(f"algorithm {name!r}: params must be an AlgorithmParams subclass (got {entry.params!r})")
    declared = entry.params.model_fields["name"].default
    if declared != name:
        # A scenario entry is validated as {"name": name, ...}: the model must accept that name.
        raise ValueError(
            f"algorithm {name!r}: {entry.params.__name__} must declare "
            f"name: Literal[{name!r}] = {name!r} (its name defaults to {declared!r})"
        )
    cls = entry.cls
    if isinstance(cls, str):
        valid = _CLASS_PATH.fullmatch(cls) is not None  # whether it imports is known on first use
    else:
        valid = isinstance(cls, type) and issubclass(cls, Algorithm)
    if not valid:
        raise ValueError(
            f"algorithm {name!r}: cls must be an Algorithm subclass or a 'module:Class' path (got {cls!r})"
        )
    for field in ("label", "colour"):
        value = getattr(entry, field)
        if not isinstance(value, str) or not value:
            raise ValueError(f"algorithm {name!r}: {field} must be a non-empty string (got {value!r})")
    if entry.variant_of is not None and entry.variant_of not in names():
        raise ValueError(
            f"algorithm {name!r}: variant_of must name a registered algorithm that is not a variant "
            f"(got {entry.variant_of!r})"
        )
    if entry.family is not None and entry.family not in FAMILIES:
        raise ValueError(
            f"algorithm {name!r}: family must be one of {', '.join(FAMILIES)} or None (got {entry.family!r})"
        )
    _REGISTRATIONS[name] = entry


for _entry in BUILT_IN:
    _add(_entry)
del _entry
