"""Whether ``run``, ``simulate`` or ``launch`` runs as a sweep, and then the sweep's exit status.

A sweep is asked for with ``--sweep KEY=V1,V2,...`` (a new one), ``--resume SWEEP_DIR`` (the
points not done) or ``--resume SWEEP_DIR --point I`` (one point: what each of its processes,
and each task of a SLURM job array, runs). The sweep itself is ``harness.sweep.execute``; this
module only checks that the command line asks for one coherently, before anything is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.commands.shared_options import scenario_overrides
from harness.launch import inside_mpi_job
from harness.sweep.execute import resume_sweep, start_sweep
from harness.sweep.store import SWEEP_FILE


def sweep_mode(command: str, args: argparse.Namespace) -> int | None:
    """The sweep's exit status when ``args`` ask for a sweep (``--sweep``, or ``--resume`` of a
    sweep directory), else None: the command runs as usual."""
    resume = getattr(args, "resume", None)
    is_sweep = resume is not None and (Path(resume) / SWEEP_FILE).is_file()
    if (is_sweep or args.sweep) and args.point is None and inside_mpi_job() is not None:
        return _error(
            "a sweep starts its points' runs itself: start it outside an MPI job (or run one point "
            "per job with --resume SWEEP_DIR --point I)"
        )
    if is_sweep:
        if args.sweep or args.scenario is not None or args.assignments or scenario_overrides(args):
            return _error(
                "--resume SWEEP_DIR takes nothing else but --point (and --jobs): the sweep keeps its "
                "scenario and settings in sweep.json"
            )
        return resume_sweep(command, args)
    if args.point is not None:
        return _error("--point I goes with --resume SWEEP_DIR")
    if args.sweep:
        if resume is not None:
            return _error(f"--resume {resume}: not a sweep directory (no {SWEEP_FILE}); --sweep starts a new one")
        return start_sweep(command, args)
    return None


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2
