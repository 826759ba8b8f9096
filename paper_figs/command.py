"""``python -m harness figures``: run the experiments the papers' figures need, then draw them.

For every figure of ``paper_figs/manifest.py`` (or those named with ``--only``) the command
first makes sure its data exist, in manifest order:

- a real run of a scenario (:class:`~paper_figs.manifest.RealRun`): the newest complete run
  under ``--results`` with the scenario's rank count and iterations is reused; otherwise
  ``python -m harness run`` makes one (``--quick``: fewer iterations). Where the figure
  compares real and simulated runs, ``python -m harness compare`` is applied, after
  ``python -m harness calibrate`` when no calibration file exists;
- a simulated sweep (:class:`~paper_figs.manifest.Sweep`): ``<results>/figures/<name>.csv``
  (``<name>-quick.csv`` with ``--quick``) is reused, otherwise computed.

``--rerun`` makes everything again. Then each figure is drawn as ``<name>.png`` and
``<name>.csv`` into ``<results>/figures/`` (``<results>/figures/quick/`` with ``--quick``), which
git ignores, so a regeneration never changes the checkout; ``--gallery`` writes into
``paper_figs/out/`` instead (the committed images the README and the docs show; full runs only), ``--out DIR``
anywhere. Progress goes to stderr; a failed experiment stops the command with its error (exit
1) and leaves what was finished; a manifest scenario that does not load is bad input (exit 2).

The command is ``paper_figs``'s, not the library's: ``harness.cli`` finds it through the
``harness.commands`` entry point group (``pyproject.toml``), the plugin point any package can
use to add a command, so the library never imports the papers' figures.

Example::

    python -m harness figures --quick
    python -m harness figures --only fig5_real_vs_sim,fig6_timeline
    python -m harness figures --gallery        # refresh the README's images
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml
from tabulate import tabulate

import paper_figs  # GALLERY_DIR read when used: a test points it elsewhere
from harness.arguments import name_list
from harness.errors import HarnessError
from harness.results import atomic
from harness.scenario import load_scenario
from harness.sim.calibration import DEFAULT_PATH
from paper_figs import manifest

FIGURES_DIR = "figures"  # under the results root: sweeps' CSVs and, by default, the drawn figures
QUICK_DIR = "quick"  # under FIGURES_DIR: figures drawn with --quick, kept apart from the full ones


class FiguresError(HarnessError):
    """An experiment that could not be made, or a figure that could not be drawn. ``figures``
    exits 1 on it, as ``run`` does on a failed job: the experiment failed, not the input."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "figures", help="run the missing experiments and draw the papers' figures", description=__doc__.splitlines()[0]
    )
    p.add_argument("--quick", action="store_true", help="smaller runs and sweeps (minutes, for a first look)")
    p.add_argument(
        "--only",
        type=name_list("figure", "fig5_real_vs_sim,fig6_timeline"),
        metavar="FIG[,FIG...]",
        help="comma-separated figure names (default: all of paper_figs/manifest.py)",
    )
    p.add_argument("--results", type=Path, default=Path("results"), help="results root (default: results/)")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--out",
        type=Path,
        help=f"output directory (default: RESULTS/{FIGURES_DIR}/, RESULTS/{FIGURES_DIR}/{QUICK_DIR}/ with --quick)",
    )
    where.add_argument(
        "--gallery",
        action="store_true",
        help="write into paper_figs/out/, the committed images the README and the docs show (not with --quick)",
    )
    p.add_argument("--rerun", action="store_true", help="make every experiment again instead of reusing results")
    p.set_defaults(func=run)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _harness(*args: str) -> None:
    """Run ``python -m harness ARGS`` with its output shown; FiguresError if it fails."""
    _say(f"$ python -m harness {' '.join(args)}")
    proc = subprocess.run([sys.executable, "-m", "harness", *args])
    if proc.returncode != 0:
        raise FiguresError(f"`python -m harness {' '.join(args)}` exited with status {proc.returncode}")


def _complete_run(root: Path, name: str, ranks: int, iterations: int) -> Path | None:
    """The newest complete real run of scenario ``name`` with these ranks and iterations."""
    directory = root / name
    if not directory.is_dir():
        return None
    for run in sorted((p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("sim-")), reverse=True):
        try:
            meta = json.loads((run / "run.json").read_text())
            resolved = yaml.safe_load((run / "scenario.resolved.yaml").read_text())
        except (OSError, ValueError, yaml.YAMLError):
            continue
        if (
            meta.get("status") == "complete"
            and resolved.get("ranks") == ranks
            and resolved.get("workload", {}).get("iterations") == iterations
        ):
            return run
    return None


def real_run(experiment, args: argparse.Namespace) -> Path:
    """A complete real run for ``experiment`` (made if missing), compared if the figure needs it."""
    scenario = load_scenario(experiment.scenario)
    iterations = experiment.quick_iterations if args.quick else scenario.workload.iterations
    run = None if args.rerun else _complete_run(args.results, scenario.name, scenario.ranks, iterations)
    if run is None:
        extra = ["--iterations", str(iterations)] if args.quick else []
        _harness("run", experiment.scenario, "--out", str(args.results), *extra)
        run = _complete_run(args.results, scenario.name, scenario.ranks, iterations)
        if run is None:
            raise FiguresError(f"{experiment.scenario}: the run finished but no complete run directory was found")
    else:
        _say(f"reusing {run}")
    if experiment.compare and (args.rerun or not (run / "compare.csv").is_file()):
        if not DEFAULT_PATH.is_file():
            _harness(
                "calibrate",
                "--scenario",
                experiment.scenario,
                "--ranks",
                str(scenario.ranks),
                *(["--quick"] if args.quick else []),
            )
        _harness("compare", str(run))
    return run


def sweep(name: str, experiment, args: argparse.Namespace) -> Path:
    """The CSV of a simulated sweep (computed if missing)."""
    path = args.results / FIGURES_DIR / (f"{name}-quick.csv" if args.quick else f"{name}.csv")
    if path.is_file() and not args.rerun:
        _say(f"reusing {path}")
        return path
    experiments = importlib.import_module("paper_figs.experiments")  # the simulator: torch, only for a sweep
    _say(f"simulating sweep {name}{' (quick)' if args.quick else ''} ...")
    t0 = time.monotonic()
    table = getattr(experiments, experiment.function)(args.quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_csv(path, table)
    _say(f"  {path} ({len(table)} rows, {time.monotonic() - t0:.0f} s)")
    return path


def output_dir(args: argparse.Namespace) -> Path:
    """Where the figures go: ``--out``, the gallery with ``--gallery``, else under the results root."""
    if args.out is not None:
        return args.out
    if args.gallery:
        return paper_figs.GALLERY_DIR
    figures = args.results / FIGURES_DIR
    return figures / QUICK_DIR if args.quick else figures


def run(args: argparse.Namespace) -> int:
    from harness.report import style  # noqa: PLC0415  (matplotlib and pandas: not for --help)

    if args.gallery and args.quick:
        print(
            "error: --gallery with --quick: the gallery shows the full experiments; drop --quick, or draw the "
            "quick figures elsewhere (the default, or --out DIR)",
            file=sys.stderr,
        )
        return 2
    out = output_dir(args)
    figures = manifest.FIGURES
    if args.only:
        wanted = args.only
        known = {f.module for f in figures}
        unknown = [name for name in wanted if name not in known]
        if unknown:
            print(
                f"error: --only: unknown figures {', '.join(unknown)} (known: {', '.join(sorted(known))})",
                file=sys.stderr,
            )
            return 2
        figures = [f for f in figures if f.module in wanted]
    inputs: dict[str, Path] = {}
    rows = []
    try:
        for figure in figures:
            for key in figure.inputs:
                if key not in inputs:
                    experiment = manifest.EXPERIMENTS[key]
                    if isinstance(experiment, manifest.Sweep):
                        inputs[key] = sweep(key, experiment, args)
                    else:
                        inputs[key] = real_run(experiment, args)
            module = importlib.import_module(f"paper_figs.{figure.module}")
            fig, table = module.draw({key: inputs[key] for key in figure.inputs})
            png, csv = style.save(fig, table, out, module.NAME)
            rows.append([module.NAME, str(png), str(csv), len(table)])
            _say(f"drew {png}")
    except (FiguresError, ValueError) as exc:  # paper_figs say a figure's data are unusable with ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted: figures drawn so far are kept in {out}", file=sys.stderr)
        return 130
    print(tabulate(rows, headers=["figure", "png", "csv", "points"], tablefmt="simple", disable_numparse=True))
    print(f"figures written to {out}" + (" (the README's gallery)" if out.resolve() == paper_figs.GALLERY_DIR else ""))
    return 0
