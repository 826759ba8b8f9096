"""Figure 7 (DiLoCo / Streaming DiLoCo): the low-communication methods against Allreduce-SGD,
Local SGD and the wait-avoiding methods, measured here (panel 0) and simulated at scale (panel 1).

Inputs: ``low_communication`` (a real run directory of ``scenarios/low_communication.yaml``:
8 ranks as 2 nodes of 4 on emulated 1 Gb/s NICs, two random 40 ms stragglers per iteration) and
``low_communication_scaling`` (the simulated sweep's CSV, ``experiments.low_communication_scaling``).

- Panel 0: test accuracy (%) of the ``average`` model rows of ``evals.csv`` against the
  evaluation's ``time_s`` minus the algorithm's first step start (``readers.accuracy_over_time``):
  each algorithm's own training time, for every algorithm the run holds evaluations for.
- Panel 1: simulated time per iteration (s) against ranks (log x), one line per method of the
  sweep: the same methods with the scenario's parameters, nodes of 8 ranks on 10 Gb Ethernet,
  the scenario's stragglers at every scale, a ResNet-50-sized model.

The table has one row per drawn point (``panel``, ``series`` = the legend label, ``x``, ``y``)
plus the context columns ``algorithm``, ``iteration`` (panel 0; -1 in panel 1), ``ranks``,
``source`` (``real run <dir>`` or ``simulated``), ``network``, ``x_unit`` and ``y_unit``.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from harness.report import style
from paper_figs import readers

NAME = "fig7_low_communication"
REAL = "low_communication"
SWEEP = "low_communication_scaling"
COLUMNS = ["panel", "series", "x", "y", "algorithm", "iteration", "ranks", "source", "network", "x_unit", "y_unit"]


def table(run: Path, sweep: pd.DataFrame) -> pd.DataFrame:
    """The plotted data of the real run at ``run`` and the simulated ``sweep`` (module docstring)."""
    run = Path(run)
    accuracy = readers.accuracy_over_time(run)
    if accuracy.empty:
        raise ValueError(f"{NAME}: run {run} has no 'average' evaluations with a test accuracy")
    scenario = readers.resolved_scenario(run)
    ranks = int(scenario.get("ranks", -1))
    network = _network(scenario)
    rows = []
    for algorithm in style.ordered(accuracy["algorithm"].unique()):
        part = accuracy[accuracy["algorithm"] == algorithm]
        rows += [
            {
                "panel": 0,
                "series": style.label(algorithm),
                "x": float(rec.elapsed_s),
                "y": 100.0 * float(rec.test_accuracy),
                "algorithm": algorithm,
                "iteration": int(rec.iteration),
                "ranks": ranks,
                "source": f"real run {run.name}",
                "network": network,
                "x_unit": "s",
                "y_unit": "test accuracy of the averaged model (%)",
            }
            for rec in part.itertuples(index=False)
        ]
    sweep = sweep.dropna(subset=["iter_time_s"])
    for algorithm in style.ordered(sweep["algorithm"].unique()):
        part = sweep[sweep["algorithm"] == algorithm].sort_values("ranks")
        rows += [
            {
                "panel": 1,
                "series": style.label(algorithm),
                "x": float(rec.ranks),
                "y": float(rec.iter_time_s),
                "algorithm": algorithm,
                "iteration": -1,
                "ranks": int(rec.ranks),
                "source": "simulated",
                "network": str(rec.network),
                "x_unit": "ranks",
                "y_unit": "s per iteration",
            }
            for rec in part.itertuples(index=False)
        ]
    return pd.DataFrame(rows, columns=COLUMNS)


def _network(scenario: dict) -> str:
    """The real run's network in words: its topology preset and ranks per node, if any."""
    topology = (scenario.get("network") or {}).get("topology") or {}
    if topology.get("preset"):
        per_node = topology.get("ranks_per_node")
        return f"{topology['preset']}" + (f", {per_node} ranks per node" if per_node else "")
    return "this host"


def _stragglers(scenario: dict) -> str:
    """The real run's injected stragglers in words (``", 2 random ranks sleep 40 ms"``), or ``""``."""
    parts = [
        f"{entry.get('count', 1)} random ranks sleep {float(entry.get('delay_ms', 0)):g} ms"
        if entry.get("kind") == "random_ranks"
        else str(entry.get("kind", "imbalance"))
        for entry in scenario.get("imbalance") or []
    ]
    return "".join(f", {part}" for part in parts)


def draw(inputs: dict[str, Path]) -> tuple[plt.Figure, pd.DataFrame]:
    run = Path(inputs[REAL])
    data = table(run, pd.read_csv(inputs[SWEEP]))
    style.setup()
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    for panel, ax in enumerate(axes):
        part = data[data["panel"] == panel]
        for algorithm in dict.fromkeys(part["algorithm"]):
            rows = part[part["algorithm"] == algorithm]
            style.line(ax, algorithm, rows["x"].to_numpy(), rows["y"].to_numpy(), linewidth=1.8, markersize=6)

    ax = axes[0]
    real = data[data["panel"] == 0]
    ranks = int(real["ranks"].iloc[0])
    ax.set_xlim(left=0)
    ax.set_xlabel("wall-clock time since the algorithm's first step (s)")
    ax.set_ylabel("test accuracy of the averaged model (%)")
    ax.set_title(
        f"Accuracy vs time, measured here\n({ranks if ranks > 0 else '?'} ranks, "
        f"{real['network'].iloc[0]}{_stragglers(readers.resolved_scenario(run))}; run {run.name})",
        fontsize=10,
    )

    ax = axes[1]
    sim = data[data["panel"] == 1]
    if sim.empty:
        ax.set_title("(no simulated data)")
    else:
        ax.set_xscale("log", base=2)
        ticks = sorted(set(sim["x"].astype(int)))
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_ylim(0, sim["y"].max() * 1.1)
        ax.set_xlabel("ranks (nodes of 8)")
        ax.set_ylabel("time per iteration (s)")
        ax.set_title(
            f"Time per iteration vs ranks, simulated: {sim['network'].iloc[0]} NICs shared by 8 ranks,\n"
            "ResNet-50 buffer, the scenario's methods and stragglers",
            fontsize=10,
        )
    # One legend for both panels (the same methods, one colour each), beside the axes: the
    # accuracy curves fill their panel.
    handles = {}
    for ax in axes:
        for line in ax.get_lines():
            handles.setdefault(line.get_label(), line)
    axes[1].legend(handles.values(), handles.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle(
        "Low-communication training: the DiLoCo family against Allreduce-SGD, Local SGD and the wait-avoiding methods",
        fontsize=12,
    )
    return fig, data
