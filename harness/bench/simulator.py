"""How fast the simulator runs: ranks x iterations per algorithm, events per second.

Settings (``--setting``):

- ``resnet50`` (default): the issue's target, a ResNet-50-sized model (25.6M floats, given as
  ``workload.params``), 250 ms of emulated compute with 10% jitter, two random ranks sleeping
  320 ms per iteration, on the default cluster network (no calibration);
- ``resnet20``: the ResNet-20-sized model (its own parameter count), 50 ms of compute, the same
  injection.

Algorithms: ``--algorithm YAML`` (repeatable; default WAGMA-SGD with group size 8 and a
synchronous round every 11) or ``--all`` (every registered algorithm with its defaults; EASGD's
alpha scaled to the rank count as its stability bound needs, WAGMA's groups at most all ranks).
Each one runs in this process, on one core, ``--repeat`` times; each repetition prints a line
and the table gives medians.

``--shapes`` runs the matrix of :func:`shapes` instead (``--only`` picks some by label): the
speed targets in the shapes the schema allows (WAGMA-SGD groups of 2 to 32, powers or not, with
synchronous rounds every 2 to 50; a slow per-link rule; nodes of 8 sharing 10 GbE NICs with a
flat ring allreduce; calibrated real compute; every built-in at 1,024 x 1,000 and 16,384 x 100;
four at 65,536 x 100), each against its wall-time target, with the peak memory of the process.

Example::

    python -m harness bench simulator --all --ranks 1024 --iterations 1000
    python -m harness bench simulator --ranks 16384 --iterations 100 --algorithm '{name: sgp}'
    python -m harness bench simulator --shapes --only wagma_g3_p6,flat_ring_nics
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import yaml
from tabulate import tabulate

from harness.algorithms import registry
from harness.arguments import argtype, split_list
from harness.errors import HarnessError
from harness.scenario.loader import scenario_from_dict
from harness.sim.calibration import CalibrationEntry, ComputePoint
from harness.workload.names import workload_labels

# The simulator itself (torch, pandas) is imported inside the functions that run it: the CLI
# imports every benchmark at start-up.
DEFAULT_RANKS = 1024
DEFAULT_ITERATIONS = 1000
DEFAULT_ALGORITHM = "{name: wagma, group_size: 8, period: 11}"
SETTINGS: dict[str, dict[str, Any]] = {
    "resnet50": {"model": "resnet20", "params": 25_600_000, "emulate_ms": 250},
    "resnet20": {"model": "resnet20", "params": None, "emulate_ms": 50},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=DEFAULT_RANKS, help=f"simulated ranks (default {DEFAULT_RANKS})")
    parser.add_argument(
        "--iterations", type=int, default=DEFAULT_ITERATIONS, help=f"iterations (default {DEFAULT_ITERATIONS})"
    )
    parser.add_argument(
        "--setting",
        choices=sorted(SETTINGS),
        default="resnet50",
        help="workload size and compute (default resnet50: 25.6M floats, 250 ms)",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--algorithm",
        action="append",
        metavar="YAML",
        help=f"an algorithm entry as YAML, repeatable (default: {DEFAULT_ALGORITHM})",
    )
    which.add_argument("--all", action="store_true", help="every registered algorithm with its defaults")
    parser.add_argument("--repeat", type=int, default=1, help="repetitions (default 1); medians are reported")
    parser.add_argument(
        "--shapes",
        action="store_true",
        help="the matrix of shapes with their speed targets (see the module's description)",
    )
    parser.add_argument(
        "--only",
        type=argtype(_shape_list),
        default=None,
        metavar="LABELS",
        help="with --shapes: comma-separated shape labels (default: all)",
    )


def _shape_list(text: str) -> list[str]:
    labels = list(dict.fromkeys(split_list(text, "shape", "wagma_g3_p6,slow_link")))
    known = [shape.label for shape in shapes()]
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise ValueError(f"unknown shape {unknown[0]!r} (shapes: {', '.join(known)})")
    return labels


def default_entries(ranks: int) -> list[dict]:
    """Every registered algorithm with its defaults, made valid for ``ranks`` where a default is not."""
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
    s = SETTINGS[setting]
    workload = {
        "model": s["model"],
        "dataset": "synthetic",
        "batch_size": 32,
        "iterations": iterations,
        "eval_every": iterations,
        "compute": {"emulate_ms": s["emulate_ms"], "jitter": 0.1},
    }
    if s["params"]:
        workload["params"] = s["params"]
    return scenario_from_dict(
        {
            "name": "bench_simulator",
            "ranks": ranks,
            "seed": 1,
            "workload": workload,
            "algorithms": algorithms,
            "imbalance": [{"kind": "random_ranks", "count": 2, "delay_ms": 320}],
        },
        source="--algorithm",
    )


def _prepared(scenario, compute: list | None = None):
    """(calibration entry, timing, delays, factors) of a benchmark scenario on the default cluster
    network; ``compute``: calibrated compute points for real compute. The model is sized here
    once (meta device): that is not the simulator's speed."""
    from harness.sim.runs import DEFAULT_NETWORK  # noqa: PLC0415  (loads torch)
    from harness.sim.simulate import injection_arrays  # noqa: PLC0415  (loads torch)
    from harness.sim.timing import PredictiveTiming  # noqa: PLC0415  (loads pandas)
    from harness.workload.models import communicated_floats  # noqa: PLC0415  (loads torch)

    entry = CalibrationEntry(ranks=scenario.ranks, network=DEFAULT_NETWORK, compute=compute or [])
    delays, factors = injection_arrays(scenario)
    timing = PredictiveTiming(scenario, entry, factors)
    communicated_floats(scenario)
    return entry, timing, delays, factors


def run(args: argparse.Namespace) -> int:
    from harness.sim.simulate import simulate_algorithm  # noqa: PLC0415  (loads torch)

    if args.repeat < 1:
        raise HarnessError(f"--repeat must be >= 1 (got {args.repeat})")
    if args.shapes:
        return run_shapes(args.only)
    if args.only:
        raise HarnessError("--only picks shapes: it needs --shapes")
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
    entry, timing, delays, factors = _prepared(scenario)
    table = []
    for params in scenario.algorithms:
        rows = []
        for repetition in range(args.repeat):
            wall0, cpu0 = time.perf_counter(), time.process_time()
            frame, stats = simulate_algorithm(scenario, params, timing, entry.network, delays, factors)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            rows.append((stats.events, wall, cpu, stats.events / wall, float(frame["end_s"].max())))
            print(
                f"{params.name} repetition {repetition + 1}: {wall:.1f} s wall, {cpu:.1f} s CPU, "
                f"{rows[-1][3]:,.0f} events/s",
                flush=True,
            )
        table.append(
            [
                params.name,
                scenario.ranks,
                scenario.workload.iterations,
                f"{rows[0][0]:,}",
                f"{statistics.median(r[1] for r in rows):.1f}",
                f"{statistics.median(r[2] for r in rows):.1f}",
                f"{statistics.median(r[3] for r in rows):,.0f}",
                f"{rows[0][4]:.1f}",
            ]
        )
    print(
        f"setting {args.setting}: {scenario.workload.params or 'model-sized'} floats, "
        f"{SETTINGS[args.setting]['emulate_ms']} ms compute, 2 random ranks sleeping 320 ms per iteration"
    )
    print(
        tabulate(
            table,
            headers=["algorithm", "ranks", "iterations", "events", "wall s", "CPU s", "events/s", "simulated s"],
            tablefmt="simple",
            disable_numparse=True,
        )
    )
    return 0


# -- the matrix of shapes (--shapes) ------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One row group of ``--shapes``: ``algorithms`` simulated one at a time at ``ranks`` x
    ``iterations``, each against ``target_s`` of wall time; ``changes`` are merged into the
    benchmark scenario (a ``network`` section, a ``workload`` section); ``real_compute_s``: the
    workload computes for real, calibrated at that many seconds per iteration."""

    label: str
    algorithms: tuple[Any, ...]
    ranks: int
    iterations: int
    target_s: float
    changes: dict = field(default_factory=dict)
    real_compute_s: float | None = None
    setting: str = "resnet50"
    memory_gb: float | None = None


def shapes() -> list[Shape]:
    """The speed targets of the simulator in the shapes the schema allows."""
    nics = {"network": {"topology": {"preset": "ethernet_10g", "ranks_per_node": 8}}}
    slow_link = {"network": {"links": [{"rank": 3, "latency_ms": 2, "bandwidth_gbps": 5}]}}
    big = ("allreduce_sgd", "local_sgd", "diloco", "sgp")
    return [
        *(
            Shape(f"wagma_g{g}_p{p}", ({"name": "wagma", "group_size": g, "period": p},), 1024, 1000, 30.0)
            for g, p in ((2, 2), (3, 6), (8, 11), (6, 50), (32, 20))
        ),
        Shape(
            "slow_link",
            ({"name": "wagma", "group_size": 4, "period": 11}, "allreduce_sgd", "sgp"),
            1024,
            1000,
            30.0,
            slow_link,
        ),
        Shape("flat_ring_nics", ("allreduce_sgd", {"name": "local_sgd", "period": 4}, "dpsgd"), 1024, 1000, 30.0, nics),
        Shape(
            "real_compute",
            ("allreduce_sgd", {"name": "wagma", "group_size": 8, "period": 11}),
            1024,
            1000,
            30.0,
            {"workload": {"compute": "real"}},
            real_compute_s=0.05,
            setting="resnet20",
        ),
        Shape("all_1024", tuple(default_entries(1024)), 1024, 1000, 30.0),
        Shape("all_16384", tuple(default_entries(16384)), 16384, 100, 60.0),
        Shape(
            "big_65536", tuple(e for e in default_entries(65536) if e["name"] in big), 65536, 100, 300.0, memory_gb=8.0
        ),
    ]


def shape_scenario(shape: Shape, algorithm: Any):
    """The benchmark scenario of one algorithm of ``shape``."""
    doc = benchmark_scenario(shape.ranks, shape.iterations, [algorithm], shape.setting).resolved_dict()
    for section, fields in shape.changes.items():
        doc[section] = {**doc.get(section, {}), **fields}
    if shape.real_compute_s is not None:
        doc["workload"].pop("params", None)
    return scenario_from_dict(doc, source=f"shape {shape.label}")


def _simulate_shape(shape: Shape, algorithm: Any) -> tuple[str, int, float, float]:
    """In a child process: (algorithm name, events, wall s, peak RSS GB) of one simulation."""
    from harness.sim.simulate import simulate_algorithm  # noqa: PLC0415  (loads torch)

    scenario = shape_scenario(shape, algorithm)
    compute = []
    if shape.real_compute_s is not None:
        model, dataset = workload_labels(scenario.workload)
        compute = [
            ComputePoint(
                model=model,
                dataset=dataset,
                batch_size=scenario.workload.batch_size,
                median_s=shape.real_compute_s,
                p95_s=shape.real_compute_s,
                samples=1,
            )
        ]
    entry, timing, delays, factors = _prepared(scenario, compute)
    wall0 = time.perf_counter()
    _, stats = simulate_algorithm(scenario, scenario.algorithms[0], timing, entry.network, delays, factors)
    wall = time.perf_counter() - wall0
    return scenario.algorithms[0].name, stats.events, wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def run_shapes(only: list[str] | None) -> int:
    """Each shape's algorithms, one simulation at a time in a child process (its own peak memory);
    a table against the targets. 0 when every target held, 1 otherwise."""
    matrix = shapes()
    if only:  # labels checked by --only's type
        matrix = [s for s in matrix if s.label in only]
    rows, missed = [], 0
    context = multiprocessing.get_context("fork")  # the parent's imports come along: no start-up in the timing
    for shape in matrix:
        for algorithm in shape.algorithms:
            with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
                name, events, wall, rss_gb = pool.submit(_simulate_shape, shape, algorithm).result()
            ok = wall <= shape.target_s and (shape.memory_gb is None or rss_gb <= shape.memory_gb)
            missed += not ok
            target = f"<= {shape.target_s:g} s" + (f", {shape.memory_gb:g} GB" if shape.memory_gb else "")
            rows.append(
                [
                    shape.label,
                    name,
                    f"{shape.ranks:,} x {shape.iterations:,}",
                    f"{wall:.1f}",
                    f"{events:,}",
                    f"{events / wall:,.0f}",
                    f"{rss_gb:.2f}",
                    target,
                    "ok" if ok else "MISSED",
                ]
            )
            print(" ".join(rows[-1]), flush=True)
    print(
        tabulate(
            rows,
            headers=[
                "shape",
                "algorithm",
                "ranks x iterations",
                "wall s",
                "events",
                "events/s",
                "peak GB",
                "target",
                "",
            ],
            tablefmt="simple",
            disable_numparse=True,
        )
    )
    print(f"{len(rows) - missed} of {len(rows)} within their targets")
    return 1 if missed else 0
