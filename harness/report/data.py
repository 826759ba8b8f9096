"""Reading a results directory into pandas frames: what every plot and the page draw from.

:func:`load_run` reads one run directory, real (``python -m harness run``) or simulated
(``simulate``, or ``compare``'s ``sim-trace/`` and ``sim-predictive/``), into a :class:`RunData`;
a real run's ``compare`` output comes with it (``compare.csv`` and the simulated runs inside the
directory). A sweep page (one sub-run per point plus a ``sweep.csv``) would call
:func:`load_run` on each sub-run and hand their frames to the same plot functions, which take
frames, not directories.

Nothing here draws or imports matplotlib.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from harness.errors import HarnessError
from harness.results.atomic import CSV_NA_REP
from harness.results.columns import EVAL_COLUMNS, STEP_COLUMNS, SUMMARY_COLUMNS, read_frame
from harness.results.layout import EVALS_FILE, RUN_FILE, SCENARIO_FILE, STEPS_FILE, SUMMARY_FILE
from harness.scenario import load_scenario

COMPARE_FILE = "compare.csv"  # harness.sim.compare.COMPARE_FILE (not imported: it pulls in the simulator)
SIMULATION_DIRS = ("sim-trace", "sim-predictive")  # what `compare` writes into a real run's directory


class NotResultsError(HarnessError):
    """The directory is not one ``run`` or ``simulate`` wrote (harness.cli prints it, exit 2)."""


@dataclass
class RunData:
    """One run directory's files as frames (empty frames for files it does not have)."""

    path: Path
    meta: dict  # run.json
    scenario: dict  # scenario.resolved.yaml ({} when it does not read)
    summary: pd.DataFrame  # summary.csv
    steps: pd.DataFrame  # steps.csv
    evals: pd.DataFrame  # evals.csv
    compare: pd.DataFrame | None = None  # compare.csv of `python -m harness compare`, if any
    simulations: dict[str, RunData] = field(default_factory=dict)  # sim-trace/, sim-predictive/ inside it

    @property
    def simulated(self) -> bool:
        return bool(self.meta.get("simulated"))

    @property
    def name(self) -> str:
        return str(self.meta.get("scenario") or self.scenario.get("name") or self.path.parent.name)

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id") or self.path.name)

    @property
    def ranks(self) -> int | None:
        ranks = self.meta.get("ranks") or self.scenario.get("ranks")
        return int(ranks) if ranks else (int(self.steps["rank"].nunique()) if len(self.steps) else None)

    @property
    def algorithms(self) -> list[str]:
        """Algorithms with records, in run order (summary.csv's, then any only steps.csv has)."""
        return list(dict.fromkeys([*self.summary["algorithm"], *self.steps["algorithm"]]))

    @property
    def target_accuracy(self) -> float | None:
        if "target_accuracy" not in self.summary:
            return None
        targets = self.summary["target_accuracy"].dropna()
        return float(targets.iloc[0]) if len(targets) else None

    @property
    def target_loss(self) -> float | None:
        """The scenario's ``results.target_loss`` as summary.csv has it; None without one."""
        if "target_loss" not in self.summary:
            return None
        targets = self.summary["target_loss"].dropna()
        return float(targets.iloc[0]) if len(targets) else None


def is_results_dir(path: Path) -> bool:
    """Whether ``path`` looks like a run directory: it has run.json and scenario.resolved.yaml."""
    return (path / RUN_FILE).is_file() and (path / SCENARIO_FILE).is_file()


def load_run(path: str | Path, with_simulations: bool = True) -> RunData:
    """Read the run directory at ``path``; :class:`NotResultsError` when it is not one."""
    path = Path(path)
    if not path.is_dir():
        raise NotResultsError(f"{path}: no such directory")
    if not is_results_dir(path):
        raise NotResultsError(
            f"{path}: not a results directory (it has no {RUN_FILE} and {SCENARIO_FILE}): give a "
            "directory `python -m harness run` or `simulate` wrote, e.g. results/<scenario>/<run-id>"
        )
    try:
        meta = json.loads((path / RUN_FILE).read_text(encoding="utf-8"))
        steps = read_frame(path / STEPS_FILE, STEP_COLUMNS)
        evals = read_frame(path / EVALS_FILE, EVAL_COLUMNS)
        summary = _summary(path / SUMMARY_FILE)
    except (ValueError, KeyError) as exc:  # a file that is not JSON, a CSV without its columns
        raise NotResultsError(f"{path}: its files do not read as a run's: {exc}") from None
    if not isinstance(meta, dict):
        raise NotResultsError(f"{path / RUN_FILE}: not a JSON object")
    run = RunData(path, meta, _scenario(path / SCENARIO_FILE), summary, steps, evals)
    _register_entries(path / SCENARIO_FILE)
    if (path / COMPARE_FILE).is_file():
        run.compare = pd.read_csv(path / COMPARE_FILE)
    if with_simulations:
        for name in SIMULATION_DIRS:
            if is_results_dir(path / name):
                try:
                    run.simulations[name.removeprefix("sim-")] = load_run(path / name, with_simulations=False)
                except NotResultsError:
                    continue  # a broken simulation loses its part of the comparison only
    return run


def _summary(path: Path) -> pd.DataFrame:
    """summary.csv (columns absent from an older file added as NaN); empty when there is none."""
    if not path.is_file():
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    frame = pd.read_csv(path, keep_default_na=False, na_values=[CSV_NA_REP])
    if "algorithm" not in frame:
        raise ValueError(f"{path.name} has no algorithm column")
    frame["algorithm"] = frame["algorithm"].astype(str)
    return frame.reindex(columns=list(dict.fromkeys([*SUMMARY_COLUMNS, *frame.columns])))


def _register_entries(path: Path) -> None:
    """Load the resolved scenario as every command does, for what loading registers: the labels
    and colours of its entries that are not plain built-in algorithms (a class of the user's, a
    built-in under a label of its own). A scenario that no longer loads (its user code moved) only
    costs those entries their registered look."""
    with contextlib.suppress(Exception):  # the report draws from the CSV files; the look is a nicety
        load_scenario(path)


def _scenario(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}
