"""BMUF: blockwise model-update filtering (Chen and Huo, ICASSP 2016): SlowMo over Local SGD.

State on every rank: the anchor z (the last global model, initially x0) and the block
momentum u (initially 0), both identical on all ranks. Every step x_i <- OPT(x_i, g_i); after
the step of every sync iteration (``periodic_sync``, the rule of ``local_sgd``), blocking::

    x_bar = mean_j x_j                       # allreduce of the flat models
    u     = block_momentum * u + (z - x_bar) / lr
    z     = z - block_lr * lr * u
    x_i   = z                                # every rank restarts from the new anchor

This is SlowMo's update (``harness.algorithms.slowmo.slow_momentum_step``, its one definition)
with BMUF's names: ``block_momentum`` is the slow momentum and ``block_lr`` the slow lr, so BMUF
is ``{name: slowmo, base: local_sgd}`` with the same numbers (a test checks it bit for bit).
The block momentum is kept in gradient units (divided by the base ``lr``), as SlowMo does; the
harness's lr is constant (``ctx.lr``, also used with emulated compute where there is no
optimizer). With ``block_momentum = 0`` and ``block_lr = 1`` the anchor is x_bar and BMUF is
Local SGD with the same period, exactly. Momentum buffers of the local optimizer stay local.
All models are identical after every sync; ``finish`` has nothing in flight.
"""

from __future__ import annotations

from harness.algorithms.base import AlgorithmContext
from harness.algorithms.params import BMUFParams, SlowMoParams
from harness.algorithms.slowmo import SlowMo


class BMUF(SlowMo):
    name = "bmuf"
    params: BMUFParams

    def __init__(self, params: BMUFParams, ctx: AlgorithmContext) -> None:
        as_slowmo = SlowMoParams(
            base="local_sgd", period=params.period, slow_momentum=params.block_momentum, slow_lr=params.block_lr
        )
        super().__init__(as_slowmo, ctx)
        self.params = params  # results and the docs speak of BMUF's own parameters
        self.name = params.name
