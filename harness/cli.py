"""Command line: ``python -m harness <command> ...``.

Each command lives in its own module under ``harness/commands/`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable taking the
parsed arguments and returning an exit status. Commands import their heavy dependencies
(torch, mpi4py, matplotlib) lazily, so ``validate`` and ``--help`` stay fast.

Commands from outside the library are found through the ``harness.commands`` entry point group
(:data:`PLUGIN_GROUP`): each entry names a module of the same shape (``figures`` is
``paper_figs.command``, declared in ``pyproject.toml``), so a package adds a command without
the library importing it. ``KEY=VALUE`` overrides may come anywhere on a command's line
(``harness.commands.overrides``).

A command reports bad input by raising a :class:`~harness.errors.HarnessError` (a scenario
file that does not load, a calibration file that lacks what is needed, a launcher that cannot
start the ranks): ``main`` prints it as ``error:`` lines and exits 2, for every command alike.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from importlib.metadata import entry_points
from types import ModuleType

from harness.commands.overrides import parse_command_line
from harness.errors import HarnessError
from harness.sweep.store import PARSER_KEY

COMMANDS = (
    "run",
    "launch",
    "validate",
    "sbatch",
    "bench",
    "calibrate",
    "simulate",
    "compare",
    "report",
    "schema",
    "chakra",
)
"""The library's own commands, modules of ``harness.commands``, in the order ``--help`` lists them."""

PLUGIN_GROUP = "harness.commands"
"""The entry point group of commands from other packages: ``NAME = "package.module"``, the
module with ``register(subparsers)`` adding the command ``NAME`` (listed after the library's)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness",
        description="Decentralized and wait-avoiding distributed SGD under stragglers and slow links.",
        epilog="examples:\n  python -m harness run scenarios/straggler.yaml\n"
        "  python -m harness simulate scenarios/straggler.yaml --ranks 1024\n"
        "each command's --help has its own",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in command_modules():
        module.register(sub)
        if name not in sub.choices:
            raise HarnessError(f"command {name}: {module.__name__}.register added no command named {name}")
        add_examples(sub.choices[name], f"python -m harness {name}", docstring_examples(module.__doc__ or ""))
    return parser


def command_modules() -> list[tuple[str, ModuleType]]:
    """(name, module) of every command: the library's (:data:`COMMANDS`), then those other
    installed packages declare in the :data:`PLUGIN_GROUP` entry point group, by name."""
    modules = [(name, importlib.import_module(f"harness.commands.{name}")) for name in COMMANDS]
    for entry in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        if entry.name not in COMMANDS:  # a plugin does not replace a command of the library
            modules.append((entry.name, entry.load()))
    return modules


def docstring_examples(doc: str) -> list[str]:
    """The command lines of a module docstring's ``Example::`` block (a line ending in a
    backslash continues on the next), the one place a command's examples are written."""
    lines = doc.split("Example::", 1)[1].splitlines()[1:] if "Example::" in doc else []
    examples: list[str] = []
    for line in lines:
        if line.strip() and not line[:1].isspace():
            break  # the block ends at the next unindented text
        text = line.strip()
        if not text:
            continue
        if examples and examples[-1].endswith("\\"):
            examples[-1] += "\n      " + text
        else:
            examples.append(text)
    return examples


def add_examples(parser: argparse.ArgumentParser, prog: str, examples: list[str]) -> None:
    """End ``parser``'s ``--help`` (and its subcommands') with the examples that run it."""
    own = [e for e in examples if e == prog or e.startswith(prog + " ")]
    if own:
        examples_text = "examples:\n" + "\n".join(f"  {e}" for e in own)
        parser.epilog = f"{parser.epilog}\n\n{examples_text}" if parser.epilog else examples_text
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                add_examples(child, f"{prog} {name}", examples)


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names; its exit status. A user error (:class:`HarnessError`)
    from any command is printed without a traceback and exits 2."""
    parser = build_parser()
    args = parse_command_line(parser, argv)
    # A sweep's point re-reads its command's arguments with the parser that read them
    # (harness.sweep.execute.run_point); handed down, so that the sweep never imports the CLI.
    setattr(args, PARSER_KEY, parser)
    try:
        return int(args.func(args) or 0)
    except HarnessError as exc:  # a bad file or option, a machine that cannot do what was asked
        print(error_text(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl+C or SIGINT in a command that has no cleanup of its own
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def error_text(exc: HarnessError) -> str:
    """``exc``'s message as ``error:`` lines: one per problem (an unindented line of the message,
    e.g. each field of a scenario file that is wrong); indented lines, such as a command to
    run, continue the problem above them as they are."""
    lines = str(exc).splitlines() or [type(exc).__name__]
    return "\n".join(line if line[:1].isspace() else f"error: {line}" for line in lines)


if __name__ == "__main__":
    sys.exit(main())
