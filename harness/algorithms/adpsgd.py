"""AD-PSGD: asynchronous decentralized parallel SGD (Lian et al., ICML 2018).

Bipartite graph (``harness.schedules.bipartite_peer``): even ranks are active, odd ranks
passive. At iteration t an active rank snapshots its model x_sent and asks its peer of
iteration t for an average while it computes its gradient; the passive peer's progress thread
(the communication agent) answers with the model its caller last published and records the
correction, so passive ranks never wait (several requests between two publishes compose like
sequential averagings). The agent serves one request at a time, as the reference
implementations do: when several active ranks pick one passive rank at once (every passive rank
is the peer of two active ranks in some rounds of ``bipartite_peer``), the later ones wait for
the earlier replies to leave. Both sides apply the
averaging to their current model: the gradient computed on the older model is applied to the
averaged one, as in the paper.

    active:  x <- OPT(x, g(x_sent)) + (x_peer - x_sent) / 2
    passive: x <- OPT(x, g(x_pub)) + the averaging moves its agent made meanwhile

``staleness``: averaging updates that landed between the model the gradient was computed at
and the model it is applied to (1 for an active rank, the number of answered requests for a
passive one).
"""

from __future__ import annotations

import torch

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.params import ADPSGDParams
from harness.schedules import bipartite_peer


class ADPSGD(Algorithm):
    name = "adpsgd"

    def __init__(self, params: ADPSGDParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        self.active = ctx.rank % 2 == 0
        self.averager = ctx.comm.pairwise_averager(ctx.params)
        self.sent = torch.empty_like(ctx.params)
        self.reply = torch.empty_like(ctx.params)
        self.pending = None

    def before_forward(self, t: int) -> None:
        if self.active:
            self.sent.copy_(self.ctx.params)
            peer = bipartite_peer(self.ctx.rank, self.ctx.size, t)
            self.pending = self.averager.irequest(self.sent, self.reply, peer)
        else:
            self.averager.publish(self.ctx.params)

    def after_step(self, t: int) -> None:
        if self.active:
            self._complete_request()
            self.staleness = 1
        else:
            self.staleness = self.averager.drain(self.ctx.params)

    def _complete_request(self) -> None:
        if self.pending is None:
            return
        self.pending.wait()
        self.pending = None
        self.ctx.params.add_(self.reply.sub_(self.sent).mul_(0.5))

    def finish(self) -> None:
        self._complete_request()
        self.averager.close()  # collective: every request has been answered after it
        if not self.active:
            self.averager.drain(self.ctx.params)
