"""Real against simulated: what ``python -m harness compare`` wrote into a real run's directory.

From ``compare.csv`` (results/README.md, compare.csv); where a directory holds the simulated runs
(``sim-trace/``, ``sim-predictive/``) but no compare.csv, the same columns are made from their
summary.csv and the run's.
"""

from __future__ import annotations

import html
from typing import TypedDict

import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from harness.report import look
from harness.report.data import RunData

KEY = "real_vs_sim"
TITLE = "Real against simulated"


class _Style(TypedDict):
    alpha: float
    hatch: str | None
    fill: bool


MODE_STYLE: dict[str, _Style] = {  # how each series is drawn: measured solid, trace hatched, predictive hollow
    "measured": {"alpha": 1.0, "hatch": None, "fill": True},
    "trace": {"alpha": 0.55, "hatch": "////", "fill": True},
    "predictive": {"alpha": 1.0, "hatch": None, "fill": False},
}


def comparison(run: RunData) -> pd.DataFrame | None:
    """compare.csv's rows, or the same columns from the simulated runs' summaries; None if neither."""
    if run.compare is not None and len(run.compare):
        return run.compare
    rows = []
    measured = run.summary.set_index("algorithm")
    for mode, sim in run.simulations.items():
        for r in sim.summary.itertuples(index=False):
            if r.algorithm not in measured.index:
                continue
            m = measured.loc[r.algorithm]
            rows.append(
                {
                    "algorithm": r.algorithm,
                    "mode": mode,
                    "measured_samples_per_s": m["samples_per_s"],
                    "predicted_samples_per_s": r.samples_per_s,
                    "throughput_error": r.samples_per_s / m["samples_per_s"] - 1.0,
                    "measured_wait_fraction": m["wait_fraction"],
                    "predicted_wait_fraction": r.wait_fraction,
                }
            )
    return pd.DataFrame(rows) if rows else None


def figure(table: pd.DataFrame, algorithms: list[str], palette: look.Palette):
    """Two panels, samples/s and the waiting share of iteration time, per algorithm: the measured
    value and each simulation mode's prediction side by side, in the algorithm's colour."""
    algorithms = [a for a in algorithms if a in set(table["algorithm"])] + [
        a for a in dict.fromkeys(table["algorithm"]) if a not in algorithms
    ]
    modes = [m for m in ("trace", "predictive") if m in set(table["mode"])] + [
        m for m in dict.fromkeys(table["mode"]) if m not in ("trace", "predictive")
    ]
    series = ["measured", *modes]
    n = len(algorithms)
    fig = look.new_figure(11, 1.0 + 0.32 * n * max(1, len(series)) / 2)
    rate_ax, wait_ax = fig.subplots(1, 2, sharey=True)
    height = 0.8 / len(series)
    y = np.arange(n)[::-1]
    for k, name in enumerate(series):
        offset = (len(series) - 1) / 2 * height - k * height
        rates, waits = [], []
        for algorithm in algorithms:
            rows = table[table["algorithm"] == algorithm]
            if name == "measured":
                rates.append(rows["measured_samples_per_s"].iloc[0])
                waits.append(rows["measured_wait_fraction"].iloc[0] if "measured_wait_fraction" in rows else np.nan)
            else:
                mode_rows = rows[rows["mode"] == name]
                rates.append(mode_rows["predicted_samples_per_s"].iloc[0] if len(mode_rows) else np.nan)
                waits.append(
                    mode_rows["predicted_wait_fraction"].iloc[0]
                    if len(mode_rows) and "predicted_wait_fraction" in mode_rows
                    else np.nan
                )
        colours = [palette.colour(a) for a in algorithms]
        for ax, values in ((rate_ax, rates), (wait_ax, np.asarray(waits, dtype=float) * 100)):
            _bars(ax, y + offset, values, height, colours, MODE_STYLE.get(name, MODE_STYLE["trace"]))
    rate_ax.set_yticks(y, [palette.label(a) for a in algorithms])
    rate_ax.set_xlabel("samples/s")
    wait_ax.set_xlabel("waiting (% of iteration time)")
    for ax in (rate_ax, wait_ax):
        ax.grid(axis="y", visible=False)
        ax.set_ylim(-0.6, n - 0.4)
    handles = [
        Patch(
            facecolor="#777777" if MODE_STYLE.get(s, MODE_STYLE["trace"])["fill"] else "white",
            edgecolor="#333333",
            hatch=MODE_STYLE.get(s, MODE_STYLE["trace"])["hatch"],
            alpha=MODE_STYLE.get(s, MODE_STYLE["trace"])["alpha"],
            label=s if s == "measured" else f"simulated: {s}",
        )
        for s in series
    ]
    fig.legend(handles=handles, loc="outside upper center", ncols=len(handles), frameon=False)
    return fig


def _bars(ax, y, values, height, colours, how) -> None:
    values = np.nan_to_num(np.asarray(values, dtype=float))
    if how["fill"]:
        ax.barh(
            y,
            values,
            height=height * 0.92,
            color=colours,
            alpha=how["alpha"],
            hatch=how["hatch"],
            edgecolor=["#333333"] * len(colours),
            linewidth=0.5,
        )
    else:
        ax.barh(y, values, height=height * 0.92, facecolor="white", edgecolor=colours, linewidth=1.5)


def table_html(table: pd.DataFrame, palette: look.Palette) -> str:
    """compare.csv as an HTML table: measured and predicted samples/s, error, waiting shares."""
    head = (
        "<tr><th>algorithm</th><th>mode</th><th>measured samples/s</th><th>predicted samples/s</th>"
        "<th>error</th><th>measured waiting</th><th>predicted waiting</th></tr>"
    )
    body = []
    for r in table.to_dict("records"):
        colour = html.escape(palette.colour(r["algorithm"]))
        body.append(
            f'<tr><td><span class="chip" style="background:{colour}"></span>'
            f"{html.escape(palette.label(r['algorithm']))}"
            f"</td><td>{html.escape(str(r['mode']))}</td><td>{_num(r.get('measured_samples_per_s'), ',.1f')}</td>"
            f"<td>{_num(r.get('predicted_samples_per_s'), ',.1f')}</td>"
            f"<td>{_num(r.get('throughput_error'), '+.1f', 100, '%')}</td>"
            f"<td>{_num(r.get('measured_wait_fraction'), '.1f', 100, '%')}</td>"
            f"<td>{_num(r.get('predicted_wait_fraction'), '.1f', 100, '%')}</td></tr>"
        )
    return f'<table class="data"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'


def _num(value, spec: str, scale: float = 1.0, unit: str = "") -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if not np.isfinite(value) else f"{format(value * scale, spec)}{unit}"


def section(run: RunData, palette: look.Palette) -> look.Section:
    if run.simulated:
        mode = run.meta.get("mode", "predictive")
        return look.Section(
            KEY,
            TITLE,
            absent=(
                f"This directory is a simulation ({mode} mode): it holds no real run to compare with. "
                "`python -m harness compare RUN_DIR` simulates a real run and writes both into that run's directory, "
                "whose report then shows them side by side."
            ),
        )
    table = comparison(run)
    if table is None:
        return look.Section(
            KEY,
            TITLE,
            absent=(
                "No simulation of this run in its directory: `python -m harness compare DIR` writes one (compare.csv, "
                "sim-trace/, sim-predictive/; it needs a calibration), then `python -m harness report DIR` draws it "
                "here."
            ),
        )
    caption = (
        "Measured (solid) against the simulator's prediction, per compare.csv: trace mode (hatched) replays "
        "each rank's measured local work, predictive mode (hollow) uses the calibration alone. Error is "
        "predicted / measured - 1 (+5%: the model is 5% optimistic)."
    )
    return look.Section(KEY, TITLE, figure(table, run.algorithms, palette), caption, html=table_html(table, palette))
