"""Figure scripts on real runs (the session fixture ``figure_results``): what a figure draws is
exactly its table, and saving writes a PNG plus a CSV that reads back equal."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.report import style
from paper_figs import fig3_overlap_local_sgd as fig3
from paper_figs import fig6_timeline as fig6


def _sorted(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    frame = frame[columns].copy()
    frame["panel"] = frame["panel"].astype(int)
    frame["series"] = frame["series"].astype(str)
    for column in columns[2:]:
        frame[column] = frame[column].astype(float)
    return frame.sort_values(columns).reset_index(drop=True)


def _assert_same(drawn: pd.DataFrame, table: pd.DataFrame, columns: list[str]) -> None:
    assert len(drawn) == len(table) > 0
    pd.testing.assert_frame_equal(_sorted(drawn, columns), _sorted(table, columns), check_exact=False,
                                  rtol=1e-9, atol=1e-9)


def _assert_saved(fig, table: pd.DataFrame, tmp_path: Path, name: str) -> None:
    png, csv = style.save(fig, table, tmp_path, name)
    assert png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    back = pd.read_csv(csv)
    assert list(back.columns) == list(table.columns)
    pd.testing.assert_frame_equal(back, table.reset_index(drop=True), check_dtype=False, check_exact=False,
                                  rtol=1e-12)


@pytest.mark.mpi
def test_fig3_draws_its_table(figure_results, tmp_path):
    fig, table = fig3.draw({"slow_link": figure_results["slow_link"]})
    assert {"panel", "series", "x", "y"} <= set(table.columns)
    _assert_same(style.plotted(fig), table, ["panel", "series", "x", "y"])
    # The quick slow_link run has every algorithm, so all six methods are drawn in both panels.
    assert set(table["algorithm"]) == set(fig3.algorithms())
    assert set(table["panel"]) == {0, 1}
    assert table["y"].between(0, 100).all()
    assert (table.loc[table["panel"] == 0, "x"] > 0).all()
    # Epochs: iteration x ranks x batch / training samples, increasing with the iteration.
    epochs = table[table["panel"] == 1]
    assert np.allclose(epochs["x"], epochs["iteration"] * 4 * 32 / epochs["train_samples"])
    # The legend hides no data: it sits beside the axes, inside the image.
    fig.tight_layout()
    fig.canvas.draw()
    (legend,) = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    box = legend.get_window_extent()
    assert not any(box.overlaps(ax.get_window_extent()) for ax in fig.axes)
    assert box.x1 <= fig.bbox.x1 + 1
    _assert_saved(fig, table, tmp_path, fig3.NAME)


@pytest.mark.mpi
def test_fig3_without_shards_uses_samples(figure_results, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(figure_results["slow_link"], run, ignore=shutil.ignore_patterns("provenance", "sim-*"))
    fig, table = fig3.draw({"slow_link": run})
    part = table[table["panel"] == 1]
    assert np.allclose(part["x"], part["samples"] / 1000.0)
    assert "samples" in fig.axes[1].get_xlabel()
    _assert_same(style.plotted(fig), table, ["panel", "series", "x", "y"])


@pytest.mark.mpi
def test_fig6_draws_its_table(figure_results, tmp_path):
    fig, table = fig6.draw({"straggler": figure_results["straggler"]})
    assert list(table.columns) == fig6.COLUMNS
    _assert_same(fig6.bars(fig), table, ["panel", "series", "x", "y", "width"])
    assert style.plotted(fig).empty  # bars only; iteration ends are unlabelled reference marks
    assert set(table["algorithm"]) == {"allreduce_sgd", "wagma"}
    assert set(table["series"]) <= set(fig6.KINDS)
    assert (table["width"] > 0).all()
    # 12 iterations: the 5-iteration window is moved back to end at the last one.
    assert sorted(set(table["iteration"])) == [7, 8, 9, 10, 11]
    # Both panels start at 0 ms and every rank has a row.
    for panel in (0, 1):
        part = table[table["panel"] == panel]
        assert part["x"].min() == pytest.approx(0.0, abs=50.0)
        assert set(part["y"]) == {0, 1, 2, 3}
    _assert_saved(fig, table, tmp_path, fig6.NAME)


@pytest.mark.mpi
def test_fig6_names_a_missing_algorithm(figure_results, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(figure_results["straggler"], run, ignore=shutil.ignore_patterns("provenance", "sim-*"))
    for name in ("steps.csv", "evals.csv", "comm_ops.csv"):
        frame = pd.read_csv(run / name)
        frame[frame["algorithm"] != "wagma"].to_csv(run / name, index=False)
    with pytest.raises(ValueError, match="wagma"):
        fig6.draw({"straggler": run})
