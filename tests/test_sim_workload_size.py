"""The simulator's torch-free parameter counts equal the real models' (one source of truth)."""

from __future__ import annotations

import pytest

from harness.sim import workload_size
from harness.workload import DATASET_NAMES, MODEL_NAMES, build_model, load_dataset
from harness.workload.models import MLP_HIDDEN


@pytest.mark.parametrize("dataset", DATASET_NAMES)
@pytest.mark.parametrize("model", MODEL_NAMES)
def test_parameter_count_matches_torch(model: str, dataset: str) -> None:
    data = load_dataset(dataset, seed=0)
    real = build_model(model, tuple(data.input_shape), data.num_classes, seed=0)
    assert workload_size.parameter_count(model, dataset) == sum(p.numel() for p in real.parameters())
    assert workload_size.DATASET_SHAPES[dataset] == (tuple(data.input_shape), data.num_classes)


def test_hidden_sizes_pinned() -> None:
    assert workload_size.MLP_HIDDEN == MLP_HIDDEN


def test_unknown_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        workload_size.parameter_count("vgg", "mnist5k")
    with pytest.raises(ValueError, match="unknown dataset"):
        workload_size.parameter_count("mlp", "imagenet")
