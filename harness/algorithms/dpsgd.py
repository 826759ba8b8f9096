"""D-PSGD: decentralized parallel SGD, symmetric blocking gossip (Lian et al., NeurIPS 2017).

Every iteration each rank averages its model with its neighbours of the iteration using a
symmetric, doubly stochastic mixing matrix W, and applies its gradient to the mixed model::

    x_i <- sum_j W_ij(t) x_j - lr * d(g_i(x_i))       (g_i evaluated at the pre-mix x_i)

Mapped onto the hooks: forward/backward run on the pre-mix model; ``after_backward`` exchanges
models with all neighbours (every ``iexchange`` posted before any is waited for, so the pairing
cannot deadlock; a pair exchanges once per iteration, so exchanges match in posting order),
waits, and mixes in place; the loop's optimizer step then applies the pre-mix gradient to the
mixed model (momentum and weight decay act on the mixed model, buffers stay local).

Graphs (``mixing_row`` below, from ``harness.schedules``):
- ``ring``: W_ij = 1 / (d + 1) for j = i and each distinct ring neighbour, d = their number:
  1/3 for P >= 3 (the paper's x_i <- (x_{i-1} + x_i + x_{i+1}) / 3), 1/2 for P = 2 (the two
  neighbours are the same rank; counting it twice would also be doubly stochastic but is not
  a uniform average), 1 for P = 1. Every rank has the same degree, so W is symmetric and
  doubly stochastic for every P.
- ``bipartite_exponential`` (even P): the 1-peer variant of the SGP code; the partner of
  iteration t is ``bipartite_peer`` (a perfect matching), W_ij = 1/2 for j in {i, partner}.

``staleness`` stays -1: the method is synchronous, like Allreduce-SGD.

Example scenario entry: ``{name: dpsgd, graph: ring}``.
"""

from __future__ import annotations

import torch

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.params import DPSGDParams
from harness.schedules import mixing_row


class DPSGD(Algorithm):
    name = "dpsgd"
    Params = DPSGDParams

    def __init__(self, params: DPSGDParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        most = 1 if params.graph == "bipartite_exponential" else 2
        self.received = [torch.empty_like(ctx.params) for _ in range(min(most, ctx.size - 1))]

    def after_backward(self, t: int) -> None:
        row = mixing_row(self.ctx.rank, self.ctx.size, t, self.params.graph)
        peers = [j for j in row if j != self.ctx.rank]
        if not peers:
            return
        x = self.ctx.params
        handles = [self.ctx.comm.iexchange(x, buf, j) for j, buf in zip(peers, self.received)]
        for h in handles:
            h.wait()
        # x is the send buffer: change it only after every exchange has completed.
        x.mul_(row[self.ctx.rank])
        for j, buf in zip(peers, self.received):
            x.add_(buf, alpha=row[j])
