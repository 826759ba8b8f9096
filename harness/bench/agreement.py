"""How closely the simulator agrees with real runs: real against simulated times, case by case.

``python -m harness bench agreement`` measures each case ``--repeats`` times (default 3) and
prints, per case and item, the real and the simulated time, the error (``real / simulated - 1``
of one repeat's times, which is the simulated throughput's relative error, ``throughput_error``
of ``compare.csv``: positive where the simulator is too fast), each the median over the repeats
(each column its own, so the error's median need not be that of the two time medians), and the
range of the error; then per case the median and the worst |error| over its items (the numbers
of the README's accuracy tables). Each repeat's line says how much CPU time the hypervisor
stole meanwhile (``/proc/stat``): a busy spell slows the real side only.

These comparisons used to be tests with bounds of 10-35%, which a loaded or stolen-from
machine broke for a healthy change; the tests now keep coarse checks (a factor of 2, the
order of two cases) on the same scenarios and helpers, which live here.

Cases (``--only``, comma-separated):

``small_run`` (default)
    The 4-rank scenario of ``tests/test_sim_commands.py`` (:data:`SMALL_SCENARIO`: 20 ms of
    emulated compute, one random rank 40 ms late per iteration; Allreduce-SGD, Local SGD,
    SGP, WAGMA-SGD) run for real, then ``compare`` with a fixed calibration (0.3 ms, 1 GB/s):
    time per iteration, trace-driven and predictive.
``nic_run`` (default)
    The 4-rank run of ``tests/test_topology.py`` (:data:`NIC_RUN_SCENARIO`): 2 emulated nodes
    of 2 behind 0.2 Gb/s NICs, 1 MB allreduces; time per iteration against the trace-driven
    simulation.
``nic_messages`` (default)
    8 ranks as 2 nodes of 4 (``tests/mpi/topology_checks.py``): every rank exchanges 1 MB
    with its partner on the other node through 1 Gb/s NICs, posted 3 ms apart; each
    exchange's time against the simulator's network (the contention rule).
``allreduce_runs`` (default)
    ``network.allreduce``'s whole-buffer algorithms in real runs (:func:`allreduce_run_scenario`):
    recursive doubling on 5 ranks and reduce + broadcast on 3, 1 MB buffers through 0.2 Gb/s
    links, each rank a node agent of 4 GPUs with emulated staging; time per iteration against
    the trace-driven simulation.
``kernel_shaping`` (default; needs root and the virtual-host test bed, else skipped)
    2 ranks on 2 virtual hosts (``tests/test_vhosts.py``), one link at 100 Mb/s both ways:
    time per iteration with the kernel's ``tbf`` shaping it, against the native emulator
    shaping it, and against ``compare``'s trace-driven simulation of the emulated run.
    Start the test bed first: ``bash tests/vhosts/start_vhosts.sh`` (as root).
``straggler``, ``slow_link``, ``balanced``, ``two_nodes`` (not by default: minutes each)
    ``scenarios/NAME.yaml`` run as it is, then ``compare`` with this machine's calibration
    (``--calibration``, default ``results/calibration.json``; skipped with the command that
    makes it when it is missing): the "How close it is" table of docs/guides/simulation.md.

Exit status: 0 when every case ran or was skipped, 1 when one failed (its error is printed,
the others still run), 2 on bad arguments.

Example::

    python -m harness bench agreement
    python -m harness bench agreement --only small_run,nic_messages --repeats 5 --json agreement.json
    python -m harness bench agreement --only straggler --repeats 1 --calibration results/calibration.json
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.arguments import argtype, int_at_least, split_list
from harness.bench.nic_exchange import NIC_RANKS, NicExchange, nic_comparisons
from harness.bench.real_runs import REPO, RUN_TIMEOUT_S, CaseFailed, CaseSkipped, run_and_compare
from harness.bench.vhost_shaping import kernel_shaping_times, vhost_bed_missing

DEFAULT_REPEATS = 3

# -- the scenarios (tests/test_sim_commands.py, tests/test_topology.py) --------------------------

#: Emulated compute: the local work is a sleep, so the comparison is of the communication model,
#: not of how well a noisy machine reproduces forward/backward times.
SMALL_SCENARIO: dict = {
    "name": "simcheck",
    "ranks": 4,
    "seed": 3,
    "workload": {"model": "mlp", "dataset": "digits", "batch_size": 8, "iterations": 24, "eval_every": 12,
                 "compute": {"emulate_ms": 20}, "params": 2000},
    "algorithms": ["allreduce_sgd", {"name": "local_sgd", "period": 3}, "sgp",
                   {"name": "wagma", "group_size": 2, "period": 4}],
    "imbalance": [{"kind": "random_ranks", "count": 1, "delay_ms": 40}],
}
#: The compute of :data:`SMALL_SCENARIO`'s fixed calibration (predictive mode uses ``emulate_ms``).
SMALL_COMPUTE = [("mlp", "mnist5k", 32, 0.003)]

#: 4 ranks as 2 nodes of 2 behind 0.2 Gb/s NICs, a 1 MB buffer: every allreduce (a flat ring)
#: puts 1.5 MB through each NIC, at 25 MB/s at least 60 ms per iteration against 10 ms of compute.
NIC_RUN_SCENARIO: dict = {
    "name": "nodes", "ranks": 4, "seed": 5,
    "workload": {"model": "mlp", "dataset": "digits", "batch_size": 8, "iterations": 8, "eval_every": 8,
                 "compute": {"emulate_ms": 10}, "params": 250_000},
    "algorithms": ["allreduce_sgd"],
    "network": {"topology": {"ranks_per_node": 2, "nic": {"latency_us": 50, "bandwidth_gbps": 0.2}}},
}
NIC_RUN_COMPUTE = [("mlp", "digits", 8, 0.01)]
#: The least time per iteration of :data:`NIC_RUN_SCENARIO`: 1.5 MB through a 25 MB/s NIC.
NIC_RUN_LEAST_S = 1.5e6 / 25e6


#: (algorithm, ranks) of the ``allreduce_runs`` case and tests/test_allreduce_algorithms.py: odd
#: rank counts, so recursive doubling folds a rank in and out and the binomial trees are uneven.
ALLREDUCE_RUNS = (("recursive_doubling", 5), ("reduce_broadcast", 3))
ALLREDUCE_RUN_COMPUTE = [("mlp", "digits", 8, 0.01)]
#: 1 MB through a 0.2 Gb/s link: one whole-buffer step of the allreduce.
ALLREDUCE_RUN_HOP_S = 1e6 / 25e6


def allreduce_run_scenario(algorithm: str, ranks: int) -> dict:
    """Allreduce-SGD with ``network.allreduce: algorithm`` on ``ranks`` ranks: a 1 MB buffer
    through private 0.2 Gb/s links (40 ms per whole-buffer step), 10 ms of emulated compute, and
    local costs of ``harness.local_costs``: a node agent of 4 GPUs on a 0.8 Gb/s link (20 ms a
    iteration) and staging at 1.6 Gb/s (10 ms)."""
    return {
        "name": f"allreduce_{algorithm}", "ranks": ranks, "seed": 5,
        "workload": {"model": "mlp", "dataset": "digits", "batch_size": 8, "iterations": 8, "eval_every": 8,
                     "compute": {"emulate_ms": 10}, "params": 250_000,
                     "node": {"gpus": 4, "link": {"bandwidth_gbps": 0.8}},
                     "staging": {"bandwidth_gbps": 1.6}},
        "algorithms": ["allreduce_sgd"],
        "network": {"default": {"bandwidth_gbps": 0.2}, "allreduce": algorithm},
    }


def cpu_steal() -> tuple[int, int]:
    """(stolen, total) CPU time of the machine since boot, in clock ticks (``/proc/stat``): the
    time a virtual machine's runnable threads waited while its hypervisor ran something else.
    (0, 0) where there is no ``/proc/stat``."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0]
    except OSError:
        return 0, 0
    fields = [int(x) for x in first.split()[1:]]
    return fields[7] if len(fields) > 7 else 0, sum(fields[:8])


# -- what a case measures -----------------------------------------------------------------------


@dataclass
class Item:
    """One real and one simulated time (s) of a case's repeat; ``group`` summarizes items
    together (a compare mode)."""

    name: str
    real_s: float
    simulated_s: float
    group: str = ""

    @property
    def error(self) -> float:
        return self.real_s / self.simulated_s - 1


def compared_items(table) -> list[Item]:
    """compare.csv's rows as items: the time per iteration of each algorithm and mode."""
    return [Item(f"{row.algorithm} ({row.mode})", float(row.measured_iter_s), float(row.predicted_iter_s), row.mode)
            for row in table.itertuples()]


def _small_run(out: Path, args: argparse.Namespace) -> list[Item]:
    from harness.sim.calibration import save_fixed_calibration

    cal = save_fixed_calibration(out / "calibration.json", SMALL_SCENARIO["ranks"], SMALL_COMPUTE)
    return compared_items(run_and_compare(SMALL_SCENARIO, out, cal).table)


def _allreduce_runs(out: Path, args: argparse.Namespace) -> list[Item]:
    from harness.sim.calibration import save_fixed_calibration

    items = []
    for algorithm, ranks in ALLREDUCE_RUNS:
        where = out / algorithm
        cal = save_fixed_calibration(where / "calibration.json", ranks, ALLREDUCE_RUN_COMPUTE)
        table = run_and_compare(allreduce_run_scenario(algorithm, ranks), where, cal, mode="trace").table
        items += [Item(f"{algorithm} on {ranks} ranks", item.real_s, item.simulated_s, item.group)
                  for item in compared_items(table)]
    return items


def _nic_run(out: Path, args: argparse.Namespace) -> list[Item]:
    from harness.sim.calibration import save_fixed_calibration

    cal = save_fixed_calibration(out / "calibration.json", NIC_RUN_SCENARIO["ranks"], NIC_RUN_COMPUTE)
    return compared_items(run_and_compare(NIC_RUN_SCENARIO, out, cal).table)


def _nic_messages(out: Path, args: argparse.Namespace) -> list[Item]:
    from harness.launch import run_ranks

    out.mkdir(parents=True, exist_ok=True)
    report = out / "nic_messages.json"
    try:
        proc = run_ranks(NIC_RANKS, [sys.executable, "-m", "harness.bench.nic_exchange", str(report)],
                         timeout=RUN_TIMEOUT_S, capture=True)
    except subprocess.TimeoutExpired:
        raise CaseFailed(f"the exchange on {NIC_RANKS} ranks did not finish in {RUN_TIMEOUT_S} s") from None
    if proc.returncode != 0 or not report.exists():
        raise CaseFailed(f"the exchange on {NIC_RANKS} ranks exited {proc.returncode}\n{proc.stderr[-3000:]}")
    data = json.loads(report.read_text())
    exchange = NicExchange([tuple(s) for s in data["spans"]], [tuple(s) for s in data["control"]],
                           data["received_right"])
    if not all(exchange.received_right):
        raise CaseFailed(f"wrong data received: {exchange.received_right}")
    return [Item(*compared) for compared in nic_comparisons(exchange)]


def _kernel_shaping(out: Path, args: argparse.Namespace) -> list[Item]:
    reason = vhost_bed_missing()
    if reason:
        raise CaseSkipped(reason)
    t = kernel_shaping_times(out)
    return [Item("kernel tbf vs native emulator", t.kernel_s, t.native_s),
            Item("kernel tbf vs simulator", t.kernel_s, t.simulated_s),
            Item("native emulator vs simulator", t.native_s, t.simulated_s)]


# -- the scenario files, with this machine's calibration ------------------------------------------


def _scenario_case(name: str) -> Callable[[Path, argparse.Namespace], list[Item]]:
    def measure(out: Path, args: argparse.Namespace) -> list[Item]:
        from harness.sim.calibration import DEFAULT_PATH, calibrate_command

        path = REPO / "scenarios" / f"{name}.yaml"
        if not path.is_file():
            raise CaseSkipped(f"no {path} in this installation")
        calibration = args.calibration or DEFAULT_PATH
        if not calibration.is_file():
            ranks = yaml.safe_load(path.read_text())["ranks"]
            raise CaseSkipped(f"no calibration file {calibration}; measure this machine with: "
                              f"{calibrate_command(path, ranks, calibration)}")
        return compared_items(run_and_compare(path, out, calibration.absolute()).table)

    return measure


@dataclass(frozen=True)
class Case:
    measure: Callable[[Path, argparse.Namespace], list[Item]]
    default: bool
    about: str


CASES: dict[str, Case] = {
    "small_run": Case(_small_run, True, "4 ranks, 4 algorithms, a random straggler: compare, both modes"),
    "nic_run": Case(_nic_run, True, "4 ranks as 2 nodes behind 0.2 Gb/s NICs: compare, trace-driven"),
    "nic_messages": Case(_nic_messages, True, "8 ranks as 2 nodes of 4: 1 MB exchanges through 1 Gb/s NICs"),
    "allreduce_runs": Case(_allreduce_runs, True, "recursive doubling and reduce + broadcast runs: compare, trace-driven"),
    "kernel_shaping": Case(_kernel_shaping, True, "2 virtual hosts, a 100 Mb/s link: kernel tbf, emulator, simulator"),
    **{name: Case(_scenario_case(name), False, f"scenarios/{name}.yaml with this machine's calibration")
       for name in ("straggler", "slow_link", "balanced", "two_nodes")},
}


# -- the command ----------------------------------------------------------------------------------


def _case_list(text: str) -> list[str]:
    names = list(dict.fromkeys(split_list(text, "case", "small_run,nic_messages")))
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise ValueError(f"unknown case {unknown[0]!r} (cases: {', '.join(CASES)})")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    default = ",".join(n for n, c in CASES.items() if c.default)
    parser.add_argument("--only", type=argtype(_case_list), metavar="CASES",
                        help=f"comma-separated cases (default: {default}; also: "
                             f"{', '.join(n for n, c in CASES.items() if not c.default)})")
    parser.add_argument("--repeats", type=int_at_least(1), default=DEFAULT_REPEATS,
                        help=f"measurements of each case (default {DEFAULT_REPEATS}); the table gives medians")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write every measurement to FILE")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="keep the runs in DIR (default: a temporary directory, removed at the end)")
    parser.add_argument("--calibration", type=Path, metavar="FILE",
                        help="this machine's calibration, for the scenario cases (default results/calibration.json)")


@dataclass
class CaseResult:
    name: str
    repeats: list[list[Item]] = field(default_factory=list)
    stolen: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    skipped: str | None = None
    failed: str | None = None


def _fmt_pct(x: float) -> str:
    return f"{100 * x:+.1f}"


def summarize(result: CaseResult) -> list[dict]:
    """Per item of a case: the medians over its repeats and the range of the error."""
    rows = []
    for i, first in enumerate(result.repeats[0] if result.repeats else []):
        items = [r[i] for r in result.repeats if i < len(r) and r[i].name == first.name]
        errors = [it.error for it in items]
        rows.append({"case": result.name, "item": first.name, "group": first.group,
                     "real_s": statistics.median(it.real_s for it in items),
                     "simulated_s": statistics.median(it.simulated_s for it in items),
                     "error": statistics.median(errors), "error_min": min(errors), "error_max": max(errors),
                     "repeats": len(items)})
    return rows


def case_summary(rows: list[dict]) -> list[tuple[str, float, float]]:
    """(group, median |error|, worst |error|) over a case's items, per group."""
    out = []
    for group in dict.fromkeys(r["group"] for r in rows):
        errors = [abs(r["error"]) for r in rows if r["group"] == group]
        out.append((group, statistics.median(errors), max(errors)))
    return out


def print_report(results: list[CaseResult], repeats: int) -> None:
    from tabulate import tabulate

    table = []
    for result in results:
        if result.skipped or result.failed:
            continue
        for row in summarize(result):
            table.append([row["case"], row["item"], f"{1e3 * row['real_s']:.1f}", f"{1e3 * row['simulated_s']:.1f}",
                          _fmt_pct(row["error"]), f"{_fmt_pct(row['error_min'])} .. {_fmt_pct(row['error_max'])}"])
    print()
    print(f"real against simulated, each column the median of its own over {repeats} repeat{'s' if repeats > 1 else ''} "
          "(error: real / simulated - 1 of a repeat's times = the simulated throughput's error)")
    if table:
        print(tabulate(table, headers=["case", "what", "real ms", "simulated ms", "error %", "error % range"],
                       colalign=("left", "left", "right", "right", "right", "right"), disable_numparse=True))
    print()
    for result in results:
        if result.skipped:
            print(f"{result.name}: skipped: {result.skipped}")
        elif result.failed:
            print(f"{result.name}: FAILED: {result.failed.splitlines()[0] if result.failed else ''}")
        else:
            parts = [f"{group + ': ' if group else ''}median |error| {100 * med:.1f}%, worst {100 * worst:.1f}%"
                     for group, med, worst in case_summary(summarize(result))]
            stolen = f"; {100 * max(result.stolen):.0f}% of the CPU time stolen at most" if result.stolen else ""
            print(f"{result.name}: {'; '.join(parts)}{stolen}")


def to_json(results: list[CaseResult], repeats: int) -> dict:
    cases: dict[str, Any] = {}
    for result in results:
        if result.skipped is not None:
            cases[result.name] = {"skipped": result.skipped}
        elif result.failed is not None:
            cases[result.name] = {"failed": result.failed}
        else:
            cases[result.name] = {
                "summary": summarize(result),
                "repeats": [[{"item": it.name, "group": it.group, "real_s": it.real_s, "simulated_s": it.simulated_s,
                              "error": it.error} for it in items] for items in result.repeats],
                "stolen": result.stolen, "seconds": result.seconds,
            }
    return {"repeats": repeats, "cases": cases}


def measure_case(name: str, out: Path, args: argparse.Namespace) -> CaseResult:
    """Every repeat of case ``name`` (one line each), or why it was skipped or failed."""
    result = CaseResult(name)
    for k in range(1, args.repeats + 1):
        before, began = cpu_steal(), time.monotonic()
        try:
            items = CASES[name].measure(out / name / f"repeat{k}", args)
        except CaseSkipped as exc:
            result.skipped = str(exc)
            print(f"{name}: skipped: {exc}", flush=True)
            return result
        except CaseFailed as exc:
            result.failed = str(exc)
            print(f"{name}: repeat {k} failed: {exc}", file=sys.stderr, flush=True)
            return result
        after = cpu_steal()
        stolen = (after[0] - before[0]) / max(after[1] - before[1], 1)
        result.repeats.append(items)
        result.stolen.append(stolen)
        result.seconds.append(time.monotonic() - began)
        worst = max(abs(it.error) for it in items) if items else math.nan
        print(f"{name}: repeat {k}/{args.repeats} in {result.seconds[-1]:.1f} s, {len(items)} items, "
              f"worst |error| {100 * worst:.1f}%, {100 * stolen:.0f}% of the CPU time stolen", flush=True)
    return result


def run(args: argparse.Namespace) -> int:
    names = args.only or [n for n, c in CASES.items() if c.default]
    if args.json is not None and not args.json.absolute().parent.is_dir():
        print(f"error: --json {args.json}: directory {args.json.absolute().parent} does not exist", file=sys.stderr)
        return 2
    out = args.out.absolute() if args.out is not None else Path(tempfile.mkdtemp(prefix="harness-agreement-"))
    try:
        results = []
        for name in names:
            print(f"{name}: {CASES[name].about}", flush=True)
            results.append(measure_case(name, out, args))
        print_report(results, args.repeats)
        if args.json is not None:
            args.json.write_text(json.dumps(to_json(results, args.repeats), indent=1) + "\n")
    except KeyboardInterrupt:
        return 130
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    return 1 if any(r.failed for r in results) else 0
