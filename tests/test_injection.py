"""Injected imbalance: deterministic, identical everywhere, windows, and how entries combine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import get_args

import numpy as np
import pytest

from harness.injection import InjectionPlan
from harness.scenario import load_scenario
from harness.scenario.imbalance_fields import AnyInjectorSpec, InjectorSpec

ROOT = Path(__file__).resolve().parents[1]
EVERYTHING = [
    {"kind": "random_ranks", "count": 2, "delay_ms": 320},
    {"kind": "fixed", "ranks": [3], "delay_ms": 50},
    {"kind": "linear", "offset_ms": 2},
    {"kind": "jitter", "sigma": 0.2},
    {"kind": "slowdown", "ranks": [5], "factor": 2.0},
]


def test_every_kind_has_its_own_effect() -> None:
    kinds = get_args(get_args(AnyInjectorSpec)[0])
    specs = [InjectionPlan(0, [entry], ranks=8).specs[0] for entry in EVERYTHING]
    assert {type(spec) for spec in specs} == set(kinds)  # EVERYTHING covers every kind
    rng = np.random.default_rng(0)
    for spec in specs:
        assert type(spec).effect is not InjectorSpec.effect, spec.kind
        delay_s, factor = spec.effect(8, rng)
        assert delay_s.shape == factor.shape == (8,), spec.kind


def test_a_random_kind_refuses_to_run_without_its_generator() -> None:
    spec = InjectionPlan(0, [EVERYTHING[0]], ranks=8).specs[0]
    assert spec.random
    with pytest.raises(ValueError, match="'random_ranks' draws at random"):
        spec.effect(8, None)


def test_same_values_from_fresh_plans_in_any_query_order() -> None:
    forward = InjectionPlan(7, EVERYTHING, ranks=8)
    values = {t: forward.at(t) for t in range(40)}
    backward = InjectionPlan(7, EVERYTHING, ranks=8)
    for t in reversed(range(40)):
        delay, factor = backward.at(t)
        np.testing.assert_array_equal(delay, values[t][0])
        np.testing.assert_array_equal(factor, values[t][1])


@pytest.mark.subprocess
def test_same_values_in_another_process() -> None:
    # Nothing may depend on process state (hash seeds, import order): each rank is a process.
    code = (
        "import json; from harness.injection import InjectionPlan; "
        f"print(json.dumps(InjectionPlan(7, {EVERYTHING!r}, 8).at(13)[0].tolist()))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    assert json.loads(out.stdout) == InjectionPlan(7, EVERYTHING, ranks=8).at(13)[0].tolist()


def test_seed_changes_the_draw() -> None:
    spec = [{"kind": "random_ranks", "count": 1, "delay_ms": 10}]
    draws = [[int(np.argmax(InjectionPlan(seed, spec, ranks=64).at(t)[0])) for t in range(20)] for seed in (1, 2)]
    assert draws[0] != draws[1]


def test_random_ranks_picks_count_distinct_ranks_with_the_delay() -> None:
    plan = InjectionPlan(3, [{"kind": "random_ranks", "count": 3, "delay_ms": 100}], ranks=16)
    chosen = set()
    for t in range(50):
        delay, factor = plan.at(t)
        delayed = np.flatnonzero(delay)
        assert len(delayed) == 3
        np.testing.assert_allclose(delay[delayed], 0.1)
        np.testing.assert_array_equal(factor, 1.0)
        chosen.add(tuple(delayed))
    assert len(chosen) > 1  # a new draw each iteration


def test_random_ranks_with_replacement_delays_one_rank_when_the_draws_coincide() -> None:
    """replace: true is the papers' code: two independent draws of 4 ranks coincide in about a
    quarter of the iterations, and the rank drawn twice sleeps once."""
    plan = InjectionPlan(3, [{"kind": "random_ranks", "count": 2, "delay_ms": 100, "replace": True}], ranks=4)
    counts = []
    for t in range(400):
        delay, _ = plan.at(t)
        delayed = np.flatnonzero(delay)
        np.testing.assert_allclose(delay[delayed], 0.1)
        counts.append(len(delayed))
    assert set(counts) == {1, 2}
    assert 0.15 < counts.count(1) / len(counts) < 0.35  # 1/4 expected; 400 draws: +-0.065 at 3 sigma


def test_random_ranks_with_count_equal_to_ranks_delays_everyone() -> None:
    delay, _ = InjectionPlan(0, [{"kind": "random_ranks", "count": 4, "delay_ms": 5}], ranks=4).at(9)
    np.testing.assert_allclose(delay, 0.005)


def test_linear_is_rank_times_offset() -> None:
    delay, _ = InjectionPlan(0, [{"kind": "linear", "offset_ms": 2}], ranks=6).at(0)
    np.testing.assert_allclose(delay, np.arange(6) * 0.002)


def test_fixed_and_slowdown_touch_only_their_ranks() -> None:
    fixed = {"kind": "fixed", "ranks": [1, 3], "delay_ms": 50}
    plan = InjectionPlan(0, [fixed, {"kind": "slowdown", "ranks": [2], "factor": 3.0}], ranks=4)
    delay, factor = plan.at(5)
    np.testing.assert_allclose(delay, [0, 0.05, 0, 0.05])
    np.testing.assert_allclose(factor, [1, 1, 3, 1])


def test_start_stop_window() -> None:
    plan = InjectionPlan(0, [{"kind": "fixed", "ranks": [0], "delay_ms": 10, "start": 5, "stop": 8}], ranks=2)
    delayed = [t for t in range(12) if plan.at(t)[0][0] > 0]
    assert delayed == [5, 6, 7]


def test_start_without_stop_runs_to_the_end() -> None:
    plan = InjectionPlan(0, [{"kind": "slowdown", "ranks": [1], "factor": 2.0, "start": 3}], ranks=2)
    assert [plan.at(t)[1][1] for t in (0, 2, 3, 1000)] == [1.0, 1.0, 2.0, 2.0]


def test_delays_add_up() -> None:
    parts = EVERYTHING[:3]  # random_ranks first, so it keeps its index (and its draw) alone
    together = InjectionPlan(11, parts, ranks=8)
    for t in range(10):
        total = sum(InjectionPlan(11, [p], ranks=8).at(t)[0] for p in parts)
        np.testing.assert_allclose(together.at(t)[0], total)


def test_compute_factors_multiply() -> None:
    jitter, slowdown = EVERYTHING[3], EVERYTHING[4]
    together = InjectionPlan(11, [jitter, slowdown], ranks=8)
    for t in range(10):
        alone = InjectionPlan(11, [jitter], ranks=8).at(t)[1]
        expected = alone * np.where(np.arange(8) == 5, 2.0, 1.0)
        np.testing.assert_allclose(together.at(t)[1], expected)


def test_jitter_is_lognormal_with_sigma() -> None:
    plan = InjectionPlan(5, [{"kind": "jitter", "sigma": 0.2}], ranks=1024)
    logs = np.log(np.concatenate([plan.at(t)[1] for t in range(20)]))
    assert abs(logs.mean()) < 0.01
    assert abs(logs.std() - 0.2) < 0.01


def test_zero_sigma_jitter_changes_nothing() -> None:
    np.testing.assert_array_equal(InjectionPlan(5, [{"kind": "jitter", "sigma": 0.0}], ranks=8).at(3)[1], 1.0)


def test_no_injectors_means_no_delay() -> None:
    delay, factor = InjectionPlan(0, [], ranks=3).at(0)
    np.testing.assert_array_equal(delay, 0.0)
    np.testing.assert_array_equal(factor, 1.0)


def test_returned_arrays_are_fresh() -> None:
    plan = InjectionPlan(0, [{"kind": "linear", "offset_ms": 1}], ranks=4)
    plan.at(0)[0][:] = 99.0
    np.testing.assert_allclose(plan.at(0)[0], np.arange(4) * 0.001)


def test_from_scenario_uses_seed_entries_and_ranks() -> None:
    scenario = load_scenario(ROOT / "tests" / "data" / "scenarios" / "full.yaml")
    plan = InjectionPlan.from_scenario(scenario)
    delay, factor = plan.at(4)
    expected = InjectionPlan(1234, EVERYTHING, ranks=8).at(4)
    np.testing.assert_array_equal(delay, expected[0])
    np.testing.assert_array_equal(factor, expected[1])


def test_rank_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match=r"rank must be < ranks \(4\)"):
        InjectionPlan(0, [{"kind": "fixed", "ranks": [4], "delay_ms": 1}], ranks=4)


def test_negative_iteration_is_refused() -> None:
    with pytest.raises(ValueError, match="iteration must be >= 0"):
        InjectionPlan(0, [], ranks=2).at(-1)


def test_a_thousand_ranks_cost_little_more_than_eight() -> None:
    """``at()`` works on arrays, not rank by rank: with 1,024 ranks a call costs a few times what
    it costs with 8 (the fixed cost dominates), not 128 times. Both are timed in turns in this
    process, best of 5 batches each, so a slower or busier machine slows both alike."""
    plans = {ranks: InjectionPlan(0, EVERYTHING, ranks=ranks) for ranks in (8, 1024)}
    best = {ranks: float("inf") for ranks in plans}
    for _ in range(5):
        for ranks, plan in plans.items():
            began = time.perf_counter()
            for t in range(40):
                plan.at(t)
            best[ranks] = min(best[ranks], (time.perf_counter() - began) / 40)
    assert best[1024] < 16 * best[8], f"per at(): {best[8] * 1e3:.3f} ms with 8 ranks, {best[1024] * 1e3:.3f} ms with 1,024"
