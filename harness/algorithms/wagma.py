"""WAGMA-SGD: wait-avoiding group model averaging (Li et al., IEEE TPDS 2021).

Shigang Li, Tal Ben-Nun, Giorgi Nadiradze, Salvatore Di Girolamo, Nikoli Dryden, Dan Alistarh,
Torsten Hoefler: "Breaking (Global) Barriers in Parallel Stochastic Optimization with
Wait-Avoiding Group Averaging". Rule (docs/algorithms.md, "WAGMA-SGD"), iteration t at rank i::

    B_i <- x_i                                  publish the current model
    sync round (t % period == period - 1):      x_i <- mean over ALL ranks of B_j  (fresh, blocking)
    otherwise:                                  x_i <- (sum_{j in G_i(t)} B_j + x_i) / (S + 1)
                                                (B_j may be stale: a late member's progress thread
                                                 contributes the model it published last)
    x_i <- OPT(x_i, g_i)                        g_i was computed at the pre-average x_i

On the loop's hooks: the loop computes g_i at x_i, then calls ``after_backward``, which
publishes x_i (``ctx.params`` before the step), runs the round and overwrites ``ctx.params``
with the average; the loop's optimizer step then applies g_i to the averaged model. That is
the rule above, with no extra copy of the model. With emulated compute (no optimizer) the
same buffer is communicated and averaged; it just never changes otherwise.

Groups come from ``harness.schedules.wagma_phases`` (base-S digits, or the documented
mixed-radix rule when P is not a power of S); the wait avoidance (first arrival activates the
round, late members contribute their stale buffer through their progress thread, a late
caller takes the finished sum without waiting) is the native op's
(``Communicator.wait_avoiding``) with ``sync_every = period``: a synchronous round every
``period`` rounds, the paper's tau = ``period - 1`` group rounds between two of them;
``period: 1`` makes every round synchronous.

Example (a scenario ``algorithms`` entry)::

    - {name: wagma, group_size: 4, period: 11}
"""

from __future__ import annotations

import torch

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.params import WAGMAParams
from harness.schedules import wagma_phases


def wagma_average(group_sum: torch.Tensor, x: torch.Tensor, group_size: int, sync: bool) -> torch.Tensor:
    """Replace ``x`` (in place) by WAGMA's averaged model; return it.

    Args:
        group_sum: the round's sum of published models (this rank's own included); in a
            synchronous round the sum over all ranks of fresh models.
        x: this rank's current (fresh) model, the one it published for the round.
        group_size: S, the number of models in ``group_sum`` (all ranks in a synchronous round).
        sync: whether the round was synchronous.

    Synchronous round: ``x <- group_sum / P``. Group round: ``x <- (group_sum + x) / (S + 1)``,
    so an on-time rank's own model weighs 2 / (S + 1) and a late member's stale model
    1 / (S + 1) in the average of every member of its group.

    Caveat (docs/algorithms.md, "WAGMA-SGD"): this group rule is read off the reference
    TensorFlow op; the paper's algorithm box could not be consulted. It lives only here so it
    is easy to revisit.

    >>> wagma_average(torch.tensor([3.0]), torch.tensor([1.0]), 2, sync=False)
    tensor([1.3333])
    """
    if sync:
        return x.copy_(group_sum).div_(group_size)
    return x.add_(group_sum).div_(group_size + 1)


class WAGMA(Algorithm):
    """WAGMA-SGD on the loop's hooks: one wait-avoiding group round per iteration.

    ``staleness`` is this rank's own contribution staleness in the iteration's round: 0 when
    it published its model in time, d when its progress thread contributed the model it had
    published d rounds earlier. The group's maximum is not known locally (the other members'
    staleness lives on their ranks); it is the maximum over the group's rows of steps.csv.
    ``info`` is the native round's info of the last iteration (round, sync, group_size,
    staleness, joined_early).
    """

    name = "wagma"
    #: ``staleness`` of iteration t is the contribution staleness of wait-avoiding round t (a
    #: trace-driven simulation with values replays the real run's contributions from it)
    round_staleness = True

    def __init__(self, params: WAGMAParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        self.sync_every = params.period
        self.phases = wagma_phases(ctx.rank, ctx.size, params.group_size)
        self.info: dict = {}
        self._sum = torch.empty_like(ctx.params)
        # Collective. The initial buffer is what a member that is late for round 0 contributes.
        self._op = ctx.comm.wait_avoiding(ctx.params, phases=self.phases, sync_every=self.sync_every)

    def after_backward(self, t: int) -> None:
        info = self._op.round(self.ctx.params, self._sum)  # publishes the pre-step model
        if info["round"] != t:
            raise RuntimeError(f"wagma: iteration {t} ran round {info['round']} (one round per iteration)")
        wagma_average(self._sum, self.ctx.params, int(info["group_size"]), bool(info["sync"]))
        self.info = info
        self.staleness = int(info["staleness"])

    def finish(self) -> None:
        self._op.close()  # collective: returns once every rank has run all its rounds
