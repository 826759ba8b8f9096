"""``report.html``: written by ``run`` and ``simulate``, rewritten by ``python -m harness report``;
self-contained (inline PNGs, nothing fetched), and what headless Chromium shows of it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import harness_cli, write_scenario_file
from harness.cli import main as harness_main
from harness.report import after_command, build, iteration_times, write_report

SECTIONS = ("summary", "accuracy", "throughput", "iteration_times", "timeline", "real_vs_sim")
FIGURES = ("accuracy", "throughput", "iteration_times", "timeline", "real_vs_sim")

# Emulated compute on 40 ranks: simulated on the default network (no calibration file in the
# working directory), more ranks than a panel shows boxes (32) or timeline rows (16).
SIMULATED = {
    "name": "reportsim",
    "ranks": 40,
    "seed": 3,
    "workload": {"model": "mlp", "dataset": "digits", "batch_size": 8, "iterations": 6,
                 "compute": {"emulate_ms": 2}, "params": 1000},
    "algorithms": ["allreduce_sgd", {"name": "local_sgd", "period": 2}],
    "imbalance": [{"kind": "fixed", "ranks": [1], "delay_ms": 10}],
}


def page_of(run: Path) -> str:
    return (run / "report.html").read_text(encoding="utf-8")


def assert_self_contained(text: str) -> None:
    """Every src/href is a data: URI or an anchor on the page; no URL of any scheme to fetch."""
    assert "http://" not in text and "https://" not in text and "file:" not in text
    for attribute in re.findall(r"""\b(?:src|href)\s*=\s*["']([^"']*)""", text):
        assert attribute.startswith(("data:image/png;base64,", "#")), attribute[:80]
    assert "@import" not in text and "url(" not in text and "<script" not in text and "<link" not in text


def assert_images(run: Path, text: str, keys) -> None:
    assert text.count('<img src="data:image/png;base64,') == len(keys)
    for key in keys:
        png = run / build.image_file(key)
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", key
        assert png.name in text  # the page names the files beside it


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    tmp = tmp_path_factory.mktemp("simulated")
    scenario = write_scenario_file(tmp, SIMULATED)
    proc = harness_cli("simulate", str(scenario), "--out", str(tmp / "out"), cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp / "out" / "reportsim").iterdir()
    return proc, run


@pytest.fixture(scope="module")
def real_copy(figure_results, tmp_path_factory) -> Path:
    """A copy of the quick straggler run (4 ranks, every algorithm; ``compare`` applied) of the
    session's ``figure_results``, without its provenance and trace: this file rewrites its report."""
    copy = tmp_path_factory.mktemp("real") / figure_results["straggler"].name
    shutil.copytree(figure_results["straggler"], copy, ignore=shutil.ignore_patterns("provenance", "trace.json"))
    return copy


@pytest.mark.mpi
def test_run_writes_the_report_and_report_rewrites_it_with_the_comparison(figure_results, real_copy, capsys) -> None:
    # `run` wrote it as it ended, and `compare`, which ran after, wrote it again with real against simulated.
    original = page_of(figure_results["straggler"])
    assert 'id="real_vs_sim"' in original and "python -m harness compare DIR" not in original
    assert_images(figure_results["straggler"], original, FIGURES)

    assert harness_main(["report", str(real_copy)]) == 0
    assert capsys.readouterr().out == f"report: {real_copy / 'report.html'}\n"
    text = page_of(real_copy)
    assert_self_contained(text)
    assert_images(real_copy, text, FIGURES)
    for key in SECTIONS:
        assert f'id="{key}"' in text, key
    assert "<h1>straggler " in text and "real run" in text and "Content-Security-Policy" in text
    for label in ("Allreduce-SGD", "WAGMA-SGD", "AD-PSGD"):  # the registry's labels, in the table and legend
        assert label in text
    assert "#d62728" in text  # WAGMA-SGD's registered colour on its chip
    assert "could not be drawn" not in text and 'class="absent"' not in text


@pytest.mark.subprocess
def test_simulate_writes_a_report_that_says_what_a_simulation_lacks(simulated) -> None:
    proc, run = simulated
    assert f"report: {run / 'report.html'}\n" in proc.stdout
    text = page_of(run)
    assert_self_contained(text)
    assert_images(run, text, ("throughput", "iteration_times", "timeline"))
    assert not (run / build.image_file("accuracy")).exists() and not (run / build.image_file("real_vs_sim")).exists()
    for key in SECTIONS:
        assert f'id="{key}"' in text, key
    assert "simulation (predictive mode" in text
    assert "No accuracy: this simulation carried no values" in text  # said instead of an empty plot
    assert "This directory is a simulation" in text
    assert "32 evenly spaced ranks are shown" in text and "every rank below 16" in text


def test_many_ranks_are_sampled_evenly_first_and_last_kept() -> None:
    shown = iteration_times.shown_ranks(range(1024))
    assert len(shown) == iteration_times.MAX_RANKS and shown[0] == 0 and shown[-1] == 1023
    assert np.all(np.diff(shown) > 0)
    assert iteration_times.shown_ranks([3, 1, 2]) == [1, 2, 3]


@pytest.mark.subprocess
def test_a_plot_that_fails_costs_only_its_section(simulated, tmp_path, monkeypatch, capsys) -> None:
    copy = tmp_path / "run"
    shutil.copytree(simulated[1], copy)

    def broken(run, palette):
        raise RuntimeError("no ink")

    monkeypatch.setattr(iteration_times, "section", broken)
    written = write_report(copy)
    assert written.failed == ["iteration_times: RuntimeError: no ink"]
    text = page_of(copy)
    assert "This plot could not be drawn: RuntimeError: no ink" in text
    assert not (copy / build.image_file("iteration_times")).exists()  # the earlier report's PNG is gone
    assert (copy / build.image_file("timeline")).is_file()
    assert harness_main(["report", str(copy)]) == 1
    assert capsys.readouterr().err == "error: plot iteration_times: RuntimeError: no ink\n"


@pytest.mark.subprocess
def test_a_report_that_cannot_be_written_only_warns_after_a_run(simulated, tmp_path, monkeypatch, capsys) -> None:
    assert after_command(tmp_path) == 0  # not a results directory: the run's status stands
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("warning: no report written: NotResultsError: ") and err.count("\n") == 1
    assert after_command(tmp_path, 1) == 1 and capsys.readouterr() == ("", "")  # a failed run: no report

    monkeypatch.setattr(build, "draw_sections", lambda run, palette: 1 / 0)
    assert after_command(simulated[1]) == 0
    assert capsys.readouterr().err == "warning: no report written: ZeroDivisionError: division by zero\n"


# -- what a browser shows ------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")
# Run in a copy of the page without its Content-Security-Policy (which would block a fetch before
# it is made): after the load, it records on <body> the images that did not decode and every
# resource the page fetched.
PROBE = """<script>window.addEventListener("load", () => {
  const images = [...document.images];
  document.body.dataset.images = images.length;
  const broken = images.filter(i => !(i.complete && i.naturalWidth > 0));
  document.body.dataset.broken = JSON.stringify(broken.map(i => i.alt));
  document.body.dataset.fetched = JSON.stringify(performance.getEntriesByType("resource").map(e => e.name));
});</script>"""


def chromium() -> str:
    """The browser; skips where it is absent (.ci/provision.sh installs it as root)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: .ci/provision.sh installs it (as root, with apt-get)")
    return CHROMIUM


def page_requests(net_log: Path) -> list[str]:
    """URLs the page itself requested (its frame's network isolation key is file://), from a
    Chromium net log; the browser's own background requests (update checks...) are not the page's."""
    text = net_log.read_text(encoding="utf-8")
    try:
        log = json.loads(text)
    except ValueError:  # a log the browser did not close
        log = json.loads(text.rstrip().rstrip(",") + "]}")
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [e["params"]["url"] for e in log["events"]
            if e["type"] == start and "file://" in e.get("params", {}).get("network_isolation_key", "")]


def check_in_chromium(report: Path, tmp_path: Path, images: int, plots_below: int = 1200,
                      coloured: float = 0.002) -> None:
    """Headless Chromium shows ``report`` (a screenshot with ink below ``plots_below`` pixels, and
    at least the share ``coloured`` of coloured pixels there), decodes its ``images`` images, and
    neither the page nor its images fetch anything."""
    from PIL import Image

    browser = chromium()
    shot = tmp_path / "shot.png"
    proc = subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile1'}", f"--screenshot={shot}",
                           "--window-size=1200,2000", report.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert pixels.shape[:2] == (2000, 1200)
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # text, table, plots: not one blank colour
    lower = pixels[plots_below:]  # below the header (and a run's summary table): the first plots
    assert (lower.min(axis=2) < 200).mean() > 0.02  # ink there, not a blank page
    saturated = (lower.max(axis=2) - lower.min(axis=2)) > 80  # coloured lines and bars
    assert saturated.mean() > coloured

    probe = report.with_name("probe.html")
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", report.read_text(encoding="utf-8"))
    probe.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    net_log = tmp_path / "net.json"
    proc = subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile2'}",
                           f"--log-net-log={net_log}", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                          capture_output=True, text=True, timeout=120)
    probe.unlink()
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", proc.stdout)
    assert body is not None, proc.stdout[:2000]
    found = {k: v.replace("&quot;", '"') for k, v in re.findall(r'data-(\w+)="([^"]*)"', body.group(1))}
    assert found.get("images") == str(images), found
    assert json.loads(found["broken"]) == [] and json.loads(found["fetched"]) == []
    assert page_requests(net_log) == []


@pytest.mark.mpi
def test_chromium_shows_every_plot_and_fetches_nothing(real_copy, tmp_path) -> None:
    report = real_copy / "report.html"
    if not report.exists():
        write_report(real_copy)
    check_in_chromium(report, tmp_path, len(FIGURES))


@pytest.mark.subprocess
def test_chromium_shows_a_simulations_page(simulated, tmp_path) -> None:
    _, run = simulated
    check_in_chromium(run / "report.html", tmp_path, images=3, plots_below=700)
