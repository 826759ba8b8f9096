"""``python -m harness bench agreement``: its arguments, its report, and one cheap real case."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from conftest import harness_cli
from harness.bench import agreement
from harness.bench.agreement import Case
from harness.bench.agreement_report import Item
from harness.testing.real_runs import CaseFailed, CaseSkipped


@pytest.mark.parametrize(("args", "message"), [
    (["--only", "nope"], "argument --only: unknown case 'nope' (cases: small_run, nic_run, nic_messages"),
    (["--only", "small_run,,nic_run"], "argument --only: bad case list 'small_run,,nic_run': empty entry"),
    (["--repeats", "0"], "argument --repeats: must be >= 1 (got 0)"),
])
@pytest.mark.subprocess
def test_bad_arguments_exit_2(args, message):
    proc = harness_cli("bench", "agreement", *args, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert proc.stdout == ""


@pytest.mark.subprocess
def test_json_into_a_missing_directory_is_refused_before_anything_runs(tmp_path):
    proc = harness_cli("bench", "agreement", "--only", "small_run", "--json", str(tmp_path / "no" / "a.json"),
                       timeout=60)
    assert proc.returncode == 2 and f"directory {tmp_path / 'no'} does not exist" in proc.stderr, proc.stderr
    assert "small_run: repeat" not in proc.stdout


def _args(tmp_path, only, repeats=2, json_path=None) -> argparse.Namespace:
    return argparse.Namespace(only=only, repeats=repeats, json=json_path, out=tmp_path / "out", calibration=None)


def test_report_gives_medians_errors_and_each_case_s_fate(tmp_path, monkeypatch, capsys):
    """Fake cases: one measured twice (the medians, the error real / simulated - 1 and its range,
    per mode the median and worst |error|), one skipped with its reason, one failing (exit 1,
    the others still reported)."""
    measured = iter([
        [Item("a (trace)", 0.110, 0.100, "trace"), Item("b (trace)", 0.080, 0.100, "trace"),
         Item("a (predictive)", 0.100, 0.100, "predictive")],
        [Item("a (trace)", 0.130, 0.100, "trace"), Item("b (trace)", 0.090, 0.100, "trace"),
         Item("a (predictive)", 0.100, 0.125, "predictive")],
    ])

    def fine(out, args):
        assert out == tmp_path / "out" / "fine" / f"repeat{next(counter)}"
        return next(measured)

    def skipped(out, args):
        raise CaseSkipped("needs a cluster")

    def broken(out, args):
        raise CaseFailed("run exited 1\ntraceback")

    counter = iter([1, 2])
    monkeypatch.setattr(agreement, "CASES", {"fine": Case(fine, True, "two items"), "skipped": Case(skipped, True, "x"),
                                             "broken": Case(broken, True, "y")})
    report = tmp_path / "agreement.json"
    assert agreement.run(_args(tmp_path, None, json_path=report)) == 1
    out = capsys.readouterr().out
    rows = {line.split()[1] + " " + line.split()[2]: line.split() for line in out.splitlines()
            if line.startswith("fine ")}
    assert rows["a (trace)"][3:] == ["120.0", "100.0", "+20.0", "+10.0", "..", "+30.0"]
    assert rows["b (trace)"][3:] == ["85.0", "100.0", "-15.0", "-20.0", "..", "-10.0"]
    assert rows["a (predictive)"][3:] == ["100.0", "112.5", "-10.0", "-20.0", "..", "+0.0"]
    assert "fine: trace: median |error| 17.5%, worst 20.0%; predictive: median |error| 10.0%, worst 10.0%" in out
    assert "skipped: skipped: needs a cluster" in out
    assert "broken: FAILED: run exited 1" in out
    data = json.loads(report.read_text())
    assert data["repeats"] == 2 and data["cases"]["skipped"] == {"skipped": "needs a cluster"}
    assert data["cases"]["broken"]["failed"].startswith("run exited 1")
    summary = {row["item"]: row for row in data["cases"]["fine"]["summary"]}
    assert summary["a (trace)"]["error"] == pytest.approx(0.2) and summary["a (trace)"]["repeats"] == 2
    assert len(data["cases"]["fine"]["repeats"]) == 2 and len(data["cases"]["fine"]["stolen"]) == 2


def test_only_runs_the_cases_named_and_a_skip_is_not_a_failure(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(agreement, "CASES", {
        "one": Case(lambda out, args: ran.append("one") or [Item("x", 1.0, 1.0)], True, ""),
        "two": Case(lambda out, args: ran.append("two") or [Item("x", 1.0, 1.0)], True, ""),
        "three": Case(lambda out, args: (_ for _ in ()).throw(CaseSkipped("no")), False, ""),
    })
    assert agreement.run(_args(tmp_path, ["two", "three"], repeats=1)) == 0
    assert ran == ["two"]
    assert "three: skipped: no" in capsys.readouterr().out


def test_the_scenario_cases_need_a_calibration_and_say_how_to_make_it(tmp_path):
    args = _args(tmp_path, ["straggler"], repeats=1)
    args.calibration = tmp_path / "none.json"
    with pytest.raises(CaseSkipped, match=r"no calibration file .*none\.json; measure this machine with: "
                                          r"python -m harness calibrate --scenario .*straggler\.yaml --ranks 8"):
        agreement.CASES["straggler"].measure(tmp_path / "out", args)


def test_the_vhost_case_says_why_it_cannot_run(monkeypatch):
    monkeypatch.setattr(agreement, "vhost_bed_missing", lambda: "the virtual-host test bed is not running")
    with pytest.raises(CaseSkipped, match="test bed is not running"):
        agreement.CASES["kernel_shaping"].measure(None, None)


@pytest.mark.mpi
def test_nic_messages_measures_every_rank(tmp_path):
    """The cheapest real case (8 ranks, one exchange each, a few seconds): a row per rank and
    mode (trace-driven, predictive) with positive real and simulated times, in the table and in
    the JSON."""
    report = tmp_path / "agreement.json"
    proc = harness_cli("bench", "agreement", "--only", "nic_messages", "--repeats", "1", "--json", str(report),
                       timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nic_messages: repeat 1/1" in proc.stdout and "nic_messages: trace: median |error|" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("nic_messages  rank ")]
    assert len(rows) == 2 * agreement.NIC_RANKS, proc.stdout
    (repeat,) = json.loads(report.read_text())["cases"]["nic_messages"]["repeats"]
    assert [it["item"] for it in repeat] == [f"rank {r} exchange ({mode})" for mode in ("trace", "predictive")
                                             for r in range(agreement.NIC_RANKS)]
    for it in repeat:
        assert it["real_s"] > 0 and it["simulated_s"] > 0 and math.isfinite(it["error"])
    # The simulator holds the later-posted messages behind the earlier ones on a NIC: the last
    # rank of a node waits longest (what the contention rule says, not a measurement).
    for mode in ("trace", "predictive"):
        simulated = [it["simulated_s"] for it in repeat if it["group"] == mode]
        assert simulated[3] > simulated[0] and simulated[7] > simulated[4], (mode, simulated)
