"""The names of a run directory's files, and what every rank reads of it (no pandas here).

``results/README.md`` documents the files; ``harness.results.records`` writes and reads them.
"""

from __future__ import annotations

import json
from pathlib import Path

STEPS_FILE = "steps.csv"
EVALS_FILE = "evals.csv"
COMM_OPS_FILE = "comm_ops.csv"
COMM_CALLS_FILE = "comm_calls.csv"  # only when the scenario sets results.comm_calls
SUMMARY_FILE = "summary.csv"
SUMMARY_TABLE_FILE = "summary.txt"
TRACE_FILE = "trace.json"
SCENARIO_FILE = "scenario.resolved.yaml"
RUN_FILE = "run.json"
PROVENANCE_DIR = "provenance"


def read_run_json(path: str | Path) -> dict:
    """The run directory's run.json, or {} when it has none yet."""
    run_file = Path(path) / RUN_FILE
    return json.loads(run_file.read_text(encoding="utf-8")) if run_file.exists() else {}


def finished_algorithms(path: str | Path) -> list[str]:
    """The algorithms run.json lists as finished (their results are written; a resume skips them)."""
    return [str(a) for a in read_run_json(path).get("finished_algorithms", [])]
