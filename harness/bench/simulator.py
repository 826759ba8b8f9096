"""How fast the simulator runs: ranks x iterations per algorithm, events per second.

Settings (``--setting``):

- ``resnet50`` (default): the issue's target, a ResNet-50-sized model (25.6M floats, given as
  ``workload.params``), 250 ms of emulated compute with 10% jitter, two random ranks sleeping
  320 ms per iteration, on the default cluster network (no calibration);
- ``resnet20``: the ResNet-20-sized model (its own parameter count), 50 ms of compute, the same
  injection.

Algorithms: ``--algorithm YAML`` (repeatable; default WAGMA-SGD with group size 8 and a
synchronous round every 11) or ``--all`` (every registered algorithm with its defaults; EASGD's
alpha scaled to the rank count as its stability bound needs, WAGMA's groups at most all ranks). Each one runs in this process, on one
core, ``--repeat`` times; each repetition prints a line and the table gives medians.

Example::

    python -m harness bench simulator --all --ranks 1024 --iterations 1000
    python -m harness bench simulator --ranks 16384 --iterations 100 --algorithm '{name: sgp}'
"""

from __future__ import annotations

import argparse
import statistics
import time

from tabulate import tabulate

DEFAULT_RANKS = 1024
DEFAULT_ITERATIONS = 1000
DEFAULT_ALGORITHM = "{name: wagma, group_size: 8, period: 11}"
SETTINGS = {
    "resnet50": {"model": "resnet20", "params": 25_600_000, "emulate_ms": 250},
    "resnet20": {"model": "resnet20", "params": None, "emulate_ms": 50},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=DEFAULT_RANKS, help=f"simulated ranks (default {DEFAULT_RANKS})")
    parser.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS,
                        help=f"iterations (default {DEFAULT_ITERATIONS})")
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="resnet50",
                        help="workload size and compute (default resnet50: 25.6M floats, 250 ms)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--algorithm", action="append", metavar="YAML",
                       help=f"an algorithm entry as YAML, repeatable (default: {DEFAULT_ALGORITHM})")
    which.add_argument("--all", action="store_true", help="every registered algorithm with its defaults")
    parser.add_argument("--repeat", type=int, default=1, help="repetitions (default 1); medians are reported")


def default_entries(ranks: int) -> list[dict]:
    """Every registered algorithm with its defaults, made valid for ``ranks`` where a default is not."""
    from harness.algorithms import registry

    entries = []
    for name in registry.names():
        entry: dict = {"name": name}
        if name == "easgd":
            entry["alpha"] = 0.9 / ranks  # below the stability bound 2 / (ranks + 1)
        if name == "wagma":
            entry["group_size"] = min(8, ranks)  # the paper's groups, or all ranks when fewer
        entries.append(entry)
    return entries


def benchmark_scenario(ranks: int, iterations: int, algorithms: list, setting: str = "resnet50"):
    """The benchmark's scenario (raises ScenarioError naming a bad entry)."""
    from harness.scenario.loader import scenario_from_dict

    s = SETTINGS[setting]
    workload = {"model": s["model"], "dataset": "synthetic", "batch_size": 32, "iterations": iterations,
                "eval_every": iterations, "compute": {"emulate_ms": s["emulate_ms"], "jitter": 0.1}}
    if s["params"]:
        workload["params"] = s["params"]
    return scenario_from_dict({
        "name": "bench_simulator",
        "ranks": ranks,
        "seed": 1,
        "workload": workload,
        "algorithms": algorithms,
        "imbalance": [{"kind": "random_ranks", "count": 2, "delay_ms": 320}],
    }, source="--algorithm")


def run(args: argparse.Namespace) -> int:
    import yaml

    from harness.config import HarnessError
    from harness.sim.calibration import CalibrationEntry
    from harness.sim.runs import DEFAULT_NETWORK
    from harness.sim.simulate import injection_arrays, simulate_algorithm
    from harness.sim.timing import PredictiveTiming
    from harness.workload.models import communicated_floats

    if args.repeat < 1:
        raise HarnessError(f"--repeat must be >= 1 (got {args.repeat})")
    if args.all:
        entries = default_entries(args.ranks)
    else:
        entries = []
        for text in args.algorithm or [DEFAULT_ALGORITHM]:
            try:
                entries.append(yaml.safe_load(text))
            except yaml.YAMLError as exc:
                raise HarnessError(f"--algorithm {text!r}: not YAML ({exc})") from None
    scenario = benchmark_scenario(args.ranks, args.iterations, entries, args.setting)
    entry = CalibrationEntry(ranks=scenario.ranks, network=DEFAULT_NETWORK)
    delays, factors = injection_arrays(scenario)
    timing = PredictiveTiming(scenario, entry, factors)
    communicated_floats(scenario)  # sizing the model once (meta device) is not the simulator's speed
    table = []
    for params in scenario.algorithms:
        rows = []
        for repetition in range(args.repeat):
            wall0, cpu0 = time.perf_counter(), time.process_time()
            frame, stats = simulate_algorithm(scenario, params, timing, entry.network, delays, factors)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            rows.append((stats.events, wall, cpu, stats.events / wall, float(frame["end_s"].max())))
            print(f"{params.name} repetition {repetition + 1}: {wall:.1f} s wall, {cpu:.1f} s CPU, "
                  f"{rows[-1][3]:,.0f} events/s", flush=True)
        table.append([params.name, scenario.ranks, scenario.workload.iterations, f"{rows[0][0]:,}",
                      f"{statistics.median(r[1] for r in rows):.1f}", f"{statistics.median(r[2] for r in rows):.1f}",
                      f"{statistics.median(r[3] for r in rows):,.0f}", f"{rows[0][4]:.1f}"])
    print(f"setting {args.setting}: {scenario.workload.params or 'model-sized'} floats, "
          f"{SETTINGS[args.setting]['emulate_ms']} ms compute, 2 random ranks sleeping 320 ms per iteration")
    print(tabulate(table, headers=["algorithm", "ranks", "iterations", "events", "wall s", "CPU s", "events/s",
                                   "simulated s"], tablefmt="simple", disable_numparse=True))
    return 0
