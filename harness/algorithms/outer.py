"""The outer optimizer of the DiLoCo family: Nesterov momentum SGD on a pseudo-gradient.

DiLoCo, Streaming DiLoCo and quorum DiLoCo keep a global model theta (identical on every rank)
and, at an outer step, move it along the averaged pseudo-gradient Delta = theta - mean_i x_i
with Nesterov momentum, as ``torch.optim.SGD(nesterov=True, dampening=0)`` does::

    m     <- mu * m + Delta                 (m starts at 0, so the first m is Delta)
    theta <- theta - lr * (Delta + mu * m)

It is written out rather than calling ``torch.optim.SGD`` because Streaming DiLoCo steps one
fragment (a slice) at a time and the simulator runs it on stand-in buffers, which a torch
optimizer cannot hold; a test compares it with ``torch.optim.SGD`` step by step.
"""

from __future__ import annotations

from typing import Any


class OuterNesterov:
    """Nesterov SGD state for a flat model: the momentum buffer, stepped whole or by slice."""

    def __init__(self, lr: float, momentum: float, like: Any) -> None:
        self.lr = lr
        self.momentum = momentum
        self.buf = like.new_zeros(like.numel())  # m; derived from the model (a stand-in in the simulator)

    def step(self, theta: Any, delta: Any, part: slice = slice(None)) -> None:
        """Move ``theta`` (the global model, or its fragment ``part``) along the pseudo-gradient
        ``delta`` of the same length. ``delta`` is overwritten (it becomes the Nesterov direction)."""
        m = self.buf[part]
        m.mul_(self.momentum).add_(delta)
        delta.add_(m, alpha=self.momentum)
        theta.sub_(delta, alpha=self.lr)
