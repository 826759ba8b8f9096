"""Workloads: model and dataset callables (built-in or the user's), shards and batch order,
flat parameter views.

``harness.workload.names`` (the built-in names and what a scenario's model and dataset refer
to) imports no torch: the scenario schema uses it in the launcher. Everything else here needs
torch and is imported on first use, so ``from harness.workload import build_model`` works as
before without making ``harness.workload.names`` pay for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "data": (
        "DATASET_NAMES",
        "DATASET_SHAPES",
        "Dataset",
        "dataset_facts",
        "load_dataset",
        "make_synthetic",
        "scenario_dataset",
    ),
    "shards": ("ShardBatches", "batch_indices", "shard_indices"),
    "models": (
        "MODEL_NAMES",
        "build_model",
        "check_model",
        "communicated_floats",
        "configure_torch_threads",
        "flat_grads",
        "flat_params",
        "parameter_count",
        "scenario_model",
    ),
}
_MODULE_OF = {name: module for module, exported in _EXPORTS.items() for name in exported}

__all__ = [
    "DATASET_NAMES",
    "DATASET_SHAPES",
    "MODEL_NAMES",
    "Dataset",
    "ShardBatches",
    "batch_indices",
    "build_model",
    "check_model",
    "communicated_floats",
    "configure_torch_threads",
    "dataset_facts",
    "flat_grads",
    "flat_params",
    "load_dataset",
    "make_synthetic",
    "parameter_count",
    "scenario_dataset",
    "scenario_model",
    "shard_indices",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
