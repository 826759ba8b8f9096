"""Fault verdicts at scale: every built-in algorithm x {kill, hang} x where it strikes, checked.

``python -m harness bench faults`` runs one small real job per case (``python -m harness run``
on a generated scenario: ``--ranks`` ranks, an MLP on MNIST-5k computed for real), each with one
injected fault on one rank, and reads the verdict the watchdog recorded in the run's
``run.json``. A case is an algorithm, a fault kind (``kill``: SIGKILL, as an out-of-memory kill;
``hang``: the training loop stops, its process lives), where it strikes (``during``: the start
of an iteration; ``communication``, just after the rank posted an operation, which the algorithm
decides: a blocking allreduce, a wait-avoiding round, a push-sum push, an AD-PSGD pair request,
the DiLoCo family's outer step; an ``evaluation``; ``finish()``), a rank count, and the faulted
rank, which rotates over the ranks (rank 0, which writes the results, included).

Per case it prints whether the verdict named the faulted rank as the root cause (``named``),
the evidence it went by, the time from the fault to the verdict (``after_s``, to be within the
watchdog's timeout), and whether any process of the job was left running. ``--load`` runs a busy
loop on every core for the whole benchmark (nice 0), as a loaded cluster node or CI machine
would. The exit status is 1 when any case missed (wrong or no verdict, late, or something left
running). The full matrix (17 algorithms x 2 kinds x 4 points x 2 rank counts) takes about an
hour on 2 cores; ``--only``, ``--kinds``, ``--during`` and ``--ranks`` pick a slice, ``--jobs``
runs cases side by side (a hang waits for its timeout, not for a core).

Example::

    python -m harness bench faults --only wagma,allreduce_sgd,adpsgd --ranks 4,5 --repeats 3 --load
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from harness.algorithms.registry import names
from harness.arguments import argtype, int_at_least, name_list
from harness.calibrate.measure import parse_ranks
from harness.scenario import ScenarioError, scenario_from_dict
from harness.testing.processes import processes_mentioning
from harness.testing.real_runs import CaseFailed, run_command

KINDS = ("kill", "hang")
POINTS = ("iteration", "communication", "evaluation", "finish")
DEFAULT_RANKS = (4, 5)
ITERATIONS = 16
EVAL_EVERY = 8
AT_ITERATION = 5  # the faults of every point but finish: an evaluation (after 8) and syncs follow
# Short enough for a benchmark, long enough for start-up on a loaded 2-core machine. A hang in an
# iteration is found after max(min_timeout_s, factor x the slowest iteration); in an evaluation
# (not an iteration) after startup_timeout_s.
WATCHDOG = {"min_timeout_s": 3.0, "factor": 5.0, "startup_timeout_s": 20.0}
SLACK_S = 2.0  # past the timeout: the watchdog's polling and a loaded machine's scheduling
CASE_TIMEOUT_S = 240.0  # a case still running then is stopped and counted as missed

# Where a built-in's default never communicates within the run (a period of 33 or 500
# iterations), or needs more ranks than the benchmark's: parameters that make every point happen.
PARAMS = {
    "wagma": {"group_size": 2},
    "eager_sgd": {"period": 4},
    "diloco": {"inner_steps": 4},
    "streaming_diloco": {"inner_steps": 4},
    "quorum_diloco": {"inner_steps": 4},
    "slowmo": {"period": 4},
}


@dataclasses.dataclass(frozen=True)
class Case:
    algorithm: str
    kind: str
    during: str
    ranks: int
    rank: int  # the faulted rank
    repeat: int

    @property
    def label(self) -> str:
        return f"{self.algorithm} {self.kind} during {self.during}, rank {self.rank} of {self.ranks}"

    def scenario(self) -> dict:
        fault = {"kind": self.kind, "rank": self.rank, "during": self.during}
        if self.during != "finish":
            fault["at_iteration"] = AT_ITERATION
        return {
            "name": "bench_faults",
            "ranks": self.ranks,
            "seed": 1 + self.repeat,
            "workload": {
                "model": "mlp",
                "dataset": "mnist5k",
                "batch_size": 32,
                "iterations": ITERATIONS,
                "eval_every": EVAL_EVERY,
            },
            "algorithms": [{"name": self.algorithm, **PARAMS.get(self.algorithm, {})}],
            "faults": [fault],
            "watchdog": WATCHDOG,
        }

    @property
    def bound_s(self) -> float:
        """The latest a verdict may come after the fault struck."""
        if self.kind == "kill":
            return WATCHDOG["min_timeout_s"] + SLACK_S  # a death is seen at once; never a timeout's wait
        return max(WATCHDOG["startup_timeout_s"], WATCHDOG["min_timeout_s"]) + SLACK_S


@dataclasses.dataclass
class Outcome:
    case: Case
    named: bool  # the verdict's root is the faulted rank
    verdict_rank: int | None
    evidence: str | None
    after_s: float | None
    left: int  # processes of the job still running after it ended
    wall_s: float
    problem: str = ""  # why the case missed, in words ("" when it did not)

    @property
    def ok(self) -> bool:
        return not self.problem


def cases(algorithms: list[str], kinds: list[str], points: list[str], ranks: list[int], repeats: int) -> list[Case]:
    """The matrix, the faulted rank rotating over the ranks from case to case."""
    out = []
    for i, (repeat, n, algorithm, kind, during) in enumerate(
        itertools.product(range(repeats), ranks, algorithms, kinds, points)
    ):
        out.append(Case(algorithm, kind, during, n, (i + repeat) % n, repeat))
    return out


def invalid(case: Case) -> str | None:
    """Why ``case`` cannot run (its scenario is refused, e.g. AD-PSGD on an odd rank count), or None."""
    try:
        scenario_from_dict(case.scenario())
    except ScenarioError as exc:
        return str(exc).split(": ", 1)[-1]
    return None


def run_case(case: Case, workdir: Path) -> Outcome:
    """Run ``case`` in a directory of its own under ``workdir``; its outcome."""
    here = workdir / f"case{abs(hash(case)) % 10**10}"
    here.mkdir(parents=True)
    scenario = here / "bench_faults.yaml"
    scenario.write_text(yaml.safe_dump(case.scenario(), sort_keys=False))
    cmd = [sys.executable, "-m", "harness", "run", str(scenario), "--out", str(here / "out")]
    start = time.monotonic()
    try:
        proc = run_command(cmd, timeout=CASE_TIMEOUT_S)  # interrupted like Ctrl+C when late
        timed_out, rc, err = False, proc.returncode, proc.stderr
    except CaseFailed:
        timed_out, rc, err = True, None, ""
    wall = time.monotonic() - start
    left = len(processes_mentioning(str(here)))
    fault = _recorded_fault(here / "out")
    verdict_rank = None if fault is None else fault.get("rank")
    after = None if fault is None else fault.get("after_s")
    outcome = Outcome(
        case,
        verdict_rank == case.rank,
        verdict_rank,
        None if fault is None else fault.get("evidence"),
        after,
        left,
        wall,
    )
    if timed_out:
        outcome.problem = f"no verdict within {CASE_TIMEOUT_S:g} s"
    elif rc == 0:
        outcome.problem = "the run finished: the fault never struck"
    elif fault is None:
        last = err.strip().splitlines()[-1] if err.strip() else "nothing on stderr"
        outcome.problem = f"no verdict in run.json (exit {rc}; {last[:200]})"
    elif not outcome.named:
        outcome.problem = f"named rank {verdict_rank}: {fault.get('message', '')[:300]}"
    elif after is None or after > case.bound_s:
        outcome.problem = f"verdict {after} s after the fault, over {case.bound_s:g} s"
    if left and not outcome.problem:
        outcome.problem = f"{left} process(es) left running"
    return outcome


def _recorded_fault(out: Path) -> dict | None:
    for run_json in out.glob("*/*/run.json"):
        with contextlib.suppress(OSError, ValueError):
            return json.loads(run_json.read_text()).get("fault")
    return None


@contextlib.contextmanager
def busy_loops(on: bool) -> Iterator[int]:
    """A busy loop on every core while the block runs (``on``); yields how many. Each is a
    process of its own, ended (and waited for) on the way out, however the block ends."""
    if not on:
        yield 0
        return
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        yield len(loops)
    finally:
        for p in loops:
            p.kill()
        for p in loops:
            p.wait()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--only", type=name_list("algorithm", "wagma,sgp"), default=None, help="algorithms (default: every built-in)"
    )
    parser.add_argument(
        "--kinds",
        type=name_list("fault kind", "kill,hang"),
        default=list(KINDS),
        help="fault kinds (default kill,hang)",
    )
    parser.add_argument(
        "--during",
        type=name_list("point", "iteration,communication"),
        default=list(POINTS),
        help=f"where they strike (default {','.join(POINTS)})",
    )
    parser.add_argument(
        "--ranks",
        type=argtype(parse_ranks),
        default=list(DEFAULT_RANKS),
        metavar="N[,N...]",
        help="rank counts, odd and even (default 4,5)",
    )
    parser.add_argument("--repeats", type=int_at_least(1), default=1, help="times over the matrix (default 1)")
    parser.add_argument("--load", action="store_true", help="a busy loop on every core throughout")
    parser.add_argument("--jobs", type=int_at_least(1), default=1, help="cases run side by side (default 1)")
    parser.add_argument("--json", type=Path, default=None, help="write every case's outcome here")
    parser.set_defaults(known_algorithms=names())


def run(args: argparse.Namespace) -> int:
    algorithms = args.only or list(args.known_algorithms)
    problems = [f"--only: unknown algorithm {a!r}" for a in algorithms if a not in args.known_algorithms]
    problems += [f"--kinds: unknown fault kind {k!r} (one of {', '.join(KINDS)})" for k in args.kinds if k not in KINDS]
    problems += [f"--during: unknown point {p!r} (one of {', '.join(POINTS)})" for p in args.during if p not in POINTS]
    ranks = args.ranks
    if args.json is not None and not args.json.absolute().parent.is_dir():
        problems.append(f"--json {args.json}: directory {args.json.absolute().parent} does not exist")
    if problems:
        print(f"error: {problems[0]}", file=sys.stderr)
        return 2
    matrix = []
    for case in cases(algorithms, args.kinds, args.during, ranks, args.repeats):
        why = invalid(case)
        if why is None:
            matrix.append(case)
        else:
            print(f"skip {case.label}: {why}", flush=True)
    print(
        f"bench faults: {len(matrix)} cases ({len(algorithms)} algorithms x {len(args.kinds)} kinds x "
        f"{len(args.during)} points x ranks {','.join(map(str, ranks))} x {args.repeats} repeats)"
        f"{', a busy loop on every core' if args.load else ''}, {args.jobs} at a time",
        flush=True,
    )
    outcomes: list[Outcome] = []
    with (
        tempfile.TemporaryDirectory(prefix="harness-bench-faults-") as tmp,
        busy_loops(args.load) as loops,
        ThreadPoolExecutor(max_workers=args.jobs) as pool,
    ):
        for outcome in pool.map(lambda c: run_case(c, Path(tmp)), matrix):
            outcomes.append(outcome)
            _print_line(outcome)
    _print_summary(outcomes, loops)
    if args.json is not None:
        rows = [
            {**dataclasses.asdict(o.case), **{k: v for k, v in dataclasses.asdict(o).items() if k != "case"}}
            for o in outcomes
        ]
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(o.ok for o in outcomes) else 1


def _print_line(o: Outcome) -> None:
    after = "-" if o.after_s is None else f"{o.after_s:.2f}"
    status = "ok  " if o.ok else "MISS"
    print(
        f"{status} {o.case.label:58s} named={'yes' if o.named else 'no ':3s} evidence={o.evidence or '-':17s} "
        f"after_s={after:>6s} left={o.left} wall={o.wall_s:5.1f}s{'  ' + o.problem if o.problem else ''}",
        flush=True,
    )


def _print_summary(outcomes: list[Outcome], loops: int) -> None:
    named = sum(o.named for o in outcomes)
    ok = sum(o.ok for o in outcomes)
    left = sum(o.left > 0 for o in outcomes)
    afters = sorted(o.after_s for o in outcomes if o.after_s is not None)
    by_kind = {}
    for kind in KINDS:
        values = sorted(o.after_s for o in outcomes if o.case.kind == kind and o.after_s is not None)
        if values:
            by_kind[kind] = (values[len(values) // 2], values[-1])
    print(
        f"\n{ok}/{len(outcomes)} cases ok; faulted rank named first in {named}/{len(outcomes)}; "
        f"cases that left a process running: {left}; busy loops: {loops}"
    )
    for kind, (median, worst) in by_kind.items():
        print(f"  {kind}: time from the fault to the verdict, median {median:.2f} s, worst {worst:.2f} s")
    if not afters:
        print("  no verdict was recorded")
