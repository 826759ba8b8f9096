"""The run directory: collects a run's records and writes (or reads back) every file of it.

The top of ``harness.results``: it builds on ``layout`` (the files' names), ``columns`` (the
files' columns and record types), ``summary`` and ``trace``, none of which imports it. The
file layout is documented in ``results/README.md``.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from harness import __version__
from harness.results import atomic

# harness.runner.loop and harness.sim.simulate still import record types and STEP_COLUMNS from
# here, where they were defined before columns.py; import them from columns in new code.
from harness.results.columns import (
    COMM_CALL_COLUMNS,
    COMM_OP_COLUMNS,
    EVAL_COLUMNS,
    STEP_COLUMNS,
    CommCallRecord,
    CommOpRecord,
    EvalRecord,
    StepRecord,
    read_frame,
    to_frame,
)
from harness.results.layout import (  # the names of the files, re-exported here
    COMM_CALLS_FILE,
    COMM_OPS_FILE,
    EVALS_FILE,
    PROVENANCE_DIR,
    RUN_FILE,
    SCENARIO_FILE,
    STEPS_FILE,
    SUMMARY_FILE,
    SUMMARY_TABLE_FILE,
    TRACE_FILE,
    read_run_json,
)
from harness.results.summary import format_table, summarize
from harness.results.trace import chrome_trace

RUN_STATUSES = ("complete", "incomplete", "failed")


def _concat(frames: Iterable[pd.DataFrame], columns: Sequence[str]) -> pd.DataFrame:
    # Empty frames are dropped: concatenating them changes dtypes and warns in pandas.
    frames = [f for f in frames if len(f)]
    if not frames:
        return to_frame([], columns)
    return to_frame(pd.concat(frames, ignore_index=True), columns)


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _check_name(kind: str, name: str) -> str:
    # Names become path components, so keep them to one portable component.
    if not _NAME_RE.match(name):
        raise ValueError(f"{kind} {name!r} must match {_NAME_RE.pattern}")
    return name


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class RunDirectory:
    """``results/<scenario>/<run-id>/``: collects records per algorithm and writes every file.

    All files are (re)written atomically, so an interrupted run leaves consistent files with
    the algorithms finished so far.
    """

    def __init__(self, path: str | Path, scenario_name: str, run_id: str, started_at: str) -> None:
        self.path = Path(path)
        self.scenario_name = scenario_name
        self.run_id = run_id
        self.started_at = started_at
        # Per-algorithm frames in the order the algorithms were appended.
        self._steps: dict[str, pd.DataFrame] = {}
        self._evals: dict[str, pd.DataFrame] = {}
        self._comm_ops: dict[str, pd.DataFrame] = {}
        self._comm_calls: dict[str, pd.DataFrame] = {}
        # From run.json when opened: what a resumed run starts from and keeps.
        self.finished_algorithms: list[str] = []
        self.resumed_at: list[str] = []

    @classmethod
    def create(
        cls, root: str | Path, scenario_name: str, run_id: str | None = None
    ) -> RunDirectory:
        """Create a fresh run directory under ``root/scenario_name``.

        The default run id is the UTC start time ``YYYYmmdd-HHMMSS``, with a short random
        suffix if that directory already exists. An explicit ``run_id`` that exists raises
        ``FileExistsError`` rather than mixing two runs' files.
        """
        _check_name("scenario name", scenario_name)
        started = _utc_now()
        scenario_dir = Path(root) / scenario_name
        scenario_dir.mkdir(parents=True, exist_ok=True)
        if run_id is not None:
            _check_name("run id", run_id)
            (scenario_dir / run_id).mkdir()
        else:
            base = started.strftime("%Y%m%d-%H%M%S")
            run_id = base
            while True:
                try:
                    # mkdir without exist_ok claims the name even against a concurrent run.
                    (scenario_dir / run_id).mkdir()
                    break
                except FileExistsError:
                    run_id = f"{base}-{secrets.token_hex(2)}"
        started_at = started.isoformat(timespec="seconds")
        return cls(scenario_dir / run_id, scenario_name, run_id, started_at)

    @classmethod
    def create_at(cls, path: str | Path, scenario_name: str) -> RunDirectory:
        """Create the run directory ``path`` itself (a sweep's point: ``harness.sweep``); its run
        id is its name. ``FileExistsError`` if it exists."""
        path = Path(path)
        _check_name("scenario name", scenario_name)
        _check_name("run id", path.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
        return cls(path, scenario_name, path.name, _utc_now().isoformat(timespec="seconds"))

    @classmethod
    def open(cls, path: str | Path) -> RunDirectory:
        """Load an existing run directory (its run.json and CSV files) for analysis or resuming."""
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"no run directory at {path}")
        meta = read_run_json(path)
        run = cls(
            path,
            meta.get("scenario", path.parent.name),
            meta.get("run_id", path.name),
            meta.get("started_at", ""),
        )
        run.finished_algorithms = [str(a) for a in meta.get("finished_algorithms", [])]
        run.resumed_at = [str(t) for t in meta.get("resumed_at", [])]
        steps = read_frame(path / STEPS_FILE, STEP_COLUMNS)
        evals = read_frame(path / EVALS_FILE, EVAL_COLUMNS)
        comm_ops = read_frame(path / COMM_OPS_FILE, COMM_OP_COLUMNS)
        names = dict.fromkeys([*steps["algorithm"], *evals["algorithm"], *comm_ops["algorithm"]])
        for name in names:
            run._steps[name] = to_frame(steps[steps["algorithm"] == name], STEP_COLUMNS)
            run._evals[name] = to_frame(evals[evals["algorithm"] == name], EVAL_COLUMNS)
            run._comm_ops[name] = to_frame(comm_ops[comm_ops["algorithm"] == name], COMM_OP_COLUMNS)
        if (path / COMM_CALLS_FILE).exists():  # kept, so a resumed run rewrites it with every algorithm
            calls = read_frame(path / COMM_CALLS_FILE, COMM_CALL_COLUMNS)
            for name in dict.fromkeys(calls["algorithm"]):
                run._comm_calls[name] = to_frame(calls[calls["algorithm"] == name], COMM_CALL_COLUMNS)
        return run

    # --- What has been collected -----------------------------------------------------------

    @property
    def algorithms(self) -> list[str]:
        """Names of the algorithms appended so far, in order."""
        return list(self._steps)

    @property
    def steps(self) -> pd.DataFrame:
        """All step records so far (:data:`STEP_COLUMNS`)."""
        return _concat(self._steps.values(), STEP_COLUMNS)

    @property
    def evals(self) -> pd.DataFrame:
        """All eval records so far (:data:`EVAL_COLUMNS`)."""
        return _concat(self._evals.values(), EVAL_COLUMNS)

    @property
    def comm_ops(self) -> pd.DataFrame:
        """All comm op records so far (:data:`COMM_OP_COLUMNS`)."""
        return _concat(self._comm_ops.values(), COMM_OP_COLUMNS)

    @property
    def comm_calls(self) -> pd.DataFrame:
        """All communicator call records so far (:data:`COMM_CALL_COLUMNS`); empty unless logged."""
        return _concat(self._comm_calls.values(), COMM_CALL_COLUMNS)

    def update_run_json(self, status: str, extra: Mapping[str, Any] | None = None,
                        drop: Sequence[str] = ("error", "fault", "stopped")) -> Path:
        """Rewrite run.json with a new ``status``, keeping what it says (ranks, hosts, device,
        ...) except the keys in ``drop``; ``extra`` adds or replaces keys."""
        meta = read_run_json(self.path)
        own = {"run_id", "scenario", "started_at", "updated_at", "hosts", "ranks", "status", "finished_algorithms",
               "harness_version", "resumed_at"}
        kept = {k: v for k, v in meta.items() if k not in own and k not in drop}
        return self.write_run_json(status, self.finished_algorithms, ranks=meta.get("ranks"),
                                   hosts=meta.get("hosts", 1), extra={**kept, **(extra or {})})

    def mark_resumed(self) -> None:
        """Record that the run is resumed now (kept in run.json's ``resumed_at``)."""
        self.resumed_at.append(_utc_now().isoformat(timespec="seconds"))

    def provenance_dir(self) -> Path:
        """The ``provenance/`` subfolder (created on first use) for models, shards, seeds."""
        path = self.path / PROVENANCE_DIR
        path.mkdir(exist_ok=True)
        return path

    # --- Writers ---------------------------------------------------------------------------

    def write_resolved_scenario(self, scenario: Mapping[str, Any]) -> Path:
        """Write the fully resolved scenario (defaults filled in) as YAML, keys in given order."""
        text = yaml.safe_dump(_plain(scenario), sort_keys=False, default_flow_style=False)
        return atomic.write_text(self.path / SCENARIO_FILE, text)

    def append_algorithm(
        self,
        name: str,
        steps: Iterable[StepRecord] | pd.DataFrame,
        evals: Iterable[EvalRecord] | pd.DataFrame = (),
        comm_ops: Iterable[CommOpRecord] | pd.DataFrame = (),
    ) -> None:
        """Add one algorithm's records (replacing any earlier ones of that name) and rewrite
        steps.csv, evals.csv and comm_ops.csv with all rows so far."""
        frames = {
            "steps": to_frame(steps, STEP_COLUMNS),
            "evals": to_frame(evals, EVAL_COLUMNS),
            "comm_ops": to_frame(comm_ops, COMM_OP_COLUMNS),
        }
        for kind, frame in frames.items():
            other = sorted(set(frame["algorithm"]) - {name})
            if other:
                raise ValueError(f"{kind} records for {other} passed to append_algorithm({name!r})")
        self._steps[name] = frames["steps"]
        self._evals[name] = frames["evals"]
        self._comm_ops[name] = frames["comm_ops"]
        atomic.write_csv(self.path / STEPS_FILE, self.steps)
        atomic.write_csv(self.path / EVALS_FILE, self.evals)
        atomic.write_csv(self.path / COMM_OPS_FILE, self.comm_ops)

    def append_comm_calls(self, name: str, calls: Iterable[CommCallRecord] | pd.DataFrame) -> None:
        """Add one algorithm's communicator calls (replacing any earlier ones of that name) and
        rewrite comm_calls.csv with all rows so far. Only runs whose scenario sets
        ``results.comm_calls`` call it: other runs have no comm_calls.csv."""
        frame = to_frame(calls, COMM_CALL_COLUMNS)
        other = sorted(set(frame["algorithm"]) - {name})
        if other:
            raise ValueError(f"comm_calls records for {other} passed to append_comm_calls({name!r})")
        self._comm_calls[name] = frame
        atomic.write_csv(self.path / COMM_CALLS_FILE, self.comm_calls)

    def write_summary(
        self,
        batch_size: int | Mapping[str, int],
        iterations: int | Mapping[str, int],
        ranks: int | Mapping[str, int] | None = None,
        *,
        target_accuracy: float | None,
        target_loss: float | None = None,
        header: str | None = None,
    ) -> pd.DataFrame:
        """Write summary.csv and the readable summary.txt; return the summary frame.

        ``target_accuracy`` (the scenario's ``results.target_accuracy``) is required so that no
        writer silently reports time to accuracy against a target the scenario did not set;
        ``target_loss`` (``results.target_loss``) is optional: None leaves its columns NaN.
        ``header``: a line summary.txt starts with (a simulation says what it predicts).
        """
        summary = summarize(self.steps, self.evals, batch_size, iterations, ranks=ranks,
                            target_accuracy=target_accuracy, target_loss=target_loss)
        atomic.write_csv(self.path / SUMMARY_FILE, summary)
        atomic.write_text(self.path / SUMMARY_TABLE_FILE,
                          (f"{header}\n" if header else "") + format_table(summary) + "\n")
        return summary

    def write_trace(self, include_comm_ops: bool = True, max_ranks: int | None = None) -> Path:
        """Write trace.json (Chrome/Perfetto trace event format) from all records so far.

        ``max_ranks``: only ranks below it (a 1,024-rank simulation would make a huge trace).
        """
        steps, ops = self.steps, self.comm_ops if include_comm_ops else None
        if max_ranks is not None:
            steps = steps[steps["rank"] < max_ranks]
            ops = None if ops is None else ops[ops["rank"] < max_ranks]
        trace = chrome_trace(steps, ops)
        trace["otherData"] = {"scenario": self.scenario_name, "run_id": self.run_id}
        # Compact JSON: traces of long runs are large.
        return atomic.write_json(self.path / TRACE_FILE, trace, indent=None)

    def write_run_json(
        self,
        status: str,
        finished: Sequence[str],
        *,
        ranks: int | None = None,
        hosts: int = 1,
        extra: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write run.json; ``ranks`` defaults to the most ranks seen in any algorithm's steps."""
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, got {status!r}")
        if ranks is None:
            ranks = max((int(f["rank"].nunique()) for f in self._steps.values()), default=0)
        meta = {
            "run_id": self.run_id,
            "scenario": self.scenario_name,
            "started_at": self.started_at,
            "updated_at": _utc_now().isoformat(timespec="seconds"),
            "hosts": int(hosts),
            "ranks": int(ranks),
            "status": status,
            "finished_algorithms": [str(a) for a in finished],
            "harness_version": __version__,
        }
        if self.resumed_at:
            meta["resumed_at"] = list(self.resumed_at)
        if extra:
            meta.update(_plain(dict(extra)))
        return atomic.write_json(self.path / RUN_FILE, meta)


def _plain(value: Any) -> Any:
    """Convert numpy scalars/arrays, tuples and paths to plain YAML/JSON-able Python values."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return value

