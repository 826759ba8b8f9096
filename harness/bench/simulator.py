"""How fast the SimPy model runs: ranks x iterations of one algorithm, events per second.

The default case is the issue's target: 1,024 simulated ranks, 1,000 iterations of WAGMA-SGD
(group size 8, synchronous every 11th round as in the paper) on the paper's injection (two
random ranks sleep 320 ms per iteration), emulated compute of 50 ms with 10% jitter, a
ResNet-20-sized model (272,474 floats) on the default cluster network. It runs in this process
(one core, no MPI, no torch). Each repetition prints wall and CPU seconds and events/s; the
last lines are the medians.

Example::

    python -m harness bench simulator --ranks 1024 --iterations 1000 --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from tabulate import tabulate

DEFAULT_RANKS = 1024
DEFAULT_ITERATIONS = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=DEFAULT_RANKS, help=f"simulated ranks (default {DEFAULT_RANKS})")
    parser.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS,
                        help=f"iterations (default {DEFAULT_ITERATIONS})")
    parser.add_argument("--algorithm", default="{name: wagma, group_size: 8, period: 11}",
                        help="the algorithm entry as YAML (default: WAGMA-SGD, S=8, tau=10)")
    parser.add_argument("--repeat", type=int, default=1, help="repetitions (default 1); medians are reported")


def benchmark_scenario(ranks: int, iterations: int, algorithm: str):
    import yaml

    from harness.scenario.loader import scenario_from_dict

    entry = yaml.safe_load(algorithm)
    return scenario_from_dict({
        "name": "bench_simulator",
        "ranks": ranks,
        "seed": 1,
        "workload": {"model": "resnet20", "dataset": "synthetic", "batch_size": 32, "iterations": iterations,
                     "eval_every": iterations, "compute": {"emulate_ms": 50, "jitter": 0.1}},
        "algorithms": [entry],
        "imbalance": [{"kind": "random_ranks", "count": 2, "delay_ms": 320}],
    }, source="--algorithm")


def run(args: argparse.Namespace) -> int:
    from harness.scenario import ScenarioError
    from harness.sim.calibration import CalibrationEntry
    from harness.sim.runs import DEFAULT_NETWORK
    from harness.sim.simulate import injection_arrays, simulate_algorithm
    from harness.sim.timing import PredictiveTiming

    if args.repeat < 1:
        print(f"error: --repeat must be >= 1 (got {args.repeat})", file=sys.stderr)
        return 2
    try:
        scenario = benchmark_scenario(args.ranks, args.iterations, args.algorithm)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    (params,) = scenario.algorithms
    entry = CalibrationEntry(ranks=scenario.ranks, network=DEFAULT_NETWORK)
    rows = []
    for repetition in range(args.repeat):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        delays, factors = injection_arrays(scenario)
        timing = PredictiveTiming(scenario, entry, factors)
        frame, stats = simulate_algorithm(scenario, params, timing, entry.network, delays)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        rows.append((repetition + 1, stats.events, wall, cpu, stats.events / stats.host_s, float(frame["end_s"].max())))
        print(f"repetition {repetition + 1}: {wall:.1f} s wall, {cpu:.1f} s CPU, {rows[-1][4]:,.0f} events/s", flush=True)
    print(tabulate(
        [[params.name, scenario.ranks, scenario.workload.iterations, f"{rows[0][1]:,}",
          f"{statistics.median(r[2] for r in rows):.1f}", f"{statistics.median(r[3] for r in rows):.1f}",
          f"{statistics.median(r[4] for r in rows):,.0f}", f"{rows[0][5]:.1f}"]],
        headers=["algorithm", "ranks", "iterations", "events", "wall s", "CPU s", "events/s", "simulated s"],
        tablefmt="simple", disable_numparse=True))
    return 0
