"""Command line: ``python -m harness <command> ...``.

Each command lives in its own module under ``harness/commands/`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable taking the
parsed arguments and returning an exit status. Commands import their heavy dependencies
(torch, mpi4py) lazily, so ``validate`` and ``--help`` stay fast.

A command reports bad input by raising a :class:`~harness.config.HarnessError` (a scenario
file that does not load, a calibration file that lacks what is needed, a launcher that cannot
start the ranks): ``main`` prints it as ``error:`` lines and exits 2, for every command alike.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from harness.config import HarnessError

COMMANDS = ("run", "launch", "validate", "sbatch", "bench", "calibrate", "simulate", "compare", "report", "figures",
            "schema", "chakra")


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
    for name in COMMANDS:
        module = importlib.import_module(f"harness.commands.{name}")
        module.register(sub)
        add_examples(sub.choices[name], f"python -m harness {name}", docstring_examples(module.__doc__ or ""))
    return parser


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
    args = build_parser().parse_args(argv)
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
