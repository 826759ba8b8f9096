"""What the benchmarks share: the job-size check, output, the worker's entry point.

Their argument types are every command's: :mod:`harness.arguments`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from harness.rank_exit import abort_job_after_error


def job_size_matches(args: argparse.Namespace, world: Any) -> bool:
    """In a worker: whether ``--ranks`` (if given) is the MPI job's size; rank 0 says why not."""
    n = world.Get_size()
    if args.ranks is None or args.ranks == n:
        return True
    if world.Get_rank() == 0:
        print(f"error: --ranks {args.ranks} but this MPI job has {n} ranks", file=sys.stderr, flush=True)
    return False


def say(line: str = "") -> None:
    """Print a report line at once (ranks' output is interleaved by the launcher)."""
    print(line, flush=True)


def worker_main(
    prog: str,
    doc: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run_worker: Callable[[argparse.Namespace], int],
    argv: list[str] | None = None,
) -> int:
    """A benchmark worker's entry point: parse, run; on any error print it and abort the whole
    MPI job, so no rank waits for a dead one."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_worker(args)
    except BaseException:  # noqa: BLE001  (whatever stopped this rank, Ctrl+C included: the job must not hang)
        return abort_job_after_error()
