"""How fast and how big simulated training is (``simulate --train``), against plain training.

For each algorithm (default: every built-in, with the parameters ``bench simulator --all``
gives them), the main job's workload (``scenarios/straggler.yaml``: the MLP on MNIST, batch 32,
its stragglers) is simulated with values at ``--ranks`` x ``--iterations`` (default 256 x
1,000) on the default cluster network, in this process. Beside it, in the same process and
with the same single compute thread, the benchmark times ``--naive-steps`` plain training steps
of one rank (the real loop's: batch, forward, backward, optimizer step) and scales them to
ranks x iterations: the cost of computing every simulated rank's steps one after the other
with nothing simulated (the median of the step timed before the algorithms and the one timed
right after each, so that a change of the machine's load hits both). The table gives, per
algorithm: the simulation's seconds, that naive cost, their ratio, the peak resident memory
while it ran, the replicas' own bytes
(parameters, gradients and optimizer state of every rank), what the peak held beyond them, the
ranks' whole state (replicas, the algorithm's buffers and its persistent operations' copies:
what the ranks of a real run would hold between them) and what the peak held beyond that: the
simulator's own memory (messages in flight, temporaries).

Peak memory is the process's high-water mark, reset before each algorithm (Linux
``/proc/self/clear_refs``), above the resident size before the first algorithm started (the
data loaded, nothing simulated); memory an earlier algorithm freed but the allocator kept
counts again, so the figure is an upper bound.

Example::

    python -m harness bench training
    python -m harness bench training --ranks 1024 --iterations 1000 --only allreduce_sgd,wagma
    python -m harness bench training --ranks 256 --iterations 100 --json training.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

from tabulate import tabulate

from harness.arguments import algorithm_list
from harness.bench.simulator import default_entries
from harness.scenario import load_scenario
from harness.scenario.loader import scenario_from_dict
from harness.sim.calibration import CalibrationEntry, ComputePoint

# The simulator and torch are imported inside the functions that run them: the CLI imports every
# benchmark at start-up.
DEFAULT_RANKS = 256
DEFAULT_ITERATIONS = 1000
DEFAULT_NAIVE_STEPS = 2000
MAIN_JOB = Path(__file__).resolve().parents[2] / "scenarios" / "straggler.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=DEFAULT_RANKS, help=f"simulated ranks (default {DEFAULT_RANKS})")
    parser.add_argument(
        "--iterations", type=int, default=DEFAULT_ITERATIONS, help=f"iterations (default {DEFAULT_ITERATIONS})"
    )
    parser.add_argument(
        "--only", type=algorithm_list, metavar="A[,B...]", help="these built-in algorithms (default: every one)"
    )
    parser.add_argument(
        "--naive-steps",
        type=int,
        default=DEFAULT_NAIVE_STEPS,
        help=f"plain training steps timed for the naive cost (default {DEFAULT_NAIVE_STEPS})",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the rows as JSON")


def _scenario(ranks: int, iterations: int, only: list[str] | None):
    """The main job at ``ranks`` x ``iterations`` with the benchmark's algorithms, with values."""
    main = load_scenario(MAIN_JOB, overrides={"only": ["allreduce_sgd"]})
    entries = [e for e in default_entries(ranks) if only is None or e["name"] in only]
    unknown = sorted(set(only or ()) - {e["name"] for e in entries})
    if unknown:
        raise ValueError(f"--only: not a built-in algorithm: {', '.join(unknown)}")
    data = main.resolved_dict()
    data.update(ranks=ranks, algorithms=entries, simulation={"train": True}, faults=[], overrides=[])
    data["workload"] = {**data["workload"], "iterations": iterations, "eval_every": iterations}
    data["results"] = {**data["results"], "provenance": "none"}
    return scenario_from_dict(data, source=f"{MAIN_JOB.name} at {ranks} ranks")


def naive_step_s(scenario, steps: int) -> float:
    """Median seconds of one plain training step of rank 0 (batch, forward, backward, optimizer
    step: what ``LocalWork`` does on a real rank), over ``steps`` steps in blocks of 100."""
    import torch  # noqa: PLC0415  (torch)

    from harness.runner.workload_state import build_state  # noqa: PLC0415  (loads torch)
    from harness.workload import scenario_dataset  # noqa: PLC0415  (loads torch)

    state = build_state(scenario, 0, scenario_dataset(scenario))
    model, optimizer = state.model, state.optimizer
    assert model is not None and optimizer is not None, "build_state builds the model and its optimizer"
    w = scenario.workload

    def step(t: int) -> None:
        x, y = state.batch(t, w.batch_size, scenario.seed, 0)
        optimizer.zero_grad(set_to_none=False)
        out = torch.nn.functional.cross_entropy(model(x), y)
        out.backward()
        float(out.detach())
        optimizer.step()

    for t in range(20):  # warm up
        step(t)
    blocks = []
    for b in range(max(1, steps // 100)):
        t0 = time.perf_counter()
        for t in range(100):
            step(b * 100 + t)
        blocks.append((time.perf_counter() - t0) / 100)
    return statistics.median(blocks)


def _status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # resets VmHWM to the current resident size
        return True
    except OSError:
        return False


def run(args: argparse.Namespace) -> int:
    import torch  # noqa: PLC0415  (torch)

    from harness.sim.runs import DEFAULT_NETWORK  # noqa: PLC0415  (loads torch)
    from harness.sim.simulate import injection_arrays, simulate_algorithm  # noqa: PLC0415  (loads torch)
    from harness.sim.timing import PredictiveTiming  # noqa: PLC0415  (loads pandas)
    from harness.sim.training import OPTIMIZER_BUFFERS, SimTraining, fit_problem  # noqa: PLC0415  (loads torch)
    from harness.workload import communicated_floats, configure_torch_threads, scenario_dataset  # noqa: PLC0415  (torch)

    if args.ranks < 1 or args.iterations < 1 or args.naive_steps < 1:
        print("error: --ranks, --iterations and --naive-steps must be >= 1", flush=True)
        return 2
    try:
        scenario = _scenario(args.ranks, args.iterations, args.only)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    problem = fit_problem(scenario, torch.device("cpu"))
    if problem is not None:
        print(f"error: {problem}")
        return 2
    configure_torch_threads(1)  # as simulate --train computes
    naive = naive_step_s(scenario, args.naive_steps)
    floats = communicated_floats(scenario)
    # Compute as the calibration would give it (any value does: the timing does not change the work).
    entry = CalibrationEntry(
        ranks=scenario.ranks,
        network=DEFAULT_NETWORK,
        compute=[
            ComputePoint(
                model="mlp",
                dataset="mnist5k",
                batch_size=scenario.workload.batch_size,
                median_s=naive,
                p95_s=naive * 1.25,
                samples=args.naive_steps,
                alone_s=naive,
            )
        ],
    )
    _, factors = injection_arrays(scenario)
    dataset = scenario_dataset(scenario)
    print(
        f"simulated training: {scenario.ranks} ranks x {scenario.workload.iterations} iterations of the main job's "
        f"model ({floats:,} floats); one plain step {naive * 1e3:.3f} ms (median of {args.naive_steps} steps)",
        flush=True,
    )
    measured_peak = _reset_peak()
    gc.collect()
    before_kb = _status_kb("VmRSS")  # the data and the naive step's model: the simulation's starting point
    rows = []
    for params in scenario.algorithms:
        gc.collect()
        _reset_peak()
        t0 = time.perf_counter()
        training = SimTraining(scenario, params, dataset, torch.device("cpu"), keep_rank_models=False)
        simulate_algorithm(
            scenario, params, PredictiveTiming(scenario, entry, factors), DEFAULT_NETWORK, training=training
        )
        seconds = time.perf_counter() - t0
        peak = (_status_kb("VmHWM") - before_kb) * 1024 if measured_peak else float("nan")
        # The plain step again right after, so that both are timed under the same load.
        optimizer = scenario.optimizer_of(params).name  # the DiLoCo family's own AdamW
        replica_bytes = scenario.ranks * floats * 4 * (2 + OPTIMIZER_BUFFERS.get(optimizer, 2))
        naive_s = (
            statistics.median([naive, naive_step_s(scenario, 300)]) * scenario.ranks * scenario.workload.iterations
        )
        rows.append(
            {
                "algorithm": params.name,
                "ranks": scenario.ranks,
                "iterations": scenario.workload.iterations,
                "seconds": seconds,
                "naive_s": naive_s,
                "ratio": seconds / naive_s,
                "peak_bytes": peak,
                "replica_bytes": replica_bytes,
                "beyond_replicas_bytes": peak - replica_bytes,
                "rank_state_bytes": training.rank_state_bytes,
                "simulator_bytes": peak - training.rank_state_bytes,
            }
        )
        row = rows[-1]
        del training
        print(
            f"  {params.name}: {seconds:.1f} s, {row['ratio']:.2f}x the naive cost, peak {peak / 1e9:.2f} GB",
            flush=True,
        )
    print(
        tabulate(
            [
                [
                    r["algorithm"],
                    f"{r['seconds']:.1f}",
                    f"{r['naive_s']:.1f}",
                    f"{r['ratio']:.2f}",
                    f"{r['peak_bytes'] / 1e9:.2f}",
                    f"{r['replica_bytes'] / 1e9:.2f}",
                    f"{r['beyond_replicas_bytes'] / 1e9:.2f}",
                    f"{r['rank_state_bytes'] / 1e9:.2f}",
                    f"{r['simulator_bytes'] / 1e9:.2f}",
                ]
                for r in rows
            ],
            headers=[
                "algorithm",
                "simulated s",
                "naive s",
                "ratio",
                "peak GB",
                "replicas GB",
                "beyond GB",
                "ranks' state GB",
                "simulator GB",
            ],
            tablefmt="simple",
            disable_numparse=True,
            colalign=("left",) + ("right",) * 8,
        )
    )
    ratios = [r["ratio"] for r in rows]
    print(
        f"median ratio {statistics.median(ratios):.2f}x (worst {max(ratios):.2f}x); worst beyond the replicas "
        f"{max(r['beyond_replicas_bytes'] for r in rows) / 1e9:.2f} GB"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"naive_step_s": naive, "floats": floats, "rows": rows}, indent=2) + "\n")
    return 0
