"""A sweep's ``report.html``: what was swept, the sweep plot, and every point with its status,
its throughput per algorithm (and its time to the target accuracy and to the target loss where
some point reached one) and a link to its own report (``points/pNNN/report.html``).

Self-contained like a run's report (``harness.report.page``: its style and Content-Security-
Policy, the plot inline); the links to the points' pages are relative, followed only on a click.
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from harness.report import REPORT_FILE, look, page
from harness.report.build import Written
from harness.report.data import _register_entries
from harness.results import atomic
from harness.results.records import SCENARIO_FILE
from harness.sweep.store import SweepDirectory
from harness.sweep.table import PLOT_FILE, TABLE_FILE, write_table_and_plot


def write_sweep_report(path: str | Path) -> Written:
    """Write sweep.csv, sweep.png and report.html of the sweep directory ``path``."""
    sweep = SweepDirectory.open(path)
    _register_labels(sweep)
    write_table_and_plot(sweep)
    return write_sweep_page(sweep)


def write_sweep_page(sweep: SweepDirectory) -> Written:
    """Write report.html of ``sweep`` from its sweep.csv and sweep.png, as written."""
    _register_labels(sweep)
    table = pd.read_csv(sweep.path / TABLE_FILE)
    plot = sweep.path / PLOT_FILE
    written = Written(sweep.path / REPORT_FILE, images=[plot] if plot.is_file() else [])
    atomic.write_text(written.html, sweep_html(sweep, table, plot.read_bytes() if plot.is_file() else None))
    return written


def _register_labels(sweep: SweepDirectory) -> None:
    """Know the labels of variant entries (``{name: X, algorithm: Y}``): a finished point's
    resolved scenario registers them, so the plot gives them their colours."""
    for point in sweep.points:
        resolved = sweep.point_dir(point["index"]) / SCENARIO_FILE
        if resolved.is_file():
            _register_entries(resolved)
            return


def sweep_html(sweep: SweepDirectory, table: pd.DataFrame, png: bytes | None) -> str:
    algorithms = list(dict.fromkeys(table["algorithm"])) if "algorithm" in table else []
    palette = look.palette(algorithms)
    statuses = {p["index"]: sweep.status(p["index"]) for p in sweep.points}
    done = sum(s.status == "done" for s in statuses.values())
    failed = sum(s.status == "failed" for s in statuses.values())
    kind = {"simulate": "simulations", "launch": "launches of a script"}.get(sweep.command, "real runs")
    name = sweep.spec.get("scenario_name", "sweep")
    values = {key: list(dict.fromkeys(str(p["values"][key]) for p in sweep.points)) for key in sweep.keys}
    facts = [
        ("scenario", f"{name} ({html.escape(str(sweep.spec['arguments'].get('scenario', '')))})"),
        (
            "points",
            f"{len(sweep.points)} {kind}: {done} done, {failed} failed, {len(sweep.points) - done - failed} not run",
        ),
        *((f"swept {html.escape(key)}", html.escape(", ".join(v))) for key, v in values.items()),
        ("overrides of every point", html.escape(" ".join(sweep.spec["arguments"].get("assignments") or []) or "none")),
        ("algorithms", "".join(page.algorithm_chip(a, palette) for a in algorithms) or "none finished"),
        ("created", html.escape(sweep.spec.get("created", ""))),
    ]
    header = (
        f'<h1>{html.escape(name)} <span class="id">{html.escape(sweep.path.name)}</span></h1>'
        f'<p class="sub">A sweep of {kind} (<code>python -m harness {sweep.command} --sweep</code>).</p>'
        '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
    )
    figure = (
        f'<figure><img src="{page.image_uri(png)}" alt="the sweep"><figcaption>Throughput (and time to the '
        "target accuracy, and to the target loss, where evaluated) against "
        f"{html.escape(sweep.keys[0])}, a line per algorithm; "
        "a column per value of the other swept keys. Also beside this page as "
        f"{PLOT_FILE}; every point's summary rows in {TABLE_FILE}.</figcaption></figure>"
        if png is not None
        else '<p class="absent">No point finished: nothing to plot.</p>'
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{page.CSP}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(name)} {html.escape(sweep.path.name)}: sweep report</title>"
        f"<style>{page.CSS}</style></head>\n<body><main>{header}"
        f'<h2 id="plot">The sweep</h2>{figure}'
        f'<h2 id="points">Points</h2>{_points_table(sweep, table, statuses, algorithms, palette)}'
        "<footer><code>python -m harness report DIR</code> redraws this page; "
        f"<code>python -m harness {sweep.command} --resume DIR</code> runs the points not done."
        "</footer></main></body></html>\n"
    )


def _points_table(
    sweep: SweepDirectory, table: pd.DataFrame, statuses, algorithms: list[str], palette: look.Palette
) -> str:
    metrics = [("samples/s", "samples_per_s", ",.0f")]  # (header, summary column, format) per algorithm
    metrics += [
        (header, column, ".3f")
        for header, column in (("to target s", "time_to_target_s"), ("to target loss s", "time_to_target_loss_s"))
        if column in table and table[column].notna().any()
    ]
    head = [
        "point",
        *sweep.keys,
        "status",
        *(f"{palette.label(a)} {header}" for a in algorithms for header, _, _ in metrics),
        "report",
    ]
    rows = []
    for point in sweep.points:
        index, status = point["index"], statuses[point["index"]]
        cells = [str(index), *(html.escape(str(point["values"][k])) for k in sweep.keys)]
        state = html.escape(status.status)
        if status.status == "failed":
            state += f": {html.escape(sweep.last_error(index) or status.error or '')}"
        cells.append(state)
        mine = table[table["point"] == index] if "point" in table else table.iloc[0:0]
        for algorithm in algorithms:
            for _, column, spec in metrics:
                value = mine.loc[mine["algorithm"] == algorithm, column]
                cells.append(format(value.iloc[0], spec) if len(value) and pd.notna(value.iloc[0]) else "")
        report = sweep.point_dir(index) / REPORT_FILE
        link = f"points/{report.parent.name}/{REPORT_FILE}"
        cells.append(f'<a href="{html.escape(link)}">page</a>' if report.is_file() else "")
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (
        '<div class="scroll"><table class="data"><thead><tr>'
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></div>"
    )
