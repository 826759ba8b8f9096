"""WAGMA-SGD's effective groups, for the commands to say when they are not what ``group_size`` asks.

The groups come from ``harness.schedules.wagma_radices`` / ``wagma_group``: with ``P = S^L``
ranks the paper's ``L`` phases of groups of ``S``; otherwise a mixed-radix decomposition of
``P`` whose digits can be smaller than ``S``, or larger when ``P`` has a prime factor above
``S`` (5 ranks with ``group_size: 4`` average all 5 every round). Round ``t`` uses phase
``t % L``. ``WAGMAParams.notes`` says them (``validate``, ``run`` and ``simulate`` print it) and
``WAGMAParams.run_facts`` records their sizes in run.json (``results/README.md``).

Example::

    >>> phase_groups(6, 4)
    [[[0, 1, 2], [3, 4, 5]], [[0, 3], [1, 4], [2, 5]]]
"""

from __future__ import annotations

from harness.schedules import wagma_group, wagma_radices

SHOW_MEMBERS_UP_TO = 16
"""Ranks up to which a note lists each phase's groups; beyond it, only their sizes."""

README_SECTION = 'see docs/guides/native-layer.md, "Wait-avoiding group allreduce"'


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
