"""Scenario files: good ones load, each kind of bad one gets a one-line message, round trips hold.

Bad example files live in tests/data/scenarios/bad_*.yaml; each starts with ``# expect:`` lines,
fragments its error message must contain. Adding a case means adding a file.
"""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from harness.cli import main
from harness.scenario import Scenario, ScenarioError, load_scenario, load_scenario_with_notes, read_yaml
from harness.scenario import scenario_from_dict
from harness.emulated_link import EmulatedLink
from harness.scenario.network import link_table

from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "scenarios"
FULL = DATA / "full.yaml"
MINIMAL = DATA / "minimal.yaml"
BAD = sorted(DATA.glob("bad_*.yaml"))
GOOD = sorted((ROOT / "scenarios").glob("*.yaml")) + sorted(set(DATA.glob("*.yaml")) - set(BAD))


def _expected(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return [line.removeprefix("# expect: ") for line in lines if line.startswith("# expect: ")]


def _error(path: Path, **overrides: Any) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, overrides=overrides or None)
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# good files


def test_there_are_good_and_bad_examples() -> None:
    names = {p.name for p in GOOD}
    assert {"straggler.yaml", "slow_link.yaml", "balanced.yaml", "full.yaml", "minimal.yaml"} <= names
    assert len(BAD) >= 12


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_good_files_load(path: Path) -> None:
    scenario = load_scenario(path)
    assert isinstance(scenario, Scenario)
    assert scenario.algorithms


def test_full_example_has_every_feature() -> None:
    s = load_scenario(FULL)
    assert (s.name, s.ranks, s.seed) == ("straggler", 8, 1234)
    w = s.workload
    assert (w.model, w.dataset, w.batch_size, w.iterations, w.eval_every, w.device) == (
        "tiny_cnn", "mnist5k", 32, 300, 50, "cpu"
    )
    assert (w.compute.emulate_ms, w.compute.jitter) == (120.0, 0.05)
    assert w.params == 25_600_000  # YAML float 25.6e6, taken as a parameter count
    assert s.optimizer.weight_decay == 1e-4
    assert [a.model_dump() for a in s.algorithms] == [
        {"name": "allreduce_sgd"},
        {"name": "wagma", "group_size": 4, "period": 11},
    ]
    assert [i.kind for i in s.imbalance] == ["random_ranks", "fixed", "linear", "jitter", "slowdown"]
    assert s.imbalance[1].ranks == [3]
    assert len(s.network.links) == 3
    topology = s.network.topology
    assert (topology.preset, topology.ranks_per_node, s.network.allreduce) == ("ethernet_10g", 4, "hierarchical")
    assert (topology.nic.latency_us, topology.nic.bandwidth_gbps) == (20.0, 25.0)  # the preset's latency, own bandwidth
    assert topology.node_of(s.ranks) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_minimal_file_gets_the_defaults() -> None:
    s = load_scenario(MINIMAL)
    assert s.description == ""
    assert s.seed == 0
    assert s.workload.compute == "real"
    assert s.workload.params is None
    assert s.workload.device == "cpu"
    assert s.workload.eval_every == 2  # max(1, iterations // 6) with 12 iterations
    assert s.optimizer.model_dump() == {"name": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": False,
                                        "weight_decay": 1e-4}
    assert s.imbalance == []
    assert link_table(s) == []


def test_every_built_in_model_and_dataset_can_be_built() -> None:
    # The schema takes the built-in names from harness.workload.names; each one must resolve.
    import torch

    from harness.workload import build_model, load_dataset, names

    for name in names.DATASETS:
        assert load_dataset(name, seed=0).num_train > 0
    for name in names.MODELS:
        assert isinstance(build_model(name, (1, 8, 8), 10, seed=0), torch.nn.Module)


def test_algorithm_entries_get_their_default_params() -> None:
    s = scenario_from_dict(_doc(algorithms=["local_sgd", {"name": "wagma", "group_size": 2}]))
    assert s.algorithms[0].period == 2
    assert s.algorithms[1].period == 11


def test_yaml_1_2_floats(tmp_path: Path) -> None:
    path = tmp_path / "floats.yaml"
    path.write_text(MINIMAL.read_text() + "optimizer: {lr: 5e-2, weight_decay: 1e-4}\n")
    s = load_scenario(path)
    assert (s.optimizer.lr, s.optimizer.weight_decay) == (0.05, 1e-4)


def test_emulated_compute_without_params_is_fine() -> None:
    s = scenario_from_dict(_doc(workload={**_doc()["workload"], "compute": {"emulate_ms": 10}}))
    assert s.workload.compute.jitter == 0.0
    assert s.workload.params is None


# ---------------------------------------------------------------------------------------------
# bad files


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_files_name_file_path_and_value(path: Path) -> None:
    expected = _expected(path)
    assert expected, f"{path.name} has no '# expect:' line"
    message = _error(path)
    assert message.startswith(f"{path}: ")
    assert "\n" not in message
    for fragment in expected:
        assert fragment in message
    for noise in ("pydantic", "http", "Traceback", "type=", "input_value"):
        assert noise not in message


def test_unreadable_file() -> None:
    message = _error(DATA / "no_such_file.yaml")
    assert message.startswith(f"{DATA / 'no_such_file.yaml'}: cannot read")


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    assert _error(tmp_path / "empty.yaml").endswith("empty.yaml: empty scenario")


def test_all_errors_each_on_its_own_line() -> None:
    doc = _doc(ranks=0)
    doc["workload"] = {**doc["workload"], "batch_size": -1, "dataset": "cifar"}
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(doc, source="x.yaml")
    assert str(info.value).splitlines() == [
        "x.yaml: ranks: must be >= 1 (got 0)",
        "x.yaml: workload.dataset: unknown dataset (built-in: mnist5k, digits, synthetic, teacher; or your own as "
        "'module:callable') (got 'cifar')",
        "x.yaml: workload.batch_size: must be >= 1 (got -1)",
    ]


def _links(*links: dict[str, Any]) -> dict[str, Any]:
    return {"network": {"links": list(links)}}


def _topology(**fields: Any) -> dict[str, Any]:
    return {"network": {"topology": fields}}


def _injector(**fields: Any) -> dict[str, Any]:
    return {"imbalance": [fields]}


def _algorithms(*entries: Any, **changes: Any) -> dict[str, Any]:
    return {"algorithms": list(entries), **changes}


MORE_BAD = [
    (_links({"from": 1, "to": 1}), "network.links[0].to: must differ from `from` (got 1)"),
    (_links({"rank": 4}), "network.links[0].rank: rank must be < ranks (4) (got 4)"),
    (_links({"from": 1}), "network.links[0].to: required field missing"),
    (_links({"rank": 1, "latency_ms": "1"}), "network.links[0].latency_ms: must be a number >= 0 (got '1')"),
    (_links({"rank": 1, "rank_": 2}), "network.links[0].rank_: unknown key"),
    (_links({"rank": 1, "a b\n": 2}), "network.links[0]['a b\\n']: unknown key"),
    ({"network": {"default": {"latency_ms": -1}}}, "network.default.latency_ms: must be a number >= 0 (got -1)"),
    (_topology(ranks_per_node=3), "network.topology.ranks_per_node: must divide ranks (4); give a placement"),
    (_topology(), "network.topology.ranks_per_node: give ranks_per_node or placement"),
    (_topology(ranks_per_node=2, placement=[0, 0, 1, 1]), "network.topology.ranks_per_node: give ranks_per_node or"),
    (_topology(placement=[0, 0, 1]), "network.topology.placement: must name the node of each of the 4 ranks"),
    (_topology(placement=[0, 0, 2, 2]), "network.topology.placement: node 1 has no ranks"),
    (_topology(ranks_per_node=2, preset="ethernet_100g"), "network.topology.preset: must be 'ethernet_1g', 'ethernet_10g' or 'infiniband_100g'"),
    (_topology(ranks_per_node=2, nic={"bandwidth_gbps": 0}), "network.topology.nic.bandwidth_gbps: must be > 0"),
    (_topology(ranks_per_node=2, allreduce="hierarchical"), "network.topology.allreduce: moved: write `network.allreduce: hierarchical`"),
    ({"network": {"allreduce": "butterfly"}}, "network.allreduce: must be 'auto', 'ring', 'recursive_doubling', 'reduce_broadcast', 'hierarchical' or 'tree' (got 'butterfly')"),
    ({"network": {"allreduce": "hierarchical"}}, "network.allreduce: hierarchical needs network.topology"),
    (_injector(count=1), "imbalance[0].kind: required field missing"),
    (_injector(kind="slowdown", ranks=[1, 1], factor=2.0), "imbalance[0].ranks[1]: rank listed twice (got 1)"),
    (_injector(kind="jitter", sigma=math.nan), "imbalance[0].sigma: must be a finite number (got nan)"),
    (_injector(kind="jitter", jitter=0.2), "imbalance[0].jitter: unknown key (valid: kind, start, stop, sigma)"),
    (_algorithms(), "algorithms: at least one is required (only a training script's own workload, without "
                    "workload.model, may list none"),
    (_algorithms({"period": 2}), "algorithms[0].name: required field missing"),
    (_algorithms({"name": "local_sgd", "tau": 2}), "algorithms[0].tau: unknown key (valid: name, period, optimizer) (got 'tau')"),
    (_algorithms({"name": "wagma", "wagma": 4}), "algorithms[0].wagma: unknown key (valid: name, group_size"),
    (_algorithms("wagma", {"name": 3}), "algorithms[1].name: must be a string (got 3)"),
    (_algorithms("hogwild"), "algorithms[0].name: unknown algorithm (valid: allreduce_sgd, local_sgd, "),
    (_algorithms(["wagma"]), "algorithms[0]: must be a mapping (got ['wagma'])"),
    (_algorithms({"name": "wagma", "period": "11"}), "algorithms[0].period: must be an integer (got '11')"),
    (_algorithms("adpsgd", ranks=3), "algorithms[0].name: adpsgd needs an even number of ranks"),
    ({"optimizer": {"momentum": 0.0, "nesterov": True}}, "optimizer.nesterov: needs momentum > 0 (got True)"),
    ({"seed": -1}, "seed: must be >= 0 (got -1)"),
    ({"ranks": 10**30}, "ranks: must be <= 65536 (got 1000000000000000000000000000000)"),
    ({"extra": 1}, "extra: unknown key (valid: name, description, ranks, seed, python_path, workload"),
]


@pytest.mark.parametrize(("change", "message"), MORE_BAD, ids=[m.split(":")[0] for _, m in MORE_BAD])
def test_more_bad_values(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(_doc(**change), source="x.yaml")
    assert str(info.value).startswith("x.yaml: ")
    assert message in str(info.value)


def test_tree_allreduce_needs_no_topology() -> None:
    """``network.allreduce: tree`` goes through the nodes of a topology when there is one, and
    over every rank as a node of its own when not; hierarchical needs one (MORE_BAD)."""
    assert scenario_from_dict(_doc(network={"allreduce": "tree"})).network.allreduce == "tree"
    with_nodes = scenario_from_dict(_doc(network={"allreduce": "tree", "topology": {"ranks_per_node": 2}}))
    assert (with_nodes.network.allreduce, with_nodes.network.topology.ranks_per_node) == ("tree", 2)


@pytest.mark.parametrize(
    ("compute", "message"), [("fast", "must be 'real' (got 'fast')"), (3, "must be 'real' or a mapping")]
)
def test_compute_must_be_real_or_emulated(compute: Any, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(_doc(workload={**_doc()["workload"], "compute": compute}))
    assert f"workload.compute: {message}" in str(info.value)


# ---------------------------------------------------------------------------------------------
# resolved dict and overrides


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_resolved_dict_round_trips(path: Path, tmp_path: Path) -> None:
    scenario = load_scenario(path)
    resolved = scenario.resolved_dict()
    dumped = tmp_path / "scenario.resolved.yaml"
    dumped.write_text(yaml.safe_dump(resolved, sort_keys=False))
    assert yaml.safe_load(dumped.read_text()) == resolved  # plain YAML 1.1 readers agree
    again = load_scenario(dumped)
    assert again == scenario
    assert again.resolved_dict() == resolved
    assert link_table(again) == link_table(scenario)


def test_resolved_dict_fills_in_defaults() -> None:
    resolved = load_scenario(MINIMAL).resolved_dict()
    assert resolved["workload"]["eval_every"] == 2
    assert resolved["algorithms"] == [{"name": "allreduce_sgd"}]
    assert resolved["optimizer"]["momentum"] == 0.9
    assert resolved["network"] == {"default": {"latency_us": 0.0, "bandwidth_gbps": None}, "links": [], "topology": None,
                                   "allreduce": "auto"}


def test_resolved_links_keep_only_the_fields_they_set() -> None:
    links = load_scenario(FULL).resolved_dict()["network"]["links"]
    assert links == [
        {"between": [0, 1], "latency_us": 5000.0, "bandwidth_gbps": 1.0},
        {"from": 7, "to": 0, "bandwidth_gbps": 0.5},
        {"rank": 6, "latency_us": 2000.0},
    ]


def test_overrides_apply_before_validation() -> None:
    s = load_scenario(FULL, overrides={"ranks": 16, "iterations": 20, "only": ["wagma"]})
    assert s.ranks == 16
    assert s.workload.iterations == 20
    assert [a.name for a in s.algorithms] == ["wagma"]
    # The rank checks see the overridden count: rank 7 no longer exists.
    assert _error(FULL, ranks=7) == f"{FULL}: network.links[1].from: rank must be < ranks (7) (got 7)"


def test_iterations_override_recomputes_the_eval_default() -> None:
    assert load_scenario(MINIMAL, overrides={"iterations": 60}).workload.eval_every == 10
    assert load_scenario(FULL, overrides={"iterations": 60}).workload.eval_every == 50  # set in the file


def test_only_keeps_file_order_and_refuses_unknown_names() -> None:
    s = load_scenario(FULL, overrides={"only": ["wagma", "allreduce_sgd"]})
    assert [a.name for a in s.algorithms] == ["allreduce_sgd", "wagma"]
    message = _error(FULL, only=["sgp"])
    assert message == f"{FULL}: --only: 'sgp' is not among the scenario's algorithms (available: allreduce_sgd, wagma)"


def test_unknown_override_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown scenario override 'batch'"):
        load_scenario(FULL, overrides={"batch": 3})


# ---------------------------------------------------------------------------------------------
# network resolution


def test_link_table_resolution_order() -> None:
    doc = _doc(
        ranks=3,
        network={
            "default": {"latency_us": 10},
            "links": [
                {"rank": 2, "bandwidth_gbps": 8},
                {"between": [0, 2], "latency_ms": 1},
                {"from": 2, "to": 0, "bandwidth_gbps": None},  # explicit null: back to unlimited
            ],
        },
    )
    links = link_table(scenario_from_dict(doc))
    table = {(link.src, link.dst): (link.latency_s, link.bandwidth_bytes_per_s) for link in links}
    assert table == {
        (0, 1): (1e-5, None),
        (0, 2): (1e-3, 1e9),
        (1, 0): (1e-5, None),
        (1, 2): (1e-5, 1e9),
        (2, 0): (1e-3, None),
        (2, 1): (1e-5, 1e9),
    }


def test_link_table_lists_only_emulated_links_sorted() -> None:
    doc = _doc(network={"links": [{"from": 3, "to": 1, "latency_us": 5}, {"from": 0, "to": 2, "latency_us": 0}]})
    assert link_table(scenario_from_dict(doc)) == [EmulatedLink(3, 1, 5e-6, None)]


def test_slow_link_scenario_slows_every_link_of_rank_0() -> None:
    table = link_table(load_scenario(ROOT / "scenarios" / "slow_link.yaml"))
    assert len(table) == 14
    assert all(0 in (link.src, link.dst) for link in table)
    assert {(link.latency_s, link.bandwidth_bytes_per_s) for link in table} == {(0.005, 0.2e9 / 8)}


# ---------------------------------------------------------------------------------------------
# python -m harness validate


def test_validate_good_file_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(FULL)]) == 0
    out, err = capsys.readouterr()
    # 8 is not a power of group_size 4: the second phase's groups have 2 ranks.
    assert err.splitlines() == ["note: wagma: 8 ranks with group_size 4 form groups of 4 in phase 0 ({0,1,2,3} "
                                "{4,5,6,7}) and 2 in phase 1 ({0,4} {1,5} {2,6} {3,7}); see docs/guides/native-layer.md, "
                                '"Wait-avoiding group allreduce"']
    assert out.startswith("straggler: 8 ranks")
    assert "wagma group_size=4 period=11" in out
    assert "network: 17 emulated links" in out


def test_validate_notes_an_old_parameter_spelling_and_resolves_it(tmp_path: Path, capsys) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(_doc(algorithms=[{"name": "wagma", "group_size": 2, "sync_period": 4}])))
    assert main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "wagma group_size=2 period=5" in out
    assert err.splitlines() == [f"note: {path}: wagma: sync_period: 4 is the old spelling of period: 5 "
                                "(a synchronous round every 5 rounds); write period: 5"]


def test_old_parameter_spelling_warns_outside_the_commands() -> None:
    with pytest.warns(FutureWarning, match="wagma: sync_period: 4 is the old spelling of period: 5"):
        s = scenario_from_dict(_doc(algorithms=[{"name": "wagma", "group_size": 2, "sync_period": 4}]))
    assert s.resolved_dict()["algorithms"] == [{"name": "wagma", "group_size": 2, "period": 5}]


def test_validate_bad_file_exits_2_with_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    path = DATA / "bad_group_size.yaml"
    assert main(["validate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"error: {path}: algorithms[1].group_size: must be <= ranks (4) (got 8)"]


def test_validate_takes_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(FULL), "--ranks", "4"]) == 2
    assert "imbalance[4].ranks[0]: rank must be < ranks (4) (got 5)" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# random mutations never escape as anything but ScenarioError

INTERESTING = [
    None, True, False, 0, 1, -1, 3, 8, 10**30, 0.5, -0.5, 1e300, math.inf, math.nan, "", "3", "real", "cuda",
    "wagma", "fixed", "between", [], [0], [0, 9], [1, 1], {}, {"kind": "fixed"}, {"name": "sgp"}, {"rank": 1},
]


def _doc(**changes: Any) -> dict[str, Any]:
    doc = read_yaml(MINIMAL)
    doc.update(changes)
    return doc


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a nested document, the root excluded."""
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    found = []
    for key, child in children:
        found.append((*prefix, key))
        found.extend(_paths(child, (*prefix, key)))
    return found


def _mutate(doc: Any, pick: Callable[[list[Any]], Any], value: Callable[[], Any]) -> None:
    """Delete a key, replace a value or add a key, somewhere in ``doc`` (in place)."""
    path = pick(_paths(doc))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    action = pick(["delete", "replace", "add"])
    if action == "delete":
        del parent[path[-1]]
    elif action == "replace":
        parent[path[-1]] = value()
    elif isinstance(parent, dict):
        parent[pick(["extra", "kind", "latency_ms", "name", "ranks", "params"])] = value()
    else:
        parent.append(value())


def _check_mutant(doc: dict[str, Any]) -> None:
    try:
        scenario = scenario_from_dict(doc, source="mutant")
    except ScenarioError as exc:
        assert all(line.startswith("mutant: ") for line in str(exc).splitlines())
        return
    assert scenario_from_dict(scenario.resolved_dict()) == scenario
    link_table(scenario)


def test_seeded_random_mutations_raise_only_scenario_error() -> None:
    base = read_yaml(FULL)
    rng = random.Random(20240611)
    for _ in range(1500):
        doc = copy.deepcopy(base)
        for _ in range(rng.randint(1, 3)):
            _mutate(doc, rng.choice, lambda: copy.deepcopy(rng.choice(INTERESTING)))
        _check_mutant(doc)


_values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6),
    st.lists(st.integers(-2, 12), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.sampled_from(INTERESTING),
)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_hypothesis_mutations_raise_only_scenario_error(data: Any) -> None:
    doc = read_yaml(FULL)
    for _ in range(data.draw(st.integers(1, 3))):
        # deepcopy: INTERESTING's lists and dicts must not be mutated by later steps
        _mutate(doc, lambda options: data.draw(st.sampled_from(options)), lambda: copy.deepcopy(data.draw(_values)))
    _check_mutant(doc)


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "scenarios").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_scenarios_load_without_old_spellings(path: Path) -> None:
    scenario, notes = load_scenario_with_notes(path)
    assert scenario.algorithms and notes == []
