"""The arguments several commands share, declared once so that they read and behave alike.

- a scenario file with its overrides, the results root and the older override options
  (``run``, ``simulate``, ``sbatch``; ``validate`` and ``launch`` take the options without the
  rest): :func:`add_scenario_arguments`, :func:`add_scenario_options`, and
  :func:`scenario_overrides`, which turns the options into the loader's ``overrides``;
- a sweep (``run``, ``simulate``, ``launch``): :func:`add_sweep_arguments`;
- where the ranks run (``run``, ``calibrate``; ``sbatch`` writes them into its script):
  :func:`add_launch_arguments`.

The argument types (lists, bounded numbers) are :mod:`harness.arguments`; the ``KEY=VALUE``
overrides, taken from anywhere on the line, :mod:`harness.commands.overrides`.
"""

from __future__ import annotations

import argparse
from typing import Any

from harness.arguments import algorithm_list, int_at_least
from harness.commands.overrides import add_overrides_argument
from harness.launch import LAUNCHERS


def add_scenario_arguments(p: argparse.ArgumentParser, scenario_optional: bool = False) -> None:
    """The scenario file, its KEY=VALUE overrides, the results root and the older overrides
    (``run``, ``simulate``, ``sbatch``)."""
    p.add_argument("scenario", nargs="?" if scenario_optional else None, help="scenario YAML file")
    add_overrides_argument(p)
    p.add_argument("--out", default="results", help="results root (default: results/)")
    add_scenario_options(p)


def add_scenario_options(
    p: argparse.ArgumentParser,
    ranks_flags: tuple[str, ...] = ("--ranks",),
    ranks_help: str = "override the scenario's rank count",
) -> None:
    """``--only``, ``--ranks`` and ``--iterations``: the scenario's algorithms, rank count and
    iterations, given as options (``launch`` spells ``--ranks`` ``-n`` too, and says more of it)."""
    p.add_argument(
        "--only", type=algorithm_list, metavar="A[,B...]", help="comma-separated subset of the scenario's algorithms"
    )
    p.add_argument(*ranks_flags, dest="ranks", type=int_at_least(1), metavar="N", help=ranks_help)
    p.add_argument("--iterations", type=int_at_least(1), metavar="N", help="override iterations per algorithm")


def scenario_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The options of :func:`add_scenario_options` that were given, as the scenario loader's
    ``overrides``."""
    given = {"ranks": args.ranks, "iterations": args.iterations, "only": args.only}
    return {key: value for key, value in given.items() if value is not None}


def add_sweep_arguments(p: argparse.ArgumentParser, parallel: bool) -> None:
    """``--sweep`` and ``--point`` (``run``, ``simulate``, ``launch``); ``--jobs`` where points run
    in parallel (``harness.commands.sweeping`` says what they do)."""
    p.add_argument(
        "--sweep",
        action="append",
        metavar="KEY=V1,V2,...",
        help="run every value (KEY=range(0,641,160) too); repeated: every combination. One directory "
        "OUT/<scenario>/sweep-<time> with a run per point, sweep.csv, sweep.png and report.html",
    )
    p.add_argument(
        "--point",
        type=int_at_least(0),
        metavar="I",
        help="with --resume SWEEP_DIR: run only point I (what each task of a SLURM job array runs)",
    )
    if parallel:
        p.add_argument(
            "--jobs",
            type=int_at_least(1),
            metavar="N",
            help="points simulated at a time (default: the number of cores)",
        )


def add_launch_arguments(p: argparse.ArgumentParser) -> None:
    """Where the ranks run (``run``, ``calibrate``; ``sbatch`` writes them into its script)."""
    p.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="auto",
        help="mpiexec (this host, or --hosts), slurm (inside an allocation: Hydra's SLURM bootstrap); "
        "auto: slurm inside an allocation, else mpiexec",
    )
    p.add_argument("--hosts", metavar="HOSTFILE", help="Hydra host file for --launcher mpiexec: 'host[:slots]' lines")
