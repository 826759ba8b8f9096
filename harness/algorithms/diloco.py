"""DiLoCo: distributed low-communication training (Douillard et al., 2023).

Arthur Douillard, Qixuan Feng, Andrei A. Rusu, Rachita Chhaparia, Yani Donchev, Adhiguna
Kuncoro, Marc'Aurelio Ranzato, Arthur Szlam, Jiajun Shen: "DiLoCo: Distributed Low-Communication
Training of Language Models", arXiv:2311.08105. State on every rank: the global model theta
(initially x0, identical on all ranks) and the outer optimizer's momentum (``OuterNesterov``,
identical too). Every step is the local (inner) optimizer's, AdamW by default
(``DiLoCoParams.optimizer``); after the step of every ``inner_steps``-th iteration
(``periodic_sync``), blocking::

    Delta = mean_i (theta - x_i)           # the pseudo-gradient, one allreduce of the model's size
    theta = OuterNesterov(theta, Delta)    # lr 0.7, momentum 0.9 by default
    x_i   = theta                          # every rank restarts from the new global model

The inner optimizer's state (AdamW's moments) stays local and carries over outer steps, as in
the paper. ``finish`` takes one more outer step when local steps were taken since the last, so
the final models are the global model on every rank. ``staleness`` is 0 at outer steps (the
step uses every rank's fresh pseudo-gradient) and -1 between them.

With ``outer_lr: 1`` and ``outer_momentum: 0`` the outer step sets theta to the mean of the
x_i: DiLoCo is then Local SGD with period ``inner_steps`` (up to rounding). Example::

    - {name: diloco, inner_steps: 20}           # optimizer: AdamW unless the entry gives one
"""

from __future__ import annotations

import torch

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.outer import OuterNesterov
from harness.algorithms.params import DiLoCoParams, QuorumDiLoCoParams
from harness.schedules import periodic_sync


class DiLoCo(Algorithm):
    name = "diloco"
    params: DiLoCoParams | QuorumDiLoCoParams

    def __init__(self, params: DiLoCoParams | QuorumDiLoCoParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        self.global_model = ctx.params.detach().clone()  # theta
        self.outer = OuterNesterov(params.outer_lr, params.outer_momentum, ctx.params)
        self.pseudo_grad: torch.Tensor | None = torch.empty_like(ctx.params)  # None: a variant that needs none
        self.local_steps = 0  # inner steps since the last outer step

    def after_step(self, t: int) -> None:
        self.local_steps += 1
        if periodic_sync(t, self.params.inner_steps):
            self.outer_step()
        else:
            self.staleness = -1

    def finish(self) -> None:
        if self.local_steps:
            self.outer_step()

    def outer_step(self) -> None:
        """Average the pseudo-gradients, step theta, restart every rank from it."""
        delta = torch.sub(self.global_model, self.ctx.params, out=self.pseudo_grad)
        self.ctx.comm.allreduce(delta, op="mean")
        self.apply_outer(delta)
        self.staleness = 0

    def apply_outer(self, delta: torch.Tensor) -> None:
        """theta <- OuterNesterov(theta, delta); x_i <- theta (delta is overwritten)."""
        self.outer.step(self.global_model, delta)
        self.ctx.params.copy_(self.global_model)
        self.local_steps = 0
