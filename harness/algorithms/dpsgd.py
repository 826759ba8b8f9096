"""D-PSGD: decentralized parallel SGD, blocking gossip (Lian et al., NeurIPS 2017).

Every iteration each rank averages its model with the models it receives in that iteration,
using a doubly stochastic mixing matrix W, and applies its gradient to the mixed model::

    x_i <- sum_j W_ij(t) x_j - lr * d(g_i(x_i))       (g_i evaluated at the pre-mix x_i)

Mapped onto the hooks: forward/backward run on the pre-mix model; ``after_backward`` sends and
receives models, waits, and mixes in place; the loop's optimizer step then applies the pre-mix
gradient to the mixed model (momentum and weight decay act on the mixed model, buffers stay
local).

Graphs (``mixing_row``, from ``harness.schedules``):
- ``ring``: symmetric exchange with both ring neighbours (every ``iexchange`` posted before any
  is waited for, so the pairing cannot deadlock; a pair exchanges once per iteration, so
  exchanges match in posting order). W_ij = 1 / (d + 1) for j = i and each distinct ring
  neighbour, d = their number: 1/3 for P >= 3 (the paper's x_i <- (x_{i-1} + x_i + x_{i+1}) / 3),
  1/2 for P = 2 (the two neighbours are the same rank; counting it twice would also be doubly
  stochastic but is not a uniform average), 1 for P = 1. W is symmetric and doubly stochastic.
- ``bipartite_exponential`` (even P): the SGP reference code's ``DynamicBipartiteExponentialGraph``
  with one peer per iteration, as its D-PSGD runs it (push-pull gossip, uniform weights):
  rank i sends x_i / 2 to ``i + d`` and receives x_{i-d} / 2 from ``i - d``, with the shift d of
  ``bipartite_exponential_shift`` (odd offsets 1, 3, 5, 9, ..., forward then backward), so
  x_i <- (x_i + x_{i-d}) / 2. A round is a shift, not a matching (at 4 ranks rank 0 sends to 1
  and receives from 3): W is doubly stochastic but not symmetric. The messages go through a push
  channel tagged by iteration, so each iteration mixes exactly its own message. The reference
  marks even ranks passive, which only orders its blocking send and receive; here both are
  non-blocking, so no rank is passive.

``staleness`` stays -1: the method is synchronous, like Allreduce-SGD.

Example scenario entry: ``{name: dpsgd, graph: ring}``.
"""

from __future__ import annotations

import torch

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.params import DPSGDParams, GossipPGAParams
from harness.schedules import bipartite_exponential_shift, mixing_row


class DPSGD(Algorithm):
    name = "dpsgd"
    params: DPSGDParams | GossipPGAParams

    def __init__(self, params: DPSGDParams | GossipPGAParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        self.directed = params.graph == "bipartite_exponential" and ctx.size > 1
        if self.directed:
            self.received = [torch.zeros_like(ctx.params)]
            self.channel = ctx.comm.push_channel(ctx.params.numel())  # collective
        else:
            self.received = [torch.empty_like(ctx.params) for _ in range(min(2, ctx.size - 1))]
            self.channel = None
            # The row of an undirected graph (the ring; bipartite_exponential at P = 1, no peers)
            # is the same every iteration: made once, not per iteration on each of thousands of
            # simulated ranks. (peer, its receive buffer) per peer.
            self._row = mixing_row(ctx.rank, ctx.size, 0, params.graph)
            self._peers = list(zip([j for j in self._row if j != ctx.rank], self.received))

    def after_backward(self, t: int) -> None:
        if self.directed:
            self.push_pull(t)
            return
        if not self._peers:
            return
        x, row, iexchange = self.ctx.params, self._row, self.ctx.comm.iexchange
        handles = [iexchange(x, buf, j) for j, buf in self._peers]
        for h in handles:
            h.wait()
        # x is the send buffer: change it only after every exchange has completed.
        x.mul_(row[self.ctx.rank])
        for j, buf in self._peers:
            x.add_(buf, alpha=row[j])

    def push_pull(self, t: int) -> None:
        """x <- x/2 + (in-peer's x)/2: halve, push the half (a snapshot), add the half received."""
        x = self.ctx.params
        out = (self.ctx.rank + bipartite_exponential_shift(self.ctx.size, t)) % self.ctx.size
        x.mul_(0.5)  # exact: (x + y) / 2 == x/2 + y/2 in float arithmetic
        self.channel.send(x, [out], round=t)
        inbox = self.received[0]
        inbox.zero_()
        self.channel.drain(inbox, min_messages=1, round=t)
        x.add_(inbox)

    def finish(self) -> None:
        if self.channel is not None:
            self.channel.close()  # collective; every message was mixed in its own iteration
            self.channel = None
