"""``report.html``: a self-contained page of a run directory's results, with its plots as PNGs.

``python -m harness run`` and ``simulate`` end by writing it (:func:`after_command`), and
``python -m harness report DIR`` rewrites it. The modules, one job each:

- ``data``: a results directory read into pandas frames (:func:`~harness.report.data.load_run`);
- ``look``: colours and labels per algorithm (the registry's, as in every figure), figure style;
- ``accuracy``, ``throughput``, ``iteration_times``, ``timeline``, ``real_vs_sim``: one plot
  each, a ``figure(frames...)`` that draws and a ``section(run)`` that says what it shows or why
  it has nothing to show (a sweep page can call the ``figure`` functions on its own frames);
- ``page``: the HTML (images inline as base64 ``data:`` URIs, no network);
- ``build``: draws the sections and writes ``report.html`` and ``report_<section>.png``.

Imported lazily: this module itself loads neither pandas nor matplotlib.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPORT_FILE = "report.html"


def write_report(path: str | Path):
    """Write the report of the run directory ``path`` (:func:`harness.report.build.write_report`).
    A sweep directory's page is ``harness.sweep.page``'s (which builds on this package; the
    ``report`` command picks between the two)."""
    from harness.report.build import write_report as write  # noqa: PLC0415  (lazy: pandas and matplotlib)

    return write(path)


def after_command(path: str | Path, status: int = 0) -> int:
    """End of ``run`` and ``simulate``: when ``status`` is 0, write the report of ``path`` and
    print ``report: PATH``; a report that cannot be drawn only prints a one-line warning (the run
    itself succeeded). Returns ``status``."""
    if status != 0:
        return status
    try:
        written = write_report(path)
    except Exception as exc:  # noqa: BLE001  (whatever broke, the run's results are written)
        print(f"warning: no report written: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return status
    print(f"report: {written.html}", flush=True)
    if written.failed:
        print(
            f"warning: the report lacks {len(written.failed)} plot(s): {'; '.join(written.failed)}".splitlines()[0],
            file=sys.stderr,
        )
    return status
