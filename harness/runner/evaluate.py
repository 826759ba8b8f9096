"""Evaluation points: test loss and accuracy of the averaged model and of rank 0, and consensus.

Collective: every rank calls ``evaluate`` at the same iterations. It uses the native layer
(an allreduce of the flat model) and is not counted in the iteration times.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch

from harness.results.columns import EvalRecord


@contextlib.contextmanager
def testing(model: torch.nn.Module, params: torch.Tensor, flat: torch.Tensor) -> Iterator[torch.nn.Module]:
    """Inside: ``model`` in eval mode with its flat parameters set to ``flat``; afterwards its own
    parameters and mode again. ``params``: the flat buffer the model's parameters are views into
    (on the model's device)."""
    saved, was_training = params.clone(), model.training
    params.copy_(flat)
    model.eval()
    try:
        yield model
    finally:
        params.copy_(saved)
        model.train(was_training)


@torch.no_grad()
def test_metrics(model: torch.nn.Module, flat: torch.Tensor, params: torch.Tensor, data) -> tuple[float, float]:
    """Loss and accuracy on the test set of ``model`` with its flat parameters set to ``flat``."""
    with testing(model, params, flat):
        logits = model(data.test_x)
    loss = torch.nn.functional.cross_entropy(logits, data.test_y).item()
    acc = (logits.argmax(1) == data.test_y).float().mean().item()
    return loss, acc


def evaluate(
    comm,
    algorithm: str,
    iteration: int,
    time_s: float,
    local: torch.Tensor,
    test: Callable[[torch.Tensor], tuple[float, float]] | None,
) -> list[EvalRecord]:
    """Average the deployable models, measure consensus; rank 0 returns the records.

    ``test(flat)``: test loss and accuracy of the model with flat parameters ``flat`` (rank 0
    calls it for the average and for its own); None: no model to test (emulated compute).
    BatchNorm running statistics are local buffers, not communicated: the averaged model is
    evaluated with rank 0's statistics.
    """
    avg = local.detach().clone()
    comm.allreduce(avg, op="mean")
    dist = torch.tensor([float(torch.sum((local - avg) ** 2))], dtype=torch.float32)
    comm.allreduce(dist, op="mean")
    if comm.rank != 0:
        return []
    consensus = float(dist[0])
    if test is None:
        return [EvalRecord(algorithm, iteration, time_s, "average", math.nan, math.nan, consensus)]
    records = []
    for which, flat in (("average", avg), ("rank0", local)):
        loss, acc = test(flat)
        records.append(EvalRecord(algorithm, iteration, time_s, which, loss, acc, consensus))
    return records
