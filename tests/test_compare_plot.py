"""``compare.png``: every algorithm findable, no label printed over another or over the points."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.report import style  # noqa: E402
from harness.sim.compare import MODES, comparison_figure, plot_comparison  # noqa: E402

ALGORITHMS = ("allreduce_sgd", "local_sgd", "overlap_local_sgd", "easgd", "cocod_sgd", "bmuf", "sgp", "osgp",
              "dpsgd", "adpsgd", "wagma", "eager_sgd")


def _clustered_table() -> pd.DataFrame:
    """Twelve algorithms within 3% of one another on the diagonal, as a real run's points are."""
    rows = []
    for i, algorithm in enumerate(ALGORITHMS):
        for mode, bias in zip(MODES, (1.01, 0.97)):
            measured = 1000.0 + 2.5 * i
            rows.append({"algorithm": algorithm, "mode": mode, "measured_samples_per_s": measured,
                         "predicted_samples_per_s": measured * bias})
    return pd.DataFrame(rows)


def test_names_are_in_a_legend_beside_the_axes_not_on_the_points():
    fig = comparison_figure(_clustered_table(), "clustered")
    try:
        (ax,) = fig.axes
        assert len(ax.texts) == 0  # no per-point labels to overprint
        fig.canvas.draw()
        legend = ax.get_legend()
        labels = [t.get_text() for t in legend.get_texts()]
        assert labels == ["exact", "±10%", *MODES, *(style.label(a) for a in ALGORITHMS)]
        assert legend.get_window_extent().x0 >= ax.get_window_extent().x1  # outside the data
        assert legend.get_window_extent().x1 <= fig.bbox.x1 + 1  # and inside the image
    finally:
        plt.close(fig)


def test_each_algorithm_is_drawn_in_its_figure_colour_filled_for_trace(tmp_path):
    table = _clustered_table()
    fig = comparison_figure(table, "clustered")
    try:
        markers = [line for line in fig.axes[0].lines if line.get_marker() not in ("None", "")]
        assert len(markers) == len(table)
        wagma = [line for line in markers if line.get_color() == style.color("wagma")]
        assert sorted(line.get_fillstyle() for line in wagma) == ["full", "none"]
    finally:
        plt.close(fig)
    plot_comparison(table, tmp_path / "compare.png", "clustered")
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
