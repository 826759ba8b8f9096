"""Argument types every command shares: one list syntax, and messages that say what is wrong.

Every list option is written with commas, as one argument: ``--only sgp,wagma``,
``--ranks 2,8``, ``--sizes 4K,1M``; spaces around an entry are ignored (``"sgp, wagma"``).
A ``type=`` built here turns a bad value into argparse's usage error (exit 2) naming the
option and the value.

Example::

    parser.add_argument("--only", type=name_list("algorithm", "sgp,wagma"))
    parser.parse_args(["--only", "sgp,wagma"]).only  # ['sgp', 'wagma']
"""

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


def split_list(text: str, what: str, example: str) -> list[str]:
    """The entries of a comma-separated list, stripped, in order; ValueError for an empty list
    or an empty entry (``a,,b``), showing ``example`` of the ``what`` list it should be."""
    parts = [part.strip() for part in text.split(",")]
    if not text.strip():
        raise ValueError(f"bad {what} list {text!r}: it is empty (write it like {example})")
    if not all(parts):
        raise ValueError(f"bad {what} list {text!r}: empty entry (write it like {example})")
    return parts


def name_list(what: str, example: str) -> Callable[[str], list[str]]:
    """An argparse ``type=`` for a comma-separated list of names: the distinct names, in the
    order given. Whether a name exists is for the command to say, with the valid ones."""

    def names(text: str) -> list[str]:
        return list(dict.fromkeys(split_list(text, what, example)))

    return argtype(names)


#: ``--only`` of every command that takes a scenario (``sgp,wagma``); the scenario loader names
#: the algorithms a scenario has when one is not among them.
algorithm_list = name_list("algorithm", "sgp,wagma")
