"""``bench stress``: its rule checks fed right and wrong rounds (no MPI), then short real runs.

The full stress test (10,000 rounds per part on 8 ranks) is a benchmark:
``mpiexec -n 8 python -m harness.bench.stress_worker``; here it runs a few hundred rounds per part.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

from harness.bench import stress, stress_worker
from harness.launch import run_ranks
from harness.schedules import is_sync_round, wagma_phases
from harness.testing import stress_rule
from harness.testing.stress_rule import (
    check_drained,
    check_group_rounds,
    check_info,
    check_push_totals,
    check_result,
    check_totals,
    g,
    initial_mass,
    payload_weights,
    publish_buffer,
    published_totals,
    push_message,
)

# A child must not believe it already runs inside an MPI job (pytest may itself run under one).
_JOB_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_STEP_ID")


def _env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in _JOB_VARS}, "PYTHONUNBUFFERED": "1"}


# -- a literal, loop-by-loop model of the rule, independent of the vectorized checker -------------
def _simulate(ranks: int, rounds: int, sync_every: int, accumulate: bool, phases_by_rank, payload: int, seed: int):
    """Random but legal staleness reports, and the sums the rule then gives every rank."""
    rng = np.random.default_rng(seed)
    weights = payload_weights(ranks, payload)
    published = np.full((ranks, rounds), -1)  # R[j, k]: the round of j's contributed buffer
    for j in range(ranks):
        last, oldest = -1, -1
        for k in range(rounds):
            if is_sync_round(k, sync_every):
                last = k
            else:
                last = int(rng.integers(max(last, oldest), k + 1))
            published[j, k] = last
            if is_sync_round(k, sync_every):
                oldest = k
    staleness = np.arange(rounds)[None, :] - published
    outs = np.zeros((ranks, rounds, 2 * ranks + payload), dtype=np.float32)
    for i in range(ranks):
        for k in range(rounds):
            members = range(ranks) if is_sync_round(k, sync_every) else phases_by_rank[i][k % len(phases_by_rank[i])]
            for j in members:
                if accumulate:
                    first = published[j, k - 1] + 1 if k else 0
                    for r in range(first, published[j, k] + 1):
                        outs[i, k] += publish_buffer(j, r, ranks, weights)
                else:
                    outs[i, k] += publish_buffer(j, int(published[j, k]), ranks, weights)
    headers = outs[:, :, :2 * ranks].astype(np.int64)
    digests = np.array([[zlib.crc32(outs[i, k].tobytes()) for k in range(rounds)] for i in range(ranks)])
    return staleness, outs, headers, digests, weights


def _info(k: int, staleness: int, group: int, sync: bool) -> dict:
    return {"round": k, "sync": sync, "group_size": group, "staleness": staleness, "joined_early": staleness > 0}


# -- per-round checks ---------------------------------------------------------------------------
def test_publish_buffer_layout():
    weights = payload_weights(4, 6)
    buf = publish_buffer(2, 10, 4, weights)
    assert buf.dtype == np.float32 and buf.shape == (14,)
    assert buf[:8].tolist() == [0, 0, 1, 0, 0, 0, g(10), 0]
    np.testing.assert_array_equal(buf[8:], weights[0][2] + weights[1][2] * g(10))
    assert g(-1) == 1 and g(0) == 2 and min(g(np.arange(-1, 20_000))) >= 1  # WAGMA's initial buffer shows as B = 1


def test_check_result_accepts_the_rule_and_rejects_wrong_sums():
    ranks, weights = 4, payload_weights(4, 32)
    pub = lambda j, r: publish_buffer(j, r, ranks, weights)  # noqa: E731
    right = pub(0, 5) + pub(2, 3)
    assert check_result(right, [0, 2], ranks, weights, accumulate=False) == []
    assert check_result(pub(0, 5) + pub(2, -1), [0, 2], ranks, weights, accumulate=False) == []  # initial buffer

    wrong = {
        "a member missing": pub(0, 5),
        "a rank outside the group": right + pub(1, 5),
        "a member counted twice": right + pub(2, 4),
        "payload off by one": right + np.eye(1, right.size, right.size - 1, dtype=np.float32)[0],
        "a slot never written": np.where(np.arange(right.size) == 9, np.nan, right).astype(np.float32),
        "a fraction": right * np.float32(1.5),
    }
    for what, out in wrong.items():
        assert check_result(out, [0, 2], ranks, weights, accumulate=False), what

    # eager-SGD: a contribution may hold several publishes, or none
    eager = pub(0, 4) + pub(0, 5) + pub(2, 5)
    assert check_result(eager, [0, 1, 2, 3], ranks, weights, accumulate=True) == []
    assert check_result(eager, [0, 1, 2, 3], ranks, weights, accumulate=False)  # two publishes of rank 0
    assert check_result(eager + pub(3, 1) * 0 + 1, [0, 1, 2, 3], ranks, weights, accumulate=True)


def test_check_info_rules():
    assert check_info(_info(6, 2, 2, False), 6, [0, 1], 5) == []
    assert check_info(_info(4, 0, 4, True), 4, [0, 1, 2, 3], 5) == []
    bad = {
        "stale in a sync round": (_info(4, 1, 4, True), 4, [0, 1, 2, 3]),
        "sync flag wrong": (_info(4, 0, 4, False), 4, [0, 1, 2, 3]),
        "group size wrong": (_info(6, 0, 3, False), 6, [0, 1]),
        "round wrong": (_info(7, 0, 2, False), 6, [0, 1]),
        "joined_early inconsistent": ({**_info(6, 1, 2, False), "joined_early": False}, 6, [0, 1]),
        "negative staleness": (_info(6, -1, 2, False), 6, [0, 1]),
        "older than the last sync round": (_info(6, 3, 2, False), 6, [0, 1]),  # round 3 < sync round 4
    }
    for what, (info, k, members) in bad.items():
        assert check_info(info, k, members, 5), what


# -- the rule across ranks ----------------------------------------------------------------------
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize(("ranks", "group_size"), [(4, 2), (6, 2), (3, 2)])
def test_group_rounds_accepts_the_rule(ranks, group_size, accumulate):
    sync_every, rounds = 4, 24
    phases = [[list(range(ranks))] if accumulate else wagma_phases(i, ranks, group_size) for i in range(ranks)]
    staleness, outs, headers, digests, weights = _simulate(ranks, rounds, sync_every, accumulate, phases, 8, seed=ranks)
    assert staleness.max() > 0  # the model does produce stale rounds
    assert check_group_rounds(phases, staleness, headers, digests, sync_every, accumulate) == (0, [])
    for i in range(ranks):
        for k in range(rounds):
            members = stress_rule.group_members(phases[i], k, ranks, sync_every)
            assert check_result(outs[i, k], members, ranks, weights, accumulate) == []
            assert check_info(_info(k, int(staleness[i, k]), len(members), bool(is_sync_round(k, sync_every))),
                              k, members, sync_every) == []
    if accumulate:  # everything published was summed out (the last round is synchronous)
        for i in range(ranks):
            assert check_totals(outs[i].astype(np.int64).sum(axis=0), published_totals(ranks, rounds, weights)) == []


@pytest.mark.parametrize("accumulate", [False, True])
def test_group_rounds_rejects_what_breaks_the_rule(accumulate):
    ranks, sync_every, rounds = 4, 4, 24
    phases = [[list(range(ranks))] if accumulate else wagma_phases(i, ranks, 2) for i in range(ranks)]
    staleness, outs, headers, digests, weights = _simulate(ranks, rounds, sync_every, accumulate, phases, 8, seed=7)
    j, k = map(int, np.argwhere(staleness > 0)[0])  # a stale contribution

    lied = staleness.copy()
    lied[j, k] -= 1  # the rank reports a fresher buffer than the one its group summed
    count, first = check_group_rounds(phases, lied, headers, digests, sync_every, accumulate)
    assert count > 0 and any(f"round {k}" in f for f in first), first

    backwards = staleness.copy()
    backwards[0, 9] = 9 - (-1)  # round 9 contributing the initial buffer: back in time, before sync round 7
    count, first = check_group_rounds(phases, backwards, headers, digests, sync_every, accumulate)
    assert any("back in time" in f for f in first) and any("older than the previous synchronous" in f for f in first)

    changed = headers.copy()
    changed[2, 5, ranks + 1] += 1  # rank 2 got a wrong B slot in round 5
    count, first = check_group_rounds(phases, staleness, changed, digests, sync_every, accumulate)
    assert count == 1 and first[0].startswith("sum differs from the rule: rank 2 round 5"), first

    split = digests.copy()
    split[1, 3] ^= 1  # rank 1's round-3 sum differs from its group's
    count, first = check_group_rounds(phases, staleness, headers, split, sync_every, accumulate)
    assert count >= 1 and all("different sums" in f and "round 3" in f for f in first), first

    if accumulate:  # a publish summed out twice, or lost
        totals = outs[0].astype(np.int64).sum(axis=0)
        published = published_totals(ranks, rounds, weights)
        assert check_totals(totals + publish_buffer(1, 3, ranks, weights).astype(np.int64), published)
        assert check_totals(totals - publish_buffer(1, 3, ranks, weights).astype(np.int64), published)


# -- push-sum -----------------------------------------------------------------------------------
def test_push_checks():
    ranks = 3
    msgs = [push_message(0, ranks, np.array([5, 1])), push_message(2, ranks, np.array([7, 0]))]
    out = np.sum(msgs, axis=0).astype(np.float32)
    assert check_drained(out, 2, ranks) == []
    assert check_drained(np.zeros_like(out), 0, ranks) == []
    assert check_drained(out, 3, ranks)  # a message counted that never arrived
    assert check_drained(out, 1, ranks)  # or one that arrived uncounted
    assert check_drained(out - msgs[0] * np.float32(0.5), 2, ranks)

    held = np.stack([initial_mass(r, ranks) for r in range(ranks)])
    initial = held.sum(axis=0)
    sent = np.array([[0, 4, 1], [2, 0, 0], [0, 3, 0]])
    assert check_push_totals(held, initial, sent, sent.T.copy()) == []
    moved = held.copy()
    moved[0] -= 3
    moved[1] += 3
    assert check_push_totals(moved, initial, sent, sent.T.copy()) == []
    lost = moved.copy()
    lost[1, 0] -= 1
    assert any("mass not conserved" in p for p in check_push_totals(lost, initial, sent, sent.T.copy()))
    short = sent.T.copy()
    short[1, 0] -= 1
    assert check_push_totals(held, initial, sent, short) == [
        "rank 0 pushed 4 messages to rank 1, which drained 3 from it"]


# -- arguments ----------------------------------------------------------------------------------
def _parse(argv):
    parser = argparse.ArgumentParser()
    stress.add_arguments(parser)
    return parser.parse_args(argv)


def test_arguments_round_trip_to_the_worker(tmp_path):
    args = _parse(["--rounds", "300", "--seed", "9", "--max-delay-ms", "0.5", "--parts", "push,wagma",
                   "--json", str(tmp_path / "s.json"), "--spin-us", "20"])
    assert args.parts == ["wagma", "push"]
    again = _parse(stress.to_argv(args, 3))
    assert vars(again) == {**vars(args), "ranks": 3}
    argv = stress_worker.worker_argv(args, 3)
    assert argv[:3] == [sys.executable, "-m", "harness.bench.stress_worker"] and argv[3:] == stress.to_argv(args, 3)
    assert _parse([]).rounds == 10_000
    for bad in (["--rounds", "0"], ["--parts", "wagma,nope"], ["--delay-fraction", "2"], ["--sync-every", "0"]):
        with pytest.raises(SystemExit):
            _parse(bad)
    assert stress_rule.magnitude_problem(8, 5, 256) is None
    assert "2^24" in stress_rule.magnitude_problem(64, 200, 256)


@pytest.mark.subprocess
def test_import_does_not_load_mpi4py():
    code = "import sys, harness.bench.stress_worker; print('mpi4py' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


# -- real runs ----------------------------------------------------------------------------------
def _run(tmp_path, ranks: int, *options: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / f"stress-{ranks}.json"
    argv = [sys.executable, "-m", "harness.bench.stress_worker", "--json", str(out), *options]
    try:
        proc = run_ranks(ranks, argv, timeout=timeout, env=_env(), capture=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"stress test on {ranks} ranks did not finish in {timeout} s (deadlock?)\n{exc.stdout}")
    return proc, json.loads(out.read_text()) if out.exists() else None


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("ranks", "rounds", "options"),
    [(3, 400, ()), (6, 300, ("--group-size", "3")), (8, 400, ()),
     (4, 100, ("--payload", "16384"))],  # 64 KiB sums: the ring algorithm
    ids=["3", "6-groups-2-3", "8", "4-ring"],
)
def test_stress_short(tmp_path, ranks, rounds, options):
    proc, report = _run(tmp_path, ranks, "--rounds", str(rounds), "--seed", str(ranks), *options)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# violations total: 0  OK" in proc.stdout
    assert report["ok"] and report["violations"] == 0 and report["ranks"] == ranks
    parts = report["results"]
    assert set(parts) == {"wagma", "eager", "push"}
    for name in ("wagma", "eager"):
        part = parts[name]
        assert part["violations"] == 0 and part["failures"] == []
        assert part["rounds"] >= rounds and part["sync_rounds"] == part["rounds"] // 5
        assert part["max_staleness"] >= 1 and part["early_joins"] > 0  # the delays made it wait-avoiding
    assert parts["wagma"]["rounds"] == rounds
    assert parts["eager"]["rounds"] % 5 == 0 and parts["eager"]["summed_out_equals_published"] is True
    push = parts["push"]
    assert push["violations"] == 0 and push["rounds"] == rounds
    assert push["messages_sent"] == push["messages_received"] >= rounds * ranks
    assert push["mass_final"] == push["mass_initial"]


@pytest.mark.mpi
def test_stress_reports_a_wrong_result(tmp_path):
    # A falsified result on one rank must fail the run and say where (the checks can fail).
    proc, report = _run(tmp_path, 2, "--rounds", "40", "--corrupt", "wagma:1:17")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED wagma rank 1 round 17" in proc.stdout and "violations total: 0" not in proc.stdout
    assert report is not None and not report["ok"]
    assert report["results"]["wagma"]["violations"] > 0
    assert report["results"]["eager"]["violations"] == 0 and report["results"]["push"]["violations"] == 0
