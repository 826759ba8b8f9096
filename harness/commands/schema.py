"""``python -m harness schema``: print the JSON Schema of a scenario file.

The schema (JSON Schema draft 2020-12) is made from the models that validate scenario files
(``harness.scenario.json_schema``): every field with its type, default, constraints and
description, the algorithms' parameters included. ``--out FILE`` writes it to FILE instead.
The repository keeps it as ``docs/scenario.schema.json``, which scenario files name on their
first line (``# yaml-language-server: $schema=...``) so that editors with the YAML language
server complete their fields and flag mistakes; rewrite it when the models change.

Example::

    python -m harness schema
    python -m harness schema --out docs/scenario.schema.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.errors import HarnessError
from harness.scenario.json_schema import scenario_json_schema_text


def register(sub: argparse._SubParsersAction) -> None:
    # harness.cli ends --help with the docstring's examples (an epilog, RawDescriptionHelpFormatter).
    p = sub.add_parser(
        "schema",
        help="print the JSON Schema of a scenario file",
        description="Print the JSON Schema (draft 2020-12) of a scenario file, made from the models "
        "that validate one. docs/scenario.schema.json is its committed copy, which scenario files "
        "name on their first line for editors with the YAML language server.",
    )
    p.add_argument(
        "--out", type=Path, metavar="FILE", help="write the schema to FILE (replacing it) instead of printing it"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    text = scenario_json_schema_text()
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        args.out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise HarnessError(f"{args.out}: cannot write: {exc.strerror or exc}") from None
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
