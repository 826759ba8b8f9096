"""``python -m harness calibrate``: measure this machine and save the simulator's calibration file.

One MPI job per rank count (``--ranks 2,8``; default: the distinct rank counts of the
scenarios) under the venv's mpiexec measures, through the native layer: point-to-point
one-way times (fitted to an alpha-beta model), native barrier and allreduce times, the
training loop's local work per iteration of every real-compute (model, dataset, batch size)
of the scenarios with all ranks computing at once, rank 0's evaluation time, and the loop's
overhead with emulated compute. ``harness.calibrate.worker`` documents exactly what each
number is; ``harness.sim.calibration`` the file format.

Scenarios: ``--scenario FILE`` (repeatable; a file that does not load is an error, exit 2),
default every ``scenarios/*.yaml`` of the current directory that loads (others are skipped
with a note). Emulated-compute scenarios add no compute point, only their communicated size
to the allreduce sizes.

Saving: the entry of each rank count is merged into ``--output`` (default
``results/calibration.json``; entries of other rank counts already there are kept, and so
are the compute and evaluation times of workloads this run did not measure, unless the file
was measured on a machine with another CPU count) and the file is saved atomically
right after that rank count succeeds, so a long calibration keeps its finished rank counts
when a later one fails or is interrupted. An existing file that does not load is an error
(exit 2) and is left alone. ``--quick`` takes few repetitions (seconds per rank count; for
tests). Inside an MPI job (``mpiexec -n 8 python -m harness calibrate``) every rank measures
in place and only that job's rank count is calibrated.

Where the ranks run: as ``run``, ``--launcher`` and ``--hosts HOSTFILE`` (``harness.launch``),
so a calibration can span the hosts a run will use. Every entry records the host of each rank;
across hosts the point-to-point times are measured for a pair on one host and a pair on two
hosts, which ``simulate`` and ``compare`` turn into the hosts' NICs (``harness.sim.hosts``).
Off this host, the jobs' plan and result files are written next to ``--output`` (a shared
file system, as a run's ``--out``), not in this host's temporary directory.

Example::

    python -m harness calibrate --ranks 2,8
    python -m harness calibrate --scenario scenarios/straggler.yaml --quick --output /tmp/cal.json
    python -m harness calibrate --scenario scenarios/straggler.yaml --ranks 8 --hosts hosts.txt
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import harness
from harness.arguments import argtype
from harness.calibrate.measure import MIN_RANKS, Plan, format_table, parse_ranks, plan_from_scenarios
from harness.commands.shared_options import add_launch_arguments
from harness.launch import Launch, LaunchError, inside_mpi_job, run_ranks
from harness.scenario import ScenarioError, load_scenario
from harness.sim.calibration import (
    DEFAULT_PATH,
    Calibration,
    CalibrationEntry,
    CalibrationError,
    load_calibration,
    save_calibration,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``calibrate`` command."""
    parser = subparsers.add_parser(
        "calibrate", help="measure this machine for the simulator", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--scenario",
        action="append",
        metavar="FILE",
        type=Path,
        default=None,
        help="scenario file whose workloads and rank counts to calibrate (repeatable; "
        "default: every scenarios/*.yaml here that loads)",
    )
    parser.add_argument(
        "--ranks",
        type=argtype(parse_ranks),
        metavar="N[,N...]",
        help="rank counts to calibrate, e.g. 2,8 (default: the scenarios' rank counts)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_PATH,
        metavar="FILE",
        help=f"calibration file to merge into (default {DEFAULT_PATH})",
    )
    parser.add_argument("--quick", action="store_true", help="few repetitions (seconds per rank count)")
    add_launch_arguments(parser)
    parser.set_defaults(func=run)


def _error(message: str, status: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return status


def _load_scenarios(args: argparse.Namespace) -> list:
    """The scenarios to calibrate for; raises ScenarioError for a named file that does not load."""
    if args.scenario:
        return [load_scenario(path) for path in args.scenario]
    scenarios = []
    for path in sorted(Path("scenarios").glob("*.yaml")):
        try:
            scenarios.append(load_scenario(path))
        except ScenarioError as exc:
            first = str(exc).splitlines()[0]
            print(f"note: skipping {path}: {first}", file=sys.stderr)
    return scenarios


def _existing(path: Path):
    """The calibration already at ``path`` to merge into, or None; raises CalibrationError."""
    if not path.exists():
        return None
    cal = load_calibration(path)
    if cal.cpus != os.cpu_count():
        print(
            f"note: {path} was measured on a machine with {cal.cpus} CPUs (this one has {os.cpu_count()}); "
            "its entries are replaced",
            file=sys.stderr,
        )
        return None
    return cal


def _unwritable(path: Path) -> str | None:
    """Why the calibration file cannot be written at ``path`` (None: it can, as far as we can tell)."""
    if path.is_dir():
        return "is a directory"
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"directory {parent} is not writable"
    return None


def _merge(cal, entry):
    """``cal`` (or a new calibration) with ``entry``, stamped now with this harness version."""
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if cal is None:
        cal = Calibration(created_at=now, harness_version=harness.__version__, cpus=os.cpu_count() or 1, entries=[])
    cal = cal.with_entry(entry)
    return cal.model_copy(update={"created_at": now, "harness_version": harness.__version__})


def run(args: argparse.Namespace) -> int:

    scenarios = _load_scenarios(args)
    plan = plan_from_scenarios(scenarios, quick=args.quick)
    job = inside_mpi_job()
    if job is not None and (args.launcher != "auto" or args.hosts is not None):
        return _error(
            f"--launcher and --hosts are for starting ranks; this process already is one of an MPI job of {job} ranks"
        )
    launch = Launch.choose(args.launcher, args.hosts) if job is None else None  # LaunchError: exit 2
    if args.ranks is not None:
        ranks = args.ranks
    elif job is not None:
        ranks = [job]
    else:
        ranks = sorted({s.ranks for s in scenarios if s.ranks >= MIN_RANKS})
        if not ranks:
            return _error(
                "no rank counts to calibrate: no scenario file "
                + ("with 2 or more ranks" if scenarios else "in ./scenarios")
                + " (pass --ranks N[,N...] and/or --scenario FILE)"
            )
    if job is not None and ranks != [job]:
        return _error(
            f"--ranks {','.join(map(str, ranks))} but this process runs in an MPI job of {job} ranks: "
            f"drop --ranks, or run it without mpiexec to launch its own jobs"
        )
    unwritable = _unwritable(args.output)
    if unwritable:
        return _error(f"--output {args.output}: {unwritable}")
    try:
        cal = _existing(args.output)
    except CalibrationError as exc:
        return _error(f"cannot merge into the existing file: {exc} (move it away or pass --output FILE)")
    if not plan.workloads:
        print("note: no real-compute workload in the scenarios: no compute or evaluation points", file=sys.stderr)

    if job is not None:
        return _run_in_place(plan.with_ranks(job), cal, args.output)

    # A SIGTERM (batch system, timeout) stops the job like Ctrl+C instead of orphaning it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    done: list[int] = []
    status = 0
    # Ranks on other hosts read the plan and rank 0 (wherever it runs) writes the entry: off this
    # host both go next to the output, on the file system the hosts share.
    shared_dir = None
    assert launch is not None  # outside a job Launch.choose gave one (or raised)
    if not launch.single_host():
        shared_dir = args.output.absolute().parent
        shared_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="harness-calibrate-", dir=shared_dir) as tmp:
        for n in ranks:
            spec, out = Path(tmp) / f"plan-{n}.json", Path(tmp) / f"entry-{n}.json"
            spec.write_text(json.dumps(plan.with_ranks(n).to_json()))
            print(f"calibrating {n} ranks{' (quick)' if args.quick else ''} ...", file=sys.stderr, flush=True)
            try:
                proc = run_ranks(
                    n, [sys.executable, "-m", "harness.calibrate.worker", str(spec), str(out)], launch=launch
                )
            except LaunchError as exc:
                status = _error(str(exc), 1)
                break
            except KeyboardInterrupt:  # run_ranks has already killed the job
                print(
                    "interrupted" + (f": rank counts {_list(done)} are saved in {args.output}" if done else ""),
                    file=sys.stderr,
                )
                return 130
            if proc.returncode != 0 or not out.exists():
                status = _error(
                    f"the calibration job of {n} ranks exited with status {proc.returncode}"
                    + (f"; rank counts {_list(done)} are saved in {args.output}" if done else ""),
                    1,
                )
                break
            entry = CalibrationEntry.model_validate_json(out.read_text())
            cal = _merge(cal, entry)
            try:
                save_calibration(cal, args.output)
            except OSError as exc:
                status = _error(f"cannot write {args.output}: {exc.strerror or exc}", 1)
                break
            done.append(n)
    if done:
        print(format_table(cal, done))
        print(f"calibration: {args.output}")
    return status


def _list(values: list[int]) -> str:
    return ", ".join(map(str, values))


def _run_in_place(plan: Plan, cal, output: Path) -> int:
    """Inside an MPI job of the plan's size: every rank measures; rank 0 merges and saves."""
    from harness.calibrate.worker import run_worker  # noqa: PLC0415  (torch and MPI: only on the ranks)

    entry = run_worker(plan)
    if entry is not None:
        cal = _merge(cal, entry)
        save_calibration(cal, output)
        print(format_table(cal, [plan.ranks]))
        print(f"calibration: {output}")
    return 0
