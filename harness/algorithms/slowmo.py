"""SlowMo: slow momentum over a base algorithm (Wang, Tantia, Ballas, Rabbat, ICLR 2020).

Jianyu Wang, Vinayak Tantia, Nicolas Ballas, Michael Rabbat: "SlowMo: Improving
Communication-Efficient Distributed SGD with Slow Momentum". State on every rank: the anchor z
(the last global model, initially x0) and the slow momentum u (initially 0), identical on all
ranks. Every step is the base algorithm's (``base``):

- ``local_sgd``: the local optimizer's step and nothing else (the paper's Local SGD base: no
  communication inside a period; fairscale's implementation can also average every few steps
  inside one, which is not offered here);
- ``sgp``: the harness's SGP (push-sum gossip on the exponential graph, harness/algorithms/
  sgp.py), one gossip round per iteration.

After the step of every ``period``-th iteration (``periodic_sync``), blocking::

    x_bar = mean_j x_j                           # exact average: an allreduce of the models
                                                 # (with SGP, of the push-sum numerators, whose
                                                 # mean push-sum conserves; weights reset to 1)
    u     = slow_momentum * u + (z - x_bar) / lr
    z     = z - slow_lr * lr * u
    x_i   = z                                    # every rank restarts from the new anchor

``lr`` is the local optimizer's (``ctx.lr``, constant in the harness), so u is in gradient
units as in the paper. :func:`slow_momentum_step` is the one definition of this update: BMUF
(harness/algorithms/bmuf.py) is SlowMo over Local SGD, with its own parameter names. With
``slow_momentum: 0`` and ``slow_lr: 1`` the update is z = x_bar, taken as a copy, so SlowMo over
Local SGD is then Local SGD with the same period bit for bit (a test checks it). The local
optimizer's buffers stay local; ``staleness`` is the base algorithm's (-1 for Local SGD).
Example::

    - {name: slowmo, base: sgp, period: 12, slow_momentum: 0.5}
"""

from __future__ import annotations

from typing import Any

import torch

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.params import BMUFParams, SGPParams, SlowMoParams
from harness.algorithms.sgp import SGP
from harness.schedules import periodic_sync


def slow_momentum_step(x: Any, anchor: Any, momentum: Any, lr: float, slow_momentum: float, slow_lr: float) -> None:
    """SlowMo's update, in place: ``x`` holds x_bar on entry and the new anchor on return.

    ``anchor`` (z) and ``momentum`` (u) are updated; with ``slow_momentum == 0`` and
    ``slow_lr == 1``, z = x_bar exactly (no rounding through u).
    """
    if slow_momentum == 0.0 and slow_lr == 1.0:
        anchor.copy_(x)
        return
    momentum.mul_(slow_momentum).add_(anchor - x, alpha=1.0 / lr)
    anchor.add_(momentum, alpha=-slow_lr * lr)
    x.copy_(anchor)


class SlowMo(Algorithm):
    name = "slowmo"
    params: SlowMoParams | BMUFParams

    def __init__(self, params: SlowMoParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        # The base algorithm runs on the same context: its hooks are called first, in order.
        self.base = SGP(SGPParams(), ctx) if params.base == "sgp" else None
        self.anchor = ctx.params.detach().clone()  # z
        self.slow_momentum = torch.zeros_like(self.anchor)  # u
        self.slow_momentum_args = (params.slow_momentum, params.slow_lr)

    def before_forward(self, t: int) -> None:
        if self.base is not None:
            self.base.before_forward(t)

    def after_backward(self, t: int) -> None:
        if self.base is not None:
            self.base.after_backward(t)

    def after_step(self, t: int) -> None:
        if self.base is not None:
            self.base.after_step(t)
            self.staleness = self.base.staleness
        if periodic_sync(t, self.params.period):
            self.slow_step()

    def slow_step(self) -> None:
        x = self.ctx.params
        self.ctx.comm.allreduce(x, op="mean")  # with SGP: the numerators, after this round's gossip
        if self.base is not None:
            self.base.weight = 1.0  # push-sum restarts from the common model with weight 1
        slow_momentum_step(x, self.anchor, self.slow_momentum, self.ctx.lr, *self.slow_momentum_args)

    def finish(self) -> None:
        if self.base is not None:
            self.base.finish()

    def eval_params(self) -> Any:
        return self.ctx.params if self.base is None else self.base.eval_params()
