"""The shared look of every figure: one colour and label per algorithm, readable fonts, and
one way to save a figure together with the data it plots.

It is the library's, not the papers' alone: the report (``harness.report.look``), the plot of
``compare`` (``harness.sim.compare``) and the papers' figures (``paper_figs``) draw every
algorithm alike through it.

Labels and colours come from each algorithm's registration (``harness.algorithms.registry``),
so an algorithm registered there, built in or at run time, looks the same in every figure. A
scenario entry that runs a built-in under a label of its own (``{name: wagma_g2, algorithm:
wagma}``, ``harness.algorithms.variant``) is registered under its label when the scenario is
loaded: it is drawn in a colour of its own, labelled "WAGMA-SGD (wagma_g2)", right after the
algorithm it runs.

Example::

    from harness.report import style

    style.setup()
    fig, ax = plt.subplots()
    ax.plot(x, y, color=style.color("wagma"), label=style.label("wagma"))
    style.save(fig, table, out_dir, "fig1_wagma_throughput")
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt
import pandas as pd

from harness.algorithms import registry
from harness.results import atomic

# Series that are one algorithm under one setting (experiments.py's eager-SGD modes, which its
# sweeps list as variants; the SGP figure's network series): labelled after the algorithm, each
# in a colour of its own. They win over a variant registered under the same label, so a figure
# drawn from a sweep's CSV alone looks the same as one drawn where the sweep ran.
VARIANTS = {
    "eager_sgd_solo": ("eager_sgd", "solo", "#ffbb78"),
    "eager_sgd_majority": ("eager_sgd", "majority", "#ff7f0e"),
    "allreduce_sgd_hierarchical": ("allreduce_sgd", "hierarchical", "#7f7f7f"),
    "wagma_groups_in_nodes": ("wagma", "groups in nodes", "#d62728"),
    "wagma_groups_across_nodes": ("wagma", "groups across nodes", "#ff9896"),
}
UNKNOWN_COLOUR = "#bcbd22"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p", "d", "8")


def algorithms() -> list[str]:
    """Every series name figures know, in their fixed order: the registered algorithms (registry
    order: the synchronous baseline, then family by family), each followed by its
    :data:`VARIANTS`, then by the variants registered in this process (in the order they were)."""
    order = []
    for name in registry.names():
        order += [name, *(variant for variant, (base, _, _) in VARIANTS.items() if base == name)]
        order += [variant for variant in registry.variants(of=name) if variant not in VARIANTS]
    return order


def ordered(names) -> list[str]:
    """``names`` in the fixed order of :func:`algorithms`, unknown names last (sorted)."""
    present = set(names)
    known = [a for a in algorithms() if a in present]
    return known + sorted(present - set(known))


def _registration(algorithm: str) -> registry.Registration | None:
    """The registration of ``algorithm`` (an algorithm's or a variant's), None for a name no one registered."""
    return registry.registration(algorithm) if algorithm in (*registry.names(), *registry.variants()) else None


def color(algorithm: str) -> str:
    """The algorithm's colour from its registration (olive for a name no one registered)."""
    if algorithm in VARIANTS:
        return VARIANTS[algorithm][2]
    entry = _registration(algorithm)
    return entry.colour if entry is not None else UNKNOWN_COLOUR


def label(algorithm: str) -> str:
    """The algorithm's display name from its registration (the name itself when unknown)."""
    if algorithm in VARIANTS:
        base, setting, _ = VARIANTS[algorithm]
        return f"{label(base)} ({setting})"
    entry = _registration(algorithm)
    return entry.label if entry is not None else algorithm


def marker(algorithm: str) -> str:
    """The series' marker: markers cycle along the fixed order of the registered algorithms and
    :data:`VARIANTS` (a registered variant's follows on from the last: one algorithm's variants
    differ in marker as in colour); "o" for an unknown name."""
    known = [a for a in algorithms() if a in VARIANTS or a in registry.names()]
    if algorithm in known:
        return MARKERS[known.index(algorithm) % len(MARKERS)]
    if algorithm in registry.variants():
        return MARKERS[(len(known) + registry.variants().index(algorithm)) % len(MARKERS)]
    return "o"


def line(ax, algorithm: str, x, y, name: str | None = None, **kwargs):
    """Plot one algorithm's series on ``ax`` in its colour and marker, labelled with its name
    unless ``name`` is given (``kwargs``: matplotlib's, e.g. ``linewidth``); matplotlib's lines."""
    return ax.plot(
        x,
        y,
        color=color(algorithm),
        marker=marker(algorithm),
        label=label(algorithm) if name is None else name,
        **kwargs,
    )


def setup() -> None:
    """Readable defaults for every figure."""
    plt.rcParams.update(
        {
            "font.size": 11,
            "axes.titlesize": 12,
            "axes.labelsize": 11,
            "legend.fontsize": 9,
            "figure.dpi": 110,
            "axes.grid": True,
            "grid.alpha": 0.3,
        }
    )


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
                points = zip(line.get_xdata(), line.get_ydata())
                rows += [(panel, line.get_label(), float(x), float(y)) for x, y in points]
        for collection in ax.collections:
            name = collection.get_label()
            if name.startswith("_") or not hasattr(collection, "get_offsets"):
                continue
            rows += [(panel, name, float(x), float(y)) for x, y in collection.get_offsets()]
    return pd.DataFrame(rows, columns=["panel", "series", "x", "y"])
