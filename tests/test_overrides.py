"""KEY=VALUE overrides of scenario fields (harness.scenario.overrides) and the sweep grid
(harness.sweep.grid): the grammar is Hydra's, the paths are the scenario's, errors name the
override as typed, and the resolved scenario records them."""

from __future__ import annotations

import pytest
import yaml

from harness.scenario import ScenarioError, load_scenario, scenario_from_dict
from harness.scenario.overrides import OverrideError, apply_override, format_value, parse_override, parse_sweep
from harness.sweep.grid import MAX_POINTS, sweep_grid
from tests.conftest import REPO, harness_cli, write_scenario_file

STRAGGLER = REPO / "scenarios" / "straggler.yaml"

BASE = {
    "name": "ovr", "ranks": 4,
    "workload": {"model": "mlp", "dataset": "digits", "batch_size": 8, "iterations": 10,
                 "compute": {"emulate_ms": 5}, "params": 1000},
    "algorithms": ["allreduce_sgd", {"name": "local_sgd", "period": 4}, {"name": "wagma", "group_size": 2}],
    "imbalance": [{"kind": "random_ranks", "count": 1, "delay_ms": 40}],
}


def test_overrides_set_fields_by_dotted_path_index_and_algorithm_name() -> None:
    scenario = scenario_from_dict(BASE, assignments=[
        "workload.iterations=200", "imbalance.0.delay_ms=160", "algorithms.wagma.period=6",
        "network.topology.preset=ethernet_10g", "network.topology.ranks_per_node=2", "seed=7"])
    assert scenario.workload.iterations == 200
    assert scenario.imbalance[0].delay_ms == 160
    wagma = {a.name: a for a in scenario.algorithms}["wagma"]
    assert wagma.period == 6 and wagma.group_size == 2  # the entry's other fields stay
    assert scenario.network.topology.preset == "ethernet_10g"  # a missing mapping is created
    assert scenario.seed == 7
    # "algorithms" given as a bare name in the file is not a mapping: an index still reaches it
    assert scenario_from_dict(BASE, assignments=["algorithms.0={name: allreduce_sgd}"]).algorithms[0].name == \
        "allreduce_sgd"


def test_override_removes_a_field_and_takes_yaml_like_values() -> None:
    scenario = scenario_from_dict(BASE, assignments=["~imbalance", "workload.compute={emulate_ms: 9}",
                                                     "algorithms.local_sgd.period=8"])
    assert scenario.imbalance == [] and scenario.workload.compute.emulate_ms == 9
    assert {a.name: a for a in scenario.algorithms}["local_sgd"].period == 8


def test_resolved_scenario_records_the_overrides_and_loads_back_equal() -> None:
    scenario = scenario_from_dict(BASE, assignments=["workload.iterations=20", "algorithms.local_sgd.period=2"])
    assert scenario.overrides == ["workload.iterations=20", "algorithms.local_sgd.period=2"]
    resolved = yaml.safe_load(yaml.safe_dump(scenario.resolved_dict()))
    again = scenario_from_dict(resolved)
    assert again == scenario
    # overriding a resolved scenario adds to its record
    assert scenario_from_dict(resolved, assignments=["seed=1"]).overrides[-1] == "seed=1"


@pytest.mark.parametrize(("text", "message"), [
    ("workload.iterations=-1", "override 'workload.iterations=-1': workload.iterations: must be >= 1 (got -1)"),
    ("algorithms.local_sgd.period=0", "override 'algorithms.local_sgd.period=0': algorithms[1].period: must be >= 1"),
    ("workload.iterationz=3", "override 'workload.iterationz=3': workload.iterationz: unknown key"),
    ("imbalance.0.delay_ms=abc", "override 'imbalance.0.delay_ms=abc': imbalance[0].delay_ms: must be a number"),
    ("algorithms.sgp.period=2", "override 'algorithms.sgp.period=2': algorithms has no entry named 'sgp' "
                                "(names: allreduce_sgd, local_sgd, wagma)"),
    ("imbalance.3.delay_ms=1", "override 'imbalance.3.delay_ms=1': imbalance has 1 entries (indices 0 to 0), no 3"),
    ("ranks.x=1", "override 'ranks.x=1': ranks is 4, not a mapping or list: it has no 'x'"),
    ("workload.iterations", "override 'workload.iterations': missing EQUAL"),
    ("workload.iterations=1,2", "several values make a sweep: give it with --sweep workload.iterations=1,2"),
    ("~seed", "override '~seed': the scenario has no 'seed' to remove"),
    ("network.topology.preset=ethernet_10g", "override 'network.topology.preset=ethernet_10g': "
                                             "network.topology.ranks_per_node: give ranks_per_node or placement"),
])
def test_a_bad_override_is_named_as_typed(text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario_from_dict(BASE, source="file.yaml", assignments=[text])
    assert str(caught.value).startswith("file.yaml: ") and message in str(caught.value)


def test_an_error_of_the_file_itself_is_not_blamed_on_an_override() -> None:
    bad = {**BASE, "seed": -1}
    with pytest.raises(ScenarioError) as caught:
        scenario_from_dict(bad, source="file.yaml", assignments=["workload.iterations=5"])
    assert str(caught.value) == "file.yaml: seed: must be >= 0 (got -1)"


def test_apply_override_leaves_its_input_alone() -> None:
    data = {"algorithms": [{"name": "sgp"}]}
    out, located = apply_override(data, parse_override("algorithms.sgp.peers=2"))
    assert data == {"algorithms": [{"name": "sgp"}]} and out["algorithms"][0]["peers"] == 2
    assert located.location == ("algorithms", 0, "peers")


@pytest.mark.parametrize("value", ["ethernet_10g", "a b", "1", "x,y", 1, 2.5, None, True, [1, 2], {"a": 1}, ""])
def test_a_swept_value_is_written_so_that_it_parses_back(value) -> None:
    assert parse_override(f"k={format_value(value)}").value == value


def test_sweep_grid_is_every_combination_first_key_slowest() -> None:
    keys, points = sweep_grid(["imbalance.0.delay_ms=range(0,641,320)", "algorithms.local_sgd.period=2,8"])
    assert keys == ["imbalance.0.delay_ms", "algorithms.local_sgd.period"]
    assert [p.values for p in points] == [
        {"imbalance.0.delay_ms": d, "algorithms.local_sgd.period": k} for d in (0, 320, 640) for k in (2, 8)]
    assert points[3].texts == ["imbalance.0.delay_ms=320", "algorithms.local_sgd.period=8"]
    assert parse_sweep("network.topology.preset=choice(ethernet_10g,infiniband)")[1][1].value == "infiniband"
    assert [o.value for o in parse_sweep("seed=3")[1]] == [3]  # one value: one point


@pytest.mark.parametrize(("texts", "message"), [
    (["seed=1,2", "seed=3"], "seed is swept twice"),
    ([f"seed=range(0,{MAX_POINTS + 1})"], "points (at most"),
    (["~seed"], "a sweep gives values"),
    (["seed=range(0"], "override 'seed=range(0'"),
])
def test_sweep_grid_errors(texts, message) -> None:
    with pytest.raises(OverrideError, match=message.replace("(", r"\(")):
        sweep_grid(texts)


@pytest.mark.subprocess
def test_commands_take_overrides_after_the_file(tmp_path) -> None:
    proc = harness_cli("validate", str(STRAGGLER), "imbalance.0.delay_ms=640", "algorithms.local_sgd.period=8")
    assert proc.returncode == 0, proc.stderr
    assert "local_sgd period=8" in proc.stdout and "640" in proc.stdout
    proc = harness_cli("validate", str(STRAGGLER), "algorithms.local_sgd.period=0")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (f"error: {STRAGGLER}: override 'algorithms.local_sgd.period=0': "
                                   "algorithms[1].period: must be >= 1 (got 0)")
    # simulate: the resolved scenario of the run records the overrides
    path = write_scenario_file(tmp_path, {**BASE, "algorithms": ["allreduce_sgd"]})
    proc = harness_cli("simulate", str(path), "workload.iterations=3", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (run,) = (tmp_path / "out" / "ovr").iterdir()
    resolved = load_scenario(run / "scenario.resolved.yaml")
    assert resolved.overrides == ["workload.iterations=3"] and resolved.workload.iterations == 3


@pytest.mark.mpi
def test_launch_takes_the_overrides_before_the_script(tmp_path) -> None:
    from harness.cli import build_parser
    from harness.commands.overrides import parse_command_line

    script = tmp_path / "train.py"
    script.write_text("")
    args = parse_command_line(build_parser(), ["launch", "workload.iterations=3", "-n", "2", "seed=2", str(script),
                                               "--lr=0.1", "x=1"])
    assert (args.assignments, args.script, args.args) == (["workload.iterations=3", "seed=2"], str(script),
                                                          ["--lr=0.1", "x=1"])
    proc = harness_cli("launch", "-n", "2", "seed=2", str(script))
    assert proc.returncode == 2 and "seed=2: KEY=VALUE overrides change a scenario: give --scenario FILE" in proc.stderr
