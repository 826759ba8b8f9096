"""``python -m harness launch -n N [--scenario FILE] SCRIPT [ARGS]``: start a training script on MPI ranks.

Starts ``python SCRIPT ARGS`` on N ranks with the venv's mpiexec and watches them as ``run``
watches its own (a rank that dies, raises or stops making progress ends the job, named). The
script uses ``harness.api`` (docs/guides/own-code.md), or is an unchanged ``torch.distributed``
script run under a scenario (below).

With ``--scenario FILE`` the scenario's imbalance, slow links and faults are injected into the
script, and the script runs once per algorithm the scenario lists (``--only`` picks some), all
into one results directory created here (``--out``, default results/): the same schema as
``run`` writes, so ``compare`` and ``figures`` work on it. Without a scenario the script runs
once, with the algorithm and settings it gives ``harness.api.Run`` itself, and writes its own
results directory.

A scenario that lists no algorithms runs an unchanged ``torch.distributed`` script as the
algorithm, once, named ``--label`` (default: the script's stem): torchrun's variables are set,
``init_process_group("harness")`` carries its traffic over the scenario's emulated network, and
every optimizer step is one iteration of the results (docs/guides/torch-distributed.md).

With ``--scenario``, ``KEY=VALUE`` overrides of its fields may come anywhere before SCRIPT, among
the options; every word after SCRIPT is the script's own.

``--sweep KEY=V1,V2,...`` (with ``--scenario``; repeated: every combination) launches the script
once per point of the grid, each under the scenario with that point's overrides, one after the
other, into ``OUT/<scenario>/sweep-<time>/points/pNNN/``, then writes ``sweep.csv`` (every
point's summary rows: throughput, time to the target accuracy and to the target loss),
``sweep.png`` and ``report.html`` beside them (``harness.sweep``, as ``run --sweep``);
``--resume SWEEP_DIR`` launches the points not done yet.

Exit status: 0 done, 1 the job failed (finished algorithms are kept), 2 bad input (nothing is
written or started), 130 interrupted.

Example::

    python -m harness launch -n 4 --scenario examples/own_training_script/scenario.yaml \\
        examples/own_training_script/train.py --epochs 1
    python -m harness launch --scenario examples/torch_ddp/scenario.yaml examples/torch_ddp/train.py
    python -m harness launch --scenario examples/torch_ddp/scenario.yaml --sweep ranks=3,4,5 \\
        examples/torch_ddp/train.py
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

from harness.commands.overrides import add_overrides_before_script
from harness.commands.run_directory import create_run_dir, mark_stopped
from harness.commands.shared_options import (
    add_launch_arguments,
    add_scenario_options,
    add_sweep_arguments,
    scenario_overrides,
)
from harness.commands.sweeping import sweep_mode
from harness.device import scenario_device_problem
from harness.launch import Launch, LaunchError
from harness.report import after_command
from harness.scenario import ScenarioError, load_scenario_with_notes
from harness.scenario.schema import WatchdogSettings
from harness.watchdog.supervision import run_watched
from harness.watchdog.verdict import Verdict


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "launch",
        help="start a training script on MPI ranks, watched (harness.api, or torch.distributed under --scenario)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--scenario", help="scenario YAML: injected imbalance, links, faults; one run per algorithm")
    add_scenario_options(
        p, ranks_flags=("-n", "--ranks"), ranks_help="rank count (default: the scenario's, which this overrides)"
    )
    p.add_argument("--out", default="results", help="results root (default: results/)")
    p.add_argument(
        "--label",
        help="with a --scenario that lists no algorithms (a torch.distributed script): the "
        "run's name in the results (default: the script's file stem)",
    )
    add_sweep_arguments(p, parallel=False)
    p.add_argument(
        "--resume",
        metavar="SWEEP_DIR",
        help="launch the points of this sweep that are not done (no SCRIPT: the sweep keeps it)",
    )
    add_launch_arguments(p)
    p.add_argument(
        "script",
        nargs="?",
        metavar="[KEY=VALUE ...] SCRIPT",
        help="your training script (Python file); with --scenario, KEY=VALUE overrides of its fields "
        "may come anywhere before it (as for `run`)",
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    add_overrides_before_script(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.resume is not None or args.point is not None:  # a sweep's points (--resume SWEEP_DIR [--point I])
        return _sweep(args)
    if args.script is None:
        raise LaunchError("give your training script after the KEY=VALUE overrides")
    if args.assignments and args.scenario is None:
        raise LaunchError(f"{args.assignments[0]}: KEY=VALUE overrides change a scenario: give --scenario FILE")
    script = Path(args.script)
    if not script.is_file():
        raise LaunchError(f"{script}: no such script")
    if args.scenario is None and (args.only or args.iterations is not None):
        raise LaunchError("--only and --iterations pick from a scenario: give --scenario FILE")
    if args.sweep:
        if args.scenario is None:
            raise LaunchError("--sweep varies a scenario: give --scenario FILE")
        args.script = str(script.absolute())  # each point launches it, from wherever the sweep is resumed
        return _sweep(args)
    scenario = _scenario(args) if args.scenario else None
    ranks = args.ranks if args.ranks is not None else (scenario.ranks if scenario else None)
    if ranks is None:
        raise LaunchError("give the rank count (-n N) or a --scenario that has one")
    if args.label is not None and (scenario is None or scenario.algorithms):
        raise LaunchError("--label names a torch.distributed script's run: give a --scenario that lists no algorithms")
    launch = Launch.choose(args.launcher, args.hosts)
    argv = [sys.executable, str(script), *args.args]
    if scenario is None:
        watched = SimpleNamespace(
            name=script.stem, watchdog=WatchdogSettings(), faults=[], algorithms=[SimpleNamespace(name=script.stem)]
        )
        return _start(watched, ranks, argv, launch, env={}, what=f"{script}")[0]
    if not scenario.algorithms:
        return _run_torch_script(scenario, args, script, ranks, launch)
    run_dir = create_run_dir(scenario, args.out, getattr(args, "into", None), {"script": script.name}).path
    print(
        f"{scenario.name}: {ranks} ranks, {script} once per algorithm ({len(scenario.algorithms)}) -> {run_dir}",
        file=sys.stderr,
    )
    from harness.api.session import ENV_ALGORITHM, ENV_RUN_DIR  # noqa: PLC0415  (torch: not for --help)

    for params in scenario.algorithms:
        env = {ENV_RUN_DIR: str(run_dir), ENV_ALGORITHM: params.name}
        status, verdict = _start(scenario, ranks, argv, launch, env=env, what=f"{script} with {params.name}")
        if status != 0:
            _mark_stopped(run_dir, status, verdict)
            return status
    return 0


def _sweep(args: argparse.Namespace) -> int:
    """``--sweep`` (a new sweep: every point validated, then launched), ``--resume SWEEP_DIR``
    (the points not done) or ``--resume SWEEP_DIR --point I`` (one point's launch: this command
    again, with the sweep's arguments and the point's overrides, into the point's directory):
    ``harness.sweep.execute``, as ``run --sweep``."""
    if args.resume is not None and args.script is not None:
        raise LaunchError("--resume SWEEP_DIR takes no SCRIPT: the sweep keeps its script and settings in sweep.json")
    status = sweep_mode("launch", args)
    if status is None:  # --resume of something else than a sweep
        raise LaunchError(
            f"--resume {args.resume}: not a sweep directory (no sweep.json); `launch` resumes only "
            "sweeps: start the script again instead"
        )
    return status


def _run_torch_script(scenario, args: argparse.Namespace, script: Path, ranks: int, launch) -> int:
    """A scenario without algorithms: the script is a torch.distributed program, run once as the
    algorithm (``harness.dist.session``): torchrun's variables set, ``init_process_group("harness")``
    on the scenario's emulated network, one iteration per optimizer step; then report.html."""
    from harness.api.session import ENV_RUN_DIR  # noqa: PLC0415  (torch: not for --help)
    from harness.dist.session import ENV_LABEL  # noqa: PLC0415  (torch and the native module: not for --help)

    label = args.label if args.label is not None else re.sub(r"[^A-Za-z0-9_-]", "_", script.stem)
    if not label:
        raise LaunchError("--label must not be empty")
    run_dir = create_run_dir(scenario, args.out, getattr(args, "into", None), {"script": script.name}).path
    print(
        f"{scenario.name}: {ranks} ranks, {script} as a torch.distributed program ({label}) -> {run_dir}",
        file=sys.stderr,
    )
    argv = [sys.executable, "-m", "harness.dist.launched", str(script), *args.args]
    env = {ENV_RUN_DIR: str(run_dir), ENV_LABEL: label, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    watched = scenario.model_copy(update={"algorithms": [SimpleNamespace(name=label)]})
    status, verdict = _start(watched, ranks, argv, launch, env=env, what=f"{script}")
    if status != 0:
        _mark_stopped(run_dir, status, verdict)
        return status
    return after_command(run_dir)


def _scenario(args: argparse.Namespace):
    scenario, notes = load_scenario_with_notes(
        args.scenario, overrides=scenario_overrides(args), assignments=args.assignments
    )
    problem = scenario_device_problem(scenario)
    if problem is not None:
        raise ScenarioError(f"{args.scenario}: {problem}")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return scenario


def _start(scenario, ranks: int, argv: list[str], launch, env: dict, what: str) -> tuple[int, Verdict | None]:
    """Run ``argv`` on ``ranks`` ranks, watched wherever they run; the exit status and the
    watchdog's verdict (None when it had none)."""
    try:
        rc, verdict = run_watched(
            scenario, ranks, argv, env, launch, on_interrupt=lambda: print("interrupted", file=sys.stderr)
        )
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1, None
    except KeyboardInterrupt:
        return 130, None
    if rc == 0:
        return 0, None
    why = verdict.message if verdict is not None else f"the ranks exited with status {rc}"
    print(f"\nerror: {what}: {why}\nstopped all ranks", file=sys.stderr)
    return 1, verdict


def _mark_stopped(run_dir: Path, status: int, verdict: Verdict | None = None) -> None:
    """``run.json`` says the run stopped, and why: the watchdog's verdict, as ``run`` records it."""
    why = {"error": verdict.message, "fault": verdict.as_json()} if verdict is not None else {}
    mark_stopped(
        run_dir,
        "failed" if status != 130 else "incomplete",
        {"stopped": "interrupted" if status == 130 else "a rank failed", **why},
    )
    print(f"finished algorithms are kept in {run_dir} (run.json says which)", file=sys.stderr)
