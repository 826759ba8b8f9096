"""Real against simulated: measured and predicted throughput of every algorithm and scenario.

Reads ``compare.csv`` of each real run (written by ``python -m harness compare``). Panel 0 is
the trace-driven simulation (each rank's measured local work replayed), panel 1 the predictive
one (calibration only); one series per scenario, one point per algorithm, on log axes with the
y = x line and a +-10% band.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from harness.report import style

NAME = "fig5_real_vs_sim"
MODES = (("trace", "trace-driven"), ("predictive", "predictive"))
SCENARIO_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def table(inputs: dict[str, Path]) -> pd.DataFrame:
    """One row per (mode, scenario, algorithm) from the runs' compare.csv files."""
    rows = []
    for scenario, run in inputs.items():
        path = Path(run) / "compare.csv"
        if not path.is_file():
            raise ValueError(f"{run}: no compare.csv (run `python -m harness compare {run}`)")
        frame = pd.read_csv(path)
        for panel, (mode, _) in enumerate(MODES):
            for row in frame[frame["mode"] == mode].itertuples(index=False):
                rows.append(
                    {
                        "panel": panel,
                        "series": scenario,
                        "x": row.measured_samples_per_s,
                        "y": row.predicted_samples_per_s,
                        "mode": mode,
                        "algorithm": row.algorithm,
                        "throughput_error": row.throughput_error,
                    }
                )
    return pd.DataFrame(rows, columns=["panel", "series", "x", "y", "mode", "algorithm", "throughput_error"])


def draw(inputs: dict[str, Path]):
    style.setup()
    data = table(inputs)
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.2), sharex=True, sharey=True)
    values = data[["x", "y"]].to_numpy()
    low, high = float(np.nanmin(values)) / 1.3, float(np.nanmax(values)) * 1.3
    line = np.geomspace(low, high, 50)
    for panel, (_mode, title) in enumerate(MODES):
        ax = axes[panel]
        ax.plot(line, line, color="black", linewidth=1, label="_y = x")
        ax.fill_between(line, line * 0.9, line * 1.1, color="grey", alpha=0.2, label="_+-10%")
        part = data[data["panel"] == panel]
        for i, scenario in enumerate(inputs):
            points = part[part["series"] == scenario]
            ax.scatter(points["x"], points["y"], label=scenario, color=SCENARIO_COLORS[i % len(SCENARIO_COLORS)], s=28)
        errors = part["throughput_error"].abs()
        ax.set_title(
            f"{title}: median |error| {errors.median() * 100:.1f}%, worst {errors.max() * 100:.1f}%"
            if len(part)
            else title
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # set_*scale resets the locators
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_xlabel("measured throughput (samples/s)")
        ax.legend(loc="upper left", title="scenario (grey: ±10%)")
    axes[0].set_ylabel("simulated throughput (samples/s)")
    fig.suptitle("Real against simulated throughput, every algorithm (one point each)")
    return fig, data
