"""Per-rank training state: data shard, model, flat buffers and optimizer, built from a scenario.

Everything derives from the scenario seed, so every rank starts from the same model and any
rank's shard and batch order can be recomputed by independent code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.device import Staging
from harness.runner.flat_sgd import FlatSGD
from harness.runner.optimizers import LocalOptimizer, build_optimizer
from harness.scenario.schema import Scenario
from harness.workload import batch_indices, communicated_floats, flat_grads, flat_params, scenario_model, shard_indices


@dataclass
class TrainState:
    """The model and data of one rank for one algorithm's run.

    ``params`` and ``grads`` are the flat host buffers the algorithm and the native layer use;
    the model computes with ``staging.device_params`` (the same tensors on the CPU).
    """

    model: torch.nn.Module | None  # None with emulated compute
    params: torch.Tensor
    grads: torch.Tensor
    optimizer: LocalOptimizer | None  # FlatSGD for sgd, else a torch.optim.Optimizer (runner/optimizers.py)
    shard: np.ndarray
    data: Any  # harness.workload.Dataset (on the rank's device) or None
    staging: Staging

    def batch(self, iteration: int, batch_size: int, seed: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(batch_indices(self.shard, batch_size, iteration, seed, rank))
        idx = idx.to(self.data.train_x.device)
        return self.data.train_x[idx], self.data.train_y[idx]


def emulated(scenario: Scenario) -> bool:
    return scenario.workload.compute != "real"


def build_state(
    scenario: Scenario, rank: int, dataset: Any, device: torch.device | None = None, optimizer: Any = None
) -> TrainState:
    """Fresh model (same on every rank), flat buffers and optimizer for one algorithm; the model
    on ``device`` (default: the CPU), the data already there (``harness.device.dataset_on``).
    ``optimizer``: the spec to build (``scenario.optimizer_of(algorithm)``); default the scenario's."""
    shard = shard_indices(dataset.num_train, scenario.ranks, rank, scenario.seed)
    if emulated(scenario):
        # Only the communicated buffer matters: the model's real size unless ``params`` says
        # otherwise (paper-scale models on a laptop), as the simulator sizes it.
        params = torch.zeros(communicated_floats(scenario), dtype=torch.float32)
        grads = torch.zeros_like(params)
        return TrainState(None, params, grads, None, shard, dataset, Staging(params, grads, params, grads))
    # Built on the CPU with the seed, then moved: the same initial model on every device.
    model = scenario_model(scenario, dataset)
    model.to(device or torch.device("cpu"))
    staging = Staging.of(flat_params(model), flat_grads(model))
    spec = scenario.optimizer if optimizer is None else optimizer
    local = build_optimizer(spec, model, scenario.python_path)  # over staging's device side
    return TrainState(model, staging.host_params, staging.host_grads, local, shard, dataset, staging)


def warm_up_torch() -> None:
    """A process's first backward pass and optimizer step initialize torch internals; do both
    untimed, before any algorithm runs."""
    w = torch.nn.Parameter(torch.zeros(4))
    torch.nn.functional.cross_entropy((w * torch.ones(2, 4)), torch.zeros(2, dtype=torch.long)).backward()
    assert w.grad is not None  # set by the backward pass
    FlatSGD(w.detach(), w.grad, lr=0.0, momentum=0.9).step()
