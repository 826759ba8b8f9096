"""Figure 4: time per iteration vs injected straggler delay (simulated), the wait-avoiding
methods against Allreduce-SGD.

Input: ``imbalance_sweep`` (the simulated sweep's CSV, ``experiments.imbalance_sweep``): 64
ranks, every iteration 2 random ranks sleep the given delay; Allreduce-SGD, eager-SGD (solo and
majority) and WAGMA-SGD. One panel, one line per series.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from harness.report import style

NAME = "fig4_imbalance_sweep"


def draw(inputs: dict[str, Path]) -> tuple[plt.Figure, pd.DataFrame]:
    style.setup()
    sweep = pd.read_csv(inputs["imbalance_sweep"])
    fig, ax = plt.subplots(figsize=(7.5, 5))
    rows: list[dict] = []
    for algorithm in style.ordered(set(sweep["algorithm"])):
        part = sweep[sweep["algorithm"] == algorithm].sort_values("delay_ms").dropna(subset=["iter_time_s"])
        name = style.label(algorithm)
        style.line(ax, algorithm, part["delay_ms"], part["iter_time_s"], name)
        rows += [
            {
                "panel": 0,
                "series": name,
                "x": float(x),
                "y": float(y),
                "algorithm": algorithm,
                "x_unit": "ms injected per iteration",
                "y_unit": "s per iteration",
            }
            for x, y in zip(part["delay_ms"], part["iter_time_s"])
        ]
    ranks = ", ".join(str(r) for r in sorted(sweep["ranks"].unique())) if "ranks" in sweep else "?"
    ax.set_xlabel("injected delay of 2 random ranks per iteration (ms)")
    ax.set_ylabel("time per iteration (s)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Time per iteration vs straggler delay ({ranks} ranks, simulated)")
    ax.legend(loc="upper left")
    table = pd.DataFrame(rows, columns=["panel", "series", "x", "y", "algorithm", "x_unit", "y_unit"])
    return fig, table
