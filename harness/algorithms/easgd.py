"""EASGD: elastic averaging SGD, symmetric synchronous variant (Zhang, Choromanska, LeCun, NeurIPS 2015).

Every rank holds the center z (initially x0) and keeps it identical to the other ranks' copies:
it only changes by the same allreduced sum. Every step x_i <- OPT(x_i, g_i); after the step of
every sync iteration (``periodic_sync``)::

    d_i = x_i - z
    x_i = x_i - alpha * d_i                  # elastic pull toward the center
    z   = z + alpha * sum_j d_j              # allreduce (sum) of the differences

``overlap: false`` waits for the allreduce at once. ``overlap: true`` starts it and applies the
center update only at the next sync point (or in ``finish``), so the communication runs while
the next ``period`` steps compute: the center lands one round late. The center is read only at
sync points, right after that update is applied, so both variants compute the same iterates
(same floating-point operations, in the same order); only the time spent blocked differs.
The reference's overlapped variant crashes (an undefined request); this is a working one.

The workers stay elastic: they are not identical after a sync, only the center is. The model a
rank deploys (``eval_params``) is its own worker model, so the harness's ``average`` model is the
mean of the workers; the center is ``self.center``. ``staleness`` is ``period`` at sync
iterations: the center pulled toward there was computed at the previous sync point.

Stability: the mean worker-to-center distance is multiplied by 1 - (P + 1) * alpha at every sync,
so alpha must be below 2 / (P + 1) (the EASGD paper's beta = P * alpha).

End state (``finish``): the round in flight (overlap) is completed and applied to the center;
worker models stay as they are.
"""

from __future__ import annotations

import torch

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.params import EASGDParams
from harness.schedules import periodic_sync


class EASGD(Algorithm):
    name = "easgd"
    params: EASGDParams

    def __init__(self, params: EASGDParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        self.center = ctx.params.detach().clone()  # z
        self._diff = torch.empty_like(self.center)  # d_i, then sum_j d_j once reduced
        self._pending = None  # handle of the difference allreduce in flight

    def after_step(self, t: int) -> None:
        if not periodic_sync(t, self.params.period):
            self.staleness = -1
            return
        self._update_center()  # overlap: the round started at the previous sync point
        x, alpha = self.ctx.params, self.params.alpha
        torch.sub(x, self.center, out=self._diff)
        x.sub_(self._diff, alpha=alpha)  # before the allreduce overwrites the buffer in place
        self._pending = self.ctx.comm.iallreduce(self._diff, op="sum")
        if not self.params.overlap:
            self._update_center()
        self.staleness = self.params.period

    def finish(self) -> None:
        self._update_center()

    def _update_center(self) -> None:
        """Wait for the difference allreduce in flight, if any, and move the center by it."""
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
            self.center.add_(self._diff, alpha=self.params.alpha)
