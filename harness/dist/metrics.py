"""``harness.dist.record``: a torch.distributed script's own loss and accuracy, into its results.

One line per step, and one per evaluation, in an otherwise unchanged script::

    import harness.dist

    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    harness.dist.record(loss=loss)                    # this step's training loss: steps.csv
    if step % 10 == 0:
        test_loss, test_accuracy = evaluate(model)
        harness.dist.record(loss=test_loss, accuracy=test_accuracy, evaluation=True)  # evals.csv

Under ``python -m harness launch --scenario`` (a :class:`harness.dist.session.ScriptSession` on
the rank) the values land in the run's results; anywhere else (plain ``python``, a bare
``mpiexec``, torchrun) :func:`record` checks its arguments and returns: a cheap no-op.

Where each value goes (docs/guides/torch-distributed.md, "The script's own metrics"):

- ``evaluation=False``: the training loss and accuracy of this rank's current optimizer step,
  steps.csv's ``loss`` and ``accuracy`` of its row. The step is the one in progress once its
  first training forward pass has run (the session's iteration t), and the step that has just
  ended when the call comes between two steps (after ``optimizer.step()``: iteration t - 1);
  before the first step, step 0. The last call in a step wins, per value: ``record(loss=l)`` then
  ``record(accuracy=a)`` keeps both.
- ``evaluation=True``: an evaluation after the steps taken so far (``iteration`` = the session's
  t, the number of optimizer steps this rank has finished), at the moment the evaluated model
  existed (the end of the last step; the call's own time inside a step). Calls of one rank at
  the same iteration are one evaluation (the last value of each kind wins). Rank 0 writes two
  rows of evals.csv per iteration that any rank evaluated: ``average``, the mean over the ranks
  that recorded a value (each rank's own model; under DDP they are one model, and a test set
  split across the ranks gives the whole set's mean for equal parts), and ``rank0``, rank 0's
  own values when it recorded some; ``time_s`` is rank 0's, else the earliest rank's.

Values: Python (or NumPy) real numbers, or tensors of one element (a 0-d tensor such as
``loss``); a tensor is detached, and those on a GPU are read together, 256 at a time (one
device synchronization per 256 values, none per call) and when the script has ended. A string, a
bool, a tensor of several elements, a complex or boolean tensor raise TypeError or ValueError
naming the argument, with a session or without; so does an accuracy outside [0, 1] (a
percentage, not a fraction), once it is read: a number always, a CPU tensor under a session, a
GPU tensor when it is read (dropped then, with a warning, so that the run's results stand). NaN
and infinite losses are kept as they are (a run that diverged). The values stay in memory until
the script ends: about 100 bytes a step.
"""

from __future__ import annotations

import math
import numbers
import sys
import time
from typing import Any

from harness.results.columns import EvalRecord

__all__ = ["Recorder", "evaluation_records", "record"]

_recorder: Recorder | None = None  # this process's session's, while the script runs under `launch`
READ_EVERY = 256  # device tensors recorded are read together once this many wait (one synchronization)


def record(loss: Any = None, accuracy: Any = None, *, evaluation: bool = False) -> None:
    """Record this rank's ``loss`` and/or ``accuracy``: of the current optimizer step
    (``evaluation=False``: steps.csv) or of an evaluation after the steps taken so far
    (``evaluation=True``: evals.csv). A no-op outside ``python -m harness launch --scenario``;
    bad values raise TypeError or ValueError either way (see the module doc)."""
    recorder = _recorder
    loss = _checked("loss", loss, read=recorder is not None)
    accuracy = _checked("accuracy", accuracy, read=recorder is not None)
    if recorder is None or (loss is None and accuracy is None):
        return
    recorder.add(loss, accuracy, bool(evaluation))


def _checked(name: str, value: Any, read: bool) -> Any:
    """``value`` as a float (or a detached one-element tensor on a device, read later); None for
    None. TypeError/ValueError naming ``name`` for anything that is not one real number.
    ``read``: convert (with a session); without one only the type and shape are checked."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"harness.dist.record: {name} must be a number or a one-element tensor, got a bool ({value})")
    if isinstance(value, numbers.Real):
        return _in_range(name, float(value)) if read or name == "accuracy" else value
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"harness.dist.record: {name} must be a scalar: got a tensor of shape "
                             f"{tuple(value.shape)} (reduce it first, e.g. {name}.mean())")
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"harness.dist.record: {name} must be real: got a tensor of dtype {value.dtype}")
        if not read:
            return value
        value = value.detach().reshape(())
        if value.device.type != "cpu":
            return value  # read later, with others (Recorder.read): no device synchronization per call
        return _in_range(name, float(value))
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        if value.size != 1:
            raise ValueError(f"harness.dist.record: {name} must be a scalar: got an array of shape {value.shape}")
        return _checked(name, value.reshape(()).item(), read)
    raise TypeError(f"harness.dist.record: {name} must be a number or a one-element tensor, got "
                    f"{type(value).__name__} {value!r:.60}")


def _in_range(name: str, value: float) -> float:
    if name == "accuracy" and not math.isnan(value) and not 0.0 <= value <= 1.0:
        raise ValueError(f"harness.dist.record: accuracy must be a fraction in [0, 1], got {value:g}"
                         + (" (a percentage? divide it by 100)" if 1.0 < value <= 100.0 else ""))
    return value


def _read(name: str, value: float | None) -> float:
    """A recorded value (read: :meth:`Recorder.read`); NaN for None. An accuracy outside [0, 1]
    (a device tensor's, checked only now) is dropped with a warning: the run's results stand."""
    if value is None:
        return math.nan
    try:
        return _in_range(name, value)
    except ValueError as exc:
        print(f"warning: {exc}: not kept", file=sys.stderr)
        return math.nan


class Recorder:
    """What :func:`record` stored on this rank, for its :class:`~harness.dist.session.ScriptSession`
    (which makes one as it starts: from then on :func:`record` stores into it)."""

    def __init__(self, session: Any) -> None:
        global _recorder
        self.session = session
        self.train: dict[int, list[Any]] = {}  # iteration -> [loss, accuracy] (None: not recorded)
        self.evals: dict[int, list[Any]] = {}  # iteration -> [monotonic time the model existed, loss, accuracy]
        self._unread: list[tuple[list[Any], int]] = []  # (entry, index) holding a device tensor not read yet
        _recorder = self

    def add(self, loss: Any, accuracy: Any, evaluation: bool) -> None:
        session = self.session
        began, t = session._began, session.t  # the iteration in progress (once its forward pass ran), steps done
        if evaluation:
            entry = self.evals.get(t)
            if entry is None:  # the model evaluated existed at the end of the last step (or now, inside a step)
                entry = self.evals[t] = [time.monotonic() if began else session._start, None, None]
            at = 1
        else:
            entry, at = self.train.setdefault(t if began or t == 0 else t - 1, [None, None]), 0
        for i, value in ((at, loss), (at + 1, accuracy)):
            if value is not None:
                entry[i] = value
                if not isinstance(value, float):  # a device tensor
                    self._unread.append((entry, i))
        if len(self._unread) >= READ_EVERY:
            self.read()

    def read(self) -> None:
        """Read the device tensors recorded so far into floats: one transfer per device and dtype."""
        torch = sys.modules.get("torch")
        slots: dict[tuple[int, int], tuple[list[Any], int]] = {}
        for entry, i in self._unread:  # a slot written twice holds its last value
            if torch is not None and isinstance(entry[i], torch.Tensor):
                slots[id(entry), i] = (entry, i)
        self._unread.clear()
        if torch is None:  # then nothing recorded is a tensor
            return
        together: dict[Any, list[tuple[list[Any], int]]] = {}
        for entry, i in slots.values():
            together.setdefault((entry[i].device, entry[i].dtype), []).append((entry, i))
        for places in together.values():
            values = torch.stack([entry[i] for entry, i in places]).tolist()
            for (entry, i), value in zip(places, values):
                entry[i] = float(value)

    def close(self) -> None:
        """The script has ended: later calls of :func:`record` are no-ops again."""
        global _recorder
        if _recorder is self:
            _recorder = None

    def steps(self) -> dict[int, tuple[float, float]]:
        """Per iteration: (loss, accuracy) as recorded, NaN where not."""
        self.read()
        return {t: (_read("loss", v[0]), _read("accuracy", v[1])) for t, v in self.train.items()}

    def evaluations(self, rank: int, t0: float) -> list[tuple[int, int, float, float, float]]:
        """This rank's evaluations as (rank, iteration, time_s since ``t0``, loss, accuracy)."""
        self.read()
        return [(rank, t, when - t0, _read("loss", loss), _read("accuracy", accuracy))
                for t, (when, loss, accuracy) in sorted(self.evals.items())]


def evaluation_records(label: str, rows: list[tuple[int, int, float, float, float]]) -> list:
    """evals.csv's rows of every rank's evaluations (:meth:`Recorder.evaluations`, gathered):
    per iteration, ``average`` (the mean over the ranks that recorded each value; ``time_s``
    rank 0's, else the earliest) and ``rank0`` (rank 0's own, when it evaluated)."""

    def mean(values: list[float]) -> float:
        kept = [v for v in values if not math.isnan(v)]
        return sum(kept) / len(kept) if kept else math.nan

    by_iteration: dict[int, list[tuple[int, int, float, float, float]]] = {}
    for row in rows:
        by_iteration.setdefault(row[1], []).append(row)
    records = []
    for t in sorted(by_iteration):
        mine = by_iteration[t]
        zero = [r for r in mine if r[0] == 0]
        when = zero[0][2] if zero else min(r[2] for r in mine)
        records.append(EvalRecord(label, t, when, "average", mean([r[3] for r in mine]), mean([r[4] for r in mine])))
        if zero:
            records.append(EvalRecord(label, t, when, "rank0", zero[0][3], zero[0][4]))
    return records
