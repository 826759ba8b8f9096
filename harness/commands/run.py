"""``python -m harness run FILE``: validate, create the run directory, launch and watch the ranks.

Outside an MPI job it starts the venv's mpiexec with the scenario's rank count and watches the
ranks, on this host or on several (``harness.runner.watchdog``): a rank that dies, raises, or
stops making progress ends the job with a message naming it and its host; inside a job of the
right size (``mpiexec -n 8 python -m harness run FILE`` or ``srun ...``) it runs in place, and
rank 0 watches the ranks and aborts the MPI job when one hangs.
``--resume RUN_DIR`` trains the algorithms an interrupted or failed run did not finish.
Nothing is launched and nothing is written when the scenario is invalid (exit 2).

Exit status: 0 done, 1 the job failed (finished algorithms are kept), 2 bad input, 130
interrupted (Ctrl+C or SIGTERM; finished algorithms are kept).

Example::

    python -m harness run scenarios/straggler.yaml
    python -m harness run scenarios/straggler.yaml imbalance.0.delay_ms=160 --only allreduce_sgd,wagma
    python -m harness run scenarios/straggler.yaml --sweep algorithms.local_sgd.period=2,8
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import get_args

from harness.arguments import algorithm_list


def register(sub: argparse._SubParsersAction) -> None:
    from harness.scenario.schema import ProvenanceSetting

    p = sub.add_parser("run", help="train every algorithm of a scenario on real MPI ranks",
                       description=__doc__.splitlines()[0])
    add_scenario_arguments(p, scenario_optional=True)
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="finish the algorithms this run did not (no FILE; faults are not injected again), or "
                        "the points of this sweep directory that are not done")
    add_sweep_arguments(p, parallel=False)
    p.add_argument("--provenance", choices=get_args(ProvenanceSetting),
                   help="what provenance/ keeps, instead of the scenario's results.provenance: final (initial "
                        "model, shards, each algorithm's averaged final model), full (final plus every rank's "
                        "final model), none; auto: full with real compute, none with emulated compute")
    add_launch_arguments(p)
    p.set_defaults(func=run)


def add_launch_arguments(p: argparse.ArgumentParser) -> None:
    """Where the ranks run (``run``; ``sbatch`` writes them into its script)."""
    from harness.launch import LAUNCHERS

    p.add_argument("--launcher", choices=LAUNCHERS, default="auto",
                   help="mpiexec (this host, or --hosts), slurm (inside an allocation: Hydra's SLURM bootstrap); "
                        "auto: slurm inside an allocation, else mpiexec")
    p.add_argument("--hosts", metavar="HOSTFILE", help="Hydra host file for --launcher mpiexec: 'host[:slots]' lines")


def add_scenario_arguments(p: argparse.ArgumentParser, scenario_optional: bool = False) -> None:
    """The scenario file, its KEY=VALUE overrides, the results root and the older overrides
    (``run``, ``simulate``, ``sbatch``)."""
    p.add_argument("scenario", nargs="?" if scenario_optional else None, help="scenario YAML file")
    add_assignments_argument(p)
    p.add_argument("--out", default="results", help="results root (default: results/)")
    p.add_argument("--only", type=algorithm_list, metavar="A[,B...]",
                   help="comma-separated subset of the scenario's algorithms")
    p.add_argument("--ranks", type=int, help="override the scenario's rank count")
    p.add_argument("--iterations", type=int, help="override iterations per algorithm")


def add_assignments_argument(p: argparse.ArgumentParser) -> None:
    """``KEY=VALUE ...`` after the file (``harness.scenario.overrides``)."""
    p.add_argument("assignments", nargs="*", metavar="KEY=VALUE",
                   help="override any scenario field: a dotted path with list indices and algorithm names, Hydra's "
                        "syntax (workload.iterations=200 imbalance.0.delay_ms=160 algorithms.wagma.period=6 "
                        "~network.links)")


def add_sweep_arguments(p: argparse.ArgumentParser, parallel: bool) -> None:
    """``--sweep`` and ``--point`` (``run``, ``simulate``); ``--jobs`` where points run in parallel."""
    p.add_argument("--sweep", action="append", metavar="KEY=V1,V2,...",
                   help="run every value (KEY=range(0,641,160) too); repeated: every combination. One directory "
                        "OUT/<scenario>/sweep-<time> with a run per point, sweep.csv, sweep.png and report.html")
    p.add_argument("--point", type=int, metavar="I",
                   help="with --resume SWEEP_DIR: run only point I (what each task of a SLURM job array runs)")
    if parallel:
        p.add_argument("--jobs", type=int, metavar="N",
                       help="points simulated at a time (default: the number of cores)")


def sweep_mode(command: str, args: argparse.Namespace) -> int | None:
    """The sweep's exit status when ``args`` ask for a sweep (``--sweep``, or ``--resume`` of a
    sweep directory), else None: the command runs as usual."""
    from harness.sweep.execute import resume_sweep, start_sweep
    from harness.sweep.store import SWEEP_FILE

    resume = getattr(args, "resume", None)
    is_sweep = resume is not None and (Path(resume) / SWEEP_FILE).is_file()
    if (is_sweep or args.sweep) and args.point is None:
        from harness.launch import inside_mpi_job

        if inside_mpi_job() is not None:
            return _error("a sweep starts its points' runs itself: start it outside an MPI job (or run one point "
                          "per job with --resume SWEEP_DIR --point I)", 2)
    if is_sweep:
        if args.sweep or args.scenario is not None or args.assignments or _overrides(args):
            return _error("--resume SWEEP_DIR takes nothing else but --point (and --jobs): the sweep keeps its "
                          "scenario and settings in sweep.json", 2)
        return resume_sweep(command, args)
    if args.point is not None:
        return _error("--point I goes with --resume SWEEP_DIR", 2)
    if args.sweep:
        if resume is not None:
            return _error(f"--resume {resume}: not a sweep directory (no {SWEEP_FILE}); --sweep starts a new one", 2)
        return start_sweep(command, args)
    return None


def _overrides(args: argparse.Namespace) -> dict:
    out: dict = {}
    if args.ranks is not None:
        out["ranks"] = args.ranks
    if args.iterations is not None:
        out["iterations"] = args.iterations
    if args.only is not None:
        out["only"] = args.only
    return out


def _error(message: str, status: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return status


def run(args: argparse.Namespace) -> int:
    # SIGINT is Ctrl+C from the start, whatever disposition was inherited: a non-interactive
    # shell starts a script's `cmd &` with SIGINT ignored, and Python then leaves it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _run(args)
    except KeyboardInterrupt:  # before any rank started: once they run, _launch handles it
        print("interrupted before the ranks started", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    swept = sweep_mode("run", args)
    if swept is not None:
        return swept
    from harness.device import scenario_device_problem
    from harness.launch import Launch, inside_mpi_job
    from harness.results import provenance
    from harness.scenario import load_scenario_with_notes
    from harness.scenario.checks import check_user_code

    # A LaunchError or ScenarioError raised before the ranks start is bad input: harness.cli
    # prints it (exit 2), and nothing has been written yet.
    in_job = inside_mpi_job()
    launch = None
    if in_job is None:
        launch = Launch.choose(args.launcher, args.hosts)
    elif args.launcher != "auto" or args.hosts is not None:
        return _error("--launcher and --hosts are for starting ranks; this process already is one of an MPI job "
                      f"of {in_job} ranks", 2)
    renamed: list[str] = []  # notes on old parameter spellings in the scenario file
    if args.resume is not None:
        if args.scenario is not None or _overrides(args) or args.assignments or args.provenance is not None:
            return _error("--resume takes only the run directory: the scenario and its settings are the run's own "
                          "(RUN_DIR/scenario.resolved.yaml)", 2)
        try:
            scenario, run_dir = _open_for_resume(Path(args.resume))
        except ValueError as exc:
            return _error(str(exc), 2)
        if scenario is None:
            print(f"nothing to resume: every algorithm of {run_dir.path} is finished", file=sys.stderr)
            return 0
    else:
        if args.scenario is None:
            return _error("give a scenario FILE, or --resume RUN_DIR", 2)
        scenario, renamed = load_scenario_with_notes(args.scenario, overrides=_overrides(args),
                                                     assignments=args.assignments)
        # The resolved scenario says what the run keeps: auto and --provenance resolved here.
        scenario = provenance.resolve(scenario, args.provenance)
        run_dir = None
    source = args.resume or args.scenario
    if scenario.workload.of_script:
        return _error(f"{source}: workload: names no model and dataset, so it is a training script's workload: run the "
                      "script with `python -m harness launch --scenario FILE SCRIPT`, or give workload.model and "
                      "workload.dataset", 2)
    problem = scenario_device_problem(scenario)
    if problem is not None:
        return _error(f"{source}: {problem}", 2)
    check_user_code(scenario, source)  # the user's model, dataset...: once, before any rank starts

    if in_job is not None:
        return _run_in_place(scenario, args, in_job, run_dir, renamed)
    problem = _provenance_problem(scenario, run_dir, args.out)
    if problem is not None:
        return _error(f"{source}: {problem}", 2)
    if run_dir is None:
        run_dir = _create_run_dir(scenario, args.out, getattr(args, "into", None))
    else:
        _begin_resume(run_dir)
    return _launch(scenario, run_dir, launch, resume=args.resume is not None, renamed=renamed)


def _create_run_dir(scenario, out: str, into: Path | None = None):
    """A new run directory under ``out``, or exactly ``into`` (a sweep's point)."""
    from harness.algorithms import scenario_facts
    from harness.results.records import RunDirectory

    run_dir = RunDirectory.create(out, scenario.name) if into is None else RunDirectory.create_at(into, scenario.name)
    run_dir.write_resolved_scenario(scenario.resolved_dict())
    run_dir.write_run_json("incomplete", [], ranks=scenario.ranks,
                           extra={"provenance": scenario.results.provenance, **scenario_facts(scenario)})
    return run_dir


def _provenance_problem(scenario, run_dir, out: str) -> str | None:
    """Why the provenance of the algorithms still to train would not fit on the disk, or None."""
    from harness.results.provenance import disk_problem

    todo = sum(run_dir is None or a.name not in run_dir.finished_algorithms for a in scenario.algorithms)
    return disk_problem(scenario, todo, run_dir.path if run_dir is not None else Path(out))


def _open_for_resume(path: Path):
    """(scenario, run directory) of a run to resume, (None, run directory) when it is complete;
    ValueError saying what is wrong otherwise. Writes nothing."""
    import json

    from harness.results.records import RUN_FILE, SCENARIO_FILE, RunDirectory
    from harness.scenario import ScenarioError, load_scenario

    if not (path / SCENARIO_FILE).is_file() or not (path / RUN_FILE).is_file():
        raise ValueError(f"--resume {path}: not a run directory (it needs {SCENARIO_FILE} and {RUN_FILE})")
    try:
        scenario = load_scenario(path / SCENARIO_FILE)
    except ScenarioError as exc:
        raise ValueError(f"--resume: {exc}") from None
    meta = json.loads((path / RUN_FILE).read_text(encoding="utf-8"))
    if meta.get("simulated"):
        raise ValueError(f"--resume {path}: a simulated run; run `python -m harness simulate` again instead")
    if meta.get("script"):
        raise ValueError(f"--resume {path}: a run of the training script {meta['script']}; start it again with "
                         "`python -m harness launch --scenario FILE --only ALGORITHMS SCRIPT`")
    if meta.get("ranks") not in (None, scenario.ranks):
        raise ValueError(f"--resume {path}: run.json says {meta.get('ranks')} ranks, the scenario {scenario.ranks}")
    run_dir = RunDirectory.open(path)
    unknown = [a for a in run_dir.finished_algorithms if a not in [p.name for p in scenario.algorithms]]
    if unknown:
        raise ValueError(f"--resume {path}: run.json lists finished algorithms {unknown} the scenario does not have")
    if len(run_dir.finished_algorithms) == len(scenario.algorithms):
        return None, run_dir
    return scenario, run_dir


def _begin_resume(run_dir) -> None:
    """Remove what a killed writer left (nothing runs there now) and record the resumption."""
    from harness.results.atomic import remove_partial_files

    remove_partial_files(run_dir.path)
    run_dir.mark_resumed()
    run_dir.update_run_json("incomplete")


def _launch(scenario, run_dir, launch, resume: bool, renamed: list[str]) -> int:
    """Start the ranks under the venv's mpiexec and watch them until they end, on this host or
    across hosts (their heartbeats come over TCP)."""
    from harness.launch import LaunchError
    from harness.report import after_command
    from harness.results.atomic import remove_partial_files
    from harness.runner.watchdog import run_watched

    todo = [a.name for a in scenario.algorithms if a.name not in run_dir.finished_algorithms]
    verb = "resuming" if resume else "running"
    print(f"{scenario.name}: {scenario.ranks} ranks, {verb} {len(todo)} algorithm{'s' * (len(todo) != 1)} "
          f"-> {run_dir.path}", file=sys.stderr)
    _print_notes(scenario, renamed)
    argv = [sys.executable, "-m", "harness.runner.worker", str(run_dir.path), *(["--resume"] if resume else [])]

    def interrupted() -> None:
        remove_partial_files(run_dir.path)
        _mark_stopped(run_dir.path, "incomplete", {"stopped": "interrupted (Ctrl+C or SIGTERM)"})
        _say_interrupted(run_dir.path)

    try:
        rc, verdict = run_watched(scenario, scenario.ranks, argv, {}, launch, faults_enabled=not resume,
                                  on_interrupt=interrupted)
    except LaunchError as exc:
        return _error(str(exc), 1)
    except KeyboardInterrupt:
        return 130
    remove_partial_files(run_dir.path)
    if rc == 0:
        return after_command(run_dir.path)  # report.html (a warning, not a failure, if it cannot be drawn)
    why = verdict.message if verdict is not None else f"the ranks exited with status {rc}"
    _mark_stopped(run_dir.path, "failed", {"error": why, **({"fault": verdict.as_json()} if verdict else {})})
    print(f"\nerror: {why}\nstopped all ranks; finished algorithms are kept in {run_dir.path} (run.json says which); "
          f"python -m harness run --resume {run_dir.path} finishes the others", file=sys.stderr)
    return 1


def _print_notes(scenario, renamed: list[str]) -> None:
    """What the run will do that the scenario file does not say outright: the new spelling of old
    parameter names it uses (``renamed``), WAGMA's effective groups."""
    from harness.algorithms import scenario_notes

    for note in renamed + scenario_notes(scenario):
        print(f"note: {note}", file=sys.stderr)


def _say_interrupted(path) -> None:
    print(f"interrupted: finished algorithms are kept in {path}; "
          f"python -m harness run --resume {path} finishes the others", file=sys.stderr)


def _mark_stopped(path: Path, status: str, extra: dict) -> None:
    """Record in run.json how the run stopped, keeping what it finished."""
    from harness.results.records import RunDirectory

    RunDirectory.open(path).update_run_json(status, extra)


def _run_in_place(scenario, args, job_size: int, run_dir, renamed: list[str]) -> int:
    from mpi4py import MPI

    from harness.launch import exit_promptly_when_interrupted
    from harness.report import after_command
    from harness.runner.worker import main as worker_main

    exit_promptly_when_interrupted()  # as every rank `run` launches itself

    if job_size != scenario.ranks:
        return _error(f"{args.resume or args.scenario}: the scenario needs {scenario.ranks} ranks but this MPI job "
                      f"has {job_size}" + ("" if args.resume else " (use --ranks to override)"), 2)
    path = problem = None
    if MPI.COMM_WORLD.rank == 0:  # every rank of the user's job gets here; one checks and writes
        _print_notes(scenario, renamed)
        problem = _provenance_problem(scenario, run_dir, args.out)
        if problem is None and run_dir is None:
            run_dir = _create_run_dir(scenario, args.out)
        elif problem is None:
            _begin_resume(run_dir)
        path = None if problem else str(run_dir.path)
    path, problem = MPI.COMM_WORLD.bcast((path, problem), root=0)
    if problem is not None:
        return _error(f"{args.resume or args.scenario}: {problem}", 2) if MPI.COMM_WORLD.rank == 0 else 2
    try:
        status = worker_main(path, resume=args.resume is not None)
        return after_command(path, status) if MPI.COMM_WORLD.rank == 0 else status  # rank 0 writes report.html
    except KeyboardInterrupt:  # the user's launcher forwarded Ctrl+C (or SIGTERM)
        if MPI.COMM_WORLD.rank == 0:
            _say_interrupted(path)
        return 130
