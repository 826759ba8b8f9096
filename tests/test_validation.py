"""``bench validation``: every case is sourced and scored the documented way, fitted numbers are
never scored, and the command writes what the issue's JSON needs."""

from __future__ import annotations

import json

import pytest

from conftest import harness_cli
from harness.validation import collective_cases, sgp_stack, systems
from harness.validation.cases import CASES
from harness.validation.model import BARS, Case, Outcome, Prediction, Published, median_abs_error


def _case(value: float, read_from: str = "text", order=None) -> Case:
    return Case("c", "claim", Published(100.0, "ms", read_from, "somewhere", "quote"), "setup", ("k: from x",),
                lambda: Prediction(value), order=order, gap="why")


def test_error_is_predicted_over_published_and_the_bar_follows_where_it_was_read():
    assert Outcome(_case(110.0), Prediction(110.0)).error == pytest.approx(0.10)
    assert Outcome(_case(110.0), Prediction(110.0)).meets  # 10% is within the text bar
    assert not Outcome(_case(112.0), Prediction(112.0)).meets
    assert Outcome(_case(114.0, "plot"), Prediction(114.0)).meets  # plots: 15%
    assert BARS == {"text": 0.10, "table": 0.10, "plot": 0.15}


def test_a_case_out_of_order_misses_whatever_its_error():
    case = _case(100.0, order=("a", "b"))
    assert Outcome(case, Prediction(100.0, ("a", "b"))).order_matches is True
    wrong = Outcome(case, Prediction(100.0, ("b", "a")))
    assert wrong.order_matches is False and not wrong.meets
    assert Outcome(_case(100.0), Prediction(100.0)).order_matches is None


def test_median_abs_error_is_taken_per_kind_of_source():
    outcomes = [Outcome(_case(v), Prediction(v)) for v in (90.0, 105.0, 130.0)]
    outcomes.append(Outcome(_case(200.0, "plot"), Prediction(200.0)))
    assert median_abs_error(outcomes, ("text", "table")) == pytest.approx(0.10)
    assert median_abs_error(outcomes, ("plot",)) == pytest.approx(1.0)
    assert median_abs_error(outcomes[:1], ("plot",)) is None


@pytest.mark.parametrize("name", list(CASES))
def test_every_case_names_its_source_setup_and_constants(name):
    case = CASES[name]
    p = case.published
    assert p.read_from in BARS and p.source and p.quote
    assert (p.value is None and case.order) or (p.value > 0 and p.unit)  # a number, or an order to score
    assert case.setup and case.constants and all(c.strip() for c in case.constants)


def test_every_case_that_misses_says_why():
    from harness.validation.model import Outcome

    for case in CASES.values():
        outcome = Outcome(case, case.predict())
        assert outcome.meets or case.gap, case.name


def test_no_fitted_number_is_scored():
    fitted = [systems.H200_1NODE_RING.where, systems.B200_4NODE[16].where]
    for case in CASES.values():
        assert case.published.quote not in fitted, case.name
        assert not (case.published.source == collective_cases.EFA_SOURCE
                    and case.published.value == 1e3 * collective_cases.EFA_RING_S), case.name
        assert case.published.value not in (sgp_stack.SGP_32_HOURS, sgp_stack.SGP_EFFICIENCY), case.name


@pytest.mark.subprocess
def test_the_command_writes_one_object_per_case(tmp_path):
    out = tmp_path / "validation.json"
    names = ["nccl_h200_4node_ring", "nccl_b200_1node_default"]
    proc = harness_cli("bench", "validation", "--only", ",".join(names), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())
    assert [r["case"] for r in rows] == names
    for row in rows:
        for key in ("case", "published", "predicted", "error", "read_from", "order_matches"):
            assert key in row, key
        assert row["error"] == pytest.approx(row["predicted"] / row["published"] - 1)
    assert "nccl_b200_1node_default misses" in proc.stdout  # and says why
    assert "median |error| over the cases read from text or tables" in proc.stdout


@pytest.mark.subprocess
def test_an_unknown_case_is_refused_with_the_known_ones(tmp_path):
    proc = harness_cli("bench", "validation", "--only", "nope")
    assert proc.returncode == 2
    assert "unknown case(s) nope" in proc.stderr and "nccl_h200_4node_ring" in proc.stderr
    proc = harness_cli("bench", "validation", "--json", str(tmp_path / "missing" / "v.json"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_the_sgp_stack_fit_reproduces_the_two_numbers_it_is_fitted_on():
    fit = sgp_stack.stack_fit()
    epoch32 = sgp_stack.SGP_32_HOURS * 3600 / sgp_stack.EPOCHS  # the published epoch the fit divides up
    assert 0 < fit.local_s < epoch32 / sgp_stack.ITERATIONS_PER_EPOCH[32] and 0 < fit.eval_s < epoch32
    hours32 = sgp_stack.training_hours("sgp", 32)
    assert hours32 == pytest.approx(sgp_stack.SGP_32_HOURS, rel=1e-6)
    efficiency = sgp_stack.training_hours("sgp", 4) / (8 * hours32)
    assert efficiency == pytest.approx(sgp_stack.SGP_EFFICIENCY, rel=1e-6)
