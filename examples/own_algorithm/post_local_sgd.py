"""Post-local SGD: Allreduce-SGD to begin with, Local SGD from iteration ``switch_at`` on.

Lin, Stich, Patel, Jaggi: "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020. Local SGD
from the very first step can hurt where the loss changes fastest, early in training; large-batch
training (averaging the gradients every step) tends to generalize worse late in training. So
the paper starts like Allreduce-SGD and turns into Local SGD at a switch point:

    t <  switch_at:  the gradient is averaged over the ranks, then the local optimizer step
    t >= switch_at:  local optimizer steps; after the step of every ``period``-th iteration
                     since the switch, every rank's model becomes the mean of all ranks' models

Up to the switch all ranks hold the same model, so the local phase starts from a synchronized
model, and its first average comes after exactly ``period`` local steps: the built-in Local
SGD's rule ``(t + 1) % period == 0`` (``harness.schedules.periodic_sync``), with t counted from
``switch_at``. Hence ``switch_at: 0`` is the built-in ``local_sgd`` with the same period, and
``switch_at`` at or beyond the run's iterations is the built-in ``allreduce_sgd``.

scenario.yaml beside this file names the class as ``class: "post_local_sgd:PostLocalSGD"``;
``python -m harness run``, ``simulate`` and ``compare`` run it with no other code. It
communicates only through ``ctx.comm``, creates no buffers, and decides when to communicate from
the iteration number alone, never from the model's values, so the simulator runs this very code
(harness/algorithms/base.py states the contract).
"""

from __future__ import annotations

from harness.algorithms import Algorithm, AlgorithmParams, NonNegativeInt, PositiveInt


class PostLocalSGD(Algorithm):
    """Gradient averaging for ``switch_at`` iterations, then periodic model averaging."""

    class Params(AlgorithmParams):
        """The keys a scenario entry may set besides ``name`` and ``class``, with their defaults."""

        switch_at: NonNegativeInt = 20  # t': iterations of Allreduce-SGD before the switch
        period: PositiveInt = 4  # H: local steps from one model average to the next after it

    label = "Post-local SGD"  # in figures; without it, the scenario's name

    def local_phase(self, t: int) -> bool:
        """Whether iteration t runs Local SGD (the same answer on every rank)."""
        return t >= self.params.switch_at

    def averages_models(self, t: int) -> bool:
        """Whether iteration t ends a period of local steps (counted from the switch)."""
        return self.local_phase(t) and (t - self.params.switch_at + 1) % self.params.period == 0

    def after_backward(self, t: int) -> None:
        # Before the switch: every rank steps with the mean gradient, as Allreduce-SGD.
        if not self.local_phase(t):
            self.ctx.comm.allreduce(self.ctx.grads, op="mean")

    def after_step(self, t: int) -> None:
        # After the switch: average the stepped models at the end of every period-th local step.
        if self.averages_models(t):
            self.ctx.comm.allreduce(self.ctx.params, op="mean")
