"""The user's errors: what a command reports in one message, without a traceback.

:class:`HarnessError` is the base of every error that is the user's to fix: a file, an option
or a machine that cannot do what was asked. ``python -m harness`` prints its message and exits
with status 2, without a traceback (``harness.cli``). :class:`ParamError` is the one a
configuration value raises: it carries the field's path, so the scenario loader can say where.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import PydanticCustomError


class HarnessError(Exception):
    """An error the user can fix; its message says what is wrong and where, in one line or block."""


class ParamError(HarnessError, ValueError):
    """A value is impossible: carries the field path (relative), a reason and the bad value.

    A ValueError too: pydantic turns a ValueError raised in a validator into a validation
    error, and ``resolve_algorithm_params`` promises one.
    """

    def __init__(self, path: str | tuple[str | int, ...], reason: str, value: Any, note: str = "") -> None:
        self.path = (path,) if isinstance(path, str) else tuple(path)
        self.reason = reason
        self.value = value
        self.note = note  # said after the value, e.g. "the default"
        where = ".".join(str(p) for p in self.path)
        super().__init__(f"{where}: {reason} (got {value!r}{', ' + note if note else ''})")

    def within(self, *prefix: str | int) -> ParamError:
        """The same error seen from a containing object: its path gets ``prefix`` in front."""
        return ParamError((*prefix, *self.path), self.reason, self.value, self.note)

    def to_pydantic(self) -> PydanticCustomError:
        """The same error raised inside a validator: the scenario loader reads path, value and note back."""
        ctx = {"reason": self.reason, "path": self.path, "value": self.value, "note": self.note}
        return PydanticCustomError("field", "{reason}", ctx)
