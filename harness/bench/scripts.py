"""torch.distributed scripts recorded at one rank count, predicted at others, against real runs there.

``python -m harness bench scripts`` launches the example ``examples/torch_parallel/train.py``
under its scenario (a fixed straggler) for every ``--modes`` (DDP, FSDP2, HSDP on a 2-D mesh,
ZeRO): once at ``--record`` ranks, and once at every rank count of ``--ranks`` (real runs to
check against). For each mode and rank count N it prints:

- ``sequence``: whether the recorded sequence scaled to N (``harness.sim.script_scaling``) is the
  sequence the real N-rank run posted, operation by operation (kind, group, bytes, root or peer)
  on every rank and step; else the first difference;
- ``bytes``: whether the simulated bytes per rank and step at N (the simulator's own schedules)
  equal what the real N-rank run's ranks sent (steps.csv's ``bytes_sent``); the largest
  difference otherwise;
- the real run's median step time, the prediction made from the ``--record`` run (predictive:
  the script's compute model, ``harness.sim.script_timing``), and its error; and ``compare``'s
  errors of the N-rank run itself (``trace`` and ``predictive``).

Then it simulates every ``--simulate`` count from the recorded run (predictive, in the cluster
reading: a core per rank and the default cluster network) and prints the predicted time per
step and how long the simulation took. Runs go under ``--out`` (default
``results/bench-scripts``); the calibration is ``results/calibration.json`` (``calibrate``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from tabulate import tabulate

from harness.arguments import argtype, int_at_least, split_list
from harness.scenario import load_scenario
from harness.sim.calibration import load_calibration
from harness.sim.script_scaling import ScriptStructure

# The simulator (torch) and pandas are imported inside the functions that need them: the CLI
# imports every benchmark at start-up.
EXAMPLE = Path("examples/torch_parallel")
MODES = ("ddp", "fsdp", "hsdp", "zero")
HSDP_SHARD = 2  # the example's default --shard: HSDP runs at multiples of it


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--modes",
        type=argtype(lambda t: split_list(t, "mode", "fsdp,zero")),
        default=",".join(MODES),
        help=f"the example's --parallel modes (default {','.join(MODES)})",
    )
    p.add_argument("--record", type=int_at_least(2), default=4, help="the recorded run's rank count (default 4)")
    p.add_argument(
        "--ranks",
        type=argtype(lambda t: split_list(t, "rank count", "2,3,8")),
        default="2,3,8",
        help="rank counts of the real runs to check against (default 2,3,8)",
    )
    p.add_argument(
        "--simulate",
        type=argtype(lambda t: split_list(t, "rank count", "64,1024")),
        default="64,1024",
        help="rank counts only simulated (default 64,1024)",
    )
    p.add_argument("--steps", type=int_at_least(3), default=12, help="steps per run (default 12)")
    p.add_argument("--out", type=Path, default=Path("results/bench-scripts"), help="where the runs go")
    p.add_argument("--calibration", type=Path, default=Path("results/calibration.json"))


def _launch(mode: str, ranks: int, steps: int, out: Path) -> Path:
    """Launch the example at ``ranks``; its run directory."""
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*/*"))
    cmd = [
        sys.executable,
        "-m",
        "harness",
        "launch",
        "-n",
        str(ranks),
        "--scenario",
        str(EXAMPLE / "scenario.yaml"),
        "--out",
        str(out),
        "--label",
        f"{mode}{ranks}",
        str(EXAMPLE / "train.py"),
        "--parallel",
        mode,
        "--steps",
        str(steps),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    new = sorted(set(out.glob("*/*")) - before)
    return new[-1]


def _sequence_difference(scaled, real) -> str | None:
    """The first difference between two ScriptTraces' operations, or None."""
    for r, (mine, theirs) in enumerate(zip(scaled.ops, real.ops, strict=True)):
        for t, (a, b) in enumerate(zip(mine, theirs, strict=False)):
            key = [(o.op, o.members, o.nbytes, o.peer) for o in a]
            other = [(o.op, o.members, o.nbytes, o.peer) for o in b]
            if key != other:
                i = next((i for i, (x, y) in enumerate(zip(key, other)) if x != y), min(len(key), len(other)))
                return (
                    f"rank {r} step {t} op {i}: scaled {key[i] if i < len(key) else '-'}, "
                    f"real {other[i] if i < len(other) else '-'}"
                )
    return None


def _simulate(run_dir: Path, ranks: int, calibration, reading: str = "machine"):
    """(steps frame, recorded scenario) of ``run_dir``'s script replayed at ``ranks``."""
    from harness.results.records import RUN_FILE, SCENARIO_FILE, RunDirectory  # noqa: PLC0415  (loads pandas)
    from harness.sim.runs import calibration_entry  # noqa: PLC0415  (loads torch)
    from harness.sim.script_replay import ScriptTrace, replay_script, script_label, steps_taken  # noqa: PLC0415  (loads torch)

    meta = json.loads((run_dir / RUN_FILE).read_text())
    recorded = steps_taken(load_scenario(run_dir / SCENARIO_FILE), meta)
    scenario = recorded.model_copy(update={"ranks": ranks})
    entry, _ = calibration_entry(scenario, calibration, run_dir / SCENARIO_FILE, needs_compute=False, reading=reading)
    run = RunDirectory.open(run_dir)
    trace = ScriptTrace.read(run_dir, recorded.ranks, recorded.workload.iterations)
    frame, _ = replay_script(
        scenario,
        script_label(meta),
        run.steps,
        trace,
        recorded,
        entry.network,
        mode="predictive",
        structure=ScriptStructure.read(run_dir),
        reading=reading,
        cpus=calibration.cpus,
    )
    return frame, recorded


def _median_step(steps) -> float:
    """Median over steps after the first of the slowest rank's step time."""
    steady = steps[steps["iteration"] >= 1]
    per_step = steady.groupby("iteration").apply(lambda f: f["end_s"].max() - f["start_s"].min(), include_groups=False)
    return float(per_step.median())


def _compare_errors(run_dir: Path, calibration: Path) -> dict[str, float]:
    import pandas as pd  # noqa: PLC0415  (loads pandas)

    done = subprocess.run(
        [sys.executable, "-m", "harness", "compare", str(run_dir), "--mode", "both", "--calibration", str(calibration)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return {}
    table = pd.read_csv(run_dir / "compare.csv")
    return {row.mode: float(row.throughput_error) for row in table.itertuples()}


def run(args: argparse.Namespace) -> int:
    from harness.results.records import RunDirectory  # noqa: PLC0415  (loads pandas)
    from harness.sim.script_replay import ScriptTrace  # noqa: PLC0415  (loads torch)

    if not args.calibration.is_file():
        print(
            f"error: --calibration {args.calibration}: no such file; measure it with `python -m harness calibrate "
            "--ranks 2,4,8`",
            file=sys.stderr,
        )
        return 2
    calibration = load_calibration(args.calibration)
    rows, sims = [], []
    for mode in args.modes:
        counts = [int(n) for n in args.ranks if mode != "hsdp" or int(n) % HSDP_SHARD == 0]
        recorded_dir = _launch(mode, args.record, args.steps, args.out)
        recorded = ScriptTrace.read(recorded_dir, args.record, args.steps)
        structure = ScriptStructure.read(recorded_dir)
        for n in counts:
            real_dir = _launch(mode, n, args.steps, args.out)
            real = RunDirectory.open(real_dir)
            real_trace = ScriptTrace.read(real_dir, n, args.steps)
            try:
                scaled = recorded.at_ranks(n, structure)
                difference = _sequence_difference(scaled, real_trace)
                frame, _ = _simulate(recorded_dir, n, calibration)
            except ValueError as exc:
                rows.append([mode, n, f"refused: {exc}", "", "", "", "", "", ""])
                continue
            merged = frame.merge(real.steps, on=["rank", "iteration"], suffixes=("_sim", "_real"))
            bytes_gap = int((merged["bytes_sent_sim"] - merged["bytes_sent_real"]).abs().max())
            measured, predicted = _median_step(real.steps), _median_step(frame)
            errors = _compare_errors(real_dir, args.calibration)
            rows.append(
                [
                    mode,
                    n,
                    "equal" if difference is None else difference,
                    "equal" if bytes_gap == 0 else f"differ by up to {bytes_gap} B",
                    f"{measured * 1e3:.1f}",
                    f"{predicted * 1e3:.1f}",
                    f"{(predicted / measured - 1) * 100:+.1f}",
                    f"{errors.get('trace', float('nan')) * 100:+.1f}",
                    f"{errors.get('predictive', float('nan')) * 100:+.1f}",
                ]
            )
        for n in [int(x) for x in args.simulate]:
            if mode == "hsdp" and n % HSDP_SHARD:
                continue
            began = time.perf_counter()
            try:
                frame, _ = _simulate(recorded_dir, n, calibration, reading="cluster")
            except ValueError as exc:
                sims.append([mode, n, f"refused: {exc}", ""])
                continue
            sims.append([mode, n, f"{_median_step(frame) * 1e3:.1f}", f"{time.perf_counter() - began:.1f}"])
    print(
        f"recorded at {args.record} ranks, {args.steps} steps; real runs at {', '.join(args.ranks)} "
        f"(predicted from the recording: the script's compute model, machine reading)"
    )
    print(
        tabulate(
            rows,
            headers=[
                "mode",
                "ranks",
                "sequence",
                "bytes per rank and step",
                "real ms/step",
                "predicted ms/step",
                "error %",
                "compare trace %",
                "compare predictive %",
            ],
        )
    )
    print()
    print("simulated only (predictive, cluster reading: a core per rank, the default cluster network):")
    print(tabulate(sims, headers=["mode", "ranks", "predicted ms/step", "simulation s"]))
    failed = any(r[2] != "equal" or r[3] != "equal" for r in rows)
    return 1 if failed else 0
