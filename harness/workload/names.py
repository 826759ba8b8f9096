"""What a scenario's ``workload.model`` and ``workload.dataset`` name, without importing torch.

Both are either a built-in name or the user's own callable as an import reference
``"module:callable"`` (``harness.user_code``). The built-ins are nothing but references into
this package, listed in :data:`MODELS` and :data:`DATASETS`: they are resolved, called and
checked exactly as a user's callables are (``harness.workload.calls``). The contract:

- model: ``callable(input_shape=(C, H, W), num_classes=K, **model_args)`` returns a
  ``torch.nn.Module`` with float32 parameters whose output for a batch of N is ``(N, K)``;
- dataset: ``callable(seed=S, **dataset_args)`` returns ``(train_x, train_y, test_x, test_y)``
  tensors (inputs float ``N x C x H x W``, labels int64 ``N``) or a pair ``(train, test)`` of
  map-style datasets whose items are ``(input, label)``. A callable with a parameter named
  ``ranks`` is also given the scenario's rank count as ``ranks=R`` (unless dataset_args set
  it), to size its data to the run (``harness.workload.data.with_ranks``).

The schema (``harness.scenario.schema``) takes the built-in names from here; the launcher
reads scenarios without torch, so nothing here imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.user_code import UserCodeError, is_reference, load_reference

# Built-in name -> the reference it stands for.
MODELS: dict[str, str] = {
    "logreg": "harness.workload.models:logreg",
    "mlp": "harness.workload.models:mlp",
    "tiny_cnn": "harness.workload.models:tiny_cnn",
    "mnist_cnn": "harness.workload.models:mnist_cnn",
    "resnet20": "harness.workload.models:resnet20",
}
DATASETS: dict[str, str] = {
    "mnist5k": "harness.workload.data:mnist5k",
    "digits": "harness.workload.data:digits",
    "synthetic": "harness.workload.data:synthetic",
    "teacher": "harness.workload.teacher:teacher",
}
_TABLES = {"model": MODELS, "dataset": DATASETS}


@dataclass(frozen=True)
class DatasetFacts:
    """What a dataset callable returns, in numbers: what sizing a model and estimating the
    provenance's disk space need."""

    input_shape: tuple[int, int, int]
    num_classes: int
    samples: int  # train + test


# What each built-in dataset returns without dataset_args (synthetic: its defaults), so that the
# simulator and the provenance estimate need no data loaded; tests/test_workload.py pins it.
# teacher's size grows with the ranks: here it is at one rank (256 training + 2,000 test
# samples, as load_dataset returns it without ranks); harness.workload.data.dataset_facts
# computes it for a scenario's ranks instead.
BUILTIN_DATASET_FACTS: dict[str, DatasetFacts] = {
    "mnist5k": DatasetFacts((1, 28, 28), 10, 5000),
    "digits": DatasetFacts((1, 8, 8), 10, 1797),
    "synthetic": DatasetFacts((1, 28, 28), 10, 4000),
    "teacher": DatasetFacts((1, 8, 8), 10, 256 + 2000),
}


class WorkloadCodeError(UserCodeError):
    """A model or dataset callable cannot be used; ``field`` is the workload key to fix
    (``model``, ``dataset``, ``model_args``, ``dataset_args`` or ``num_classes``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class WorkloadArgumentsError(WorkloadCodeError, TypeError):
    """The callable does not take the keyword arguments it would be called with (a TypeError
    too, as calling it would have raised)."""


def unknown_name(kind: str, value: str) -> str | None:
    """Why ``value`` cannot be a ``kind`` (``model``/``dataset``) name, or None when it can: a
    built-in name, or a reference (whose form ``harness.user_code.check_reference`` checks)."""
    if is_reference(value) or value in _TABLES[kind]:
        return None
    return f"unknown {kind} (built-in: {', '.join(_TABLES[kind])}; or your own as 'module:callable')"


def reference_of(kind: str, value: str) -> str:
    """The import reference ``value`` stands for (itself when it is one)."""
    if is_reference(value):
        return value
    if value not in _TABLES[kind]:
        raise WorkloadCodeError(kind, f"{unknown_name(kind, value)}: {value!r}")
    return _TABLES[kind][value]


def resolve(kind: str, value: str, search_path: Sequence[str] = ()) -> Callable[..., Any]:
    """The callable a ``model``/``dataset`` value names; WorkloadCodeError (field ``kind``) when
    its module does not import, the attribute is missing or is not callable."""
    try:
        target = load_reference(reference_of(kind, value), search_path)
    except WorkloadCodeError:
        raise
    except UserCodeError as exc:
        raise WorkloadCodeError(kind, str(exc)) from None
    if not callable(target):
        raise WorkloadCodeError(kind, f"{value!r} is a {type(target).__name__}, not a callable")
    return target


def is_plain(workload: Any) -> bool:
    """Whether ``workload`` (the scenario's section) is a built-in model on a built-in dataset with
    no arguments: nothing of the user's to import or check, and the dataset's facts known."""
    return (
        not is_reference(workload.model)
        and not is_reference(workload.dataset)
        and not workload.model_args
        and not workload.dataset_args
        and workload.num_classes is None
    )


def call_label(value: str, args: Mapping[str, Any], **extra: Any) -> str:
    """``value`` with its arguments in call form, e.g. ``net:build(width=8)``; the bare value
    without any. Names a workload's model or dataset in calibration files and messages."""
    items = {**dict(args), **{k: v for k, v in extra.items() if v is not None}}
    if not items:
        return value
    return f"{value}({', '.join(f'{k}={items[k]!r}' for k in sorted(items))})"


def workload_labels(workload: Any) -> tuple[str, str]:
    """(model label, dataset label) of a scenario's ``workload``: what its compute time is
    measured and looked up under (``harness.calibrate``, ``harness.sim.timing``). A model's label
    includes ``num_classes`` when the scenario sets it (the head's size depends on it)."""
    model = call_label(workload.model, workload.model_args, num_classes=workload.num_classes)
    return model, call_label(workload.dataset, workload.dataset_args)
