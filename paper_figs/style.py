"""The shared look of every figure: one colour and label per algorithm, readable fonts, and
one way to save a figure together with the data it plots.

Example::

    from paper_figs import style

    style.setup()
    fig, ax = plt.subplots()
    ax.plot(x, y, color=style.color("wagma"), label=style.label("wagma"))
    style.save(fig, table, out_dir, "fig1_wagma_throughput")
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.results import atomic  # noqa: E402

# Fixed order and colours, so an algorithm looks the same in every figure (tab20 pairs, the
# synchronous baseline in black).
ALGORITHMS = (
    "allreduce_sgd", "local_sgd", "overlap_local_sgd", "easgd", "cocod_sgd", "bmuf",
    "sgp", "osgp", "dpsgd", "adpsgd", "wagma", "eager_sgd", "eager_sgd_solo", "eager_sgd_majority",
)
_COLORS = {
    "allreduce_sgd": "#000000",
    "local_sgd": "#1f77b4",
    "overlap_local_sgd": "#aec7e8",
    "easgd": "#17becf",
    "cocod_sgd": "#9edae5",
    "bmuf": "#7f7f7f",
    "sgp": "#2ca02c",
    "osgp": "#98df8a",
    "dpsgd": "#8c564b",
    "adpsgd": "#c49c94",
    "wagma": "#d62728",
    "eager_sgd": "#ff7f0e",
    "eager_sgd_solo": "#ffbb78",
    "eager_sgd_majority": "#ff7f0e",
}
_LABELS = {
    "allreduce_sgd": "Allreduce-SGD",
    "local_sgd": "Local SGD",
    "overlap_local_sgd": "Overlap Local SGD",
    "easgd": "EASGD",
    "cocod_sgd": "CoCoD-SGD",
    "bmuf": "BMUF",
    "sgp": "SGP",
    "osgp": "1-OSGP",
    "dpsgd": "D-PSGD",
    "adpsgd": "AD-PSGD",
    "wagma": "WAGMA-SGD",
    "eager_sgd": "eager-SGD",
    "eager_sgd_solo": "eager-SGD (solo)",
    "eager_sgd_majority": "eager-SGD (majority)",
}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p", "d", "8")


def ordered(algorithms) -> list[str]:
    """``algorithms`` in the fixed order of :data:`ALGORITHMS`, unknown names last (sorted)."""
    present = set(algorithms)
    known = [a for a in ALGORITHMS if a in present]
    return known + sorted(present - set(known))


def color(algorithm: str) -> str:
    """The algorithm's colour (grey for a name not in :data:`ALGORITHMS`)."""
    return _COLORS.get(algorithm, "#bcbd22")


def label(algorithm: str) -> str:
    """The algorithm's display name (the name itself when unknown)."""
    return _LABELS.get(algorithm, algorithm)


def marker(algorithm: str) -> str:
    return MARKERS[ALGORITHMS.index(algorithm) % len(MARKERS)] if algorithm in ALGORITHMS else "o"


def setup() -> None:
    """Readable defaults for every figure."""
    plt.rcParams.update({
        "font.size": 11,
        "axes.titlesize": 12,
        "axes.labelsize": 11,
        "legend.fontsize": 9,
        "figure.dpi": 110,
        "axes.grid": True,
        "grid.alpha": 0.3,
    })


def save(fig, table: pd.DataFrame, out_dir: Path, name: str) -> tuple[Path, Path]:
    """Write ``<name>.png`` and ``<name>.csv`` (the plotted data) atomically; close the figure."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png, csv = out_dir / f"{name}.png", out_dir / f"{name}.csv"
    fig.tight_layout()
    with atomic.atomic_open(png, "wb") as handle:
        fig.savefig(handle, format="png")
    plt.close(fig)
    atomic.write_csv(csv, table)
    return png, csv


def plotted(fig) -> pd.DataFrame:
    """The points a figure draws, as (panel, series, x, y): for checking a figure against its CSV.

    ``panel`` is the axis index in ``fig.axes``; ``series`` the artist's label. Lines and
    scatter plots are read; artists whose label starts with ``_`` (matplotlib's unlabelled
    ones, reference lines drawn with such a label) are skipped.
    """
    rows = []
    for panel, ax in enumerate(fig.axes):
        for line in ax.get_lines():
            if not line.get_label().startswith("_"):
                rows += [(panel, line.get_label(), float(x), float(y)) for x, y in zip(line.get_xdata(), line.get_ydata())]
        for collection in ax.collections:
            name = collection.get_label()
            if name.startswith("_") or not hasattr(collection, "get_offsets"):
                continue
            rows += [(panel, name, float(x), float(y)) for x, y in collection.get_offsets()]
    return pd.DataFrame(rows, columns=["panel", "series", "x", "y"])
