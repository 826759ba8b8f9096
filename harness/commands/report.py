"""``python -m harness report DIR``: (re)write the report of a results directory.

Writes ``report.html`` (one self-contained page: the summary table, accuracy against time,
throughput split into computing, waiting and injected delay, iteration times per rank, a
timeline of the first iterations, and real against simulated where ``compare`` has run) and the
same plots as ``report_<section>.png`` beside it, then prints the page's path. ``run`` and
``simulate`` write it themselves when they finish; run this after ``compare``, or to redraw an
older directory. A directory that is not a run's is an error (exit 2); a plot that could not be
drawn is named on stderr (exit 1; the page says so in its place).

Example::

    python -m harness report results/straggler/20260101-120000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.report import write_report
from harness.sweep.store import SWEEP_FILE


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write report.html (summary, plots) into a results directory",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("run_dir", type=Path, metavar="DIR", help="a directory `python -m harness run` or `simulate` wrote")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (args.run_dir / SWEEP_FILE).is_file():  # a sweep's page: its table, plot and points
        from harness.sweep.page import write_sweep_report  # noqa: PLC0415  (matplotlib: not for --help)

        written = write_sweep_report(args.run_dir)
    else:
        written = write_report(args.run_dir)  # NotResultsError (a HarnessError): harness.cli says why, exit 2
    print(f"report: {written.html}")
    for problem in written.failed:
        print(f"error: plot {problem}", file=sys.stderr)
    return 1 if written.failed else 0
