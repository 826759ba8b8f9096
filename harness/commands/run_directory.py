"""A real run's directory from start to end: created, resumed, marked stopped.

``run`` creates one per run (``launch`` too, for a training script's runs): the resolved
scenario and an ``incomplete`` run.json are written before any rank starts, so a run that is
killed still says what it was. ``run --resume RUN_DIR`` reopens it, checks that it is a real
run of the harness's own training loop that is not finished, clears what a killed writer left
and records the resumption; a run that fails or is interrupted records how in run.json. The
files themselves are ``harness.results.records``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.algorithms import scenario_facts
from harness.results.atomic import remove_partial_files
from harness.results.layout import RUN_FILE, SCENARIO_FILE
from harness.results.provenance import disk_problem
from harness.scenario import Scenario, ScenarioError, load_scenario

if TYPE_CHECKING:
    from harness.results.records import RunDirectory


def create_run_dir(
    scenario: Scenario, out: str, into: Path | None = None, facts: dict[str, Any] | None = None
) -> RunDirectory:
    """A new run directory under ``out``, or exactly ``into`` (a sweep's point), with the resolved
    scenario and an ``incomplete`` run.json holding ``facts`` and the scenario's own."""
    from harness.results.records import RunDirectory  # noqa: PLC0415  (pandas: not for --help)

    run_dir = RunDirectory.create(out, scenario.name) if into is None else RunDirectory.create_at(into, scenario.name)
    run_dir.write_resolved_scenario(scenario.resolved_dict())
    run_dir.write_run_json("incomplete", [], ranks=scenario.ranks, extra={**(facts or {}), **scenario_facts(scenario)})
    return run_dir


def provenance_problem(scenario: Scenario, run_dir: RunDirectory | None, out: str) -> str | None:
    """Why the provenance of the algorithms still to train would not fit on the disk, or None."""
    todo = sum(run_dir is None or a.name not in run_dir.finished_algorithms for a in scenario.algorithms)
    return disk_problem(scenario, todo, run_dir.path if run_dir is not None else Path(out))


def open_for_resume(path: Path) -> tuple[Scenario | None, RunDirectory]:
    """(scenario, run directory) of a run to resume, (None, run directory) when it is complete;
    ValueError saying what is wrong otherwise. Writes nothing."""
    from harness.results.records import RunDirectory  # noqa: PLC0415  (pandas: not for --help)

    if not (path / SCENARIO_FILE).is_file() or not (path / RUN_FILE).is_file():
        raise ValueError(f"--resume {path}: not a run directory (it needs {SCENARIO_FILE} and {RUN_FILE})")
    try:
        scenario = load_scenario(path / SCENARIO_FILE)
    except ScenarioError as exc:
        raise ValueError(f"--resume: {exc}") from None
    meta = json.loads((path / RUN_FILE).read_text(encoding="utf-8"))
    if meta.get("simulated"):
        raise ValueError(f"--resume {path}: a simulated run; run `python -m harness simulate` again instead")
    if meta.get("script"):
        raise ValueError(
            f"--resume {path}: a run of the training script {meta['script']}; start it again with "
            "`python -m harness launch --scenario FILE --only ALGORITHMS SCRIPT`"
        )
    if meta.get("ranks") not in (None, scenario.ranks):
        raise ValueError(f"--resume {path}: run.json says {meta.get('ranks')} ranks, the scenario {scenario.ranks}")
    run_dir = RunDirectory.open(path)
    unknown = [a for a in run_dir.finished_algorithms if a not in [p.name for p in scenario.algorithms]]
    if unknown:
        raise ValueError(f"--resume {path}: run.json lists finished algorithms {unknown} the scenario does not have")
    if len(run_dir.finished_algorithms) == len(scenario.algorithms):
        return None, run_dir
    return scenario, run_dir


def begin_resume(run_dir: RunDirectory) -> None:
    """Remove what a killed writer left (nothing runs there now) and record the resumption."""
    remove_partial_files(run_dir.path)
    run_dir.mark_resumed()
    run_dir.update_run_json("incomplete")


def mark_stopped(path: Path, status: str, extra: dict[str, Any]) -> None:
    """Record in run.json how the run stopped (``status`` and why), keeping what it finished."""
    from harness.results.records import RunDirectory  # noqa: PLC0415  (pandas: not for --help)

    RunDirectory.open(path).update_run_json(status, extra)
