"""Overlap Local SGD paper's figure: test accuracy of the averaged model against wall-clock time
(panel 0) and against epochs (panel 1), for fully synchronous SGD and the periodic-averaging
family (Local SGD, Overlap Local SGD, EASGD, CoCoD-SGD, BMUF).

Input ``slow_link``: a real run of ``scenarios/slow_link.yaml``. Every algorithm of
:func:`algorithms` (the registered algorithms of the synchronous and periodic families) that the
run holds evaluations for is drawn (at least one must be there), and every entry of the run that
runs one of them under a label of its own (``{name: local_sgd_p8, algorithm: local_sgd}``,
registered when the scenario was loaded: ``harness.algorithms.variant``), after it.

- y: ``test_accuracy`` (in %) of the ``average`` model rows of ``evals.csv``.
- Panel 0, x: ``time_s`` of the evaluation minus the algorithm's first step start (the smallest
  ``start_s`` of its rows in ``steps.csv``), in seconds: each algorithm's own training time.
- Panel 1, x: epochs = iteration x ranks x batch_size / training samples. ``iteration`` of an
  evaluation counts the steps done; ranks and batch_size come from ``summary.csv`` (else
  ``scenario.resolved.yaml``); the number of training samples is the total size of the data
  shards in ``provenance/shards.npz`` (the shards partition the training split). A run without
  that file gives no training-set size, so panel 1 then shows samples processed (x 1,000)
  = iteration x ranks x batch_size / 1000 instead, and says so on the axis.

Only result files are read; no evaluation is recomputed. The table has one row per drawn
point (``panel``, ``series`` = the legend label, ``x``, ``y``) plus the context columns
``algorithm``, ``iteration``, ``time_s`` (since that algorithm's first step), ``epochs``
(NaN without shards), ``samples`` (iteration x ranks x batch_size), ``test_accuracy``
(fraction) and ``train_samples``.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from harness.algorithms import registry
from harness.report import style
from paper_figs import readers

NAME = "fig3_overlap_local_sgd"
INPUT = "slow_link"
# The paper compares fully synchronous SGD (our Allreduce-SGD) with the periodic-averaging family.
FAMILIES = ("synchronous", "periodic")
LABELS = {"allreduce_sgd": "Synchronous SGD"}


def algorithms() -> list[str]:
    """The algorithms this figure draws: the registered ones of :data:`FAMILIES`, in registry order."""
    return [name for name in registry.names() if registry.registration(name).family in FAMILIES]


def _drawn(algorithm: str) -> bool:
    """Whether this figure draws ``algorithm``: one of :func:`algorithms`, or a variant of one (by
    the algorithm it runs)."""
    if algorithm in registry.variants():
        return registry.algorithm_of(algorithm) in algorithms()
    return algorithm in algorithms()


def _series_label(algorithm: str) -> str:
    return LABELS.get(algorithm, style.label(algorithm))


def _train_samples(path: Path) -> int | None:
    """Training-set size: total length of the saved data shards, or None without them."""
    shards = path / "provenance" / "shards.npz"
    if not shards.exists():
        return None
    with np.load(shards) as data:
        return int(sum(len(data[key]) for key in data.files if key.startswith("rank")))


def _sizes(path: Path, algorithm: str) -> tuple[int, int]:
    """(ranks, per-rank batch_size) of ``algorithm`` from summary.csv, else the resolved scenario."""
    summary = path / "summary.csv"
    if summary.exists():
        frame = pd.read_csv(summary)
        row = frame[frame["algorithm"] == algorithm]
        if len(row):
            return int(row["ranks"].iloc[0]), int(row["batch_size"].iloc[0])
    scenario = readers.resolved_scenario(path)
    return int(scenario["ranks"]), int(scenario["workload"]["batch_size"])


def table(path: Path) -> pd.DataFrame:
    """The plotted data of the run at ``path`` (see the module docstring)."""
    accuracy = readers.accuracy_over_time(path)
    present = [a for a in style.ordered(set(accuracy["algorithm"])) if _drawn(a)]
    if not present:
        raise ValueError(f"{NAME}: run {path} has no 'average' evaluations of any of {', '.join(algorithms())}")
    train = _train_samples(path)
    rows = []
    for algorithm in present:
        ranks, batch = _sizes(path, algorithm)
        for rec in accuracy[accuracy["algorithm"] == algorithm].itertuples(index=False):
            samples = int(rec.iteration) * ranks * batch
            rows.append(
                {
                    "algorithm": algorithm,
                    "iteration": int(rec.iteration),
                    "time_s": float(rec.elapsed_s),
                    "epochs": samples / train if train else float("nan"),
                    "samples": samples,
                    "test_accuracy": float(rec.test_accuracy),
                    "train_samples": train if train else -1,
                }
            )
    data = pd.DataFrame(rows)
    data["series"] = data["algorithm"].map(_series_label)
    data["y"] = 100.0 * data["test_accuracy"]
    wall = data.assign(panel=0, x=data["time_s"])
    progress = data.assign(panel=1, x=data["epochs"] if train else data["samples"] / 1000.0)
    columns = [
        "panel",
        "series",
        "x",
        "y",
        "algorithm",
        "iteration",
        "time_s",
        "epochs",
        "samples",
        "test_accuracy",
        "train_samples",
    ]
    return pd.concat([wall, progress], ignore_index=True)[columns]


def draw(inputs: dict[str, Path]) -> tuple[plt.Figure, pd.DataFrame]:
    path = Path(inputs[INPUT])
    data = table(path)
    style.setup()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4), sharey=True)
    for panel, ax in enumerate(axes):
        part = data[data["panel"] == panel]
        for algorithm in dict.fromkeys(part["algorithm"]):
            rows = part[part["algorithm"] == algorithm]
            style.line(
                ax,
                algorithm,
                rows["x"].to_numpy(),
                rows["y"].to_numpy(),
                _series_label(algorithm),
                linewidth=1.8,
                markersize=6,
            )
    has_epochs = bool((data["train_samples"] > 0).all())
    axes[0].set_xlabel("wall-clock time since the algorithm's first step (s)")
    axes[0].set_ylabel("test accuracy of the averaged model (%)")
    axes[0].set_title("Accuracy vs wall-clock time")
    if has_epochs:
        axes[1].set_xlabel(f"epochs (training set: {int(data['train_samples'].iloc[0]):,} samples)")
        axes[1].set_title("Accuracy vs epochs")
    else:
        axes[1].set_xlabel("samples processed, all ranks (x 1,000)")
        axes[1].set_title("Accuracy vs samples processed")
    axes[0].set_xlim(left=0)
    axes[1].set_xlim(left=0)
    # Outside the axes: in a short run the curves reach every corner, so no inside spot is free.
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    scenario = readers.resolved_scenario(path)
    ranks = scenario.get("ranks", "?")
    fig.suptitle(
        f"Overlap Local SGD family on '{scenario.get('name', path.parent.name)}' ({ranks} ranks, run {path.name})",
        fontsize=12,
    )
    return fig, data
