"""Run a sweep: validate every point, then run each in a process of its own, then tabulate.

``run`` and ``simulate`` hand their arguments here when ``--sweep`` is given
(:func:`start_sweep`), and again with ``--resume SWEEP_DIR`` (:func:`resume_sweep`: the points
not done yet) or ``--resume SWEEP_DIR --point I`` (:func:`run_point`: what each point's process,
and each task of a SLURM job array, runs). Simulated points run ``--jobs`` at a time; real
points one after another, since ranks of two runs on one machine would slow each other. A point
that fails is recorded with its error (``points/pNNN.json``) and the others go on.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.scenario import ScenarioError, load_scenario
from harness.scenario.overrides import OverrideError
from harness.sweep.grid import Point, sweep_grid
from harness.sweep.store import PARSER_KEY, SweepDirectory, SweepError, arguments_from_json, arguments_to_json


def start_sweep(command: str, args: argparse.Namespace) -> int:
    """Validate every point of ``args.sweep`` (nothing is written if one is invalid), create the
    sweep directory and run the points."""
    plan = plan_sweep(args)
    return _run_points(create_sweep(command, args, plan), _jobs(command, args))


@dataclass(frozen=True)
class SweepPlan:
    """A sweep's keys, points and each point's scenario, validated."""

    keys: list[str]
    points: list[Point]
    scenarios: list[Any]


def plan_sweep(args: argparse.Namespace) -> SweepPlan:
    """Every point of ``args.sweep`` loaded as its run will load it; SweepError naming the first
    point that does not load. Writes nothing."""
    if args.scenario is None:
        raise SweepError("--sweep needs a scenario FILE")
    try:
        keys, points = sweep_grid(args.sweep)
    except OverrideError as exc:
        raise SweepError(str(exc)) from None
    base = list(args.assignments or [])
    clash = [k for k in keys if any(a.split("=", 1)[0].lstrip("+~") == k for a in base)]
    if clash:
        raise SweepError(f"{clash[0]} is both overridden and swept: give it once")
    legacy = {"ranks": args.ranks, "iterations": args.iterations, "only": args.only}
    scenarios = []
    for point in points:
        try:
            scenarios.append(load_scenario(args.scenario, overrides=legacy, assignments=[*base, *point.texts]))
        except ScenarioError as exc:
            raise SweepError(f"sweep point {point.index} ({point.label}):\n{exc}") from None
    return SweepPlan(keys, points, scenarios)


def create_sweep(command: str, args: argparse.Namespace, plan: SweepPlan, **arguments) -> SweepDirectory:
    """The sweep directory of ``plan``, whose points run ``command`` with the arguments of ``args``
    (``arguments`` replace some: ``sbatch`` gives ``run``'s launcher)."""
    stored = {**arguments_to_json(args), **arguments, "scenario": str(Path(args.scenario).absolute())}
    described = [{"index": p.index, "overrides": p.texts, "values": p.values} for p in plan.points]
    sweep = SweepDirectory.create(args.out, plan.scenarios[0].name, command, stored, plan.keys, described)
    print(f"sweep: {len(plan.points)} points of {', '.join(plan.keys)} -> {sweep.path}", file=sys.stderr)
    return sweep


def resume_sweep(command: str, args: argparse.Namespace) -> int:
    """``--resume SWEEP_DIR [--point I]``: one point, or every point not done yet."""
    sweep = SweepDirectory.open(args.resume)
    if sweep.command != command:
        raise SweepError(
            f"{sweep.path} is a sweep of `{sweep.command}`: resume it with "
            f"`python -m harness {sweep.command} --resume {sweep.path}`"
        )
    if args.point is not None:
        return run_point(sweep, args.point, getattr(args, PARSER_KEY))
    return _run_points(sweep, _jobs(command, args))


def _jobs(command: str, args: argparse.Namespace) -> int:
    if command != "simulate":
        return 1
    jobs = args.jobs if args.jobs is not None else (os.cpu_count() or 1)
    if jobs < 1:
        raise SweepError(f"--jobs must be >= 1 (got {jobs})")
    return jobs


def run_point(sweep: SweepDirectory, index: int, parser: argparse.ArgumentParser) -> int:
    """Run point ``index`` in this process: its command with the sweep's arguments (read back with
    ``parser``, the command line's, ``harness.cli``), its overrides after them, into its own run
    directory; record how it ended."""
    point = sweep.point(index)
    args = arguments_from_json(parser, sweep.command, sweep.spec["arguments"])
    args.assignments = [*(args.assignments or []), *point["overrides"]]
    args.sweep, args.resume, args.point = None, None, None
    args.into = sweep.begin_point(index)
    error = None
    try:
        status = args.func(args)
    except HarnessError as exc:  # what harness.cli would print: bad input
        print(f"error: {exc}", file=sys.stderr)
        status, error = 2, str(exc).splitlines()[0]
    except KeyboardInterrupt:
        status = 130
    if status != 0 and error is None:
        error = f"exit status {status}"
    sweep.end_point(index, status, error)
    return status


def _run_points(sweep: SweepDirectory, jobs: int) -> int:
    """Every point not done yet, ``jobs`` at a time, each in a process of its own with its output
    in its log; a progress bar over the points; then the table, the plot and the report."""
    from tqdm import tqdm  # noqa: PLC0415  (off the CLI's import path: --help loads every command)

    todo = [p["index"] for p in sweep.points if sweep.status(p["index"]).status != "done"]
    running: dict[int, subprocess.Popen] = {}
    bar = tqdm(
        total=len(sweep.points),
        initial=len(sweep.points) - len(todo),
        desc="sweep",
        unit="point",
        file=sys.stderr,
        dynamic_ncols=True,
    )
    try:
        while todo or running:
            while todo and len(running) < jobs:
                index = todo.pop(0)
                running[index] = _start_point(sweep, index)
            for index, process in list(running.items()):
                if process.poll() is not None:
                    del running[index]
                    _settle(sweep, index, process.returncode, bar)
                    bar.update(1)
            if running:
                time.sleep(0.2)  # a point takes seconds to minutes: polling costs nothing
    except KeyboardInterrupt:
        for process in running.values():
            process.send_signal(signal.SIGINT)
        for process in running.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        bar.close()
        print(
            f"interrupted: finish the sweep with `python -m harness {sweep.command} --resume {sweep.path}`",
            file=sys.stderr,
        )
        return 130
    bar.close()
    return _finish(sweep)


def _start_point(sweep: SweepDirectory, index: int) -> subprocess.Popen:
    log = open(sweep.log_file(index), "w", encoding="utf-8")  # noqa: SIM115 - the child owns it
    try:
        # Its own process group: Ctrl+C reaches the sweep, which stops the points in order.
        return subprocess.Popen(
            [sys.executable, "-m", "harness", sweep.command, "--resume", str(sweep.path), "--point", str(index)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        log.close()


def _settle(sweep: SweepDirectory, index: int, returncode: int, bar) -> None:
    """Record a point whose process ended without saying how (killed) and name a failure."""
    status = sweep.status(index)
    if status.status == "pending":  # the process died before recording its end
        sweep.end_point(
            index,
            returncode if returncode != 0 else 1,
            sweep.last_error(index) or f"its process ended with status {returncode}",
        )
        status = sweep.status(index)
    if status.status == "failed":
        label = " ".join(sweep.point(index)["overrides"])
        error = sweep.last_error(index) or status.error
        bar.write(f"point {index} ({label}) failed: {error} (log: {sweep.log_file(index)})", file=sys.stderr)


def _finish(sweep: SweepDirectory) -> int:
    """Write sweep.csv, sweep.png and the report; say what failed. 1 if a point failed."""
    failed = [p for p in sweep.points if sweep.status(p["index"]).status != "done"]
    _report(sweep)  # sweep.csv, sweep.png and report.html
    done = len(sweep.points) - len(failed)
    print(
        f"sweep: {done} of {len(sweep.points)} points done" + (f", {len(failed)} failed:" if failed else ""),
        file=sys.stderr,
    )
    for p in failed:
        print(f"  point {p['index']} ({' '.join(p['overrides'])}): {sweep.status(p['index']).error}", file=sys.stderr)
    print(f"results: {sweep.path}")
    return 1 if failed else 0


def _report(sweep: SweepDirectory) -> None:
    """sweep.csv and sweep.png, then report.html; a page that cannot be drawn is a warning."""
    from harness.sweep.table import write_table_and_plot  # noqa: PLC0415  (pandas, matplotlib: off the CLI's import path)

    for path in write_table_and_plot(sweep):
        print(f"wrote {path}", file=sys.stderr)
    try:
        from harness.sweep.page import write_sweep_page  # noqa: PLC0415  (matplotlib, off the CLI's import path)

        written = write_sweep_page(sweep)
        print(f"report: {written.html}")
    except Exception as exc:  # noqa: BLE001 - the sweep's results stand without their page
        print(f"warning: report.html not written: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
