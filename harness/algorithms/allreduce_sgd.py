"""Allreduce-SGD: the synchronous baseline (Goyal et al., 2017; AR-SGD of the SGP paper).

Every step: g_bar = mean over ranks of g_i by a blocking allreduce of the flat gradient,
then the local momentum-SGD step with g_bar. All models stay identical.
"""

from __future__ import annotations

from harness.algorithms.base import Algorithm


class AllreduceSGD(Algorithm):
    name = "allreduce_sgd"

    def after_backward(self, t: int) -> None:
        self.ctx.comm.allreduce(self.ctx.grads, op="mean")
