"""The columns of a run's CSV files, the records that fill them, and typed frames of them.

The schema of every file is documented in ``results/README.md``; the column tuples below are
the single source of truth for column names and order. This module is the bottom of
``harness.results``: it imports only ``atomic``, so every other module can import it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from harness.results import atomic

if TYPE_CHECKING:  # pandas is imported where frames are made: every rank uses the record types,
    import pandas as pd  # only rank 0 makes frames, and pandas costs each process 0.35 s of CPU

STEP_COLUMNS = (
    "algorithm",
    "rank",
    "iteration",
    "start_s",
    "end_s",
    "compute_s",
    "injected_delay_s",
    "comm_blocked_s",
    "loss",
    "bytes_sent",
    "staleness",
    # Added after steps.csv was first written: a torch.distributed script's training accuracy
    # (harness.dist.record); older files read as NaN. Last, as StepRecord's last field.
    "accuracy",
)
EVAL_COLUMNS = (
    "algorithm",
    "iteration",
    "time_s",
    "model",
    "test_loss",
    "test_accuracy",
    "consensus_distance",
)
COMM_OP_COLUMNS = ("algorithm", "rank", "op", "post_s", "start_s", "end_s", "bytes", "group")
# Columns added after results directories were first written: the value an older file reads as.
_ADDED_LATER: dict[str, Any] = {"group": "", "accuracy": math.nan}
# Every value comm_ops.csv's ``op`` can take: the names the native layer (kernels/) gives the
# operations it records. tests/test_results.py holds this tuple, those C++ sources and
# results/README.md together.
COMM_OP_NAMES = (
    "allreduce",
    "broadcast",
    "barrier",
    "exchange",
    "push",
    "pair_request",
    "wa_group_round",
    "wa_sync_round",
    "reduce",
    "allgather",
    "reduce_scatter",
    "gather",
    "scatter",
    "alltoall",
    "send",
    "recv",
)
# collectives.csv (only for a torch.distributed script run under ``launch --scenario``): every
# operation of the ``harness`` backend per rank and step, what the simulator replays
# (harness.dist.sequence writes it, harness.sim.script_replay reads it).
COLLECTIVE_COLUMNS = ("rank", "iteration", "seq", "op", "group_ranks", "payload_bytes", "peer", "phase", "at",
                      "waited")
COLLECTIVE_FILE = "collectives.csv"
STRUCTURE_FILE = "script_structure.json"  # a script run's notes of what makes its collectives scale
# comm_calls.csv (only when the scenario sets results.comm_calls): every call an algorithm made
# to its communicator, logged by harness.comm.call_log.CallLog, whose CALL_NAMES are the ops.
COMM_CALL_COLUMNS = ("algorithm", "rank", "iteration", "seq", "op", "peers", "floats", "detail", "result")
SUMMARY_COLUMNS = (
    "algorithm",
    "ranks",
    "iterations",
    "batch_size",
    "steps_recorded",
    "wall_s",
    "samples_per_s",
    "baseline",
    "throughput_vs_baseline",
    "iter_time_median_s",
    "iter_time_p95_s",
    "compute_fraction",
    "wait_fraction",
    "injected_fraction",
    "bytes_sent_per_step",
    "final_accuracy",
    "final_accuracy_rank0",
    "final_test_loss",
    "final_train_loss",
    "final_consensus_distance",
    "target_accuracy",
    "time_to_target_s",
    "target_loss",
    "time_to_target_loss_s",
    "complete",
)

EVAL_MODELS = ("average", "rank0")
NO_STALENESS = -1

_INT = "int64"
_FLOAT = "float64"
_DTYPES: dict[str, str] = {
    "rank": _INT,
    "iteration": _INT,
    "bytes_sent": _INT,
    "staleness": _INT,
    "bytes": _INT,
    "seq": _INT,
    "floats": _INT,
    "payload_bytes": _INT,
    "peer": _INT,
    "at": _FLOAT,
    "waited": "bool",
}
_TEXT = frozenset({"algorithm", "model", "op", "peers", "detail", "result", "group", "group_ranks", "phase"})


class StepRecord(NamedTuple):
    """One iteration of one rank; times in seconds since the run's t0 on a common clock.

    A named tuple rather than a dataclass: a simulation of thousands of ranks makes millions.
    """

    algorithm: str
    rank: int
    iteration: int
    start_s: float
    end_s: float
    compute_s: float
    injected_delay_s: float
    comm_blocked_s: float
    loss: float = math.nan
    bytes_sent: int = 0
    staleness: int = NO_STALENESS
    # Last, so that the fields from start_s on stay in STEP_COLUMNS' order (the simulator slices them).
    accuracy: float = math.nan

    def as_row(self) -> dict[str, Any]:
        """The record as ``{column: value}`` in :data:`STEP_COLUMNS` order."""
        return {name: getattr(self, name) for name in STEP_COLUMNS}


@dataclasses.dataclass(frozen=True)
class EvalRecord:
    """One evaluation of one model ("average" or "rank0") on the test set."""

    algorithm: str
    iteration: int
    time_s: float
    model: str
    test_loss: float
    test_accuracy: float
    consensus_distance: float = math.nan

    def __post_init__(self) -> None:
        if self.model not in EVAL_MODELS:
            raise ValueError(f"model must be one of {EVAL_MODELS}, got {self.model!r}")

    def as_row(self) -> dict[str, Any]:
        """The record as ``{column: value}`` in :data:`EVAL_COLUMNS` order."""
        return {name: getattr(self, name) for name in EVAL_COLUMNS}


@dataclasses.dataclass(frozen=True)
class CommOpRecord:
    """One operation of the native communication layer, as seen by one rank."""

    algorithm: str
    rank: int
    op: str
    post_s: float
    start_s: float
    end_s: float
    bytes: int
    # The torch.distributed group of a collective of the ``harness`` backend (harness.dist.session):
    # its name and world ranks, e.g. ``"0 [0,1,2]"``; empty for the communicator of the harness's own algorithms.
    group: str = ""

    def as_row(self) -> dict[str, Any]:
        """The record as ``{column: value}`` in :data:`COMM_OP_COLUMNS` order."""
        return {name: getattr(self, name) for name in COMM_OP_COLUMNS}


@dataclasses.dataclass(frozen=True)
class CommCallRecord:
    """One call an algorithm made to its communicator (``harness.comm.call_log.Call``) on one rank."""

    algorithm: str
    rank: int
    iteration: int
    seq: int
    op: str
    peers: str
    floats: int
    detail: str
    result: str

    def as_row(self) -> dict[str, Any]:
        """The record as ``{column: value}`` in :data:`COMM_CALL_COLUMNS` order."""
        return {name: getattr(self, name) for name in COMM_CALL_COLUMNS}


def _typed(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Reorder to ``columns`` and coerce dtypes: ints int64, text str, everything else float64."""
    import pandas as pd  # noqa: PLC0415  (see the imports)

    missing = [c for c in columns if c not in frame.columns]
    if any(c in _ADDED_LATER for c in missing):
        frame = frame.assign(**{c: _ADDED_LATER[c] for c in missing if c in _ADDED_LATER})
        missing = [c for c in missing if c not in _ADDED_LATER]
    if missing:
        raise ValueError(f"missing columns: {missing}")
    frame = frame.loc[:, list(columns)].copy()
    for name in columns:
        if name in _TEXT:
            frame[name] = frame[name].astype(str)
        else:
            column = frame[name]
            if name not in _DTYPES and not pd.api.types.is_numeric_dtype(column):  # text: an empty cell
                column = column.replace("", math.nan)  # (pandas' to_csv writes NaN so) is a missing float
            frame[name] = column.astype(_DTYPES.get(name, _FLOAT))
    return frame.reset_index(drop=True)


def to_frame(records: Iterable[Any] | pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """A typed DataFrame from records (anything with ``as_row()``) or an existing DataFrame."""
    import pandas as pd  # noqa: PLC0415  (see the imports)

    if isinstance(records, pd.DataFrame):
        return _typed(records, columns)
    rows = [r.as_row() for r in records]
    frame = pd.DataFrame(rows, columns=list(columns))
    return _typed(frame, columns)


def read_frame(path: str | Path, columns: Sequence[str]) -> pd.DataFrame:
    """Read one of the run's CSV files back with the schema's dtypes; empty if absent."""
    import pandas as pd  # noqa: PLC0415  (see the imports)

    path = Path(path)
    if not path.exists():
        return to_frame([], columns)
    # keep_default_na=False so an op or algorithm named e.g. "NA" stays text.
    frame = pd.read_csv(path, keep_default_na=False, na_values=[atomic.CSV_NA_REP])
    return _typed(frame, columns)
