"""What a validation case is: a published measurement of someone else's system, the setup it
was measured on, and how the simulator predicts it; and how a prediction is scored.

A case's error is ``predicted / published - 1``. Its bar is 10% where the published number is
stated in text or a table and 15% where it is read off a plot (what the trace-free simulators
in the literature reach; docs/guides/simulation.md). Where the source ranks methods, the case
also says whether the simulated order is the source's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

ReadFrom = Literal["text", "table", "plot"]
BARS: dict[str, float] = {"text": 0.10, "table": 0.10, "plot": 0.15}


@dataclass(frozen=True)
class Published:
    """A number as its source gives it."""

    value: float | None
    """None where the source ranks methods without a number this case can score."""
    unit: str
    read_from: ReadFrom
    source: str
    """Where: the paper, page or repository file, and the section, table or figure."""
    quote: str
    """The words (or the table row) the number is taken from, or how it is derived from them."""


@dataclass(frozen=True)
class Prediction:
    """The simulator's value for a case, and (where the case ranks methods) the simulated order
    of the methods, best first."""

    value: float | None
    order: tuple[str, ...] | None = None
    note: str = ""


@dataclass(frozen=True)
class Case:
    """One published measurement and how it is simulated.

    ``setup``: the system as its source describes it (model, batch, GPUs per node, network,
    framework and backend). ``constants``: every number the simulation needs that the source
    does not give, each with where it came from. ``order``: the source's order of the methods,
    best first (None where it ranks none). ``gap``: why the prediction misses its bar, said
    wherever it does."""

    name: str
    claim: str
    published: Published
    setup: str
    constants: tuple[str, ...]
    predict: Callable[[], Prediction]
    order: tuple[str, ...] | None = None
    gap: str = ""


@dataclass(frozen=True)
class Outcome:
    """A case's prediction, scored."""

    case: Case
    prediction: Prediction
    error: float | None = field(init=False)
    order_matches: bool | None = field(init=False)

    def __post_init__(self) -> None:
        published, predicted = self.case.published.value, self.prediction.value
        error = None if published is None or predicted is None else predicted / published - 1
        object.__setattr__(self, "error", error)
        order = None if self.case.order is None else self.prediction.order == self.case.order
        object.__setattr__(self, "order_matches", order)

    @property
    def bar(self) -> float:
        return BARS[self.case.published.read_from]

    @property
    def meets(self) -> bool:
        within = self.error is None or abs(self.error) <= self.bar + 1e-12  # 10.0% is within 10%
        return within and self.order_matches is not False

    def row(self) -> dict:
        """The case as ``bench validation --json`` writes it."""
        c, p = self.case, self.case.published
        return {
            "case": c.name,
            "claim": c.claim,
            "published": p.value,
            "predicted": self.prediction.value,
            "unit": p.unit,
            "error": self.error,
            "read_from": p.read_from,
            "order_matches": self.order_matches,
            "order_published": list(c.order) if c.order else None,
            "order_predicted": list(self.prediction.order) if self.prediction.order else None,
            "meets": self.meets,
            "bar": self.bar,
            "source": p.source,
            "quote": p.quote,
            "setup": c.setup,
            "constants": list(c.constants),
            "note": self.prediction.note,
            "gap": "" if self.meets else c.gap,
        }


def median_abs_error(outcomes: list[Outcome], read_from: tuple[str, ...]) -> float | None:
    """The median |error| over the outcomes whose number is read from one of ``read_from``."""
    errors = sorted(abs(o.error) for o in outcomes if o.case.published.read_from in read_from and o.error is not None)
    if not errors:
        return None
    mid = len(errors) // 2
    return errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2
