"""Gossip-PGA: gossip SGD with periodic global averaging (Chen et al., ICML 2021).

Yiming Chen, Kun Yuan, Yingya Zhang, Pan Pan, Yinghui Xu, Wotao Yin: "Accelerating Gossip SGD
with Periodic Global Averaging". Gossip alone is cheap but lets the models drift apart on a
sparse graph; replacing every H-th gossip round (H = ``period``) by an exact global average
removes the drift accumulated since. Iteration t at rank i::

    (t + 1) % period != 0:   x_i <- sum_j W_ij x_j - lr * g_i(x_i)     # a D-PSGD step
    (t + 1) % period == 0:   x_i <- mean_j (x_j - lr * g_j(x_j))       # step, then allreduce

The gossip steps are the harness's D-PSGD (harness/algorithms/dpsgd.py: ``ring`` or
``bipartite_exponential``, mix then step, as Lian et al. write it; the paper mixes after the
step, which only changes whether that iteration's gradient is mixed too). The global rounds
follow ``periodic_sync``, the rule of Local SGD: with ``period: 1`` every iteration is a model
average after the step, which is Local SGD with period 1, i.e. Allreduce-SGD on the models (a
test checks it bit for bit). ``staleness`` is -1: every exchange is synchronous.

Example::

    - {name: gossip_pga, graph: ring, period: 4}
"""

from __future__ import annotations

from harness.algorithms.dpsgd import DPSGD
from harness.algorithms.params import GossipPGAParams
from harness.schedules import periodic_sync


class GossipPGA(DPSGD):
    name = "gossip_pga"
    params: GossipPGAParams

    def after_backward(self, t: int) -> None:
        if not periodic_sync(t, self.params.period):  # a global round replaces the gossip
            super().after_backward(t)

    def after_step(self, t: int) -> None:
        if periodic_sync(t, self.params.period):
            self.ctx.comm.allreduce(self.ctx.params, op="mean")
