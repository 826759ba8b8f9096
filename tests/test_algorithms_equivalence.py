"""Equivalences checked by independent code from a run's provenance (initial model, shards).

- Allreduce-SGD on P ranks = single-process SGD on the concatenated batch.
- Local SGD with period 1 and no momentum = Allreduce-SGD.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.workload import batch_indices, build_model, flat_params, load_dataset
from test_run import harness_run, only_run_dir, write_scenario

RANKS, ITERS, BATCH, SEED = 3, 10, 8, 11


def run(tmp_path, name: str, momentum: float, algorithms: list) -> tuple:
    path = write_scenario(
        tmp_path, name=name, ranks=RANKS, seed=SEED, imbalance=[], algorithms=algorithms,
        workload={"model": "logreg", "dataset": "digits", "batch_size": BATCH, "iterations": ITERS, "eval_every": ITERS},
        optimizer={"lr": 0.1, "momentum": momentum, "weight_decay": 1e-4},
    )
    proc = harness_run(str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return only_run_dir(tmp_path / "out", name)


def single_process_sgd(run_dir, momentum: float) -> torch.Tensor:
    data = load_dataset("digits", SEED)
    model = build_model("logreg", tuple(data.input_shape), data.num_classes, SEED)
    params = flat_params(model)
    params.copy_(torch.load(run_dir / "provenance" / "initial_model.pt"))
    shards = np.load(run_dir / "provenance" / "shards.npz")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum, weight_decay=1e-4)
    for t in range(ITERS):
        idx = np.concatenate([batch_indices(shards[f"rank{r}"], BATCH, t, SEED, r) for r in range(RANKS)])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
        opt.step()
    return params.detach().clone()


@pytest.mark.mpi
def test_allreduce_sgd_equals_single_process_sgd_on_the_concatenated_batch(tmp_path):
    torch.set_num_threads(1)
    run_dir = run(tmp_path, "eqar", 0.9, ["allreduce_sgd"])
    finals = torch.load(run_dir / "provenance" / "final_models_allreduce_sgd.pt")
    reference = single_process_sgd(run_dir, 0.9)
    for r in range(RANKS):
        torch.testing.assert_close(finals[r], reference, rtol=1e-5, atol=1e-6)


@pytest.mark.mpi
def test_local_sgd_period_1_without_momentum_equals_allreduce_sgd(tmp_path):
    run_dir = run(tmp_path, "eqlocal", 0.0, ["allreduce_sgd", {"name": "local_sgd", "period": 1}])
    ar = torch.load(run_dir / "provenance" / "final_models_allreduce_sgd.pt")
    local = torch.load(run_dir / "provenance" / "final_models_local_sgd.pt")
    torch.testing.assert_close(local, ar, rtol=1e-5, atol=1e-6)
