"""``KEY=VALUE`` overrides on the command line, taken wherever they are written.

Hydra's users write overrides anywhere among the options (``run FILE --out DIR
workload.iterations=30``), so every command that takes them (``run``, ``simulate``,
``validate``, ``sbatch``; ``launch`` before its script, whose own arguments follow it) does.
argparse alone cannot: it fills positionals from the first run of words between options and
calls any later word unrecognized. So :func:`parse_command_line` parses the known arguments,
then moves every word that is an override (:func:`is_override`) into the command's
``assignments``, in the order written; whatever else is left stays an error that names it, an
unknown option included, and an override given to a command that takes none is refused as such.

What an override means is ``harness.scenario.overrides`` (Hydra's grammar); here only whether
a word is one: ``KEY=VALUE``, ``+KEY=VALUE``, ``++KEY=VALUE`` or ``~KEY[=VALUE]``, KEY a dotted
path of names and indices, and no file of that name.

Example::

    parser = build_parser()
    args = parse_command_line(parser, ["run", "s.yaml", "--out", "r", "workload.iterations=30"])
    args.scenario, args.assignments  # ('s.yaml', ['workload.iterations=30'])
"""

from __future__ import annotations

import argparse
import os
import re

OVERRIDES = "assignments"
"""The namespace attribute of a command's overrides (``args.assignments``), in the order written."""

_OVERRIDE = re.compile(r"(?:~[\w$@-]+(?:\.[\w$@-]+)*(?:=.*)?|\+{0,2}[\w$@-]+(?:\.[\w$@-]+)*=.*)", re.DOTALL)


def is_override(word: str) -> bool:
    """Whether ``word`` is a ``KEY=VALUE`` (or ``~KEY``) override rather than a file, a script or
    an option: an existing file of that name is taken for the file."""
    return not word.startswith("-") and _OVERRIDE.fullmatch(word) is not None and not os.path.exists(word)


def add_overrides_argument(parser: argparse.ArgumentParser) -> None:
    """The command's ``KEY=VALUE ...``, which :func:`parse_command_line` gathers from anywhere."""
    parser.add_argument(
        OVERRIDES,
        nargs="*",
        metavar="KEY=VALUE",
        help="override any scenario field, anywhere on the line: a dotted path with list indices and "
        "algorithm names, Hydra's syntax (workload.iterations=200 imbalance.0.delay_ms=160 "
        "algorithms.wagma.period=6 ~network.links)",
    )


def add_overrides_before_script(parser: argparse.ArgumentParser) -> None:
    """For a command whose last positionals are a script and its own arguments (``launch``): its
    ``KEY=VALUE`` overrides come anywhere before the script; every word after it is the script's."""
    parser.set_defaults(**{OVERRIDES: []})


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, with each command's overrides taken from wherever they are;
    exits with a usage error (status 2) naming what is neither a known argument nor an override
    the command takes."""
    args, extra = parser.parse_known_args(argv)
    command = _chosen(parser, args)
    if not hasattr(args, OVERRIDES):
        overrides = [word for word in extra if is_override(word)]
        if overrides:
            command.error(f"unrecognized arguments: {' '.join(extra)} (this command takes no KEY=VALUE overrides)")
    elif any(action.dest == OVERRIDES for action in _positionals(command)):
        extra = _gather_after_file(command, args, extra)
    else:
        extra = _gather_before_script(command, args, extra)
    if extra:
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions if not action.option_strings]


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command parser ``args`` ran, down to the last subcommand named."""
    while True:
        subparsers = [a for a in _positionals(parser) if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subparsers[0].dest, None) if subparsers else None
        if name is None:
            return parser
        parser = subparsers[0].choices[name]


def _gather_after_file(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> list[str]:
    """``FILE KEY=VALUE...`` in any order among the options: the first word that is not an
    override is the file (argparse may have put an override in its place), the overrides are
    ``assignments``; what is left is unrecognized."""
    (file,) = [a for a in _positionals(parser) if a.dest != OVERRIDES]
    given = getattr(args, file.dest)
    words = [*([given] if given is not None else []), *getattr(args, OVERRIDES), *extra]
    overrides = [word for word in words if is_override(word)]
    others = [word for word in words if not is_override(word)]
    if file.nargs is None and not others:
        parser.error(f"the following arguments are required: {file.metavar or file.dest}")
    setattr(args, file.dest, others[0] if others else None)
    setattr(args, OVERRIDES, overrides)
    return others[1:]


def _gather_before_script(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> list[str]:
    """Overrides before the script (a positional followed by the script's own arguments, taken
    whole): while argparse took an override for the script, keep it and parse the words after it
    again, into the same namespace, for the options and overrides still to come."""
    script, rest = _positionals(parser)
    overrides = [word for word in extra if is_override(word)]
    while getattr(args, script.dest) is not None and is_override(getattr(args, script.dest)):
        overrides.append(getattr(args, script.dest))
        words = getattr(args, rest.dest)
        setattr(args, script.dest, None)
        setattr(args, rest.dest, [])
        _, more = parser.parse_known_args(words, namespace=args)
        overrides += [word for word in more if is_override(word)]
        extra = [*extra, *more]
    setattr(args, OVERRIDES, overrides)
    return [word for word in extra if not is_override(word)]
