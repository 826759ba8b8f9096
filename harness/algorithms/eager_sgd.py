"""eager-SGD: gradient averaging with solo or majority partial allreduce (Li et al., PPoPP 2020).

Shigang Li, Tal Ben-Nun, Salvatore Di Girolamo, Dan Alistarh, Torsten Hoefler: "Taming
Unbalanced Training Workloads in Deep Learning with Partial Collective Operations".
Rule (docs/algorithms.md, "eager-SGD"), iteration t at rank i::

    send_i += g_i / P                      publish (the send buffer accumulates)
    round t: g_bar = sum over ALL ranks of send_j, each send_j taken and zeroed as contributed
    x_i <- OPT(x_i, g_bar)                 the loop's optimizer step

Every rank receives the same g_bar for round t, so with one initial model all models stay
identical. Who triggers round t: ``solo``: the first rank to arrive (every rank may
activate); ``majority``: only ``harness.schedules.majority_initiator(seed, t, P)``, a draw
shared by all ranks, so on average half the ranks have arrived. Rounds with
``t % period == period - 1`` are synchronous allreduces of fresh buffers.

Deliberate choice (as in the reference): a rank that is late for round t has its progress
thread contribute whatever its send buffer holds (zeros when everything it published was
already consumed). Its gradient g_i(t), published when it arrives, stays in the buffer and is
carried into the next round it contributes to, so no gradient is lost while rounds go on; a
gradient still in a buffer after the last round is dropped unless that round is synchronous.
The late rank itself applies round t's g_bar, which does not contain g_i(t).

With emulated compute (no optimizer) the zero gradient buffer is communicated all the same.

Example (a scenario ``algorithms`` entry)::

    - {name: eager_sgd, mode: majority, period: 33}
"""

from __future__ import annotations

import torch

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.params import EagerSGDParams
from harness.schedules import majority_initiator


class EagerSGD(Algorithm):
    """eager-SGD on the loop's hooks: one partial allreduce of g / P per iteration.

    ``staleness`` is the native round's: rounds between round t and the last round this rank
    had published for when its buffer was taken (0 when on time). ``info`` is the last round's
    info (round, sync, group_size, staleness, joined_early).
    """

    name = "eager_sgd"
    params: EagerSGDParams
    #: ``staleness`` of iteration t is the contribution staleness of wait-avoiding round t (a
    #: trace-driven simulation with values replays the real run's contributions from it)
    round_staleness = True

    def __init__(self, params: EagerSGDParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        self.info: dict = {}
        self._send = torch.zeros_like(ctx.grads)
        # Collective. One group of every rank; the op starts from an empty (zero) send buffer.
        self._op = ctx.comm.wait_avoiding(
            self._send, phases=[list(range(ctx.size))], sync_every=params.period, accumulate=True
        )

    def may_activate(self, t: int) -> bool:
        """Whether this rank's arrival at round ``t`` may trigger the round."""
        if self.params.mode == "solo":
            return True
        return self.ctx.rank == majority_initiator(self.ctx.seed, t, self.ctx.size)

    def after_backward(self, t: int) -> None:
        torch.div(self.ctx.grads, self.ctx.size, out=self._send)
        info = self._op.round(self._send, self.ctx.grads, may_activate=self.may_activate(t))
        if info["round"] != t:
            raise RuntimeError(f"eager_sgd: iteration {t} ran round {info['round']} (one round per iteration)")
        self.info = info
        self.staleness = int(info["staleness"])

    def finish(self) -> None:
        self._op.close()  # collective
