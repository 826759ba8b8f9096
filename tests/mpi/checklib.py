"""Running many checks in one mpiexec launch: registration, skips, one JSON report from rank 0.

Each check runs on every rank. A check raises ``Skip`` when the rank count cannot show its
property, fails by raising anything else, and may return a string saying what it saw. Rank 0
writes ``{name: {"status": "pass" | "fail" | "skip", "detail": ...}}`` to the report path,
which ``tests/conftest.py`` turns into one pytest result per check.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

from mpi4py import MPI


class Skip(Exception):
    """The check cannot show its property at this rank count; the message says why."""


class Checks(dict):
    """A registry of checks; use an instance as the ``@check`` decorator."""

    def __call__(self, fn: Callable) -> Callable:
        self[fn.__name__] = fn
        return fn


def run_checks(checks: Checks, out_path: str, world: Any, *args: Any, only: list[str] | None = None) -> int:
    """Run every check with ``*args`` on every rank of ``world`` (an mpi4py communicator)."""
    results = {}
    for name, fn in checks.items():
        if only and name not in only:
            continue
        if "-v" in sys.argv:
            print(f"[{world.rank}] {name}", flush=True)
        status, detail = "pass", ""
        try:
            detail = fn(*args) or ""
        except Skip as exc:
            status, detail = "skip", str(exc)
        except Exception:  # noqa: BLE001  any failure is reported, the run goes on
            status, detail = "fail", traceback.format_exc(limit=4)
        gathered = world.gather((status, detail), root=0)
        if world.rank == 0:
            statuses = {s for s, _ in gathered}
            overall = "fail" if "fail" in statuses else ("skip" if statuses == {"skip"} else "pass")
            failures = "\n".join(f"rank {r}: {d}" for r, (s, d) in enumerate(gathered) if s == "fail")
            results[name] = {"status": overall, "detail": failures or gathered[0][1]}
        world.Barrier()
    if world.rank == 0:
        with open(out_path, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


def agree(assertion: Callable[[], object], world: Any = MPI.COMM_WORLD) -> None:
    """Run a local assertion on every rank; if it fails anywhere, raise on every rank.

    Keeps the ranks in step: none goes on into a collective that another one has left, so a
    failed check fails at once instead of hanging until the test's timeout.
    """
    try:
        assertion()
        message = None
    except AssertionError as exc:
        message = str(exc)
    failed = [f"rank {r}: {m}" for r, m in enumerate(world.allgather(message)) if m is not None]
    if failed:
        raise AssertionError("\n".join(failed))


def agree_that(ok: bool, message: str, world: Any = MPI.COMM_WORLD) -> None:
    """``assert ok, message`` on every rank at once (``ok`` may differ across ranks)."""

    def assertion() -> None:
        assert ok, message

    agree(assertion, world)
