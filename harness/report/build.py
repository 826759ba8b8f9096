"""Writing a run directory's report: each section drawn, its PNG saved, the page assembled.

The sections, in page order, are the plot modules' :func:`section` functions; each returns a
:class:`~harness.report.look.Section` with a figure or the reason it has none. A section that
fails to draw says so in its place on the page and in :attr:`Written.failed`; the others are
still drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.report import REPORT_FILE, accuracy, iteration_times, look, page, real_vs_sim, throughput, timeline
from harness.report.data import RunData, load_run
from harness.results import atomic

SECTIONS = (accuracy, throughput, iteration_times, timeline, real_vs_sim)


def image_file(key: str) -> str:
    """The PNG beside the page of the section ``key``: ``report_<key>.png``."""
    return f"report_{key}.png"


@dataclass
class Written:
    """What :func:`write_report` wrote."""

    html: Path
    images: list[Path] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # "<section>: <error>" per section that could not be drawn


def draw_sections(run: RunData, palette: look.Palette) -> list[tuple[look.Section, bytes | None, str | None]]:
    """Every section of ``run`` with its PNG (None when it has no figure) and the error that kept
    it from being drawn (None when none did)."""
    out: list[tuple[look.Section, bytes | None, str | None]] = []
    with look.rc():
        for module in SECTIONS:
            try:
                section = module.section(run, palette)
                png = look.png_bytes(section.figure) if section.figure is not None else None
                out.append((section, png, None))
            except Exception as exc:  # noqa: BLE001  (a plot's bug must not cost the other plots)
                problem = f"{type(exc).__name__}: {exc}"
                out.append(
                    (
                        look.Section(module.KEY, module.TITLE, absent=f"This plot could not be drawn: {problem}"),
                        None,
                        problem,
                    )
                )
    return out


def write_report(path: str | Path) -> Written:
    """Write ``report.html`` and its ``report_<section>.png`` files into the run directory at
    ``path``; a PNG left from an earlier report whose section now has no figure is removed.
    :class:`~harness.report.data.NotResultsError` when ``path`` is not a run directory."""
    run = load_run(path)
    compared = list(run.compare["algorithm"]) if run.compare is not None and "algorithm" in run.compare else []
    palette = look.palette(list(dict.fromkeys([*run.algorithms, *compared])))
    drawn = draw_sections(run, palette)
    written = Written(run.path / REPORT_FILE)
    for section, png, problem in drawn:
        target = run.path / image_file(section.key)
        if png is not None:
            atomic.write_bytes(target, png)
            written.images.append(target)
        elif target.exists():
            target.unlink()
        if problem is not None:
            written.failed.append(f"{section.key}: {problem}")
    text = page.page_html(run, palette, [(s, png) for s, png, _ in drawn], [p.name for p in written.images])
    atomic.write_text(written.html, text)
    return written
