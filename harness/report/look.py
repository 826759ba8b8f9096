"""The report's look: one colour and label per algorithm, the figure style, PNG bytes.

Colours and labels are the figures' (``harness.report.style``, from each algorithm's registration in
``harness.algorithms.registry``), so a method looks the same in the report as in every figure;
names nobody registered get distinct spare colours rather than one shared olive.

Figures are ``matplotlib.figure.Figure`` objects drawn by the Agg renderer without pyplot: no
window, no global figure list; the report's rcParams hold only inside :func:`rc`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only, never a window (harmless when pyplot is not imported)
from matplotlib.figure import Figure

from harness.report import style

# The parts of an iteration (steps.csv), as every plot shows them.
PART_COLUMNS = {"compute": "compute_s", "waiting": "comm_blocked_s", "injected delay": "injected_delay_s"}
PART_COLOURS = {"compute": "#4c72b0", "waiting": "#dd8452", "injected delay": "#9a9a9a", "other": "#e6e6e6"}
SPARE = (
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#5254a3",
    "#8ca252",
    "#bd9e39",
    "#ad494a",
    "#a55194",
    "#6b6ecf",
    "#b5cf6b",
    "#e7ba52",
    "#d6616b",
    "#ce6dbd",
)
RC = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
DPI = 100


@dataclass(frozen=True)
class Palette:
    """Colour and label of every algorithm of a report."""

    colours: dict[str, str]
    labels: dict[str, str]

    def colour(self, algorithm: str) -> str:
        return self.colours.get(algorithm, style.UNKNOWN_COLOUR)

    def label(self, algorithm: str) -> str:
        return self.labels.get(algorithm, algorithm)


def palette(algorithms) -> Palette:
    """The registered colour and label of each of ``algorithms``; a spare colour for a name whose
    colour another of them already has (unregistered names all share olive in ``style``)."""
    colours: dict[str, str] = {}
    spare = iter(c for c in SPARE if c not in {style.color(a) for a in algorithms})
    for algorithm in algorithms:
        colour = style.color(algorithm)
        colours[algorithm] = next(spare, colour) if colour.lower() in {c.lower() for c in colours.values()} else colour
    return Palette(colours, {a: style.label(a) for a in algorithms})


@dataclass
class Section:
    """One part of the page: a figure (saved as ``report_<key>.png`` and shown inline), or the
    reason there is none (``absent``), with a caption and optional HTML beneath it."""

    key: str
    title: str
    figure: Figure | None = None
    caption: str = ""  # plain text
    absent: str | None = None  # plain text: why nothing is drawn
    html: str = ""  # trusted HTML (a table) after the figure


def rc():
    """The report's rcParams, for drawing and saving (``with look.rc(): ...``)."""
    return matplotlib.rc_context(RC)


def new_figure(width: float, height: float) -> Figure:
    """A figure of ``width`` x ``height`` inches laid out by matplotlib (call it under :func:`rc`)."""
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def panel_grid(
    width: float,
    panel_height: float,
    count: int,
    columns: int,
    *,
    top: float = 0.35,
    bottom: float = 0.5,
    left: float = 0.75,
    right: float = 0.15,
    gap_x: float = 0.5,
    gap_y: float = 0.55,
    sharey: bool = False,
):
    """(figure, axes) of ``count`` panels in ``columns`` columns, margins and gaps in inches and
    fixed (the constrained layout of a dozen panels costs more than drawing them); the axes
    beyond ``count`` are hidden."""
    columns = max(1, min(columns, count))
    rows = -(-count // columns)
    height = top + bottom + rows * panel_height + (rows - 1) * gap_y
    fig = Figure(figsize=(width, height), dpi=DPI)
    panel_width = (width - left - right - (columns - 1) * gap_x) / columns
    fig.subplots_adjust(
        left=left / width,
        right=1 - right / width,
        bottom=bottom / height,
        top=1 - top / height,
        wspace=gap_x / panel_width,
        hspace=gap_y / panel_height,
    )
    axes = np.atleast_1d(fig.subplots(rows, columns, squeeze=False, sharey=sharey)).ravel()
    for ax in axes[count:]:
        ax.set_visible(False)
    return fig, axes[:count], columns


def mark_panel(ax, colour: str) -> None:
    """Colour the panel's left spine with its algorithm's colour."""
    ax.spines["left"].set_color(colour)
    ax.spines["left"].set_linewidth(4)


def png_bytes(fig: Figure) -> bytes:
    """``fig`` as PNG (call it under :func:`rc`)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, facecolor="white")
    return buffer.getvalue()
