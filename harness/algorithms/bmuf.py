"""BMUF: blockwise model-update filtering (Chen and Huo, ICASSP 2016), i.e. SlowMo with slow lr 1.

State on every rank: the anchor z (the last global model, initially x0) and the block
momentum u (initially 0), both identical on all ranks. Every step x_i <- OPT(x_i, g_i); after
the step of every sync iteration (``periodic_sync``, the rule of ``local_sgd``), blocking::

    x_bar = mean_j x_j                       # allreduce of the flat models
    u     = block_momentum * u + (z - x_bar) / lr
    z     = z - block_lr * lr * u
    x_i   = z                                # every rank restarts from the new anchor

The block momentum is kept in gradient units (divided by the base ``lr``), as SlowMo does; the
harness's lr is constant (``ctx.lr``, also used with emulated compute where there is no
optimizer). With ``block_momentum = 0`` and ``block_lr = 1`` the anchor is x_bar and BMUF is
Local SGD with the same period (up to rounding). Momentum buffers of the local optimizer stay
local. All models are identical after every sync; ``finish`` has nothing in flight.
"""

from __future__ import annotations

import torch

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.schedules import periodic_sync
from harness.algorithms.params import BMUFParams


class BMUF(Algorithm):
    name = "bmuf"

    def __init__(self, params: BMUFParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        self.anchor = ctx.params.detach().clone()  # z
        self.block_momentum = torch.zeros_like(self.anchor)  # u (first sync: no momentum term)

    def after_step(self, t: int) -> None:
        if not periodic_sync(t, self.params.period):
            return
        x, z, u, lr = self.ctx.params, self.anchor, self.block_momentum, self.ctx.lr
        self.ctx.comm.allreduce(x, op="mean")  # x is replaced by the anchor below: average in place
        u.mul_(self.params.block_momentum).add_(z - x, alpha=1.0 / lr)
        z.add_(u, alpha=-self.params.block_lr * lr)
        x.copy_(z)
