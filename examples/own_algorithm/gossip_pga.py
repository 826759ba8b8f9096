"""Gossip-PGA: gossip SGD with periodic global averaging, defined here and nowhere in the harness.

Chen, Yuan, Zhang, Pan, Yin, Sayed: "Accelerating Gossip SGD with Periodic Global Averaging",
ICML 2021. Gossip SGD mixes each model with its neighbours' on a sparse graph, which is cheap
but lets the models drift apart; Gossip-PGA replaces the gossip of every H-th iteration
(``period``) by an exact global average, which removes the drift accumulated since:

    t with (t + 1) % period != 0:  a D-PSGD step  x_i <- sum_j W_ij x_j - lr * g_i
    t with (t + 1) % period == 0:  x_i <- mean over ranks of (x_j - lr * g_j)

The gossip steps are the harness's own D-PSGD (harness/algorithms/dpsgd.py; mix, then the
local optimizer step, as Lian et al. write it; the paper mixes after the step, which only
changes whether this iteration's gradients are mixed too), reused by subclassing it. With
``period: 1`` every iteration is a global average: all ranks hold the same model after each
iteration, as with Local SGD of period 1.

scenario.yaml beside this file names the class as ``class: "gossip_pga:GossipPGA"``; ``python -m
harness run``, ``simulate`` and ``compare`` run it with no other code. It talks only to
``ctx.comm`` and never lets communication depend on the model's values, so the simulator runs
this very code (harness/algorithms/base.py states the contract).
"""

from __future__ import annotations

from typing import Literal

from harness.algorithms import AlgorithmParams, ParamError, PositiveInt
from harness.algorithms.dpsgd import DPSGD


class GossipPGA(DPSGD):
    """D-PSGD gossip, with a global model average instead at the end of every period-th iteration."""

    class Params(AlgorithmParams):
        """The keys a scenario entry may set besides ``name`` and ``class``, with their defaults."""

        graph: Literal["ring", "bipartite_exponential"] = "ring"  # D-PSGD's gossip graph
        period: PositiveInt = 4  # H: iterations from one global average to the next

        def check(self, ranks: int) -> None:
            # D-PSGD's bipartite exponential graph pairs ranks by odd offsets: it needs an even count.
            if self.graph == "bipartite_exponential" and ranks > 1 and ranks % 2:
                raise ParamError("graph", f"bipartite_exponential needs an even number of ranks (ranks is {ranks})",
                                 self.graph)

    label = "Gossip-PGA"  # in figures; without it, the scenario's name

    def global_round(self, t: int) -> bool:
        """Whether iteration t ends with the global average (the same answer on every rank)."""
        return (t + 1) % self.params.period == 0

    def after_backward(self, t: int) -> None:
        # D-PSGD gossips here, before the optimizer step; a global round skips it.
        if not self.global_round(t):
            super().after_backward(t)

    def after_step(self, t: int) -> None:
        # After the optimizer step: every rank's model becomes the mean of all ranks' models.
        if self.global_round(t):
            self.ctx.comm.allreduce(self.ctx.params, op="mean")
