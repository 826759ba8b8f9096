"""``python -m harness sbatch FILE``: write a SLURM batch script for a scenario and say how to submit it.

The script asks for one task per rank and runs ``python -m harness run FILE --launcher slurm``
in this directory with this environment's Python, so inside the allocation the harness starts
its ranks with Hydra's SLURM bootstrap, and writes the results where ``--out`` says. The
scenario is validated first; nothing is written for an invalid one (exit 2). The device is
checked by ``run`` on the allocated nodes, not here: a login node often has no GPU.

Example::

    python -m harness sbatch scenarios/straggler.yaml --time 00:30:00 --partition debug
    sbatch results/straggler/straggler.sbatch
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

from harness.commands.shared_options import add_scenario_arguments, scenario_overrides
from harness.results import atomic
from harness.scenario import load_scenario
from harness.sweep.execute import create_sweep, plan_sweep

_TIME = re.compile(r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$")  # SLURM's forms: M, M:S, H:M:S, D-H[:M[:S]]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sbatch",
        help="write a SLURM batch script running a scenario, and say how to submit it",
        description=__doc__.splitlines()[0],
    )
    add_scenario_arguments(p)
    p.add_argument(
        "--sweep",
        action="append",
        metavar="KEY=V1,V2,...",
        help="a SLURM job array: one task per point of the grid (as `run --sweep`); the sweep directory "
        "is created now, each task runs its point into it",
    )
    p.add_argument("--script", help="where to write the script (default: OUT/<scenario>/<scenario>.sbatch)")
    p.add_argument("--time", default="01:00:00", help="the job's time limit, in SLURM's format (default 01:00:00)")
    p.add_argument("--partition", help="the partition to submit to (default: the cluster's default)")
    p.add_argument("--nodes", type=int, help="spread the ranks over exactly this many nodes")
    p.add_argument("--account", help="the account to charge")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.sweep:
        return _sweep_array(args)
    scenario = load_scenario(args.scenario, overrides=scenario_overrides(args), assignments=args.assignments)
    if not _TIME.match(args.time):
        return _error(f"--time {args.time!r}: not a SLURM time limit (e.g. 30, 01:00:00, 1-12:00:00)")
    if args.nodes is not None and not 1 <= args.nodes <= scenario.ranks:
        return _error(f"--nodes {args.nodes}: must be between 1 and the scenario's {scenario.ranks} ranks")
    # The device is not checked here: a login node often has no GPU; `run` checks on the nodes.
    note = None
    if scenario.workload.device == "cuda":
        note = (
            "each rank takes the GPU of its local rank: ask for GPUs with your cluster's options (e.g. --gpus-per-node)"
        )
    out = Path(args.out).absolute()
    script = Path(args.script) if args.script else out / scenario.name / f"{scenario.name}.sbatch"
    (out / scenario.name).mkdir(parents=True, exist_ok=True)  # SLURM opens the job's --output there
    atomic.write_text(
        script, batch_script(scenario.name, scenario.ranks, Path(args.scenario).absolute(), out, args, note)
    )
    script.chmod(0o755)
    print(f"wrote {script} ({scenario.ranks} tasks, time limit {args.time})")
    print(f"submit it with:  sbatch {shlex.quote(str(script))}")
    if note:
        print(f"note: {note}")
    return 0


def _sweep_array(args: argparse.Namespace) -> int:
    """``--sweep``: validate every point, create the sweep directory, write a job array script
    with one task per point (each runs ``run --resume SWEEP_DIR --point $SLURM_ARRAY_TASK_ID``)."""
    if not _TIME.match(args.time):
        return _error(f"--time {args.time!r}: not a SLURM time limit (e.g. 30, 01:00:00, 1-12:00:00)")
    if args.script is not None:
        return _error("--script: a sweep's job array script is written into its sweep directory")
    plan = plan_sweep(args)
    scenarios = plan.scenarios
    ranks = max(s.ranks for s in scenarios)  # a job array's tasks all get the same resources
    if args.nodes is not None and not 1 <= args.nodes <= min(s.ranks for s in scenarios):
        return _error(
            f"--nodes {args.nodes}: must be between 1 and the fewest ranks of a point "
            f"({min(s.ranks for s in scenarios)})"
        )
    sbatch_only = {k: None for k in ("time", "partition", "nodes", "account", "script")}
    sweep = create_sweep("run", args, plan, launcher="slurm", hosts=None, provenance=None, **sbatch_only)
    script = sweep.path / "sweep.sbatch"
    run = shlex.join([sys.executable, "-m", "harness", "run", "--resume", str(sweep.path.absolute()), "--point"])
    text = batch_script(
        f"{sweep.spec['scenario_name']}-sweep",
        ranks,
        None,
        sweep.path.absolute(),
        args,
        array=len(scenarios),
        command=f'{run} "$SLURM_ARRAY_TASK_ID"',
    )
    atomic.write_text(script, text)
    script.chmod(0o755)
    print(f"wrote {script} (a job array of {len(scenarios)} points, {ranks} tasks each, time limit {args.time})")
    print(f"submit it with:  sbatch {shlex.quote(str(script))}")
    print(
        f"when it has finished:  python -m harness report {shlex.quote(str(sweep.path))}   (sweep.csv, sweep.png, "
        "report.html; `python -m harness run --resume` of the sweep runs the points that did not finish)"
    )
    return 0


def batch_script(
    name: str,
    ranks: int,
    scenario: Path | None,
    out: Path,
    args: argparse.Namespace,
    note: str | None = None,
    array: int | None = None,
    command: str | None = None,
) -> str:
    """The text of the batch script: SLURM directives, then the harness run inside the allocation
    (``command`` instead, for a job ``array`` of that many tasks)."""
    log = "slurm-%A_%a.out" if array else "slurm-%j.out"
    directives = [
        f"--job-name=harness-{name}",
        f"--ntasks={ranks}",
        f"--time={args.time}",
        f"--output={out / (log if array else name + '/' + log)}",
    ]
    if array:
        directives.append(f"--array=0-{array - 1}")
    for option in ("partition", "nodes", "account"):
        value = getattr(args, option)
        if value is not None:
            directives.append(f"--{option}={value}")
    run = (
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            str(scenario),
            *args.assignments,
            "--out",
            str(out),
            "--launcher",
            "slurm",
        ]
        if scenario is not None
        else []
    )
    for option in ("only", "ranks", "iterations"):
        value = getattr(args, option)
        if value is not None and scenario is not None:
            run += [f"--{option}", ",".join(value) if option == "only" else str(value)]
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    lines = [
        "#!/bin/bash",
        f"# Written by `python -m harness sbatch` on {stamp}: scenario {name}, {ranks} ranks.",
        *(f"# note: {note}" for note in [note] if note),
        *(f"#SBATCH {d}" for d in directives),
        "set -euo pipefail",
        f"cd {shlex.quote(str(Path.cwd()))}",
        "# This environment's Python: the same harness, mpiexec and MPI library on every node.",
        command if command is not None else shlex.join(run),
        "",
    ]
    return "\n".join(lines)


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2
