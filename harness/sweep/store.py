"""A sweep's directory: what it runs (``sweep.json``), a run directory and a status per point.

Layout::

    results/<scenario>/sweep-<time>/
      sweep.json           the command, its arguments, the swept keys and every point's overrides
      points/p000/         point 0's run directory (as `run` or `simulate` writes one)
      points/p000.log      its output
      points/p000.json     its status once it ended: done or failed, exit status, error
      sweep.csv, sweep.png, report.html

A point runs in a process of its own (``python -m harness run|simulate --resume DIR --point I``),
which writes only its own files: points of a simulated sweep run in parallel, and a SLURM job
array's tasks each run one. Nothing but the sweep command writes ``sweep.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.results import atomic

SWEEP_FILE = "sweep.json"
POINTS_DIR = "points"
# Arguments of the sweep itself, not of its points' commands.
PARSER_KEY = "command_line_parser"
"""Where ``harness.cli`` leaves the parser that read the command line, for a sweep's points to read
their stored arguments back with (:func:`harness.sweep.execute.run_point`)."""
SWEEP_ONLY = ("sweep", "jobs", "resume", "point", "func", "into", PARSER_KEY)


class SweepError(HarnessError):
    """A sweep directory that cannot be used; the message says why."""


@dataclass(frozen=True)
class PointStatus:
    status: str  # "done", "failed" or "pending"
    exit: int | None = None
    error: str | None = None


class SweepDirectory:
    """An existing sweep directory (:meth:`create`, :meth:`open`)."""

    def __init__(self, path: Path, spec: dict[str, Any]) -> None:
        self.path = path
        self.spec = spec

    @property
    def command(self) -> str:
        return self.spec["command"]

    @property
    def keys(self) -> list[str]:
        return list(self.spec["keys"])

    @property
    def points(self) -> list[dict[str, Any]]:
        return list(self.spec["points"])

    @classmethod
    def create(
        cls,
        out: str | Path,
        scenario_name: str,
        command: str,
        arguments: dict[str, Any],
        keys: list[str],
        points: list[dict[str, Any]],
    ) -> SweepDirectory:
        """A new ``out/<scenario>/sweep-<UTC time>[-n]`` with its ``sweep.json``."""
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        base = Path(out) / scenario_name / f"sweep-{stamp}"
        base.parent.mkdir(parents=True, exist_ok=True)
        path, n = base, 1
        while True:
            try:
                path.mkdir()  # without exist_ok: claims the name against a concurrent sweep
                break
            except FileExistsError:
                n += 1
                path = base.with_name(f"{base.name}-{n}")
        (path / POINTS_DIR).mkdir()
        spec = {
            "command": command,
            "scenario_name": scenario_name,
            "arguments": arguments,
            "keys": keys,
            "points": points,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        atomic.write_text(path / SWEEP_FILE, json.dumps(spec, indent=2) + "\n")
        return cls(path, spec)

    @classmethod
    def open(cls, path: str | Path) -> SweepDirectory:
        path = Path(path)
        try:
            spec = json.loads((path / SWEEP_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SweepError(f"{path}: not a sweep directory (no {SWEEP_FILE})") from None
        except (OSError, ValueError) as exc:
            raise SweepError(f"{path / SWEEP_FILE}: cannot read: {exc}") from None
        if not isinstance(spec, dict) or not {"command", "arguments", "keys", "points"} <= set(spec):
            raise SweepError(f"{path / SWEEP_FILE}: not a sweep's description")
        return cls(path, spec)

    # -- points ---------------------------------------------------------------------------------
    def point_dir(self, index: int) -> Path:
        return self.path / POINTS_DIR / f"p{index:03d}"

    def log_file(self, index: int) -> Path:
        return self.path / POINTS_DIR / f"p{index:03d}.log"

    def _status_file(self, index: int) -> Path:
        return self.path / POINTS_DIR / f"p{index:03d}.json"

    def point(self, index: int) -> dict[str, Any]:
        points = self.points
        if not 0 <= index < len(points):
            raise SweepError(f"{self.path}: no point {index} (it has {len(points)}: 0 to {len(points) - 1})")
        return points[index]

    def status(self, index: int) -> PointStatus:
        try:
            data = json.loads(self._status_file(index).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return PointStatus("pending")
        return PointStatus(data.get("status", "pending"), data.get("exit"), data.get("error"))

    def begin_point(self, index: int) -> Path:
        """Clear what an earlier, unfinished attempt at point ``index`` left; its run directory's path."""
        self._status_file(index).unlink(missing_ok=True)
        directory = self.point_dir(index)
        if directory.exists():
            shutil.rmtree(directory)
        return directory

    def end_point(self, index: int, exit_status: int, error: str | None) -> None:
        status = "done" if exit_status == 0 else "failed"
        atomic.write_text(
            self._status_file(index),
            json.dumps(
                {
                    "status": status,
                    "exit": exit_status,
                    "error": error,
                    "ended": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                }
            )
            + "\n",
        )

    def last_error(self, index: int) -> str | None:
        """The last ``error:`` line of a point's log (what its command said), or None."""
        try:
            lines = self.log_file(index).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return None
        errors = [line for line in lines if line.startswith("error:")]
        return errors[-1][len("error:") :].strip() if errors else (lines[-1].strip() if lines else None)


# -- a command's arguments, kept in sweep.json --------------------------------------------------
def arguments_to_json(args: argparse.Namespace) -> dict[str, Any]:
    """The command's own arguments (not the sweep's), as JSON values."""
    out = {}
    for key, value in vars(args).items():
        if key in SWEEP_ONLY:
            continue
        out[key] = str(value) if isinstance(value, Path) else value
    return out


def arguments_from_json(parser: argparse.ArgumentParser, command: str, stored: dict[str, Any]) -> argparse.Namespace:
    """The namespace ``command`` gets for the stored arguments (its ``func`` and the types its
    parser gives, a Path where it has type=Path)."""
    subparser = _subparser(parser, command)
    namespace = subparser.parse_args([stored.get("scenario") or "-"])
    types = {action.dest: action.type for action in subparser._actions}
    for key, value in stored.items():
        if types.get(key) is Path and isinstance(value, str):
            value = Path(value)
        setattr(namespace, key, value)
    return namespace


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    raise SweepError(f"no command {command!r} to run a sweep's points with")
