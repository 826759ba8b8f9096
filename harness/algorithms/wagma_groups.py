"""WAGMA-SGD's effective groups, for the commands to say when they are not what ``group_size`` asks.

The groups come from ``harness.schedules.wagma_radices`` / ``wagma_group``: with ``P = S^L``
ranks the paper's ``L`` phases of groups of ``S``; otherwise a mixed-radix decomposition of
``P`` whose digits can be smaller than ``S``, or larger when ``P`` has a prime factor above
``S`` (5 ranks with ``group_size: 4`` average all 5 every round). Round ``t`` uses phase
``t % L``. ``validate``, ``run`` and ``simulate`` print :func:`group_notes`; run.json records
:func:`run_json_keys` (``results/README.md``).

Example::

    >>> phase_groups(6, 4)
    [[[0, 1, 2], [3, 4, 5]], [[0, 3], [1, 4], [2, 5]]]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.algorithms.params import WAGMAParams
from harness.schedules import wagma_group, wagma_radices

if TYPE_CHECKING:
    from harness.scenario.schema import Scenario

SHOW_MEMBERS_UP_TO = 16
"""Ranks up to which a note lists each phase's groups; beyond it, only their sizes."""

README_SECTION = 'see README "Wait-avoiding group allreduce"'


def phase_groups(ranks: int, group_size: int) -> list[list[list[int]]]:
    """Per phase, its groups (sorted members), ordered by their lowest rank."""
    phases = []
    for phase in range(len(wagma_radices(ranks, group_size))):
        groups = {tuple(wagma_group(r, ranks, group_size, phase)) for r in range(ranks)}
        phases.append([list(g) for g in sorted(groups)])
    return phases


def differs(ranks: int, group_size: int) -> bool:
    """Whether some phase's groups are not of ``group_size`` ranks (``ranks`` not a power of it)."""
    return any(size != group_size for size in wagma_radices(ranks, group_size))


def group_note(name: str, ranks: int, group_size: int) -> str:
    """One line saying which groups ``ranks`` ranks with ``group_size`` form, phase by phase."""
    sizes = wagma_radices(ranks, group_size)
    head = f"{name}: {ranks} ranks with group_size {group_size} form"
    if sizes == [ranks]:
        return f"{head} one group of all {ranks}: every round averages all ranks; {README_SECTION}"
    members = phase_groups(ranks, group_size) if ranks <= SHOW_MEMBERS_UP_TO else None
    parts = []
    for phase, size in enumerate(sizes):
        part = f"{size} in phase {phase}"
        if members is not None:
            part += " (" + " ".join("{" + ",".join(map(str, g)) + "}" for g in members[phase]) + ")"
        parts.append(part)
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"{head} groups of {listed}; {README_SECTION}"


def group_notes(scenario: Scenario) -> list[str]:
    """A note for each WAGMA algorithm of ``scenario`` whose groups differ from its ``group_size``."""
    return [group_note(p.name, scenario.ranks, p.group_size) for p in _wagma_entries(scenario)
            if differs(scenario.ranks, p.group_size)]


def run_json_keys(scenario: Scenario) -> dict[str, Any]:
    """``{"wagma_group_sizes": {name: [group size of each phase]}}`` for the scenario's WAGMA
    algorithms (whether or not they differ from ``group_size``); ``{}`` without one."""
    sizes = {p.name: list(wagma_radices(scenario.ranks, p.group_size)) for p in _wagma_entries(scenario)}
    return {"wagma_group_sizes": sizes} if sizes else {}


def _wagma_entries(scenario: Scenario) -> list[WAGMAParams]:
    return [p for p in scenario.algorithms if isinstance(p, WAGMAParams)]
