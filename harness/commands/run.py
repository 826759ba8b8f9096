"""``python -m harness run FILE``: validate, create the run directory, launch the ranks.

Outside an MPI job it starts the venv's mpiexec with the scenario's rank count; inside a job
of the right size (``mpiexec -n 8 python -m harness run FILE`` or ``srun ...``) it runs in
place. Nothing is launched and nothing is written when the scenario is invalid (exit 2).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="train every algorithm of a scenario on real MPI ranks",
                       description=__doc__.splitlines()[0])
    add_scenario_arguments(p)
    p.set_defaults(func=run)


def add_scenario_arguments(p: argparse.ArgumentParser) -> None:
    """The scenario file, the results root and the overrides (``run`` and ``simulate``)."""
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--out", default="results", help="results root (default: results/)")
    p.add_argument("--only", help="comma-separated subset of the scenario's algorithms")
    p.add_argument("--ranks", type=int, help="override the scenario's rank count")
    p.add_argument("--iterations", type=int, help="override iterations per algorithm")


def _overrides(args: argparse.Namespace) -> dict:
    out: dict = {}
    if args.ranks is not None:
        out["ranks"] = args.ranks
    if args.iterations is not None:
        out["iterations"] = args.iterations
    if args.only:
        out["only"] = [a.strip() for a in args.only.split(",") if a.strip()]
    return out


def run(args: argparse.Namespace) -> int:
    from harness.algorithms import implemented
    from harness.launch import LaunchError, inside_mpi_job, run_ranks
    from harness.results.records import RunDirectory
    from harness.scenario import ScenarioError, load_scenario

    try:
        scenario = load_scenario(args.scenario, overrides=_overrides(args))
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missing = [a.name for a in scenario.algorithms if a.name not in implemented()]
    if missing:
        print(f"error: {args.scenario}: algorithms {', '.join(missing)} are valid but not implemented yet "
              f"(available: {', '.join(implemented())}); use --only", file=sys.stderr)
        return 2

    in_job = inside_mpi_job()
    if in_job is not None:
        return _run_in_place(scenario, args, in_job)

    run_dir = RunDirectory.create(args.out, scenario.name)
    run_dir.write_resolved_scenario(scenario.resolved_dict())
    run_dir.write_run_json("incomplete", [], ranks=scenario.ranks)
    print(f"{scenario.name}: {scenario.ranks} ranks, {len(scenario.algorithms)} algorithms -> {run_dir.path}",
          file=sys.stderr)
    # A SIGTERM (batch system, timeout) stops the ranks like Ctrl+C instead of orphaning them.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        proc = run_ranks(scenario.ranks, [sys.executable, "-m", "harness.runner.worker", str(run_dir.path)])
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted: finished algorithms are kept in {run_dir.path}", file=sys.stderr)
        return 130
    if proc.returncode != 0:
        _mark_failed(run_dir.path, f"ranks exited with status {proc.returncode}")
        print(f"error: the ranks exited with status {proc.returncode}; finished algorithms are kept in "
              f"{run_dir.path} (run.json says which)", file=sys.stderr)
        return 1
    return 0


def _mark_failed(path: Path, why: str) -> None:
    """Record in run.json that the run stopped on an error, keeping what it finished."""
    import json

    from harness.results.records import RunDirectory

    meta = json.loads((path / "run.json").read_text())
    RunDirectory.open(path).write_run_json("failed", meta.get("finished_algorithms", []), ranks=meta.get("ranks"),
                                           extra={"error": why})


def _run_in_place(scenario, args, job_size: int) -> int:
    from mpi4py import MPI

    from harness.results.records import RunDirectory
    from harness.runner.worker import main as worker_main

    if job_size != scenario.ranks:
        print(f"error: {args.scenario}: the scenario needs {scenario.ranks} ranks but this MPI job has {job_size} "
              "(use --ranks to override)", file=sys.stderr)
        return 2
    path = None
    if MPI.COMM_WORLD.rank == 0:
        run_dir = RunDirectory.create(args.out, scenario.name)
        run_dir.write_resolved_scenario(scenario.resolved_dict())
        run_dir.write_run_json("incomplete", [], ranks=scenario.ranks)
        path = str(run_dir.path)
    path = MPI.COMM_WORLD.bcast(path, root=0)
    return worker_main(str(Path(path)))
