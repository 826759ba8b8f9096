"""Run results: record types, the run directory, atomic writers, summary and trace."""

from harness.results.columns import (
    COMM_OP_COLUMNS,
    EVAL_COLUMNS,
    STEP_COLUMNS,
    SUMMARY_COLUMNS,
    CommOpRecord,
    EvalRecord,
    StepRecord,
)
from harness.results.records import RunDirectory
from harness.results.summary import format_table, summarize
from harness.results.trace import chrome_trace

__all__ = [
    "COMM_OP_COLUMNS",
    "EVAL_COLUMNS",
    "STEP_COLUMNS",
    "SUMMARY_COLUMNS",
    "CommOpRecord",
    "EvalRecord",
    "RunDirectory",
    "StepRecord",
    "chrome_trace",
    "format_table",
    "summarize",
]
