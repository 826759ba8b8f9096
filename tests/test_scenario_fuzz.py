"""Property-based fuzzing of the scenario loader: every input loads or fails with one clear ScenarioError.

Two generators start from the shipped ``scenarios/*.yaml``:

* data mutations (``scenario_from_dict``): delete a key, add an unknown key, replace a value at any
  depth by a value of another type, rename algorithms / injector kinds, set ranks, append imbalance
  entries, link rules and algorithm entries with fuzzed (often out-of-range) fields and windows;
* text mutations (``load_scenario`` on a file): insert, delete or replace characters and lines,
  add YAML snippets that PyYAML cannot construct, invalid UTF-8, deep nesting.

Any exception other than ScenarioError fails the test (hypothesis then shrinks the input). A
ScenarioError's message must be a few lines, each ``source: ...`` as the loader's ``_format``
writes them, with no traceback text and no pydantic boilerplate. Whatever loads must round-trip
through ``resolved_dict()``, both as data and as a YAML file.

Settings are local to this file: derandomized (the same examples on every run), no example
database, no deadline; the whole file runs in under 10 s.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from harness.algorithms.registry import names, params_model  # noqa: E402
from harness.scenario import Scenario, ScenarioError, load_scenario, scenario_from_dict  # noqa: E402
from harness.scenario.loader import MAX_ERROR_LINES  # noqa: E402
from harness.scenario.network import link_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "scenarios").glob("*.yaml"))
TEXTS = {path.name: path.read_text(encoding="utf-8") for path in FILES}
BASES = {name: yaml.safe_load(text) for name, text in TEXTS.items()}

FUZZ = settings(
    max_examples=1000,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
TEXT_FUZZ = settings(FUZZ, max_examples=600)

ALGORITHMS = sorted(names())
MODELS = [params_model(name) for name in ALGORITHMS]
KINDS = ["random_ranks", "fixed", "linear", "jitter", "slowdown"]
# Every key some model knows: set in the wrong place, each is an "unknown key" of another kind.
KNOWN_KEYS = sorted(
    {"name", "description", "ranks", "seed", "workload", "optimizer", "algorithms", "imbalance", "network"}
    | {"model", "dataset", "batch_size", "iterations", "compute", "params", "eval_every", "device"}
    | {"emulate_ms", "jitter", "lr", "momentum", "nesterov", "weight_decay"}
    | {"kind", "start", "stop", "count", "delay_ms", "offset_ms", "sigma", "factor"}
    | {"default", "links", "between", "from", "to", "rank", "latency_us", "latency_ms", "bandwidth_gbps"}
    | {field for cls in MODELS for field in cls.model_fields}
)
ALGORITHM_FIELDS = sorted({f for cls in MODELS for f in cls.model_fields} - {"name"})

# ---------------------------------------------------------------------------------------------
# values

BIG_INTS = [2**31, 2**63, 2**64 + 1, 10**30, 10**400, -(10**400)]


class _Huge:
    """Stands for 10**5000 in generated data: repr() refuses ints of over 4300 digits, and
    hypothesis must be able to print a failing example. ``_materialize`` swaps in the int."""

    def __repr__(self) -> str:
        return "10**5000"


HUGE = _Huge()
huge_ints = st.just(HUGE)


def _materialize(node: Any) -> Any:
    if isinstance(node, _Huge):
        return 10**5000
    if isinstance(node, dict):
        return {key: _materialize(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_materialize(value) for value in node]
    return node

SPECIAL_FLOATS = [math.nan, math.inf, -math.inf, -0.0, 1e-320, 1e308, 2.5, 1e30]
texts = st.text(max_size=8) | st.sampled_from(["", " ", "real", "cpu", "cuda:0", "é€😀", "\n", "1e-4", "null", "x" * 200])
# In-range values first (so that a fair share of mutants still load), then edge cases.
numbers = (
    st.integers(0, 300)
    | st.floats(0.0, 500.0)
    | st.integers(-3, 0)
    | st.sampled_from(BIG_INTS + SPECIAL_FLOATS + [True, False, None, "1", "0.5"])
    | st.floats(allow_nan=True, allow_infinity=True)
    | huge_ints
)
rankish = st.integers(0, 7) | st.integers(-2, 12) | st.sampled_from([True, 7.0, 8, 9, 65535, 65536, 65537, 10**30, "0", None])
scalars = st.none() | st.booleans() | st.integers() | st.sampled_from(BIG_INTS) | huge_ints | st.floats() | texts
keys = st.sampled_from(KNOWN_KEYS) | texts | st.integers(-2, 3) | st.none() | st.booleans() | st.floats()
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=6,
)
names = (
    st.sampled_from(ALGORITHMS + KINDS + ["", "Local_SGD", " sgp", "sgp ", "allreduce-sgd", "between", "real"])
    | texts
    | values
)
windows = st.fixed_dictionaries({}, optional={"start": rankish | numbers, "stop": rankish | numbers})
imbalance_entries = st.builds(
    lambda kind, fields, window: {"kind": kind, **fields, **window},
    st.sampled_from(KINDS) | names,
    st.fixed_dictionaries(
        {},
        optional={
            "count": rankish, "ranks": st.lists(rankish, max_size=4) | rankish, "delay_ms": numbers,
            "offset_ms": numbers, "sigma": numbers, "factor": numbers,
        },
    ),
    windows,
)
link_settings = st.fixed_dictionaries(
    {}, optional={"latency_us": numbers, "latency_ms": numbers, "bandwidth_gbps": numbers}
)
link_selectors = st.one_of(
    st.fixed_dictionaries({"between": st.lists(rankish, max_size=3) | rankish}),
    st.fixed_dictionaries({"from": rankish, "to": rankish}),
    st.fixed_dictionaries({"rank": rankish}),
    st.fixed_dictionaries({}, optional={"between": st.lists(rankish, max_size=2), "rank": rankish, "from": rankish}),
)
link_rules = st.builds(lambda sel, link: {**sel, **link}, link_selectors, link_settings)
algorithm_entries = st.sampled_from(ALGORITHMS) | st.builds(
    lambda name, fields: {"name": name, **fields},
    st.sampled_from(ALGORITHMS) | names,
    st.dictionaries(st.sampled_from(ALGORITHM_FIELDS), numbers | names, max_size=3),
)
computes = st.sampled_from(["real", "emulated", None]) | st.fixed_dictionaries(
    {}, optional={"emulate_ms": numbers, "jitter": numbers, "params": numbers}
)

# ---------------------------------------------------------------------------------------------
# data mutations


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every node below ``node`` (not ``node`` itself), parents before children."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    out = []
    for key, child in items:
        out.append((*prefix, key))
        out.extend(_paths(child, (*prefix, key)))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _list_at(doc: dict[str, Any], *path: str) -> list[Any]:
    """The list at ``path``, created (with its parents) where missing or not a list."""
    node = doc
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    if not isinstance(node.get(path[-1]), list):
        node[path[-1]] = []
    return node[path[-1]]


@st.composite
def mutants(draw: Any) -> tuple[str, Any]:
    base = draw(st.sampled_from(sorted(BASES)))
    doc = copy.deepcopy(BASES[base])
    for _ in range(draw(st.integers(1, 3))):
        if not isinstance(doc, dict):  # the whole document was replaced: nothing left to mutate
            break
        paths = _paths(doc)
        op = draw(
            st.sampled_from(
                ["delete", "add_key", "replace", "rename", "ranks", "imbalance", "link", "algorithm", "compute", "window",
                 "tweak", "tweak", "tweak"]
            )
        )
        if op == "delete" and paths:
            path = draw(st.sampled_from(paths))
            parent = _get(doc, path[:-1])
            del parent[path[-1]]
        elif op in ("delete", "add_key"):
            dicts = [()] + [p for p in paths if isinstance(_get(doc, p), dict)]
            _get(doc, draw(st.sampled_from(dicts)))[draw(keys)] = draw(values)
        elif op == "replace":
            path = draw(st.sampled_from([()] + paths))
            if path:
                _get(doc, path[:-1])[path[-1]] = draw(values)
            else:
                doc = draw(values)
        elif op == "rename":  # algorithm names (string entries too), kinds, model, dataset
            named = [
                p for p in paths
                if p[-1] in ("name", "kind", "model", "dataset", "device")
                or (len(p) == 2 and p[0] == "algorithms" and isinstance(_get(doc, p), str))
            ]
            path = draw(st.sampled_from(named or [("name",)]))
            _get(doc, path[:-1])[path[-1]] = draw(names)
        elif op == "tweak":  # a number at any depth to another, mostly valid, number
            numeric = [p for p in paths if type(_get(doc, p)) in (int, float)]
            if numeric:
                path = draw(st.sampled_from(numeric))
                old = _get(doc, path)
                new = draw(st.integers(0, 16) if type(old) is int else st.floats(0.0, 1.0))
                _get(doc, path[:-1])[path[-1]] = new
        elif op == "ranks":
            doc["ranks"] = draw(rankish | st.integers(1, 9))
        elif op == "imbalance":
            _list_at(doc, "imbalance").append(draw(imbalance_entries))
        elif op == "link":
            _list_at(doc, "network", "links").append(draw(link_rules))
        elif op == "algorithm":
            entries = _list_at(doc, "algorithms")
            entries.insert(draw(st.integers(0, len(entries))), draw(algorithm_entries))
        elif op == "compute":
            if not isinstance(doc.get("workload"), dict):
                doc["workload"] = {}
            workload = doc["workload"]
            compute = draw(computes)
            if isinstance(compute, dict) and "params" in compute and draw(st.booleans()):
                workload["params"] = compute.pop("params")
            workload["compute"] = compute
        else:  # window: start/stop on an imbalance entry, often swapped or equal
            entries = doc.get("imbalance")
            dicts = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
            if not dicts:
                dicts = [{"kind": "linear", "offset_ms": 1}]
                _list_at(doc, "imbalance").append(dicts[0])
            entry = draw(st.sampled_from(dicts))
            low, high = sorted([draw(st.integers(-1, 50)), draw(st.integers(-1, 50))])
            swap = draw(st.booleans())
            entry.update(start=high if swap else low, stop=low if swap else high)
    return base, doc


# ---------------------------------------------------------------------------------------------
# text mutations

YAML_CHARS = st.sampled_from(list(":{}[],-#&*!|>'\"%@`?\t\n .0123456789eE") + ["\x00", "\x07", "\x85", "\ufeff", "é", "\u2028"])
# Lines to insert. `fuzz:` is a key no base file has: a repeated existing key (`seed:`) would stop
# at "duplicate key" before PyYAML constructs the value.
SNIPPETS = [
    "ranks: 3",
    "ranks: 8\nranks: 9",
    "  - {name: sgp, peers: 99}",
    "  - {name: wagma, group_size: 1}",
    "  - adpsgd\n  - adpsgd",
    "imbalance:\n  - {kind: fixed, ranks: [9], delay_ms: 1}",
    "imbalance:\n  - {kind: jitter, sigma: .nan, start: 5, stop: 2}",
    "network: {default: {latency_ms: 1e400}, links: [{between: [0, 0]}]}",
    "network: {links: [{from: 1, to: 1, latency_ms: " + "9" * 400 + "}]}",
    "network: {links: [{rank: 0x" + "f" * 3700 + "}]}",  # hex: PyYAML's int() has no digit limit
    "fuzz: 2020-02-30",
    "fuzz: 2020-01-01 25:00:00",
    "fuzz: !!int abc",
    "fuzz: !!int ''",
    "fuzz: !!float ''",
    "fuzz: !!bool maybe",
    "fuzz: !!timestamp nope",
    "fuzz: !!set [1]",
    "fuzz: !!map [1]",
    "fuzz: !!binary '@@'",
    "fuzz: !!python/object:os.system {}",
    "fuzz: !unknown x",
    "fuzz: " + "9" * 4400,
    "fuzz: " + "[" * 600 + "]" * 600,
    "fuzz: &a [*a]",
    "<<: *nope",
    "<<: {ranks: 2}",
    "? [1]\n: 2",
    "? {a: 1}\n: 2",
    "%YAML 1.1\n---",
    "---",
    "...",
    "name: 'unterminated",
    "\ttab: 1",
    "description: |\n  ok\n bad",
    "workload: {compute: {emulate_ms: 1, jitter: -1}, params: 1e30}",
]


@st.composite
def text_mutants(draw: Any) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(TEXTS)))
    text = TEXTS[name]
    for _ in range(draw(st.integers(1, 3))):
        lines = text.split("\n")
        op = draw(st.sampled_from(["insert", "delete", "replace", "dup_line", "del_line", "swap", "indent", "snippet", "snippet"]))
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 20)))
        k = draw(st.integers(0, len(lines) - 1))
        chars = draw(st.text(YAML_CHARS, min_size=1, max_size=4) | st.text(min_size=1, max_size=4))
        if op == "insert":
            text = text[:i] + chars + text[i:]
        elif op == "delete":
            text = text[:i] + text[j:]
        elif op == "replace":
            text = text[:i] + chars + text[j:]
        elif op == "dup_line":
            lines.insert(k, lines[k])
        elif op == "del_line":
            del lines[k]
        elif op == "swap":
            m = draw(st.integers(0, len(lines) - 1))
            lines[k], lines[m] = lines[m], lines[k]
        elif op == "indent":
            lines[k] = draw(st.sampled_from([" ", "  ", "\t", "- "])) + lines[k] if draw(st.booleans()) else lines[k].lstrip()
        else:
            lines.insert(k, draw(st.sampled_from(SNIPPETS)))
        if op in ("dup_line", "del_line", "swap", "indent", "snippet"):
            text = "\n".join(lines)
    raw = text.encode("utf-8")
    if draw(st.integers(0, 9)) == 0:  # not UTF-8 at all
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + raw[at:]
    return name, raw


# ---------------------------------------------------------------------------------------------
# the properties


def _check_error(exc: ScenarioError, source: str) -> None:
    """One clear message: a few ``source: ...`` lines, no traceback, no pydantic boilerplate."""
    message = str(exc)
    lines = message.splitlines()
    assert lines, "empty ScenarioError"
    assert len(lines) <= MAX_ERROR_LINES + 1, message  # the loader's cap, plus its "... and N more" line
    assert lines[0].startswith(f"{source}: ") and lines[0].removeprefix(f"{source}: ").strip(), message
    for line in lines[1:]:
        # PyYAML's ReaderError (bad control characters) appends an ``  in "<unicode string>", position N`` line.
        assert line.startswith(f"{source}: ") or line.startswith('  in "<unicode string>", position '), message
    for junk in ("Traceback", '  File "', "For further information visit", "errors.pydantic.dev", "[type="):
        assert junk not in message, message
    assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__), "chained exception"


def _check_loaded(scenario: Scenario, tmp: Path) -> None:
    """``resolved_dict()`` loads back to an equal scenario, as data and through a YAML file."""
    assert isinstance(scenario, Scenario)
    resolved = scenario.resolved_dict()
    again = scenario_from_dict(copy.deepcopy(resolved), source="roundtrip")
    assert again == scenario
    assert again.resolved_dict() == resolved
    path = tmp / "resolved.yaml"
    path.write_text(yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True), encoding="utf-8")
    assert load_scenario(path) == scenario
    if scenario.ranks <= 64:  # the link table has ranks * (ranks - 1) entries
        link_table(scenario)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("scenario_fuzz")


@pytest.mark.parametrize("name", sorted(BASES))
def test_shipped_scenarios_load_and_round_trip(name: str, tmp: Path) -> None:
    _check_loaded(scenario_from_dict(copy.deepcopy(BASES[name]), source=name), tmp)


@FUZZ
@given(case=mutants())
def test_mutated_data_loads_or_raises_one_clear_scenario_error(case: tuple[str, Any], tmp: Path) -> None:
    doc = _materialize(case[1])
    try:
        scenario = scenario_from_dict(doc, source="fuzz")
    except ScenarioError as exc:
        _check_error(exc, "fuzz")
        event("error")
        return
    event("loaded")
    _check_loaded(scenario, tmp)


def _check_file(path: Path, tmp: Path) -> str:
    try:
        scenario = load_scenario(path)
    except ScenarioError as exc:
        _check_error(exc, str(path))
        return "YAML error" if "invalid YAML" in str(exc) else "schema error"
    _check_loaded(scenario, tmp)
    return "loaded"


@TEXT_FUZZ
@given(case=text_mutants())
def test_mutated_text_loads_or_raises_one_clear_scenario_error(case: tuple[str, bytes], tmp: Path) -> None:
    name, raw = case
    path = tmp / name
    path.write_bytes(raw)
    event(_check_file(path, tmp))


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: repr(s[:30]))
def test_each_snippet_appended_to_each_shipped_file(snippet: str, tmp: Path) -> None:
    """Every snippet once at the end of every file, where it is a top-level line (no luck needed)."""
    for name, text in TEXTS.items():
        path = tmp / f"snippet_{name}"
        path.write_text(f"{text}\n{snippet}\n", encoding="utf-8")
        _check_file(path, tmp)
