"""The user's own code named in a scenario: import references ``"module:attribute"``.

A scenario may name a model, a dataset, an optimizer or an algorithm class by reference
(``model: "mynet:build"``, ``class: "post_local_sgd:PostLocalSGD"``). The module is looked up
first in the scenario's ``python_path`` directories (by default the scenario file's own
directory), then on ``sys.path``, as ``python -m`` would find it. The attribute may be dotted
(``"pkg.models:Zoo.resnet"``).

Every failure is a :class:`UserCodeError` with one line saying what went wrong (a module that
does not import, with the import error's first line; a missing attribute); callers put the
scenario field in front of it.

Example::

    >>> from harness.user_code import is_reference, load_reference
    >>> is_reference("resnet20"), is_reference("torch.nn:Linear")
    (False, True)
    >>> load_reference("collections:OrderedDict").__name__
    'OrderedDict'
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Sequence
from typing import Any

from harness.errors import HarnessError

REFERENCE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
REFERENCE_FORM = "'module:attribute' (e.g. 'mynet:build')"


class UserCodeError(HarnessError, ValueError):
    """A reference cannot be used: it does not parse or import, or its object is missing or
    misbehaves. The message is one line without the field; the scenario code adds it."""


def is_reference(value: Any) -> bool:
    """Whether ``value`` is written as an import reference (a string with a colon)."""
    return isinstance(value, str) and ":" in value


def check_reference(value: str) -> str:
    """``value`` if it has the form ``module:attribute``; UserCodeError saying the form otherwise."""
    if not REFERENCE.fullmatch(value):
        raise UserCodeError(f"not an import reference of the form {REFERENCE_FORM}")
    return value


def use_search_path(directories: Sequence[str]) -> None:
    """Put ``directories`` in front of ``sys.path`` (in their order), each once.

    They stay there: a user's module may import its neighbours lazily, long after it loaded.
    """
    for directory in reversed([str(d) for d in directories]):
        if directory in sys.path:
            sys.path.remove(directory)
        sys.path.insert(0, directory)


def load_reference(reference: str, search_path: Sequence[str] = ()) -> Any:
    """The object ``reference`` names, its module imported from ``search_path`` first."""
    module_name, _, attribute = check_reference(reference).partition(":")
    use_search_path(search_path)
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001  a user's module may raise anything on import
        raise UserCodeError(f"module {module_name!r} does not import: {first_line(exc)}") from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            where = getattr(module, "__file__", None) or module_name
            raise UserCodeError(f"module {module_name!r} ({where}) has no attribute {attribute!r}")
        target = getattr(target, part)
    return target


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` of an exception raised by the user's code."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
