"""What several figures read from a real run directory, read once here."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml


def accuracy_over_time(run: Path) -> pd.DataFrame:
    """Test accuracy of the averaged model at each evaluation of the real run at ``run``.

    Columns: ``algorithm``, ``iteration``, ``time_s`` (on the run's clock), ``elapsed_s``
    (seconds since that algorithm's first iteration began on any rank) and ``test_accuracy``;
    rows in run order of the algorithms, then by iteration and time; evaluations without an
    accuracy (emulated compute) are left out.
    """
    run = Path(run)
    evals = pd.read_csv(run / "evals.csv")
    steps = pd.read_csv(run / "steps.csv", usecols=["algorithm", "start_s"])
    first_start = steps.groupby("algorithm")["start_s"].min()
    averaged = evals[(evals["model"] == "average") & evals["algorithm"].isin(first_start.index)]
    averaged = averaged.dropna(subset=["test_accuracy"])
    order = {name: i for i, name in enumerate(dict.fromkeys(steps["algorithm"]))}
    averaged = averaged.assign(
        elapsed_s=averaged["time_s"] - averaged["algorithm"].map(first_start), _order=averaged["algorithm"].map(order)
    )
    averaged = averaged.sort_values(["_order", "iteration", "time_s"], kind="stable")
    return averaged[["algorithm", "iteration", "time_s", "elapsed_s", "test_accuracy"]].reset_index(drop=True)


def resolved_scenario(run: Path) -> dict:
    """The scenario the real run at ``run`` ran (its ``scenario.resolved.yaml``), or ``{}``
    when the run directory has none."""
    path = Path(run) / "scenario.resolved.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
