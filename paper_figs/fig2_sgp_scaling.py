"""Figure 2 (SGP paper): time per iteration vs nodes on 10 GbE and on InfiniBand, and test error
vs wall-clock time under a slow link.

Inputs: ``sgp_scaling`` (the simulated sweep's CSV, ``experiments.sgp_scaling``) and
``slow_link`` (a real run directory of ``scenarios/slow_link.yaml``).

- Panels 0 and 1: simulated time per iteration (s) vs nodes of 8 workers that share their
  node's NIC, one line per series (``experiments.sgp_scaling``: the SGP paper's methods, the
  hierarchical allreduce, WAGMA-SGD's groups inside and across nodes), on "10 GbE" and on
  "100 Gb InfiniBand" (shared y range).
- Panel 2: test error (1 - accuracy of the average model) vs seconds since the algorithm's first
  iteration began, for Allreduce-SGD, D-PSGD, SGP and 1-OSGP in the real slow-link run.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from paper_figs import readers, style

NAME = "fig2_sgp_scaling"
NETWORKS = ("10 GbE", "100 Gb InfiniBand")
REAL_ALGORITHMS = ("allreduce_sgd", "dpsgd", "sgp", "osgp")


def draw(inputs: dict[str, Path]) -> tuple[plt.Figure, pd.DataFrame]:
    style.setup()
    sweep = pd.read_csv(inputs["sgp_scaling"])
    run = Path(inputs["slow_link"])
    summary = pd.read_csv(run / "summary.csv")
    ranks = int(summary["ranks"].iloc[0]) if len(summary) else 0

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    rows: list[dict] = []
    networks = [n for n in NETWORKS if n in set(sweep["network"])] + sorted(set(sweep["network"]) - set(NETWORKS))
    for panel, network in enumerate(networks[:2]):
        ax = axes[panel]
        part_net = sweep[sweep["network"] == network]
        for algorithm in style.ordered(part_net["algorithm"].unique()):
            part = part_net[part_net["algorithm"] == algorithm].sort_values("nodes").dropna(subset=["iter_time_s"])
            name = style.label(algorithm)
            ax.plot(part["nodes"], part["iter_time_s"], color=style.color(algorithm), marker=style.marker(algorithm),
                    label=name)
            rows += [{"panel": panel, "series": name, "x": float(x), "y": float(y), "algorithm": algorithm,
                      "network": network, "source": "simulated", "x_unit": "nodes of 8 workers",
                      "y_unit": "s per iteration"}
                     for x, y in zip(part["nodes"], part["iter_time_s"])]
        ax.set_xscale("log", base=2)
        nodes = sorted(part_net["nodes"].unique())
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.set_xlabel("nodes (8 workers each)")
        ax.set_ylabel("time per iteration (s)")
        ax.set_title(f"Time per iteration, {network} NICs shared by 8 workers\n(simulated, ResNet-50 buffer, "
                     "no stragglers)", fontsize=10)
        ax.set_ylim(0, sweep["iter_time_s"].max() * 1.45)  # room above the lines for the legend
        ax.legend(loc="upper left", ncol=2, fontsize=8)
    for ax in axes[len(networks[:2]):2]:  # a sweep with one network: leave the other panel empty
        ax.set_title("(no data)")

    ax = axes[2]
    accuracy = readers.accuracy_over_time(run)
    for algorithm in style.ordered(set(accuracy["algorithm"]) & set(REAL_ALGORITHMS)):
        part = accuracy[accuracy["algorithm"] == algorithm]
        x, y = part["elapsed_s"], 1.0 - part["test_accuracy"]
        name = style.label(algorithm)
        ax.plot(x, y, color=style.color(algorithm), marker=style.marker(algorithm), label=name)
        rows += [{"panel": 2, "series": name, "x": float(a), "y": float(b), "algorithm": algorithm,
                  "network": "slow link to rank 0", "source": f"real run {run.name}",
                  "x_unit": "s", "y_unit": "test error (fraction)"}
                 for a, b in zip(x, y)]
    ax.set_xlabel("wall-clock time since the algorithm's start (s)")
    ax.set_ylabel("test error, average model (1 - accuracy)")
    ax.set_title(f"Test error vs time, measured here\n({ranks} ranks, rank 0 on a slow link)", fontsize=10)
    ax.legend(loc="upper right")

    table = pd.DataFrame(rows, columns=["panel", "series", "x", "y", "algorithm", "network", "source", "x_unit",
                                        "y_unit"])
    return fig, table
