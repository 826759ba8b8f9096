"""Argument types the benchmarks share: argparse messages that say what is wrong with a value."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def argtype(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type=`` from a parser raising ValueError: its message becomes the usage error."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def int_at_least(low: int) -> Callable[[str], int]:
    """A whole number >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise ValueError(f"must be >= {low} (got {value})")
        return value

    return argtype(parse)
