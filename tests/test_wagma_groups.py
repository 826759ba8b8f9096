"""WAGMA's effective groups: said by ``validate``, ``run`` and ``simulate`` when they are not of
``group_size`` ranks, recorded in run.json as ``wagma_group_sizes``."""

from __future__ import annotations

import json

import pytest

from harness.algorithms.wagma_groups import phase_groups
from harness.cli import main
from harness.schedules import wagma_group
from conftest import harness_cli, write_scenario_file

README = 'see docs/guides/native-layer.md, "Wait-avoiding group allreduce"'


def _scenario(ranks: int, group_size: int, **changes) -> dict:
    return {
        "name": "groups",
        "ranks": ranks,
        "seed": 2,
        "workload": {"model": "mlp", "dataset": "digits", "batch_size": 4, "iterations": 3, "eval_every": 3,
                     "compute": {"emulate_ms": 1}, "params": 64},
        "algorithms": ["sgp", {"name": "wagma", "group_size": group_size, "period": 3}],
        **changes,
    }


def _validate_notes(tmp_path, capsys, ranks: int, group_size: int) -> list[str]:
    path = write_scenario_file(tmp_path, _scenario(ranks, group_size))
    assert main(["validate", str(path)]) == 0
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]


def test_validate_says_that_5_ranks_with_group_size_4_average_all_ranks(tmp_path, capsys) -> None:
    assert _validate_notes(tmp_path, capsys, 5, 4) == [
        f"note: wagma: 5 ranks with group_size 4 form one group of all 5: every round averages all ranks; {README}"]


def test_validate_lists_each_phase_of_6_ranks(tmp_path, capsys) -> None:
    assert _validate_notes(tmp_path, capsys, 6, 4) == [
        "note: wagma: 6 ranks with group_size 4 form groups of 3 in phase 0 ({0,1,2} {3,4,5}) "
        f"and 2 in phase 1 ({{0,3}} {{1,4}} {{2,5}}); {README}"]


def test_validate_gives_only_sizes_for_many_ranks(tmp_path, capsys) -> None:
    assert _validate_notes(tmp_path, capsys, 1100, 8) == [
        f"note: wagma: 1100 ranks with group_size 8 form groups of 5 in phase 0, 5 in phase 1, 4 in phase 2 "
        f"and 11 in phase 3; {README}"]


@pytest.mark.parametrize(("ranks", "group_size"), [(8, 2), (4, 4), (16, 4), (64, 8)])
def test_no_note_when_every_group_has_group_size_ranks(tmp_path, capsys, ranks, group_size) -> None:
    assert _validate_notes(tmp_path, capsys, ranks, group_size) == []


@pytest.mark.parametrize(("ranks", "group_size"), [(6, 4), (8, 4), (12, 8), (16, 4)])
def test_phase_groups_are_the_schedule_groups(ranks, group_size) -> None:
    for phase, groups in enumerate(phase_groups(ranks, group_size)):
        assert sorted(r for g in groups for r in g) == list(range(ranks))  # a partition of the ranks
        for group in groups:
            for rank in group:
                assert wagma_group(rank, ranks, group_size, phase) == group


@pytest.mark.subprocess
def test_simulate_notes_and_records_the_groups(tmp_path) -> None:
    path = write_scenario_file(tmp_path, _scenario(6, 4))
    proc = harness_cli("simulate", str(path), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "note: wagma: 6 ranks with group_size 4 form groups of 3 in phase 0" in proc.stderr
    (run,) = (tmp_path / "out" / "groups").iterdir()
    assert json.loads((run / "run.json").read_text())["wagma_group_sizes"] == {"wagma": [3, 2]}


@pytest.mark.mpi
def test_run_notes_and_records_the_groups(tmp_path) -> None:
    proc = harness_cli("run", str(write_scenario_file(tmp_path, _scenario(3, 2))), "--out", str(tmp_path / "out"),
                       timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"note: wagma: 3 ranks with group_size 2 form one group of all 3: every round averages all ranks; " \
           f"{README}" in proc.stderr
    (run,) = (tmp_path / "out" / "groups").iterdir()
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["wagma_group_sizes"] == {"wagma": [3]}


@pytest.mark.subprocess
def test_run_json_has_no_group_key_without_wagma(tmp_path) -> None:
    path = write_scenario_file(tmp_path, _scenario(6, 4, algorithms=["sgp"]))
    proc = harness_cli("simulate", str(path), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0 and "wagma" not in proc.stderr, proc.stderr
    (run,) = (tmp_path / "out" / "groups").iterdir()
    assert "wagma_group_sizes" not in json.loads((run / "run.json").read_text())
