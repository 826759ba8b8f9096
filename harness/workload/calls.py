"""Calling a model or dataset callable (built-in or the user's) the one way the harness does.

:func:`call` checks the keyword arguments against the callable's signature first (so a typo in
``model_args`` is reported as such, not as whatever the callable did with it), seeds torch,
NumPy and ``random`` with the given seed around the call (so even an unseeded draw inside it is
the same on every rank) and leaves their global states as they were, and turns anything the
callable raises into a one-line :class:`~harness.workload.names.WorkloadCodeError` (a built-in's
own WorkloadCodeError passes through: it names the field to fix, e.g. ``teacher``'s
``dataset_args``). :func:`takes_keyword` says whether a callable takes an optional argument
the harness passes only to callables that ask for it (a dataset's ``ranks``).
"""

from __future__ import annotations

import contextlib
import inspect
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from harness.user_code import first_line, is_reference
from harness.workload.names import WorkloadArgumentsError, WorkloadCodeError


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch (CPU), NumPy's and Python's global generators with ``seed`` inside; restore
    their states afterwards, so the call does not perturb other seeded draws of the process."""
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            np.random.seed(int(seed) % (1 << 32))
            random.seed(int(seed))
            yield
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)


def call(
    kind: str, value: str, fn: Callable[..., Any], seed: int, given: Mapping[str, Any], args: Mapping[str, Any]
) -> Any:
    """``fn(**given, **args)`` seeded with ``seed``.

    ``kind`` is ``model`` or ``dataset`` and ``value`` what the scenario wrote; ``given`` are
    the contract's arguments (``input_shape``/``num_classes``, or ``seed``), ``args`` the
    scenario's ``<kind>_args``. Raises WorkloadArgumentsError when ``fn`` does not take them,
    WorkloadCodeError when it raises.
    """
    clash = sorted(set(given) & set(args))
    if clash:
        raise WorkloadArgumentsError(f"{kind}_args", f"{', '.join(clash)} is set by the harness, not in {kind}_args")
    _check_signature(kind, value, fn, given, args)
    try:
        with seeded(seed):
            return fn(**given, **args)
    except (Exception, SystemExit) as exc:  # the user's code may raise anything
        if isinstance(exc, WorkloadCodeError) and not is_reference(value):
            raise  # a built-in's check of its arguments, which names the field to fix
        raise WorkloadCodeError(kind, f"{value} raised {first_line(exc)}") from None


def takes_keyword(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` has a parameter ``name`` that can be passed by keyword (a ``**kwargs``
    catch-all does not count: such a callable did not ask for it). False when ``fn`` has no
    signature Python can read."""
    try:
        parameter = inspect.signature(fn).parameters.get(name)
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def _check_signature(
    kind: str, value: str, fn: Callable[..., Any], given: Mapping[str, Any], args: Mapping[str, Any]
) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C types have none: the call will tell
        return
    try:
        signature.bind_partial(**given)
    except TypeError as exc:
        wanted = ", ".join(f"{k}=..." for k in given)
        raise WorkloadArgumentsError(kind, f"{value} must take the keyword arguments {wanted} ({exc})") from None
    try:
        signature.bind(**given, **args)
    except TypeError as exc:
        raise WorkloadArgumentsError(f"{kind}_args", f"{value} cannot be called with these arguments: {exc}") from None
