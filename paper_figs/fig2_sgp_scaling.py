"""Figure 2 (SGP paper): time per iteration vs nodes on 10 GbE and on InfiniBand, and test error
vs wall-clock time under a slow link.

Inputs: ``sgp_scaling`` (the simulated sweep's CSV, ``experiments.sgp_scaling``) and
``slow_link`` (a real run directory of ``scenarios/slow_link.yaml``).

- Panels 0 and 1 (``setup == "paper"``): the paper's cluster as it ran, simulated: one rank per
  node of 8 V100s, each series with its stack (``harness.validation.systems.SGP_PAPER_SERIES``: THD's
  recursive-doubling allreduce over TCP from the host on 10 GbE; Gloo's bandwidth-optimal
  allreduce and MPI gossip from the GPU on InfiniBand); AR-SGD, D-PSGD and SGP on "10 GbE",
  AR-SGD and SGP on "100 Gb InfiniBand" (shared y range). The titles give the paper's targets
  next to the simulated values: AR-SGD at the most nodes over at the fewest, SGP over AR-SGD.
- Panel 2 (``setup == "per_worker"``): a modern cluster on 10 GbE, one rank per GPU (8 workers
  share their node's NIC): the paper's methods per worker, the hierarchical allreduce and
  WAGMA-SGD's groups inside and across nodes.
- Panel 3: test error (1 - accuracy of the average model) vs seconds since the algorithm's first
  iteration began, for Allreduce-SGD, D-PSGD, SGP and 1-OSGP in the real slow-link run.

The table has a ``setup`` column: ``paper`` (panels 0-1), ``per_worker`` (panel 2), ``measured``
(panel 3).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from harness.report import style
from paper_figs import readers

NAME = "fig2_sgp_scaling"
NETWORKS = ("10 GbE", "100 Gb InfiniBand")
REAL_ALGORITHMS = ("allreduce_sgd", "dpsgd", "sgp", "osgp")
PER_WORKER_NETWORK = "10 GbE"
COLUMNS = ["panel", "setup", "series", "x", "y", "algorithm", "network", "source", "x_unit", "y_unit"]


def paper_ratios(part: pd.DataFrame) -> tuple[float | None, float | None]:
    """(AR-SGD's time at the most nodes / at the fewest, SGP / AR-SGD at the most nodes) of one
    network's ``setup == "paper"`` rows; None where a series is missing."""
    t = part.set_index(["algorithm", "nodes"])["iter_time_s"]
    most, fewest = part["nodes"].max(), part["nodes"].min()
    growth = ratio = None
    if ("allreduce_sgd", most) in t and ("allreduce_sgd", fewest) in t:
        growth = float(t[("allreduce_sgd", most)] / t[("allreduce_sgd", fewest)])
        if ("sgp", most) in t:
            ratio = float(t[("sgp", most)] / t[("allreduce_sgd", most)])
    return growth, ratio


def _lines(ax, part: pd.DataFrame, panel: int, setup: str, network: str) -> list[dict]:
    rows = []
    for algorithm in style.ordered(part["algorithm"].unique()):
        series = part[part["algorithm"] == algorithm].sort_values("nodes").dropna(subset=["iter_time_s"])
        name = style.label(algorithm)
        style.line(ax, algorithm, series["nodes"], series["iter_time_s"], name)
        rows += [
            {
                "panel": panel,
                "setup": setup,
                "series": name,
                "x": float(x),
                "y": float(y),
                "algorithm": algorithm,
                "network": network,
                "source": "simulated",
                "x_unit": "nodes",
                "y_unit": "s per iteration",
            }
            for x, y in zip(series["nodes"], series["iter_time_s"])
        ]
    nodes = sorted(part["nodes"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(nodes, [str(n) for n in nodes])
    ax.set_ylabel("time per iteration (s)")
    ax.legend(loc="upper left", ncol=2, fontsize=8)
    return rows


def draw(inputs: dict[str, Path]) -> tuple[plt.Figure, pd.DataFrame]:
    style.setup()
    sweep = pd.read_csv(inputs["sgp_scaling"])
    run = Path(inputs["slow_link"])
    summary = pd.read_csv(run / "summary.csv")
    ranks = int(summary["ranks"].iloc[0]) if len(summary) else 0

    fig, grid = plt.subplots(2, 2, figsize=(14, 10))
    axes = grid.ravel()
    rows: list[dict] = []
    paper = sweep[sweep["setup"] == "paper"]
    top = paper["iter_time_s"].max() * 1.45 if len(paper) else 1.0  # room above the lines for the legend
    for panel, network in enumerate(NETWORKS):
        ax, part = axes[panel], paper[paper["network"] == network]
        if part.empty:
            ax.set_title(f"(no data for {network})")
            continue
        rows += _lines(ax, part, panel, "paper", network)
        growth, ratio = paper_ratios(part)
        most, fewest = part["nodes"].max(), part["nodes"].min()
        facts = []
        if growth is not None:
            target = " (paper: >= 1.5x)" if network == "10 GbE" else ""
            facts.append(f"AR-SGD {most}/{fewest} nodes: {growth:.2f}x{target}")
        if ratio is not None:
            facts.append(
                f"SGP / AR-SGD at {most}: {ratio:.2f}"
                + (" (paper: about 0.33)" if network == "10 GbE" else " (paper: about 1)")
            )
        ax.set_title(
            f"The paper's cluster on {network}: a rank per node of 8 V100s (simulated)\n" + "; ".join(facts),
            fontsize=10,
        )
        ax.set_xlabel("nodes (one process each, 8 GPUs)")
        ax.set_ylim(0, top)

    ax = axes[2]
    per_worker = sweep[(sweep["setup"] == "per_worker") & (sweep["network"] == PER_WORKER_NETWORK)]
    if per_worker.empty:
        ax.set_title("(no per-worker data)")
    else:
        rows += _lines(ax, per_worker, 2, "per_worker", PER_WORKER_NETWORK)
        ax.set_xlabel("nodes (8 workers each)")
        ax.set_ylim(0, per_worker["iter_time_s"].max() * 1.45)
        ax.set_title(
            f"A modern cluster: one process per GPU, 8 share a {PER_WORKER_NETWORK} NIC\n"
            "(simulated, ring allreduce unless hierarchical, no stragglers)",
            fontsize=10,
        )

    ax = axes[3]
    accuracy = readers.accuracy_over_time(run)
    for algorithm in style.ordered(set(accuracy["algorithm"]) & set(REAL_ALGORITHMS)):
        part = accuracy[accuracy["algorithm"] == algorithm]
        x, y = part["elapsed_s"], 1.0 - part["test_accuracy"]
        name = style.label(algorithm)
        style.line(ax, algorithm, x, y, name)
        rows += [
            {
                "panel": 3,
                "setup": "measured",
                "series": name,
                "x": float(a),
                "y": float(b),
                "algorithm": algorithm,
                "network": "slow link to rank 0",
                "source": f"real run {run.name}",
                "x_unit": "s",
                "y_unit": "test error (fraction)",
            }
            for a, b in zip(x, y)
        ]
    ax.set_xlabel("wall-clock time since the algorithm's start (s)")
    ax.set_ylabel("test error, average model (1 - accuracy)")
    ax.set_title(f"Test error vs time, measured here\n({ranks} ranks, rank 0 on a slow link)", fontsize=10)
    ax.legend(loc="upper right")

    return fig, pd.DataFrame(rows, columns=COLUMNS)
