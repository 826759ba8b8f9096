"""Local SGD: local steps, models averaged every ``period`` steps (Lin et al., ICLR 2020).

Every step x_i <- OPT(x_i, g_i); after steps t with (t + 1) % period == 0 the flat models are
averaged by a blocking allreduce. Momentum buffers stay local.

Deliberate choice: the reference code averages when ``t != 0 and t % period == 0`` (first
average after period + 1 steps). Here the first average comes after exactly ``period`` steps,
so period 1 (without momentum) is exactly Allreduce-SGD. ``periodic_sync`` is that rule, and
every algorithm of the periodic family (Overlap Local SGD, EASGD, CoCoD-SGD, BMUF) uses it.
"""

from __future__ import annotations

from harness.algorithms.base import Algorithm
from harness.algorithms.params import LocalSGDParams


def periodic_sync(t: int, period: int) -> bool:
    """Whether iteration ``t`` (0-based) ends with a synchronization: ``(t + 1) % period == 0``.

    The periodic family synchronizes after the optimizer step of such iterations, so the first
    synchronization follows exactly ``period`` local steps.

    >>> [t for t in range(8) if periodic_sync(t, 3)]
    [2, 5]
    """
    return (t + 1) % period == 0


class LocalSGD(Algorithm):
    name = "local_sgd"
    Params = LocalSGDParams

    def is_sync_step(self, t: int) -> bool:
        return periodic_sync(t, self.params.period)

    def after_step(self, t: int) -> None:
        if self.is_sync_step(t):
            self.ctx.comm.allreduce(self.ctx.params, op="mean")
