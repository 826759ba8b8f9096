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
import math
from collections.abc import Callable, Sequence
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


def number_in(low: float, high: float = math.inf, *, above: bool = False) -> Callable[[str], float]:
    """A number in ``[low, high]``; with ``above``, greater than ``low`` (``(low, high]``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
        if high == math.inf:
            if not (value > low if above else value >= low):
                raise ValueError(f"must be {'>' if above else '>='} {low:g} (got {text})")
        elif not ((low < value if above else low <= value) and value <= high):
            raise ValueError(f"must be in {'(' if above else '['}{low:g}, {high:g}] (got {text})")
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


def choice_list(
    what: str, choices: Sequence[str], example: str, *, in_given_order: bool = True, ignore_case: bool = False
) -> Callable[[str], list[str]]:
    """An argparse ``type=`` for a comma-separated list of names out of ``choices``, duplicates
    dropped: in the order given, or (``in_given_order=False``) in the order of ``choices``; an
    unknown name is refused naming the valid ones."""
    canonical = {(c.lower() if ignore_case else c): c for c in choices}

    def names(text: str) -> list[str]:
        given = split_list(text, what, example)
        bad = [n for n in given if (n.lower() if ignore_case else n) not in canonical]
        if bad:
            raise ValueError(f"unknown {what} {bad[0]!r}: choose from {', '.join(choices)}")
        picked = list(dict.fromkeys(canonical[n.lower() if ignore_case else n] for n in given))
        return picked if in_given_order else [c for c in choices if c in picked]

    names.__name__ = f"{what.replace(' ', '_')}_list"
    return argtype(names)


#: ``--only`` of every command that takes a scenario (``sgp,wagma``); the scenario loader names
#: the algorithms a scenario has when one is not among them.
algorithm_list = name_list("algorithm", "sgp,wagma")
