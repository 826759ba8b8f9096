"""The loop's optimizer computes what ``torch.optim.SGD`` computes, on the flat buffers."""

from __future__ import annotations

import pytest
import torch

from harness.runner.flat_sgd import FlatSGD
from harness.workload import build_model, flat_grads, flat_params


def _train(model, opt, steps: int = 6) -> None:
    gen = torch.Generator().manual_seed(3)
    for _ in range(steps):
        x = torch.randn(16, 1, 8, 8, generator=gen)
        y = torch.randint(0, 10, (16,), generator=gen)
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("momentum, nesterov, weight_decay", [
    (0.0, False, 0.0), (0.9, False, 1e-4), (0.9, True, 1e-4), (0.5, False, 0.0), (0.0, False, 1e-2),
])
def test_flat_sgd_follows_torch_sgd(momentum, nesterov, weight_decay):
    ours, theirs = build_model("mlp", (1, 8, 8), 10, 0), build_model("mlp", (1, 8, 8), 10, 0)
    params, grads = flat_params(ours), flat_grads(ours)
    _train(ours, FlatSGD(params, grads, lr=0.05, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay))
    _train(theirs, torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=momentum, nesterov=nesterov,
                                   weight_decay=weight_decay))
    reference = torch.cat([p.detach().reshape(-1) for p in theirs.parameters()])
    assert not torch.equal(params, flat_params(build_model("mlp", (1, 8, 8), 10, 0)))  # it did train
    torch.testing.assert_close(params, reference, rtol=1e-6, atol=1e-7)


def test_flat_sgd_refuses_what_would_break_the_views():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="set_to_none=False"):
        FlatSGD(x, torch.zeros(3), lr=0.1).zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="one shape"):
        FlatSGD(x, torch.zeros(4), lr=0.1)
    with pytest.raises(ValueError, match="nesterov needs momentum"):
        FlatSGD(x, torch.zeros(3), lr=0.1, nesterov=True)
