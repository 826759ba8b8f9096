"""Overlap Local SGD: an anchor model averaged in the background (Wang et al., ICASSP 2020).

Wang, Liang, Joshi: Overlap Local-SGD: An Algorithmic Approach to Hide Communication Delays in
Distributed SGD. State on every rank: the anchor z (initially x0, identical on all ranks), the
anchor momentum u (initially 0) and one buffer that is in flight between sync points. Every
step x_i <- OPT(x_i, g_i); after the step of every sync iteration (``periodic_sync``)::

    z   = result of the anchor allreduce started at the previous sync (wait; none the first time)
    x_i = (1 - alpha) * x_i + alpha * z      # pull toward the anchor
    u   = beta * u + (z - x_i) / lr
    start the non-blocking allreduce of (z - lr * u) / P      # the next anchor

so the allreduce runs while the next ``period`` local steps compute, and the anchor a rank pulls
toward is one round (``period`` iterations) old; ``staleness`` says so at sync iterations. With
beta = 0 the next anchor is exactly the mean of the pulled models. ``lr`` is ``ctx.lr`` (constant
in the harness; also there with emulated compute, where there is no optimizer step).

End state (``finish``): local steps taken since the last sync point, if any, are folded in by one
more sync point; the round in flight is completed, and every rank deploys the anchor it
produced: x_i = z. Final models are therefore identical on all ranks.
"""

from __future__ import annotations

import torch

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.params import OverlapLocalSGDParams
from harness.schedules import periodic_sync


class OverlapLocalSGD(Algorithm):
    name = "overlap_local_sgd"
    params: OverlapLocalSGDParams

    def __init__(self, params: OverlapLocalSGDParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        self.anchor = ctx.params.detach().clone()  # z
        self.anchor_momentum = torch.zeros_like(self.anchor)  # u
        self._next_anchor = torch.empty_like(self.anchor)  # reduced in the background
        self._pending = None  # handle of the anchor allreduce in flight
        self._local_steps = 0  # steps since the last sync point

    def after_step(self, t: int) -> None:
        self._local_steps += 1
        if periodic_sync(t, self.params.period):
            self._sync()
            self.staleness = self.params.period
        else:
            self.staleness = -1

    def finish(self) -> None:
        if self._local_steps:
            self._sync()
        self._complete_round()
        self.ctx.params.copy_(self.anchor)

    def _complete_round(self) -> None:
        """Wait for the anchor allreduce in flight, if any; its result becomes the anchor."""
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
            self.anchor, self._next_anchor = self._next_anchor, self.anchor

    def _sync(self) -> None:
        self._complete_round()
        x, z, u, lr = self.ctx.params, self.anchor, self.anchor_momentum, self.ctx.lr
        x.mul_(1.0 - self.params.alpha).add_(z, alpha=self.params.alpha)
        u.mul_(self.params.beta).add_(z - x, alpha=1.0 / lr)
        torch.add(z, u, alpha=-lr, out=self._next_anchor)
        self._pending = self.ctx.comm.iallreduce(self._next_anchor, op="mean")
        self._local_steps = 0
