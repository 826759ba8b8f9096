"""The simulator against published measurements of other people's clusters, case by case.

``python -m harness bench validation`` simulates every case of
:data:`harness.validation.cases.CASES` as its system ran (the setup and every constant, each
with its source, are in the case) and prints, per case, the published value, where it is read
from (``text``, ``table`` or ``plot``), the prediction, the error (predicted / published - 1)
and, where the source ranks methods, whether the simulated order is the source's. Then the
median |error| over the cases stated in text or tables (bar: 10%) and over those read off plots
(bar: 15%), and why each case that misses its bar misses.

``--only NAMES`` runs some cases; ``--json FILE`` writes one object per case (``case``,
``published``, ``predicted``, ``error``, ``read_from``, ``order_matches`` and the setup,
constants and sources). ``--verbose`` prints every case's setup and constants. Exit status: 0
when every case ran (a case that misses its bar is a finding, not a failure), 2 on bad
arguments.

Example::

    python -m harness bench validation
    python -m harness bench validation --only sgp_10gbe_sgp_hours,nccl_efa_tree_1gb --json validation.json
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from tabulate import tabulate

from harness.arguments import argtype, split_list
from harness.validation.model import BARS, Outcome, median_abs_error


def _case_names(text: str) -> list[str]:
    from harness.validation.cases import CASES  # noqa: PLC0415  (the simulator: loads torch)

    names = list(dict.fromkeys(split_list(text, "case", "nccl_h200_4node_ring")))
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(unknown)} (known: {', '.join(CASES)})")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--only",
        type=argtype(_case_names),
        default=None,
        metavar="NAMES",
        help="comma-separated case names (default: all)",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write one object per case here")
    parser.add_argument("--verbose", action="store_true", help="print every case's setup, constants and source")


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def print_report(outcomes: list[Outcome], verbose: bool) -> None:
    rows = []
    for o in outcomes:
        p = o.case.published
        order = "" if o.order_matches is None else ("yes" if o.order_matches else "NO")
        rows.append(
            [
                o.case.name,
                f"{_fmt(p.value)} {p.unit}" if p.value is not None else "(an order)",
                p.read_from,
                _fmt(o.prediction.value) if o.prediction.value is not None else "-",
                f"{100 * o.error:+.1f}" if o.error is not None else "-",
                order,
                "yes" if o.meets else "NO",
            ]
        )
    print(
        tabulate(
            rows,
            headers=["case", "published", "read from", "predicted", "error %", "order as source", "within bar"],
            disable_numparse=True,
        )
    )
    print()
    for label, kinds in (("text or tables", ("text", "table")), ("plots", ("plot",))):
        median = median_abs_error(outcomes, kinds)
        if median is not None:
            bar = BARS[kinds[0]]
            print(f"median |error| over the cases read from {label}: {100 * median:.1f}% (bar {100 * bar:.0f}%)")
    misses = [o for o in outcomes if not o.meets]
    for o in misses:
        how = f"{100 * o.error:+.1f}%" if o.error is not None and abs(o.error) > o.bar else "out of the source's order"
        print(
            textwrap.fill(
                f"{o.case.name} misses ({how}): {o.case.gap or 'no reason recorded'}",
                width=100,
                subsequent_indent="    ",
            )
        )
    if verbose:
        for o in outcomes:
            c = o.case
            value = "an order" if c.published.value is None else f"{_fmt(c.published.value)} {c.published.unit}"
            print(
                f"\n{c.name}: {c.claim}\n  published: {value} "
                f"({c.published.read_from}; {c.published.source})\n  quote: {c.published.quote}\n  setup: {c.setup}"
            )
            for constant in c.constants:
                print(textwrap.fill(constant, width=100, initial_indent="  - ", subsequent_indent="    "))
            if c.order:
                print(
                    f"  order, the source's: {' > '.join(c.order)}; simulated: {' > '.join(o.prediction.order or ())}"
                )
            if o.prediction.note:
                print(f"  simulated: {o.prediction.note}")


def run(args: argparse.Namespace) -> int:
    from harness.validation.cases import CASES  # noqa: PLC0415  (the simulator: loads torch)

    if args.json is not None and not args.json.absolute().parent.is_dir():
        print(f"error: --json {args.json}: directory {args.json.absolute().parent} does not exist", file=sys.stderr)
        return 2
    names = args.only or list(CASES)
    outcomes = []
    for name in names:
        case = CASES[name]
        outcomes.append(Outcome(case, case.predict()))
    print_report(outcomes, args.verbose)
    if args.json is not None:
        args.json.write_text(json.dumps([o.row() for o in outcomes], indent=1) + "\n")
    return 0
