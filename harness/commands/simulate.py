"""``python -m harness simulate FILE``: predict a scenario's run with the SimPy model.

Needs no MPI (but torch: simulated ranks run the algorithms' own code). The network (and,
for real compute, the time per iteration) comes from the calibration file of ``python -m
harness calibrate``; a scenario with emulated compute can also be simulated without one, on a
default cluster network (docs/guides/simulation.md).
Notes on stderr say when the calibration of another rank count is used (run.json records it
as ``calibration_ranks``) and which WAGMA groups form when they are not of ``group_size``; a
real-compute workload that was never calibrated is an error (exit 2) that gives the exact
``calibrate`` command to run. Writes a run directory ``results/<scenario>/sim-<time>/`` with
the real run's files and columns (no losses, no evaluations), and prints the summary with the
simulator's speed.

``--train`` (the scenario's ``simulation.train``, so sweeps and overrides reach it) makes the
simulated ranks train real models (``harness.sim.training``): the run directory then also has
losses, evaluations and ``provenance/``, and the summary's accuracy and time-to-target columns
are filled, at any rank count. A run that would not fit in memory is refused with the estimate.

The ``scenario.resolved.yaml`` of a real run whose ranks ran on several hosts (``rank_hosts``
in the run.json beside it) is simulated with those hosts as nodes sharing a NIC, as ``compare``
does (``harness.sim.hosts.simulated_topology``, which also says when it cannot).

Example::

    python -m harness simulate scenarios/straggler.yaml --ranks 1024 --iterations 1000 --only wagma
    python -m harness simulate scenarios/at_scale.yaml --train --sweep ranks=16,64,256
    python -m harness simulate scenarios/straggler.yaml --sweep 'imbalance.0.delay_ms=range(0,641,160)' \\
        --sweep ranks=16,64
    python -m harness simulate scenarios/straggler.yaml --ranks 64 workload.iterations=200 --only wagma
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

from harness.algorithms import scenario_notes
from harness.arguments import int_at_least
from harness.commands.shared_options import add_scenario_arguments, add_sweep_arguments, scenario_overrides
from harness.commands.sweeping import sweep_mode
from harness.report import after_command
from harness.results import provenance
from harness.results.layout import RUN_FILE, SCENARIO_FILE, SUMMARY_TABLE_FILE
from harness.scenario import load_scenario, load_scenario_with_notes
from harness.scenario.checks import check_user_code
from harness.sim.calibration import DEFAULT_PATH, load_calibration
from harness.sim.hosts import run_rank_hosts, simulated_topology
from harness.sim.script_scaling import ScriptStructure


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="predict a scenario's run with the discrete-event model (no MPI)",
        description=__doc__.splitlines()[0],
    )
    add_scenario_arguments(p, scenario_optional=True)
    add_sweep_arguments(p, parallel=True)
    p.add_argument("--resume", metavar="SWEEP_DIR", help="simulate the points of this sweep that are not done")
    p.add_argument("--calibration", type=Path, help="calibration file (default: results/calibration.json)")
    p.add_argument(
        "--reading",
        choices=("cluster", "machine"),
        default=None,
        help="what to predict: cluster (every rank with cores of its own, the default cluster network) "
        "or machine (this machine, its cores shared as a run here shares them); default: machine "
        "when the calibration measured the scenario's rank count, else cluster",
    )
    p.add_argument(
        "--trace-ranks",
        type=int_at_least(0),
        default=None,
        metavar="N",
        help="write only ranks below N into trace.json (default: 64)",
    )
    p.add_argument(
        "--train",
        action="store_true",
        help="the simulated ranks train real models (simulation.train=true): accuracy against simulated "
        "time, at any rank count",
    )
    p.set_defaults(func=run)


def load_optional_calibration(path: Path | None, real_compute: bool):
    """(calibration or None, the file it is or would be read from): the file at ``path``
    (default: results/calibration.json). None where the file does not exist and the simulation
    can go on or say what to run instead: the default file with emulated compute (the default
    network), or real compute (``calibration_entry`` then gives the ``calibrate`` command).
    A ``path`` given for emulated compute must exist."""
    file = path or DEFAULT_PATH
    if file.exists() or (path is not None and not real_compute):
        return load_calibration(file), file
    return None, file


def _simulate_script_run(args: argparse.Namespace, scenario, meta: dict) -> int:
    """The ``scenario.resolved.yaml`` of a torch.distributed script run (``launch --scenario``):
    its recorded collectives replayed (``harness.sim.script_replay``). At the recorded rank
    count in the machine reading, on every step's recorded local work (trace-driven); at any
    other rank count (``--ranks``, rescaled by ``harness.sim.script_scaling``) or in the cluster
    reading, on the script's compute model (``harness.sim.script_timing``). The scenario's
    overrides (``KEY=VALUE``, ``--ranks``, ``--iterations``) apply; no more steps than the run
    took."""
    from harness.results.records import RunDirectory  # noqa: PLC0415  (pandas: not for --help)
    from harness.sim.runs import (  # noqa: PLC0415  (the simulator, torch: not for --help)
        DEFAULT_TRACE_RANKS,
        calibration_entry,
        default_reading,
        describe_reading,
        new_simulated_run_path,
        write_simulated_run,
    )
    from harness.sim.script_replay import (  # noqa: PLC0415  (the simulator, torch: not for --help)
        ScriptTrace,
        replay_script,
        script_label,
        steps_taken,
    )

    run_dir = Path(args.scenario).parent
    recorded = steps_taken(load_scenario(args.scenario), meta)
    label = script_label(meta)
    run = RunDirectory.open(run_dir)
    if label not in run.algorithms:
        print(f"error: {run_dir}: the script run did not finish: nothing to replay", file=sys.stderr)
        return 2
    taken = recorded.workload.iterations
    asked = args.iterations if args.iterations is not None else _assigned_iterations(args, scenario)
    if asked is not None and asked > taken:
        print(
            f"error: {args.scenario}: workload.iterations {asked}: the script run took {taken} steps; a replay "
            "has no sequence for more",
            file=sys.stderr,
        )
        return 2
    scenario = scenario.model_copy(
        update={"workload": scenario.workload.model_copy(update={"iterations": asked or taken})}
    )
    calibration, calibration_file = load_optional_calibration(args.calibration, False)
    reading = args.reading or default_reading(scenario, calibration)
    entry, note = calibration_entry(
        scenario, calibration, args.scenario, calibration_file, needs_compute=False, reading=reading
    )
    for line in [note] if note else []:
        print(f"note: {line}", file=sys.stderr)
    mode = "trace" if scenario.ranks == recorded.ranks and reading == "machine" else "predictive"
    trace = ScriptTrace.read(run_dir, recorded.ranks, taken)
    print(
        f"{scenario.name}: replaying {label} (torch.distributed, recorded at {recorded.ranks} ranks) at "
        f"{scenario.ranks} ranks x {scenario.workload.iterations} steps, {mode}: "
        + ("every step's recorded local work" if mode == "trace" else "the script's compute model"),
        file=sys.stderr,
    )
    print(f"reading: {describe_reading(reading)}", file=sys.stderr)
    frame, stat = replay_script(
        scenario,
        label,
        run.steps,
        trace,
        recorded,
        entry.network,
        mode=mode,
        structure=ScriptStructure.read(run_dir),
        reading=reading,
    )
    path = new_simulated_run_path(Path(args.out), scenario.name)
    trace_ranks = DEFAULT_TRACE_RANKS if args.trace_ranks is None else args.trace_ranks
    out = write_simulated_run(
        path,
        scenario,
        {label: frame},
        [stat],
        mode,
        str(calibration_file) if calibration is not None else None,
        trace_ranks,
        calibration_ranks=entry.ranks if calibration is not None else None,
        reading=reading,
    )
    print((out.path / SUMMARY_TABLE_FILE).read_text(), end="")
    print(f"results: {out.path}")
    return after_command(out.path)


def _assigned_iterations(args: argparse.Namespace, scenario) -> int | None:
    """``workload.iterations`` where a ``KEY=VALUE`` or ``--set`` gave it, else None."""
    for item in args.assignments or []:
        if item.split("=", 1)[0].strip() == "workload.iterations":
            return scenario.workload.iterations
    return None


def start_training(scenario, path: Path, algorithms: int):
    """(the ``TrainedRun`` of a simulation with values, or None without ``simulation.train``;
    why it cannot run, or None). Refused before anything is allocated: a run that would not fit
    in memory (with the estimate), a device this machine lacks, provenance that would not fit on
    disk. The run's provenance is staged beside ``path`` until the run directory is written."""
    if not scenario.simulation.train:
        return None, None
    from harness.sim.runs import TrainedRun  # noqa: PLC0415  (the simulator, torch: not for --help)
    from harness.sim.training import training_problem  # noqa: PLC0415  (torch: not for --help)

    problem = training_problem(scenario) or provenance.disk_problem(scenario, algorithms, path.parent)
    if problem is not None:
        return None, problem
    path.parent.mkdir(parents=True, exist_ok=True)
    return TrainedRun(scenario, Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))), None


def _device_problem(scenario) -> str | None:
    """Why a simulation with values cannot compute on the scenario's device here, or None
    (said before the calibration is read)."""
    if not scenario.simulation.train:
        return None
    from harness.sim.training import TrainingError, training_device  # noqa: PLC0415  (torch: not for --help)

    try:
        training_device(scenario)
    except TrainingError as exc:
        return str(exc)
    return None


def _run_beside(scenario_file: Path) -> dict | None:
    """The run.json of the real run whose ``scenario.resolved.yaml`` ``scenario_file`` is, or None
    (another file, no run.json, a simulated run's, or one that does not read as JSON)."""
    if scenario_file.name != SCENARIO_FILE or not (scenario_file.parent / RUN_FILE).is_file():
        return None
    try:
        meta = json.loads((scenario_file.parent / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the scenario is what is simulated; a broken run.json only loses the hosts
    return meta if isinstance(meta, dict) and not meta.get("simulated") else None


def run(args: argparse.Namespace) -> int:
    from harness.sim.runs import (  # noqa: PLC0415  (the simulator, torch: not for --help)
        DEFAULT_TRACE_RANKS,
        calibration_entry,
        default_reading,
        describe_reading,
        new_simulated_run_path,
        predict,
        write_simulated_run,
    )
    from harness.sim.value_check import scenario_value_dependence  # noqa: PLC0415  (torch: not for --help)

    if getattr(args, "train", False):  # a scenario field, so that a sweep's points have it too
        args.assignments = [*args.assignments, "simulation.train=true"]
        args.train = False
    swept = sweep_mode("simulate", args)
    if swept is not None:
        return swept
    if args.resume is not None:
        print(
            f"error: --resume {args.resume}: not a sweep directory (no sweep.json); a simulation is simply run again",
            file=sys.stderr,
        )
        return 2
    if args.scenario is None:
        print("error: give a scenario FILE (or --resume SWEEP_DIR)", file=sys.stderr)
        return 2
    scenario, renamed = load_scenario_with_notes(
        args.scenario, overrides=scenario_overrides(args), assignments=args.assignments
    )
    beside = _run_beside(Path(args.scenario))
    if beside is not None and beside.get("torch_distributed"):
        if scenario.simulation.train:
            print(
                f"error: {args.scenario}: simulation.train: a torch.distributed script's run is replayed from its "
                "recorded collectives; the simulator cannot run the script's own training",
                file=sys.stderr,
            )
            return 2
        return _simulate_script_run(args, scenario, beside)
    if scenario.workload.of_script and scenario.workload.compute == "real":
        print(
            f"error: {args.scenario}: workload: a training script's workload (no model and dataset) says neither "
            "its size nor its compute time: simulate the scenario.resolved.yaml of a `python -m harness launch` "
            "run of it, or give emulated compute and params",
            file=sys.stderr,
        )
        return 2
    check_user_code(scenario, args.scenario)  # the user's model, dataset...: imported and called
    problem = scenario_value_dependence(scenario) or _device_problem(scenario)
    if problem is not None:
        print(f"error: {args.scenario}: {problem}", file=sys.stderr)
        return 2
    calibration, calibration_file = load_optional_calibration(args.calibration, scenario.workload.compute == "real")
    reading = args.reading or default_reading(scenario, calibration)
    entry, note = calibration_entry(scenario, calibration, args.scenario, calibration_file, reading=reading)
    # A real run's hosts are this machine's reading; a cluster brings its own network.
    rank_hosts, host_notes = (
        run_rank_hosts(_run_beside(Path(args.scenario)), scenario.ranks) if reading == "machine" else (None, [])
    )
    topology = simulated_topology(scenario, entry if calibration is not None else None, rank_hosts)
    print(f"reading: {describe_reading(reading)}", file=sys.stderr)
    for line in renamed + ([note] if note else []) + host_notes + list(topology.notes) + scenario_notes(scenario):
        print(f"note: {line}", file=sys.stderr)
    if topology.worth_recording:
        print(f"simulated network topology: {topology.description}", file=sys.stderr)
    if scenario.faults:
        print(
            f"note: the scenario's {len(scenario.faults)} faults are not simulated (the model predicts the "
            "run without them)",
            file=sys.stderr,
        )
    print(
        f"{scenario.name}: simulating {scenario.ranks} ranks x {scenario.workload.iterations} iterations"
        f"{' with values (every rank trains its model)' if scenario.simulation.train else ''}, "
        f"{len(scenario.algorithms)} algorithms",
        file=sys.stderr,
    )

    def report(name, frame, stat) -> None:
        print(
            f"  {name}: {stat.events:,} events in {stat.host_s:.2f} s ({stat.events_per_s:,.0f} events/s)",
            file=sys.stderr,
        )

    into = getattr(args, "into", None)  # a sweep's point: exactly there
    path = Path(into) if into is not None else new_simulated_run_path(Path(args.out), scenario.name)
    trained, problem = start_training(scenario, path, len(scenario.algorithms))
    if problem is not None:
        print(f"error: {args.scenario}: {problem}", file=sys.stderr)
        return 2
    try:
        frames, stats = predict(scenario, entry, on_done=report, hosts=topology.hosts, trained=trained)
    except KeyboardInterrupt:
        print("interrupted: nothing written", file=sys.stderr)
        return 130
    trace_ranks = DEFAULT_TRACE_RANKS if args.trace_ranks is None else args.trace_ranks
    calibrated = calibration is not None  # else the default network: run.json says null for both
    run_dir = write_simulated_run(
        path,
        scenario,
        frames,
        stats,
        "predictive",
        str(calibration_file) if calibrated else None,
        trace_ranks,
        calibration_ranks=entry.ranks if calibrated else None,
        topology=topology,
        reading=reading,
    )
    print((run_dir.path / SUMMARY_TABLE_FILE).read_text(), end="")  # written with the run, its header first
    total_events, total_s = sum(s.events for s in stats), sum(s.host_s for s in stats)
    print(
        tabulate(
            [[f"{total_events:,}", f"{total_s:.2f}", f"{total_events / max(total_s, 1e-9):,.0f}"]],
            headers=["events", "simulator s", "events/s"],
            tablefmt="simple",
            disable_numparse=True,
        )
    )
    print(f"results: {run_dir.path}")
    return after_command(run_dir.path)  # report.html (a warning, not a failure, if it cannot be drawn)
