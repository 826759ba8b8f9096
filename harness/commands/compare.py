"""``python -m harness compare RUN_DIR``: real against simulated throughput of a finished run.

Simulates the run's scenario trace-driven (the local work each rank measured) and predictive
(calibrated compute only), prints measured and predicted time per iteration and throughput
with the relative error per algorithm, and writes ``compare.csv``, ``compare.png`` and the
simulated runs (``sim-trace/``, ``sim-predictive/``) into RUN_DIR. When the calibration has no
entry for the run's rank count, a note names the one used (``calibration_ranks`` in
compare.csv and in the simulated runs' run.json); a real-compute workload the calibration
lacks is an error (exit 2) giving the exact ``calibrate`` command to run.

A run whose ranks ran on several hosts (run.json ``rank_hosts``) is simulated with the hosts
as nodes sharing a NIC, from the calibration's inter-host link, unless the scenario declares
its own ``network.topology`` (``harness.sim.hosts.simulated_topology``); a line before the
table says which topology was simulated, and a note when the hosts could not be used.

``--train`` (or the run's ``simulation.train``) makes the simulations train real models from
the run's own provenance (initial model, shards, batch order): the table then adds the final
accuracy, real and simulated, and the largest accuracy difference over the evaluation points.

Example::

    python -m harness compare results/straggler/20260101-120000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tabulate import tabulate

from harness.report import after_command
from harness.results.layout import RUN_FILE, SCENARIO_FILE
from harness.scenario import load_scenario
from harness.sim.calibration import DEFAULT_PATH, CalibrationError, calibrate_command, load_calibration
from harness.sim.hosts import run_rank_hosts, simulated_topology


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="simulate a finished run and compare real and predicted throughput",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("run_dir", type=Path, help="a run directory written by `python -m harness run`")
    p.add_argument("--calibration", type=Path, help="calibration file (default: results/calibration.json)")
    p.add_argument(
        "--mode",
        choices=("trace", "predictive", "both"),
        default="both",
        help="which simulation to compare with (default: both)",
    )
    p.add_argument(
        "--train",
        action="store_true",
        help="the simulations train real models too (simulation.train): compare accuracy as well",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.results.records import RunDirectory  # noqa: PLC0415  (pandas: not for --help)
    from harness.sim.compare import (  # noqa: PLC0415  (the simulator, torch: not for --help)
        COMPARE_FILE,
        COMPARE_PLOT,
        MODES,
        compare_run,
        compared_scenario,
        error_summary,
    )
    from harness.sim.runs import calibration_entry  # noqa: PLC0415  (the simulator, torch: not for --help)
    from harness.sim.script_replay import script_label, steps_taken  # noqa: PLC0415  (the simulator, torch: not for --help)
    from harness.sim.training import training_problem  # noqa: PLC0415  (the simulator, torch: not for --help)
    from harness.sim.value_check import scenario_value_dependence  # noqa: PLC0415  (the simulator, torch: not for --help)

    run_dir: Path = args.run_dir
    if not (run_dir / SCENARIO_FILE).is_file():
        print(f"error: {run_dir}: not a run directory (no {SCENARIO_FILE})", file=sys.stderr)
        return 2
    meta = json.loads((run_dir / RUN_FILE).read_text()) if (run_dir / RUN_FILE).is_file() else None
    if isinstance(meta, dict) and meta.get("simulated"):
        print(f"error: {run_dir}: is a simulated run; compare takes a real one", file=sys.stderr)
        return 2
    calibration_path = args.calibration or DEFAULT_PATH
    modes = MODES if args.mode == "both" else (args.mode,)
    run_meta: dict = meta if isinstance(meta, dict) else {}
    script = None
    if run_meta.get("torch_distributed"):
        # A script run: its recorded collectives are replayed, on its recorded local work (trace)
        # or on the compute model made from it (predictive).
        script = script_label(run_meta)
    # The run's own files and harness.sim.compare say what makes a run unusable (a run.json that
    # is not JSON, a CSV without its columns, no finished algorithm) with a plain ValueError.
    # Scenario, calibration and timing problems are user errors harness.cli reports.
    try:
        run = RunDirectory.open(run_dir)
        scenario = load_scenario(run_dir / SCENARIO_FILE)
        if script is None:
            scenario = compared_scenario(run, scenario)
        elif script not in run.algorithms:
            raise ValueError(f"{run_dir}: the script run {script!r} did not finish: nothing to compare")
        else:
            scenario = steps_taken(scenario, run_meta)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not calibration_path.exists():
        command = calibrate_command(run_dir / SCENARIO_FILE, scenario.ranks, calibration_path)
        raise CalibrationError(
            f"{calibration_path}: no calibration file; compare needs this machine's: "
            f"measure it with (or pass --calibration FILE):\n  {command}"
        )
    calibration = load_calibration(calibration_path)
    # Checked before anything is simulated or written; trace mode takes compute from the run.
    entry, note = calibration_entry(
        scenario,
        calibration,
        run_dir / SCENARIO_FILE,
        calibration_path,
        needs_compute="predictive" in modes and script is None,
    )
    rank_hosts, host_notes = run_rank_hosts(meta, scenario.ranks)
    topology = simulated_topology(scenario, entry, rank_hosts)
    for line in ([note] if note else []) + host_notes + list(topology.notes):
        print(f"note: {line}", file=sys.stderr)
    if topology.worth_recording:
        print(f"simulated network topology: {topology.description}")
    train = bool(args.train or scenario.simulation.train)
    if not train and script is None:
        problem = scenario_value_dependence(scenario)
        if problem is not None:
            print(f"error: {run_dir}: {problem}", file=sys.stderr)
            return 2
    if train:
        if script is not None:
            print(
                f"error: {run_dir}: --train: a torch.distributed script's own training cannot be simulated",
                file=sys.stderr,
            )
            return 2
        problem = training_problem(scenario)
        if problem is not None:
            print(f"error: {run_dir}: {problem}", file=sys.stderr)
            return 2
    try:
        table = compare_run(run, scenario, entry, str(calibration_path), modes, topology, script=script, train=train)
    except ValueError as exc:  # records the simulation cannot replay, as above
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = [
        [
            r.algorithm,
            r.mode,
            f"{r.measured_iter_s * 1e3:.2f}",
            f"{r.predicted_iter_s * 1e3:.2f}",
            f"{r.measured_samples_per_s:,.1f}",
            f"{r.predicted_samples_per_s:,.1f}",
            f"{r.throughput_error * 100:+.1f}",
        ]
        + (
            [
                f"{r.measured_final_accuracy * 100:.2f}",
                f"{r.predicted_final_accuracy * 100:.2f}",
                f"{r.accuracy_error_max:.2f}",
            ]
            if train
            else []
        )
        for r in table.itertuples(index=False)
    ]
    headers = [
        "algorithm",
        "mode",
        "measured ms/it",
        "predicted ms/it",
        "measured samples/s",
        "predicted samples/s",
        "error %",
    ] + (["real acc %", "sim acc %", "max |acc diff| pts"] if train else [])
    print(
        tabulate(
            rows,
            headers=headers,
            tablefmt="simple",
            disable_numparse=True,
            colalign=("left", "left") + ("right",) * (len(headers) - 2),
        )
    )
    errors = error_summary(table)
    print()
    print(
        tabulate(
            [
                [mode, f"{e.median_abs_error * 100:.1f}", f"{e.worst_abs_error * 100:.1f}"]
                for mode, e in errors.iterrows()
            ],
            headers=["mode", "median |error| %", "worst |error| %"],
            tablefmt="simple",
            disable_numparse=True,
        )
    )
    print(f"wrote {run_dir / COMPARE_FILE} and {run_dir / COMPARE_PLOT}")
    return after_command(run_dir)  # report.html again, now with real against simulated
