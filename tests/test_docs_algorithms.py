"""The algorithm reference (docs/algorithms/) agrees with the code: its parameter table
(index.md) lists exactly each algorithm's parameters with the defaults of
``harness/algorithms/params.py``, and every registered algorithm
(``harness/algorithms/registry.py``) has a section on its family's page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.algorithms.registry import BUILT_IN

PAGES = Path(__file__).resolve().parent.parent / "docs" / "algorithms"
DOC = PAGES / "index.md"
# The built-in algorithms: tests may register others at run time, which the docs do not list.
MODELS = {entry.name: entry.params for entry in BUILT_IN}


def documented_defaults() -> dict[str, dict[str, str]]:
    """{algorithm: {parameter: default as written}} from the "Parameters at a glance" table."""
    text = DOC.read_text(encoding="utf-8")
    table = text.split("## Parameters at a glance", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, dict[str, str]] = {}
    current = None
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 4 or cells[0] in ("name", "---"):
            continue
        if cells[0]:
            current = cells[0].strip("`")
            rows[current] = {}
        match = re.match(r"`(\w+)`", cells[1])
        if match:
            rows[current][match.group(1)] = cells[2].strip("`")
    return rows


def written(value) -> str:
    if isinstance(value, dict) and "name" in value:  # an optimizer: its name and lr, the rest torch's defaults
        return f"{value['name']} lr={value['lr']}"
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_every_algorithm_and_default_is_documented():
    doc = documented_defaults()
    assert sorted(doc) == sorted(MODELS)
    for name, cls in MODELS.items():
        defaults = cls().model_dump(exclude={"name"})
        assert doc[name] == {k: written(v) for k, v in defaults.items()}, name


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_algorithm_has_a_section_on_its_familys_page(name):
    from harness.algorithms.registry import registration

    family = registration(name).family
    page = PAGES / ("synchronous.md" if family == "synchronous" else f"{family.replace('_', '-')}.md")
    assert f"`name: {name}`" in page.read_text(encoding="utf-8"), page
