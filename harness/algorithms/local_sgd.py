"""Local SGD: local steps, models averaged every ``period`` steps (Lin et al., ICLR 2020).

Every step x_i <- OPT(x_i, g_i); after steps t with (t + 1) % period == 0 the flat models are
averaged by a blocking allreduce. Momentum buffers stay local.

Deliberate choice: the reference code averages when ``t != 0 and t % period == 0`` (first
average after period + 1 steps). Here the first average comes after exactly ``period`` steps,
so period 1 (without momentum) is exactly Allreduce-SGD. ``harness.schedules.periodic_sync`` is that rule, and
every algorithm of the periodic family (Overlap Local SGD, EASGD, CoCoD-SGD, BMUF) uses it.
"""

from __future__ import annotations

from harness.algorithms.base import Algorithm
from harness.algorithms.params import LocalSGDParams
from harness.schedules import periodic_sync


class LocalSGD(Algorithm):
    name = "local_sgd"
    params: LocalSGDParams

    def is_sync_step(self, t: int) -> bool:
        return periodic_sync(t, self.params.period)

    def after_step(self, t: int) -> None:
        if self.is_sync_step(t):
            self.ctx.comm.allreduce(self.ctx.params, op="mean")
