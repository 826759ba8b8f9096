"""Workloads: offline datasets, sharding and batch order, models and flat parameter views."""

from harness.workload.data import (
    DATASET_NAMES,
    DATASET_SHAPES,
    Dataset,
    batch_indices,
    load_dataset,
    make_synthetic,
    shard_indices,
)
from harness.workload.models import (
    MODEL_NAMES,
    build_model,
    communicated_floats,
    configure_torch_threads,
    flat_grads,
    flat_params,
    parameter_count,
)

__all__ = [
    "DATASET_NAMES",
    "DATASET_SHAPES",
    "MODEL_NAMES",
    "Dataset",
    "batch_indices",
    "build_model",
    "communicated_floats",
    "configure_torch_threads",
    "flat_grads",
    "flat_params",
    "load_dataset",
    "make_synthetic",
    "parameter_count",
    "shard_indices",
]
