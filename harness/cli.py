"""Command line: ``python -m harness <command> ...``.

Each command lives in its own module under ``harness/commands/`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable taking the
parsed arguments and returning an exit status. Commands import their heavy dependencies
(torch, mpi4py) lazily, so ``validate`` and ``--help`` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS = ("run", "validate", "sbatch", "bench", "calibrate", "simulate", "compare", "figures")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness",
        description="Decentralized and wait-avoiding distributed SGD under stragglers and slow links.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"harness.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from harness.launch import LaunchError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LaunchError as exc:  # e.g. srun tasks MPI cannot join, found by any command that launches
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl+C or SIGINT in a command that has no cleanup of its own
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
