"""The HTML page: a header that says what ran, the summary table, then each section's figure as an
inline PNG (a base64 ``data:`` URI) or the reason it has none.

Self-contained: inline CSS, no script, no font, no external reference; a Content-Security-Policy
forbids the browser any fetch but ``data:`` images.
"""

from __future__ import annotations

import base64
import html
import math

import pandas as pd

from harness import __version__
from harness.report import look
from harness.report.data import RunData
from harness.results.summary import _footnotes, _table_labels, loss_columns, loss_footnotes

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; color: #222;
       background: #f4f5f7; margin: 0; }
main { max-width: 1140px; margin: 0 auto; padding: 24px 28px 48px; background: #fff; min-height: 100vh; }
h1 { font-size: 26px; margin: 0 0 4px; }
h1 .id { color: #777; font-weight: normal; font-size: 18px; }
h2 { font-size: 19px; margin: 34px 0 8px; padding-bottom: 4px; border-bottom: 1px solid #ddd; }
p.sub { margin: 0 0 14px; color: #555; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 3px 16px; margin: 12px 0; font-size: 14px; }
dl.facts dt { color: #666; } dl.facts dd { margin: 0; }
.chip { display: inline-block; width: 11px; height: 11px; border-radius: 2px; margin-right: 6px;
        vertical-align: -1px; border: 1px solid rgba(0,0,0,.25); }
.algo { white-space: nowrap; margin-right: 14px; }
nav { font-size: 14px; margin: 10px 0 0; } nav a { margin-right: 14px; color: #2a5db0; text-decoration: none; }
div.scroll { overflow-x: auto; }
table.data { border-collapse: collapse; font-size: 13px; margin: 6px 0; font-variant-numeric: tabular-nums; }
table.data th, table.data td { padding: 4px 7px; border-bottom: 1px solid #e3e3e3; text-align: right; }
table.data th { background: #f0f2f5; font-weight: 600; font-size: 12px; vertical-align: bottom; }
table.data td:first-child, table.data th:first-child { text-align: left; white-space: nowrap; }
table.data tbody tr:hover { background: #f7f9fc; }
.note { font-size: 12.5px; color: #555; margin: 4px 0; max-width: 1000px; }
.absent { background: #f6f6f6; border-left: 4px solid #bbb; padding: 10px 14px; color: #444; font-size: 14px; }
.warn { background: #fff4e5; border-left: 4px solid #e69500; padding: 10px 14px; font-size: 14px; }
figure { margin: 8px 0; } figure img { max-width: 100%; height: auto; display: block; }
figcaption { font-size: 13px; color: #555; margin-top: 4px; max-width: 1000px; }
footer { margin-top: 36px; font-size: 12px; color: #777; }
"""


def image_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def algorithm_chip(algorithm: str, palette: look.Palette) -> str:
    return (
        f'<span class="algo"><span class="chip" style="background:{html.escape(palette.colour(algorithm))}">'
        f"</span>{html.escape(palette.label(algorithm))}</span>"
    )


def header_html(run: RunData, palette: look.Palette) -> str:
    """Title (scenario, run id), what kind of run, and its facts: date, ranks, algorithms..."""
    meta, scenario = run.meta, run.scenario
    kind = "real run"
    if run.simulated:
        kind = f"simulation ({meta.get('mode', 'predictive')} mode"
        kind += f", {meta['reading']} reading)" if meta.get("reading") else ")"
    workload = scenario.get("workload") or {}
    facts = [
        ("started", str(meta.get("started_at") or "-").replace("T", " ").replace("+00:00", " UTC")),
        ("status", str(meta.get("status", "-"))),
        (
            "ranks",
            f"{run.ranks if run.ranks is not None else '-'}"
            + (f" on {meta['hosts']} hosts" if int(meta.get("hosts") or 1) > 1 else ""),
        ),
        (
            "workload",
            ", ".join(
                str(x)
                for x in (
                    f"{workload.get('model')} on {workload.get('dataset')}" if workload.get("model") else None,
                    f"{workload.get('compute')} compute" if workload.get("compute") else None,
                    f"batch {workload.get('batch_size')} per rank" if workload.get("batch_size") else None,
                    f"{workload.get('iterations')} iterations" if workload.get("iterations") else None,
                )
                if x
            )
            or "-",
        ),
    ]
    if meta.get("device"):
        facts.append(("device", str(meta["device"])))
    if run.simulated:
        facts.append(("calibration", str(meta.get("calibration") or "default network")))
    facts.append(("directory", str(run.path)))
    algorithms = "".join(algorithm_chip(a, palette) for a in run.algorithms) or "none finished"
    facts.insert(3, ("algorithms", algorithms))
    rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{v if k == 'algorithms' else html.escape(v)}</dd>" for k, v in facts)
    description = scenario.get("description")
    description = f'<p class="sub">{html.escape(str(description))}</p>' if description else ""
    warn = ""
    if meta.get("status") not in (None, "complete"):
        why = meta.get("error") or meta.get("stopped") or "not every algorithm finished"
        warn = (
            f'<p class="warn">This run is <b>{html.escape(str(meta.get("status")))}</b>: {html.escape(str(why))}. '
            "The page shows the algorithms that finished.</p>"
        )
    return (
        f'<h1>{html.escape(run.name)} <span class="id">{html.escape(run.run_id)} · {html.escape(kind)}</span></h1>'
        f'{description}<dl class="facts">{rows}</dl>{warn}'
    )


def _cell(value, spec: str, scale: float = 1.0) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(value) else format(value * scale, spec)


def summary_html(summary: pd.DataFrame, palette: look.Palette) -> str:
    """summary.csv as summary.txt shows it (its columns and footnotes), with each algorithm's colour."""
    if summary.empty:
        return '<p class="absent">No summary: no algorithm finished (summary.csv has no rows).</p>'
    vs, to_target, target = _table_labels(summary)
    before, after = loss_columns(summary)  # shown with a target loss, or losses without accuracy
    columns = [  # (header, column, format, scale)
        ("samples/s", "samples_per_s", ",.1f", 1),
        (vs, "throughput_vs_baseline", ".2f", 1),
        ("iter median ms", "iter_time_median_s", ".2f", 1e3),
        ("iter p95 ms", "iter_time_p95_s", ".2f", 1e3),
        ("compute %", "compute_fraction", ".1f", 100),
        ("waiting %", "wait_fraction", ".1f", 100),
        ("injected %", "injected_fraction", ".1f", 100),
        *((h, c, f, 1) for h, c, f in before),
        ("acc avg %", "final_accuracy", ".2f", 100),
        ("acc r0 %", "final_accuracy_rank0", ".2f", 100),
        (to_target, "time_to_target_s", ".3f", 1),
        *((h, c, f, 1) for h, c, f in after),
        ("consensus", "final_consensus_distance", ".3g", 1),
    ]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["algorithm", "ranks", *(c[0] for c in columns), "complete"])
    body = []
    for row in summary.to_dict("records"):
        cells = [algorithm_chip(str(row["algorithm"]), palette), str(row.get("ranks", "-"))]
        cells += [_cell(row.get(column), spec, scale) for _, column, spec, scale in columns]
        cells.append("yes" if row.get("complete") else "no")
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    notes = "".join(
        f'<p class="note">{html.escape(n)}</p>' for n in [*_footnotes(vs, to_target, target), *loss_footnotes(summary)]
    )
    notes += '<p class="note">compute %: share of iteration time computing. Every column: summary.csv.</p>'
    return (
        f'<div class="scroll"><table class="data"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
        f"</table></div>{notes}"
    )


def section_html(section: look.Section, png: bytes | None) -> str:
    parts = [f'<h2 id="{html.escape(section.key)}">{html.escape(section.title)}</h2>']
    if png is not None:
        parts.append(
            f'<figure><img src="{image_uri(png)}" alt="{html.escape(section.title)}">'
            f"<figcaption>{html.escape(section.caption)}</figcaption></figure>"
        )
    elif section.absent:
        parts.append(f'<p class="absent">{html.escape(section.absent)}</p>')
    elif section.caption:
        parts.append(f'<p class="note">{html.escape(section.caption)}</p>')
    parts.append(section.html)
    return "".join(parts)


def page_html(
    run: RunData, palette: look.Palette, sections: list[tuple[look.Section, bytes | None]], files: list[str]
) -> str:
    """The whole page: header, summary table, ``sections`` (each with its PNG or None)."""
    title = f"{run.name} {run.run_id}: report"
    nav = "".join(
        f'<a href="#{html.escape(s.key)}">{html.escape(s.title)}</a>'
        for s, _ in [(look.Section("summary", "Summary"), None), *sections]
    )
    body = "".join(section_html(s, png) for s, png in sections)
    footer = (
        f"Written by harness {html.escape(__version__)} (<code>python -m harness report DIR</code> redraws it). "
        f"The figures are also beside this page as {html.escape(', '.join(files)) or 'no files'}; the data "
        "in the directory's CSV files (results/README.md)."
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head>\n"
        f"<body><main>{header_html(run, palette)}<nav>{nav}</nav>"
        f'<h2 id="summary">Summary</h2>{summary_html(run.summary, palette)}{body}'
        f"<footer>{footer}</footer></main></body></html>\n"
    )
