"""What ``bench agreement`` measured and how it reports it: each repeat's items (a real and a
simulated time), the medians over the repeats with the error's range, per case the median and
worst |error|, and the same as JSON (``--json``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate


@dataclass
class Item:
    """One real and one simulated time (s) of a case's repeat; ``group`` summarizes items
    together (a compare mode)."""

    name: str
    real_s: float
    simulated_s: float
    group: str = ""

    @property
    def error(self) -> float:
        return self.real_s / self.simulated_s - 1


@dataclass
class CaseResult:
    name: str
    repeats: list[list[Item]] = field(default_factory=list)
    stolen: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    skipped: str | None = None
    failed: str | None = None


def _fmt_pct(x: float) -> str:
    return f"{100 * x:+.1f}"


def summarize(result: CaseResult) -> list[dict]:
    """Per item of a case: the medians over its repeats and the range of the error."""
    rows = []
    for i, first in enumerate(result.repeats[0] if result.repeats else []):
        items = [r[i] for r in result.repeats if i < len(r) and r[i].name == first.name]
        errors = [it.error for it in items]
        rows.append(
            {
                "case": result.name,
                "item": first.name,
                "group": first.group,
                "real_s": statistics.median(it.real_s for it in items),
                "simulated_s": statistics.median(it.simulated_s for it in items),
                "error": statistics.median(errors),
                "error_min": min(errors),
                "error_max": max(errors),
                "repeats": len(items),
            }
        )
    return rows


def case_summary(rows: list[dict]) -> list[tuple[str, float, float]]:
    """(group, median |error|, worst |error|) over a case's items, per group."""
    out = []
    for group in dict.fromkeys(r["group"] for r in rows):
        errors = [abs(r["error"]) for r in rows if r["group"] == group]
        out.append((group, statistics.median(errors), max(errors)))
    return out


def print_report(results: list[CaseResult], repeats: int) -> None:
    table = []
    for result in results:
        if result.skipped or result.failed:
            continue
        for row in summarize(result):
            table.append(
                [
                    row["case"],
                    row["item"],
                    f"{1e3 * row['real_s']:.1f}",
                    f"{1e3 * row['simulated_s']:.1f}",
                    _fmt_pct(row["error"]),
                    f"{_fmt_pct(row['error_min'])} .. {_fmt_pct(row['error_max'])}",
                ]
            )
    print()
    plural = "s" if repeats > 1 else ""
    print(
        f"real against simulated, each column the median of its own over {repeats} repeat{plural} "
        "(error: real / simulated - 1 of a repeat's times = the simulated throughput's error)"
    )
    if table:
        print(
            tabulate(
                table,
                headers=["case", "what", "real ms", "simulated ms", "error %", "error % range"],
                colalign=("left", "left", "right", "right", "right", "right"),
                disable_numparse=True,
            )
        )
    print()
    for result in results:
        if result.skipped:
            print(f"{result.name}: skipped: {result.skipped}")
        elif result.failed:
            print(f"{result.name}: FAILED: {result.failed.splitlines()[0] if result.failed else ''}")
        else:
            parts = [
                f"{group + ': ' if group else ''}median |error| {100 * med:.1f}%, worst {100 * worst:.1f}%"
                for group, med, worst in case_summary(summarize(result))
            ]
            stolen = f"; {100 * max(result.stolen):.0f}% of the CPU time stolen at most" if result.stolen else ""
            print(f"{result.name}: {'; '.join(parts)}{stolen}")


def to_json(results: list[CaseResult], repeats: int) -> dict:
    cases: dict[str, Any] = {}
    for result in results:
        if result.skipped is not None:
            cases[result.name] = {"skipped": result.skipped}
        elif result.failed is not None:
            cases[result.name] = {"failed": result.failed}
        else:
            cases[result.name] = {
                "summary": summarize(result),
                "repeats": [
                    [
                        {
                            "item": it.name,
                            "group": it.group,
                            "real_s": it.real_s,
                            "simulated_s": it.simulated_s,
                            "error": it.error,
                        }
                        for it in items
                    ]
                    for items in result.repeats
                ],
                "stolen": result.stolen,
                "seconds": result.seconds,
            }
    return {"repeats": repeats, "cases": cases}
