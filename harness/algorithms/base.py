"""The one interface every training algorithm implements: hooks the training loop calls.

The loop (``harness.runner.loop``) owns the data, the forward/backward pass and the local
optimizer step; an algorithm only decides what to communicate and when, through the native
layer's ``Communicator`` (never mpi4py). Time spent inside the hooks is recorded as time the
main thread was blocked in communication.

Per iteration t the loop calls, in this order::

    before_forward(t)    # e.g. apply a finished non-blocking average, pick the eval point
    <injected delay> <forward + backward>   (gradient in ctx.grads)
    after_backward(t)    # e.g. allreduce the gradient
    <optimizer step on ctx.params>
    after_step(t)        # e.g. average models every period
    end_iteration(t)

and ``finish()`` once after the last iteration (flush what is in flight, close persistent
operations) before the final evaluation.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness.algorithms.params import AlgorithmParams


@dataclass
class AlgorithmContext:
    """What an algorithm may use: the communicator and the flat model and gradient buffers.

    ``params`` and ``grads`` are 1-D float32 CPU tensors that the model's parameters and
    gradients are views into, so one collective moves the whole model. In the simulator the
    same hooks run on a simulated communicator with stand-in buffers that have the model's
    length but no values (``harness.sim.standin``, whose docstring says the two rules an
    algorithm must follow there).
    """

    comm: Any  # harness.comm.Communicator, or harness.sim.comm.SimCommunicator in the simulator
    params: Any  # torch.Tensor (harness.sim.standin.StandIn in the simulator)
    grads: Any  # torch.Tensor (StandIn in the simulator)
    lr: float
    seed: int

    rank: int = field(init=False)  # the communicator's, read once (hooks ask for it all the time)
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.rank = self.comm.rank
        self.size = self.comm.size


class Algorithm(ABC):
    """Base class: every hook defaults to doing nothing."""

    name: ClassVar[str]
    #: staleness of the model this rank used in the current iteration (-1: not applicable)
    staleness: int = -1

    def __init__(self, params: AlgorithmParams, ctx: AlgorithmContext) -> None:
        self.params = params
        self.ctx = ctx

    def before_forward(self, t: int) -> None:
        """Before the injected delay and the forward pass of iteration t."""

    def after_backward(self, t: int) -> None:
        """After the gradient of iteration t is in ``ctx.grads``, before the optimizer step."""

    def after_step(self, t: int) -> None:
        """After the optimizer step of iteration t."""

    def end_iteration(self, t: int) -> None:
        """Last thing in iteration t."""

    def finish(self) -> None:
        """After the last iteration: complete in-flight communication (collective)."""

    def eval_params(self) -> Any:
        """The flat model this rank would deploy (e.g. push-sum's de-biased model)."""
        return self.ctx.params
