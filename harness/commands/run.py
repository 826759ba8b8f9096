"""``python -m harness run FILE``: validate, create the run directory, launch and watch the ranks.

Outside an MPI job it starts the venv's mpiexec with the scenario's rank count and watches the
ranks, on this host or on several (``harness.watchdog``): a rank that dies, raises, or
stops making progress ends the job with a message naming it and its host; inside a job of the
right size (``mpiexec -n 8 python -m harness run FILE`` or ``srun ...``) it runs in place, and
rank 0 watches the ranks and aborts the MPI job when one hangs.
``--resume RUN_DIR`` trains the algorithms an interrupted or failed run did not finish.
Nothing is launched and nothing is written when the scenario is invalid (exit 2).

Exit status: 0 done, 1 the job failed (finished algorithms are kept), 2 bad input, 130
interrupted (Ctrl+C or SIGTERM; finished algorithms are kept).

The run directory's life (created before any rank starts, resumed, marked stopped) is
``harness.commands.run_directory``; the options ``run`` shares with other commands
``harness.commands.shared_options``. ``KEY=VALUE`` overrides may come anywhere on the line.

Example::

    python -m harness run scenarios/straggler.yaml
    python -m harness run scenarios/straggler.yaml imbalance.0.delay_ms=160 --only allreduce_sgd,wagma
    python -m harness run scenarios/straggler.yaml --out /tmp/results workload.iterations=30
    python -m harness run scenarios/straggler.yaml --sweep algorithms.local_sgd.period=2,8
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import get_args

from harness.algorithms import scenario_notes
from harness.commands.run_directory import (
    begin_resume,
    create_run_dir,
    mark_stopped,
    open_for_resume,
    provenance_problem,
)
from harness.commands.shared_options import (
    add_launch_arguments,
    add_scenario_arguments,
    add_sweep_arguments,
    scenario_overrides,
)
from harness.commands.sweeping import sweep_mode
from harness.device import scenario_device_problem
from harness.launch import Launch, LaunchError, inside_mpi_job
from harness.mpi_library import import_mpi
from harness.rank_exit import exit_promptly_when_interrupted
from harness.report import after_command
from harness.results import provenance
from harness.results.atomic import remove_partial_files
from harness.scenario import load_scenario_with_notes
from harness.scenario.checks import check_user_code
from harness.scenario.schema import ProvenanceSetting
from harness.watchdog.supervision import run_watched


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="train every algorithm of a scenario on real MPI ranks", description=__doc__.splitlines()[0]
    )
    add_scenario_arguments(p, scenario_optional=True)
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="finish the algorithms this run did not (no FILE; faults are not injected again), or "
        "the points of this sweep directory that are not done",
    )
    add_sweep_arguments(p, parallel=False)
    p.add_argument(
        "--provenance",
        choices=get_args(ProvenanceSetting),
        help="what provenance/ keeps, instead of the scenario's results.provenance: final (initial "
        "model, shards, each algorithm's averaged final model), full (final plus every rank's "
        "final model), none; auto: full with real compute, none with emulated compute",
    )
    add_launch_arguments(p)
    p.set_defaults(func=run)


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
    # A LaunchError or ScenarioError raised before the ranks start is bad input: harness.cli
    # prints it (exit 2), and nothing has been written yet.
    in_job = inside_mpi_job()
    launch = None
    if in_job is None:
        launch = Launch.choose(args.launcher, args.hosts)
    elif args.launcher != "auto" or args.hosts is not None:
        return _error(
            "--launcher and --hosts are for starting ranks; this process already is one of an MPI job "
            f"of {in_job} ranks",
            2,
        )
    renamed: list[str] = []  # notes on old parameter spellings in the scenario file
    if args.resume is not None:
        if args.scenario is not None or scenario_overrides(args) or args.assignments or args.provenance is not None:
            return _error(
                "--resume takes only the run directory: the scenario and its settings are the run's own "
                "(RUN_DIR/scenario.resolved.yaml)",
                2,
            )
        try:
            scenario, run_dir = open_for_resume(Path(args.resume))
        except ValueError as exc:
            return _error(str(exc), 2)
        if scenario is None:
            print(f"nothing to resume: every algorithm of {run_dir.path} is finished", file=sys.stderr)
            return 0
    else:
        if args.scenario is None:
            return _error("give a scenario FILE, or --resume RUN_DIR", 2)
        scenario, renamed = load_scenario_with_notes(
            args.scenario, overrides=scenario_overrides(args), assignments=args.assignments
        )
        # The resolved scenario says what the run keeps: auto and --provenance resolved here.
        scenario = provenance.resolve(scenario, args.provenance)
        run_dir = None
    source = args.resume or args.scenario
    if scenario.workload.of_script:
        return _error(
            f"{source}: workload: names no model and dataset, so it is a training script's workload: run the "
            "script with `python -m harness launch --scenario FILE SCRIPT`, or give workload.model and "
            "workload.dataset",
            2,
        )
    problem = scenario_device_problem(scenario)
    if problem is not None:
        return _error(f"{source}: {problem}", 2)
    check_user_code(scenario, source)  # the user's model, dataset...: once, before any rank starts

    if in_job is not None:
        return _run_in_place(scenario, args, in_job, run_dir, renamed)
    problem = provenance_problem(scenario, run_dir, args.out)
    if problem is not None:
        return _error(f"{source}: {problem}", 2)
    if run_dir is None:
        run_dir = create_run_dir(scenario, args.out, getattr(args, "into", None), _facts(scenario))
    else:
        begin_resume(run_dir)
    return _launch(scenario, run_dir, launch, resume=args.resume is not None, renamed=renamed)


def _facts(scenario) -> dict:
    """What run.json says of a run beyond its scenario: what its provenance keeps."""
    return {"provenance": scenario.results.provenance}


def _launch(scenario, run_dir, launch, resume: bool, renamed: list[str]) -> int:
    """Start the ranks under the venv's mpiexec and watch them until they end, on this host or
    across hosts (their heartbeats come over TCP)."""
    todo = [a.name for a in scenario.algorithms if a.name not in run_dir.finished_algorithms]
    verb = "resuming" if resume else "running"
    print(
        f"{scenario.name}: {scenario.ranks} ranks, {verb} {len(todo)} algorithm{'s' * (len(todo) != 1)} "
        f"-> {run_dir.path}",
        file=sys.stderr,
    )
    _print_notes(scenario, renamed)
    argv = [sys.executable, "-m", "harness.runner.worker", str(run_dir.path), *(["--resume"] if resume else [])]

    def interrupted() -> None:
        remove_partial_files(run_dir.path)
        mark_stopped(run_dir.path, "incomplete", {"stopped": "interrupted (Ctrl+C or SIGTERM)"})
        _say_interrupted(run_dir.path)

    try:
        rc, verdict = run_watched(
            scenario, scenario.ranks, argv, {}, launch, faults_enabled=not resume, on_interrupt=interrupted
        )
    except LaunchError as exc:
        return _error(str(exc), 1)
    except KeyboardInterrupt:
        return 130
    remove_partial_files(run_dir.path)
    if rc == 0:
        return after_command(run_dir.path)  # report.html (a warning, not a failure, if it cannot be drawn)
    why = verdict.message if verdict is not None else f"the ranks exited with status {rc}"
    mark_stopped(run_dir.path, "failed", {"error": why, **({"fault": verdict.as_json()} if verdict else {})})
    print(
        f"\nerror: {why}\nstopped all ranks; finished algorithms are kept in {run_dir.path} (run.json says which); "
        f"python -m harness run --resume {run_dir.path} finishes the others",
        file=sys.stderr,
    )
    return 1


def _print_notes(scenario, renamed: list[str]) -> None:
    """What the run will do that the scenario file does not say outright: the new spelling of old
    parameter names it uses (``renamed``), WAGMA's effective groups."""
    for note in renamed + scenario_notes(scenario):
        print(f"note: {note}", file=sys.stderr)


def _say_interrupted(path) -> None:
    print(
        f"interrupted: finished algorithms are kept in {path}; "
        f"python -m harness run --resume {path} finishes the others",
        file=sys.stderr,
    )


def _run_in_place(scenario, args, job_size: int, run_dir, renamed: list[str]) -> int:
    MPI = import_mpi()  # MPI only inside a job: never for --help or the launching parent

    from harness.runner.worker import main as worker_main  # noqa: PLC0415  (the training loop: on the ranks only)

    exit_promptly_when_interrupted()  # as every rank `run` launches itself

    if job_size != scenario.ranks:
        return _error(
            f"{args.resume or args.scenario}: the scenario needs {scenario.ranks} ranks but this MPI job "
            f"has {job_size}" + ("" if args.resume else " (use --ranks to override)"),
            2,
        )
    path = problem = None
    if MPI.COMM_WORLD.rank == 0:  # every rank of the user's job gets here; one checks and writes
        _print_notes(scenario, renamed)
        problem = provenance_problem(scenario, run_dir, args.out)
        if problem is None and run_dir is None:
            run_dir = create_run_dir(scenario, args.out, facts=_facts(scenario))
        elif problem is None:
            begin_resume(run_dir)
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
