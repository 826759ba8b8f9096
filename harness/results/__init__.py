"""Run results: record types, the run directory, atomic writers, summary and trace.

The names below are imported on first use: ``harness.results.columns`` (the record types every
rank fills) needs no pandas, and a rank that only records should not pay for the run
directory's, the summary's and the trace's imports.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULE_OF = {
    "COMM_OP_COLUMNS": "columns",
    "EVAL_COLUMNS": "columns",
    "STEP_COLUMNS": "columns",
    "SUMMARY_COLUMNS": "columns",
    "CommOpRecord": "columns",
    "EvalRecord": "columns",
    "StepRecord": "columns",
    "RunDirectory": "records",
    "format_table": "summary",
    "summarize": "summary",
    "chrome_trace": "trace",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
