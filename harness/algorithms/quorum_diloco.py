"""Quorum DiLoCo: DiLoCo whose outer step waits for a quorum of ranks, not for all of them.

The harness's own variant, in the spirit of the wait-avoiding methods (WAGMA-SGD, eager-SGD)
and of recent straggler-tolerant DiLoCo variants. DiLoCo's outer step (harness/algorithms/
diloco.py) waits for the slowest rank; here it runs on the native layer's wait-avoiding
allreduce (``Communicator.wait_avoiding``) over one group of all ranks, in its accumulating
(eager-SGD) form, activated once Q = ``quorum_ranks`` = ceil(``quorum`` * P) ranks have arrived.

Outer round k at rank i, after its ``inner_steps``-th local step::

    publish [theta - x_i, 1]                      # pseudo-gradient and its weight, added to the
                                                  # rank's send buffer (which may still hold a
                                                  # late pseudo-gradient of an earlier round)
    [S, W] = sum over ranks of what their buffers held when round k was activated;
             each buffer is taken and zeroed as it is contributed
    theta  = OuterNesterov(theta, S / W)          # the mean of the pseudo-gradients that came
    x_i    = theta

The first Q ranks to arrive contribute their fresh pseudo-gradients (each published before it
counted itself in). A rank that is late has its progress thread contribute whatever its buffer
holds then (nothing, weight 0, if it published nothing since its last contribution); its own
pseudo-gradient, published when it arrives, stays in its buffer and joins round k + 1 with its
own weight 1 (stale by one round: computed against the previous global model). So every
pseudo-gradient is counted exactly once, in the first round activated after it was published,
and W counts how many a round holds. Every rank receives the same [S, W] for round k and holds
the same theta after it (the late rank too, when it takes the stored result without waiting).
Exception, as in eager-SGD: pseudo-gradients published for the last round by ranks that were
late for it are still in their buffers when the run ends and are dropped.

The outer momentum defaults to 0.5, not DiLoCo's 0.9: about half of a round's pseudo-gradients
are one round stale, and Nesterov momentum 0.9 on them oscillated (docs/algorithms.md).

``staleness`` at an outer step is the native round's: 0 when this rank's fresh pseudo-gradient
was in the round, otherwise how many rounds old the buffer it contributed was; -1 between outer
steps. With ``quorum: 1.0`` every round waits for everyone and this is DiLoCo (up to rounding).
Example::

    - {name: quorum_diloco, inner_steps: 20, quorum: 0.5}
"""

from __future__ import annotations

from harness.algorithms.base import AlgorithmContext
from harness.algorithms.diloco import DiLoCo
from harness.algorithms.params import QuorumDiLoCoParams


class QuorumDiLoCo(DiLoCo):
    name = "quorum_diloco"
    params: QuorumDiLoCoParams

    def __init__(self, params: QuorumDiLoCoParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        self.pseudo_grad = None  # DiLoCo's allreduce buffer: the pseudo-gradient goes in self.message here
        n = ctx.params.numel()
        self.quorum = params.quorum_ranks(ctx.size)
        self.message = ctx.params.new_zeros(n + 1)  # [Delta, weight]; derived from the model
        self.total = ctx.params.new_zeros(n + 1)  # the round's [S, W]
        self.info: dict = {}
        # Collective. Accumulating: publishing adds, a contribution takes and zeroes the buffer.
        self._op = ctx.comm.wait_avoiding(
            self.message, phases=[list(range(ctx.size))], sync_every=0, accumulate=True, quorum=self.quorum
        )

    def outer_step(self) -> None:
        n = self.ctx.params.numel()
        self.message[:n].copy_(self.global_model).sub_(self.ctx.params)
        self.message[n] = 1.0
        info = self._op.round(self.message, self.total)
        weight = float(self.total[n])  # >= 1: the quorum's ranks contributed fresh
        delta = self.total[:n]
        if weight > 0:  # a value, never a communication decision (0.0 in the simulator)
            delta.div_(weight)
        self.apply_outer(delta)
        self.info = info
        self.staleness = int(info["staleness"])

    def finish(self) -> None:
        super().finish()  # an outer round for local steps since the last one
        self._op.close()  # collective: returns once every rank has run all its rounds
