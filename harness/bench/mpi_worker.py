"""What every benchmark's MPI worker does around its own work.

A worker is the module the ranks of a benchmark's job run (``python -m
harness.bench.<benchmark>_worker`` under the venv's mpiexec), or the function
``python -m harness bench <benchmark>`` calls itself when it already runs inside an MPI job.
Either way the work needs MPI's world communicator, and the job must be as large as
``--ranks`` says when it is given; the launching parent needs the command line each rank runs.
MPI is initialized here, on the ranks, never when the parent imports a worker: the parent of a
benchmark never loads mpi4py.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import Any

from harness.bench.arguments import job_size_matches
from harness.mpi_library import import_mpi


def on_world(work: Callable[[argparse.Namespace, Any], int]) -> Callable[[argparse.Namespace], int]:
    """``run_worker(args)`` doing ``work(args, world)`` on MPI's world communicator; exit status 2
    without calling ``work`` when ``--ranks`` is not the job's size (rank 0 says so)."""

    @functools.wraps(work)
    def run_worker(args: argparse.Namespace) -> int:
        MPI = import_mpi()  # initializes MPI: on the ranks, never in the launching parent

        world = MPI.COMM_WORLD
        if not job_size_matches(args, world):
            return 2
        return work(args, world)

    return run_worker


def worker_command(module: str, options: list[str]) -> list[str]:
    """The whole command each rank runs: ``python -m MODULE OPTIONS`` with this interpreter."""
    return [sys.executable, "-m", module, *options]
