"""Conformance: a real run and its trace-driven simulation do the same thing, call by call.

The simulator runs the algorithms' own code on a simulated communicator, so what an algorithm
decides (which operation to post, to whom, how large, when to wait or drain, when to skip) and
what it records must not depend on the backend. For every built-in algorithm this file runs a
real run under mpiexec at 3 and 5 ranks (4 for those that need an even rank count) with emulated
compute (10 ms, jitter), a straggler (rank 1 sleeps 100 ms every iteration) and a random rank
sleeping 15 ms every iteration, with ``results: {comm_calls: true}``; then replays it in the
simulator (``harness.sim.runs.replay``: each rank's local work as the run measured it, the
default network) with call logs, and compares per (algorithm, rank, iteration):

- the call sequences (comm_calls.csv: op, peers, floats, the caller's arguments, what came back);
- ``bytes_sent`` (the bytes of the operations the rank posted in the iteration);
- ``staleness``.

Everything is compared exactly, except what the real run leaves to timing by design
(docs/algorithms.md, "What the simulator reproduces exactly"):

- OSGP absorbs whatever gossip has arrived when it looks: its ``push.pending`` and
  ``push.drain`` calls (how many, and what they find) are not compared; its pushes, their
  waits and its staleness are (with ``synch_freq: 0`` it completes and pushes one round per
  iteration whatever the timing), and every message is absorbed exactly once in both;
- AD-PSGD's passive ranks answer requests in their progress threads as they arrive: what a
  passive rank's ``pair.drain`` finds per iteration (its staleness) is not compared; every
  request is answered exactly once in both (the drains of the run add up to the requests);
- the wait-avoiding round (WAGMA-SGD, eager-SGD) is joined early by a rank's progress thread
  when another rank activates it first: among ranks a few milliseconds apart, which one is first
  is timing. Staleness (and ``joined_early``) is compared on synchronous rounds, always fresh,
  and for the straggler, whose 100 ms make it late for every group round by a wide margin and
  give it a staleness set by the schedule (the rounds the others ran since the last
  synchronous or straggler-triggered round); round numbers, sync flags and group sizes always.
  The margin is checked on the run's own clock, not assumed: a straggler's group round is
  compared only where every other rank had arrived at it ``SCHEDULE_MARGIN_S`` before the
  straggler arrived at its first round since the last synchronous one (on a loaded machine the
  others can fall 100 ms behind, and then where the round lands among the straggler's own
  arrivals is timing too). Quorum DiLoCo's outer rounds are the same op with a quorum and no
  synchronous rounds: its staleness is compared for the straggler (with the same check) and
  between outer rounds (-1).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from conftest import run_scenario
from harness.algorithms.registry import BUILT_IN
from harness.results.records import RunDirectory
from harness.scenario import load_scenario
from harness.schedules import is_sync_round, periodic_sync
from harness.sim.runs import DEFAULT_NETWORK, replay

STRAGGLER = 1
PERIOD = 3  # the periodic family: syncs at 2, 5, 8; iteration 9's local step is folded in by finish()
WA_PERIOD = 4  # wait-avoiding: synchronous rounds 3 and 7; three group rounds between them
ITERATIONS = 10
WORKLOAD = {"model": "logreg", "dataset": "digits", "batch_size": 8, "iterations": ITERATIONS,
            "eval_every": ITERATIONS, "compute": {"emulate_ms": 10, "jitter": 0.1},
            "params": 20001}  # 80 kB: ring allreduces, with chunks that do not divide evenly
IMBALANCE = [{"kind": "fixed", "ranks": [STRAGGLER], "delay_ms": 100},
             {"kind": "random_ranks", "count": 1, "delay_ms": 15}]


def _odd_friendly(easgd_overlap: bool, eager_mode: str) -> list:
    return [
        "allreduce_sgd",
        {"name": "local_sgd", "period": PERIOD},
        {"name": "overlap_local_sgd", "period": PERIOD},
        {"name": "easgd", "period": PERIOD, "overlap": easgd_overlap},
        {"name": "cocod_sgd", "period": PERIOD},
        {"name": "bmuf", "period": PERIOD},
        "sgp",
        {"name": "osgp", "synch_freq": 0},
        {"name": "dpsgd", "graph": "ring"},
        {"name": "wagma", "group_size": 2, "period": WA_PERIOD},  # one group of all ranks at 3 and 5
        {"name": "eager_sgd", "mode": eager_mode, "period": WA_PERIOD},
        {"name": "diloco", "inner_steps": PERIOD},
        {"name": "streaming_diloco", "inner_steps": 4, "fragments": 2, "overlap": 1},
        {"name": "quorum_diloco", "inner_steps": PERIOD, "quorum": 0.5},
        {"name": "slowmo", "base": "sgp", "period": PERIOD},
        {"name": "gossip_pga", "period": PERIOD},
    ]


ALGORITHMS = {
    3: _odd_friendly(easgd_overlap=False, eager_mode="solo"),
    5: _odd_friendly(easgd_overlap=True, eager_mode="majority"),
    4: [{"name": "dpsgd", "graph": "bipartite_exponential"}, "adpsgd",
        {"name": "wagma", "group_size": 2, "period": WA_PERIOD}],  # groups of 2
}


def _name(entry) -> str:
    return entry if isinstance(entry, str) else entry["name"]


CASES = [(ranks, _name(entry)) for ranks, entries in ALGORITHMS.items() for entry in entries]

# Differences this suite found and that were fixed stay out of here; one would be listed as
# {(check, algorithm): reason} and run as a strict expected failure. (Found and fixed: an
# operation finish() posts at the very time the last iteration ended, on the simulated clock,
# was counted in that iteration; the simulator's records now carry the posting iteration.)
KNOWN_DISCREPANCIES: dict[tuple[str, str], str] = {}


def _cases(check: str, names: tuple[str, ...] | None = None) -> list:
    """(ranks, name) parameters of ``check``; a known discrepancy is an expected (strict) failure."""
    params = []
    for ranks, name in CASES:
        if names is not None and name not in names:
            continue
        known = KNOWN_DISCREPANCIES.get((check, name))
        marks = [pytest.mark.xfail(reason=known)] if known else []
        params.append(pytest.param(ranks, name, id=f"{ranks}-{name}", marks=marks))
    return params


def _scenario(ranks: int) -> dict:
    return {"name": f"conformance{ranks}", "ranks": ranks, "seed": 5, "workload": WORKLOAD,
            "algorithms": ALGORITHMS[ranks], "imbalance": IMBALANCE, "results": {"comm_calls": True}}


class Backends:
    """One real run and its replay: steps and call logs of both, and the real run's op records."""

    def __init__(self, run_dir: Path) -> None:
        run = RunDirectory.open(run_dir)
        scenario = load_scenario(run_dir / "scenario.resolved.yaml")
        frames, _ = replay(scenario, run.steps, DEFAULT_NETWORK)
        self.ranks = scenario.ranks
        self.steps = {"real": run.steps, "sim": pd.concat(frames.values(), ignore_index=True)}
        self.calls = {"real": run.comm_calls, "sim": pd.concat(frames.comm_calls.values(), ignore_index=True)}
        self.real_ops = run.comm_ops

    def straggler_timing(self, name: str) -> set[int]:
        """Iterations whose straggler round the real run's timing decided (:func:`straggler_rounds_left_to_timing`)."""
        if name not in WAIT_AVOIDING:
            return set()
        ops = self.real_ops[self.real_ops["algorithm"] == name]
        return straggler_rounds_left_to_timing(ops, self.calls_of("real", name))

    def steps_of(self, backend: str, name: str) -> pd.DataFrame:
        frame = self.steps[backend]
        return frame[frame["algorithm"] == name].sort_values(["rank", "iteration"]).reset_index(drop=True)

    def calls_of(self, backend: str, name: str) -> pd.DataFrame:
        frame = self.calls[backend]
        return frame[frame["algorithm"] == name].sort_values(["rank", "iteration", "seq"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    """``get(ranks)``: the real run at ``ranks`` (run on first use) and its replay."""
    cache: dict[int, Backends] = {}

    def get(ranks: int) -> Backends:
        if ranks not in cache:
            tmp = tmp_path_factory.mktemp(f"conformance{ranks}")
            cache[ranks] = Backends(run_scenario(tmp, _scenario(ranks), timeout=240))
        return cache[ranks]

    return get


# -- what is compared ----------------------------------------------------------------------------
WAIT_AVOIDING = ("wagma", "eager_sgd", "quorum_diloco")
# OSGP's absorption: how many pending/drain calls it makes, and what they find, is arrival timing.
DROPPED_CALLS = {"osgp": {"push.pending", "push.drain"}}
_OF = re.compile(r"of=(-?\d+)\.(\d+)")
_EARLY = re.compile(r" staleness=\d+ joined_early=\d+")
_ROUND = re.compile(r"round=(\d+) sync=([01]) ")
# How far ahead of the straggler the other ranks must have been for the schedule, not timing, to
# decide the straggler's group round: the activation still has to reach its progress thread.
SCHEDULE_MARGIN_S = 0.02
WA_OPS = ("wa_group_round", "wa_sync_round")


def straggler_rounds_left_to_timing(ops: pd.DataFrame, calls: pd.DataFrame) -> set[int]:
    """The iterations whose straggler group round the real run's timing decided, not the schedule.

    The straggler's staleness in group round k is k minus the last round it had arrived at when
    the round was joined. The schedule has every other rank arrive at k long before the straggler
    arrives at its first round since the last synchronous round s: then a peer's activation (or,
    if only the straggler may activate k, its own arrival) joins k, and the staleness is k - s
    (or 0) whatever the milliseconds. Where some rank arrived later than that less
    ``SCHEDULE_MARGIN_S`` (the machine was loaded), the round may land anywhere among the
    straggler's arrivals. Arrival at round k is the ``post_s`` of a rank's k-th wait-avoiding op
    record (every rank posts every round, in order); the calls give each round's iteration."""
    rounds = ops[ops["op"].isin(WA_OPS)].sort_values("post_s")
    arrivals = {rank: list(group["post_s"]) for rank, group in rounds.groupby("rank")}
    mine = calls[(calls["rank"] == STRAGGLER) & (calls["op"] == "wa.round")]
    left_to_timing: set[int] = set()
    first_since_sync = 0
    for call in mine.itertuples(index=False):
        match = _ROUND.search(call.result)
        k, sync = int(match[1]), match[2] == "1"
        if sync:
            first_since_sync = k + 1
            continue
        last_other = max(times[k] for rank, times in arrivals.items() if rank != STRAGGLER)
        if last_other > arrivals[STRAGGLER][first_since_sync] - SCHEDULE_MARGIN_S:
            left_to_timing.add(call.iteration)
    return left_to_timing


def _kept_result(name: str, rank: int, iteration: int, op: str, result: str, straggler_timing: set[int]) -> str:
    """``result`` where it is deterministic, '' or its deterministic part where it is timing."""
    if name == "adpsgd" and op == "pair.drain":
        return ""  # a passive rank's agent answered however many requests had arrived
    if name in WAIT_AVOIDING and op in ("wa.round", "info") and " sync=0 " in result:
        if rank != STRAGGLER or iteration in straggler_timing:
            return _EARLY.sub("", result)  # whether the progress thread joined first is timing
    return result


def comparable_calls(calls: pd.DataFrame, name: str, straggler_timing: set[int]) -> dict[tuple[int, int], list[tuple]]:
    """Per (rank, iteration), the calls compared: (op, peers, floats, detail, result), with the
    timing-dependent calls and results left out and handle references (``of=I.S``) renumbered
    to the calls kept. ``straggler_timing``: the iterations whose straggler round was timing."""
    dropped = DROPPED_CALLS.get(name, set())
    kept: dict[tuple[int, int], list[tuple]] = {}
    position: dict[tuple[int, int, int], int] = {}  # (rank, iteration, seq) -> index among kept
    for c in calls.itertuples(index=False):
        if c.op in dropped:
            continue
        sequence = kept.setdefault((c.rank, c.iteration), [])
        position[c.rank, c.iteration, c.seq] = len(sequence)
        detail = _OF.sub(lambda m, r=c.rank: f"of={m[1]}.{position[r, int(m[1]), int(m[2])]}", c.detail)
        result = _kept_result(name, c.rank, c.iteration, c.op, c.result, straggler_timing)
        sequence.append((c.op, c.peers, c.floats, detail, result))
    return kept


def compared_staleness(steps: pd.DataFrame, name: str, straggler_timing: set[int]) -> pd.Series:
    """The rows whose staleness is compared (see the module docstring)."""
    straggler = (steps["rank"] == STRAGGLER) & ~steps["iteration"].isin(straggler_timing)
    if name == "quorum_diloco":  # no synchronous rounds; between outer rounds staleness is -1
        between = steps["iteration"].map(lambda t: not periodic_sync(t, PERIOD))
        return between | straggler
    if name in WAIT_AVOIDING:
        sync = steps["iteration"].map(lambda t: is_sync_round(t, WA_PERIOD))
        return sync | straggler
    if name == "adpsgd":
        return steps["rank"] % 2 == 0  # active ranks; passive ones: test_adpsgd_answers_every_request_once
    return pd.Series(True, index=steps.index)


def _side_by_side(real: pd.DataFrame, sim: pd.DataFrame, column: str, rows: pd.Series) -> str:
    table = real.loc[rows, ["rank", "iteration"]].assign(real=real.loc[rows, column], sim=sim.loc[rows, column])
    return table.to_string(index=False)


# -- the comparisons -----------------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("ranks, name", _cases("calls"))
def test_call_sequences_match(backends, ranks, name):
    """Every rank makes the same calls in the same order in every iteration (and before the first
    and in finish()), with the same peers, sizes, arguments and deterministic results."""
    b = backends(ranks)
    timing = b.straggler_timing(name)
    real, sim = (comparable_calls(b.calls_of(side, name), name, timing) for side in ("real", "sim"))
    assert real, f"{name}: no calls logged"
    assert sorted(real) == sorted(sim), f"{name}: (rank, iteration) with calls differ"
    for key in sorted(real):
        assert real[key] == sim[key], f"{name} rank {key[0]} iteration {key[1]}:\nreal {real[key]}\nsim  {sim[key]}"


@pytest.mark.mpi
@pytest.mark.parametrize("ranks, name", _cases("bytes_sent"))
def test_bytes_sent_match(backends, ranks, name):
    """``bytes_sent``: the bytes of the operations a rank posted during the iteration, wherever they
    finished, counted as the native layer counts them (allreduce schedules, group rounds, pushes
    to every peer, requests without their replies)."""
    b = backends(ranks)
    real, sim = b.steps_of("real", name), b.steps_of("sim", name)
    differ = real["bytes_sent"] != sim["bytes_sent"]
    assert not differ.any(), f"{name}: bytes_sent differs:\n{_side_by_side(real, sim, 'bytes_sent', differ)}"
    if name != "adpsgd":  # its passive ranks send nothing in any iteration: replies are their agents'
        assert (real.groupby("rank")["bytes_sent"].sum() > 0).all(), f"{name}: a rank sent nothing"


@pytest.mark.mpi
@pytest.mark.parametrize("ranks, name", _cases("staleness"))
def test_staleness_matches(backends, ranks, name):
    """``staleness`` where it is not a matter of timing (module docstring): all rows except
    wait-avoiding group rounds of ranks other than the straggler and AD-PSGD's passive ranks."""
    b = backends(ranks)
    real, sim = b.steps_of("real", name), b.steps_of("sim", name)
    rows = compared_staleness(real, name, b.straggler_timing(name))
    assert rows.sum() >= ranks, f"{name}: too few rows compared"
    differ = rows & (real["staleness"] != sim["staleness"])
    assert not differ.any(), f"{name}: staleness differs:\n{_side_by_side(real, sim, 'staleness', differ)}"


@pytest.mark.mpi
@pytest.mark.parametrize("ranks, name", _cases("absorbed", ("osgp",)))
def test_osgp_absorbs_every_message_once(backends, ranks, name):
    """OSGP's drains are timing, but what they add up to is not: over the run (finish() flushes
    the channel and absorbs the rest) each rank absorbs exactly the messages pushed to it."""
    b = backends(ranks)
    for side in ("real", "sim"):
        calls = b.calls_of(side, name)
        pushed = Counter(int(p) for peers in calls.loc[calls["op"] == "push.send", "peers"] for p in peers.split(";"))
        drains = calls[calls["op"] == "push.drain"]
        absorbed = drains.groupby("rank")["result"].apply(lambda r: sum(map(int, r))).to_dict()
        assert absorbed == dict(pushed), f"{side}: absorbed {absorbed}, pushed to {dict(pushed)}"


@pytest.mark.mpi
@pytest.mark.parametrize("ranks, name", _cases("answered", ("adpsgd",)))
def test_adpsgd_answers_every_request_once(backends, ranks, name):
    """A passive rank's staleness is the number of requests its agent answered since its last
    drain: timing. Over the run (finish() closes the averager, then drains) the drains add up to
    the requests addressed to it, and the iterations' drains are its staleness, in both."""
    b = backends(ranks)
    for side in ("real", "sim"):
        calls, steps = b.calls_of(side, name), b.steps_of(side, name)
        requests = Counter(int(p) for p in calls.loc[calls["op"] == "pair.irequest", "peers"])
        drains = calls[calls["op"] == "pair.drain"].assign(found=lambda d: d["result"].astype(int))
        assert drains.groupby("rank")["found"].sum().to_dict() == dict(requests), side
        in_iterations = drains[drains["iteration"] < ITERATIONS].groupby("rank")["found"].sum()
        passive = steps[steps["rank"] % 2 == 1].groupby("rank")["staleness"].sum()
        assert passive.to_dict() == in_iterations.to_dict(), side


def test_every_algorithm_is_compared():
    """All built-in algorithms, at 3 and 5 ranks unless they need an even rank count (then 4)."""
    names = {entry.name for entry in BUILT_IN}
    assert {name for _, name in CASES} == names
    at_3_and_5 = {_name(e) for e in ALGORITHMS[3]} & {_name(e) for e in ALGORITHMS[5]}
    assert names - at_3_and_5 == {"adpsgd"}


def _wa_records(arrivals: dict[int, list[float]], sync_rounds: set[int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """comm_ops rows and the straggler's ``wa.round`` calls of a run where rank r arrived at round
    k at ``arrivals[r][k]`` (one round per iteration, as eager-SGD and WAGMA-SGD run them)."""
    ops = pd.DataFrame([{"rank": rank, "op": "wa_sync_round" if k in sync_rounds else "wa_group_round", "post_s": t}
                        for rank, times in arrivals.items() for k, t in enumerate(times)])
    calls = pd.DataFrame([{"rank": STRAGGLER, "iteration": k, "op": "wa.round",
                           "result": f"round={k} sync={int(k in sync_rounds)} group_size=3 staleness=0 joined_early=0"}
                          for k in range(len(arrivals[STRAGGLER]))])
    return ops, calls


def test_a_straggler_round_the_others_reached_late_is_left_to_timing():
    """The CI failure this rule came from: on a loaded machine the other ranks reached group round
    6 only after the straggler had arrived at round 4 (its first since synchronous round 3), so
    the straggler's staleness in round 6 was 2 in the run and 3 (the schedule's) in the replay.
    That round is left to timing; the others, reached in time, are still compared."""
    straggler = [0.11 * (k + 1) for k in range(8)]  # rounds 4 and 5 at 0.55 and 0.66
    on_time = [0.01 * (k + 1) for k in range(4)] + [0.45, 0.46, 0.47, 0.89]
    late = on_time[:6] + [0.60, 0.89]  # round 6 after the straggler's 0.55, before its 0.66
    ops, calls = _wa_records({0: on_time, STRAGGLER: straggler, 2: on_time}, sync_rounds={3, 7})
    assert straggler_rounds_left_to_timing(ops, calls) == set()
    ops, calls = _wa_records({0: on_time, STRAGGLER: straggler, 2: late}, sync_rounds={3, 7})
    assert straggler_rounds_left_to_timing(ops, calls) == {6}
    calls["result"] = calls["result"].str.replace("staleness=0", "staleness=2")
    kept = comparable_calls(calls.assign(seq=0, peers="", floats=1, detail=""), "eager_sgd", {6})
    assert kept[STRAGGLER, 6][0][4] == "round=6 sync=0 group_size=3"
    assert kept[STRAGGLER, 5][0][4].endswith("staleness=2 joined_early=0")
