"""Momentum SGD on the flat parameter and gradient buffers, the rule of ``torch.optim.SGD``.

The loop's optimizer. With dampening 0 and no ``maximize`` (the scenario offers neither), per
step::

    d = g + weight_decay * x
    m = d                      at the first step
    m = momentum * m + d       afterwards
    d = d + momentum * m       with nesterov, else d = m
    x = x - lr * d

It runs over the whole model as one tensor (the flat buffers every parameter and gradient is a
view into) instead of looping over parameters. And it spares every rank process the import of
``torch._dynamo`` that ``torch.optim`` triggers on first use: about 1.5 s of CPU per process,
which on an oversubscribed machine every launch paid several times over. Tests pin it to
``torch.optim.SGD``.
"""

from __future__ import annotations

import torch


class FlatSGD:
    """``step()`` updates ``params`` from ``grads`` in place; ``zero_grad()`` zeroes ``grads``."""

    def __init__(
        self,
        params: torch.Tensor,
        grads: torch.Tensor,
        *,
        lr: float,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        if params.shape != grads.shape or params.device != grads.device:
            raise ValueError("params and grads must be flat buffers of one shape on one device")
        if nesterov and momentum == 0.0:
            raise ValueError("nesterov needs momentum > 0")
        self.params, self.grads = params, grads
        self.lr, self.momentum, self.nesterov, self.weight_decay = lr, momentum, nesterov, weight_decay
        self.momentum_buffer: torch.Tensor | None = None

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero the gradient buffer in place (``set_to_none`` is refused: the model's ``.grad``
        are views into it and must stay so)."""
        if set_to_none:
            raise ValueError("FlatSGD keeps .grad as views into the flat buffer: use set_to_none=False")
        self.grads.zero_()

    @torch.no_grad()
    def step(self) -> None:
        d = self.grads
        if self.weight_decay != 0.0:
            d = d.add(self.params, alpha=self.weight_decay)
        if self.momentum != 0.0:
            if self.momentum_buffer is None:
                self.momentum_buffer = d.clone()
            else:
                self.momentum_buffer.mul_(self.momentum).add_(d)
            d = d.add(self.momentum_buffer, alpha=self.momentum) if self.nesterov else self.momentum_buffer
        self.params.add_(d, alpha=-self.lr)
