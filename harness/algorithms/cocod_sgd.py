"""CoCoD-SGD: computation and communication decoupled (Shen, Xu, Liu, Tan, Zhao, IJCAI 2019).

State on every rank: the global model z (the result of the last completed allreduce; x0 before
the first), the local base a (this rank's model right after the previous sync point; x0 at
first) and one buffer in flight between sync points. Every step x_i <- OPT(x_i, g_i); after the
step of every sync iteration (``periodic_sync``)::

    z   = result of the allreduce started at the previous sync (wait; none the first time)
    x_i = z + (x_i - a)                      # the stale global model plus this round's local progress
    a   = x_i
    start the non-blocking allreduce of x_i / P       # the next global model

The allreduce runs while the next ``period`` steps compute; the global model applied at a sync
point is one round (``period`` iterations) old, which ``staleness`` reports at sync iterations.

End state (``finish``): the round in flight is completed and applied with the same rule,
x_i = z + (x_i - a). When the iterations are a multiple of the period, x_i - a is zero and
every rank ends with the same model, the mean of the models at the last sync point.
"""

from __future__ import annotations

import torch

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.params import CoCoDSGDParams
from harness.schedules import periodic_sync


class CoCoDSGD(Algorithm):
    name = "cocod_sgd"
    params: CoCoDSGDParams

    def __init__(self, params: CoCoDSGDParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        self.global_model = ctx.params.detach().clone()  # z
        self.base = ctx.params.detach().clone()  # a
        self._next_global = torch.empty_like(self.global_model)  # reduced in the background
        self._pending = None  # handle of the allreduce in flight

    def after_step(self, t: int) -> None:
        if not periodic_sync(t, self.params.period):
            self.staleness = -1
            return
        self._apply_global()
        self._next_global.copy_(self.ctx.params)
        self._pending = self.ctx.comm.iallreduce(self._next_global, op="mean")
        self.staleness = self.params.period

    def finish(self) -> None:
        self._apply_global()

    def _apply_global(self) -> None:
        """Complete the round in flight (z becomes its result); x_i = z + (x_i - a); a = x_i."""
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
            self.global_model, self._next_global = self._next_global, self.global_model
        x = self.ctx.params
        x.sub_(self.base).add_(self.global_model)
        self.base.copy_(x)
