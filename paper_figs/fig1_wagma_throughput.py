"""Figure 1 (WAGMA-SGD paper): training throughput relative to Allreduce-SGD vs number of workers
under injected stragglers, and test accuracy vs wall-clock time.

Inputs: ``wagma_scaling`` (the simulated sweep's CSV, ``experiments.wagma_scaling``) and
``straggler`` (a real run directory of ``scenarios/straggler.yaml``).

- Panel 0: simulated throughput / Allreduce-SGD's throughput vs ranks (log2 axis), one line per
  algorithm, from the repository's ResNet-50 configuration (``experiments.wagma_scaling``); the
  real straggler run's ratios (summary.csv) at its rank count overlaid as one scatter series, each
  point in its algorithm's colour.
- Panel 1: test accuracy of the average model vs seconds since the algorithm's first iteration
  began, from the real run's evals.csv.

The title of panel 0 states the simulated WAGMA-SGD / best other decentralized method ratio at
the largest rank count against the paper's 2.1x on 1,024 GPUs.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from harness.report import style
from paper_figs import readers

NAME = "fig1_wagma_throughput"
PAPER_RATIO = 2.1  # WAGMA-SGD vs state-of-the-art decentralized SGD, 1,024 GPUs (TPDS'21)


def draw(inputs: dict[str, Path]) -> tuple[plt.Figure, pd.DataFrame]:
    style.setup()
    sweep = pd.read_csv(inputs["wagma_scaling"])
    run = Path(inputs["straggler"])
    summary = pd.read_csv(run / "summary.csv")
    accuracy = readers.accuracy_over_time(run)

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(13, 5))
    rows: list[dict] = []
    sim_algorithms = style.ordered(sweep["algorithm"].unique())

    # Panel 0: simulated scaling.
    for algorithm in sim_algorithms:
        part = sweep[sweep["algorithm"] == algorithm].sort_values("ranks").dropna(subset=["relative_to_allreduce"])
        name = f"{style.label(algorithm)} (sim.)"
        style.line(ax0, algorithm, part["ranks"], part["relative_to_allreduce"], name)
        rows += [
            {
                "panel": 0,
                "series": name,
                "x": float(x),
                "y": float(y),
                "algorithm": algorithm,
                "source": "simulated",
                "x_unit": "ranks",
                "y_unit": "throughput / Allreduce-SGD's",
            }
            for x, y in zip(part["ranks"], part["relative_to_allreduce"])
        ]

    # Panel 0: the real run's ratios at its rank count.
    if "allreduce_sgd" in set(summary["algorithm"]):
        base = float(summary.loc[summary["algorithm"] == "allreduce_sgd", "samples_per_s"].iloc[0])
        real = summary[summary["algorithm"].isin(sim_algorithms)].copy()
        real["ratio"] = real["samples_per_s"] / base
        real = real.dropna(subset=["ratio"])
        if len(real):
            n = int(real["ranks"].iloc[0])
            name = f"measured here ({n} ranks)"
            ax0.scatter(
                real["ranks"],
                real["ratio"],
                c=[style.color(a) for a in real["algorithm"]],
                marker="D",
                s=60,
                edgecolors="black",
                linewidths=1.0,
                zorder=5,
                label=name,
            )
            rows += [
                {
                    "panel": 0,
                    "series": name,
                    "x": float(x),
                    "y": float(y),
                    "algorithm": a,
                    "source": f"real run {run.name}",
                    "x_unit": "ranks",
                    "y_unit": "throughput / Allreduce-SGD's",
                }
                for x, y, a in zip(real["ranks"], real["ratio"], real["algorithm"])
            ]
    ax0.set_xscale("log", base=2)
    ax0.set_xlabel("workers (ranks)")
    ax0.set_ylabel("throughput relative to Allreduce-SGD (x)")
    title = (
        "Throughput vs workers, the WAGMA-SGD repository's ResNet-50 runs\n(a P100 and 128 images per worker, "
        "2 random stragglers of 320 ms per step, Aries network; simulated)"
    )
    largest = sweep["ranks"].max()
    at = sweep[sweep["ranks"] == largest].set_index("algorithm")["samples_per_s"]
    others = at.drop(labels=[a for a in ("wagma", "allreduce_sgd") if a in at.index])
    if "wagma" in at.index and len(others):
        best = others.idxmax()
        title += (
            f"\nWAGMA-SGD / best other ({style.label(best)}) at {largest} ranks: "
            f"{at['wagma'] / others.max():.2f}x (paper: {PAPER_RATIO}x at 1,024 GPUs)"
        )
    ax0.set_title(title, fontsize=10)
    ax0.legend(loc="best")

    # Panel 1: accuracy vs wall-clock in the real run.
    for algorithm in style.ordered(set(accuracy["algorithm"]) & set(sim_algorithms)):
        part = accuracy[accuracy["algorithm"] == algorithm]
        x = part["elapsed_s"]
        name = style.label(algorithm)
        style.line(ax1, algorithm, x, part["test_accuracy"], name)
        rows += [
            {
                "panel": 1,
                "series": name,
                "x": float(a),
                "y": float(b),
                "algorithm": algorithm,
                "source": f"real run {run.name}",
                "x_unit": "s",
                "y_unit": "test accuracy (fraction)",
            }
            for a, b in zip(x, part["test_accuracy"])
        ]
    ranks = int(summary["ranks"].iloc[0]) if len(summary) else 0
    ax1.set_xlabel("wall-clock time since the algorithm's start (s)")
    ax1.set_ylabel("test accuracy, average model (fraction)")
    ax1.set_title(f"Test accuracy vs time, measured here ({ranks} ranks, straggler scenario)", fontsize=10)
    ax1.legend(loc="lower right")

    table = pd.DataFrame(rows, columns=["panel", "series", "x", "y", "algorithm", "source", "x_unit", "y_unit"])
    return fig, table
