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

The local optimizer (the algorithm entry's ``optimizer:``, else the scenario's: momentum SGD,
Adam, AdamW or the user's; ``harness.scenario.schema.Scenario.optimizer_of``) and
its state belong to the loop: the context has no optimizer, and no algorithm reads, sends,
averages or resets its state (momentum, Adam's moments), which stays rank-local, fresh per
algorithm. Algorithms change ``ctx.params`` in place under it (an average or mix is what the
next step starts from); gradient averaging hands every rank the same gradient, so the ranks'
states stay equal. ``ctx.lr`` is that optimizer's ``lr`` whatever the optimizer; BMUF, SlowMo
and Overlap Local SGD use it only as the unit of their momentum, so their models do not depend
on its value (docs/algorithms.md, "Local optimizer state").

Writing one: the public contract
--------------------------------

An algorithm of your own is one class, imported from ``harness.algorithms`` alone, and named in
a scenario by reference (``harness.algorithms.user_class``)::

    algorithms:
      # post_local_sgd.py beside the scenario file
      - {name: post_local, class: "post_local_sgd:PostLocalSGD", period: 4}

- Subclass :class:`Algorithm`. Declare the parameters as a class attribute ``Params``, a
  subclass of :class:`~harness.algorithms.params.AlgorithmParams` (a frozen, strict pydantic
  model; field types ``PositiveInt``, ``NonNegativeInt``, ``PositiveFloat``, ``NonNegativeFloat``
  and ``Literal``), with defaults (a field without one must be in every entry), and no ``name``
  field (the entry's name is filled in, so one class may be listed twice under two names).
  ``Params.check(ranks)`` raises ``ParamError(field, reason, value)`` for values that cannot
  work at that rank count. Optional class attributes: ``label`` (figures; default: the entry's
  name) and ``colour``.
- ``__init__(self, params, ctx)`` calls ``super().__init__(params, ctx)``, which sets
  ``self.params``, ``self.ctx`` and ``self.name`` (the entry's name, which results use). It runs
  on every rank before iteration 0: create buffers and persistent operations (collectives) here.
- Override the hooks you need (above); every rank runs the same hooks in the same iterations,
  so collectives match. Set ``self.staleness`` in an iteration where the model used was stale;
  override :meth:`Algorithm.eval_params` if the deployed model is not ``ctx.params``.
- The context (:class:`AlgorithmContext`) offers ``comm``, ``params`` and ``grads`` (the flat
  float32 model and gradient, modified in place), ``lr`` (the optimizer's), ``seed`` (the
  scenario's), ``rank`` and ``size``.
- Communicate only through ``ctx.comm`` (never mpi4py, threads or files): it is the native
  layer's ``harness.comm.Communicator`` on real ranks, a simulated one in the simulator, and a
  call log when ``results.comm_calls`` is on. An algorithm may use::

      rank, size
      allreduce(buf, op="sum"|"mean")   iallreduce(buf, op)  -> handle      (in place, all ranks)
      broadcast(buf, root=0)            ibroadcast(buf, root) -> handle
      barrier()                         ibarrier() -> handle
      exchange(send, recv, peer)        iexchange(send, recv, peer) -> handle   (both sides call it)
      push_channel(count)               -> .send(buf, peers, round=0) -> handle, .drain(out,
                                           min_messages=0, timeout=None, round=None) -> int,
                                           .pending(round=None), .flush(), .close(), .count
      wait_avoiding(initial, phases=, sync_every=, accumulate=False)
                                        -> .iround(buf, out, may_activate=True) -> handle,
                                           .round(buf, out, may_activate=True) -> dict, .close()
      pairwise_averager(initial)        -> .publish(buf), .irequest(buf, out, peer) -> handle,
                                           .drain(out) -> int, .close()
      handle.wait(timeout=None), handle.done(), handle.info()  (a wait-avoiding round's)

  (``harness.comm.communicator`` documents each; ``push_channel``, ``wait_avoiding`` and
  ``pairwise_averager`` are collective, and their ``close()`` too, so call it in ``finish()``.)
  Buffers are float32 tensors: ``ctx.params``, ``ctx.grads`` or buffers derived from them.
  ``set_links``, ``drain_records`` and ``close`` of the communicator belong to the harness.
- The simulator (``simulate``, ``compare``) runs the class's own code on a simulated
  communicator with no other code; it needs only the two rules of ``harness.sim.standin``:
  derive every buffer from the model (``torch.empty_like(x)``, ``x.new_empty(n)``,
  ``x.clone()``, slices; never ``torch.empty(n)``), and never let communication depend on the
  model's values (which operation, to whom, when to wait), which are 0.0 there. ``simulate``
  checks that before it predicts an algorithm of yours (``harness.sim.value_check``); with
  ``simulate --train`` the simulated buffers hold real values and the rule does not apply.
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

    #: the algorithm's name in the scenario and in results: ``params.name``, set by ``__init__``
    #: (the built-in classes also declare theirs as a class attribute)
    name: str
    #: figure label and colour of a class named in a scenario (None: the name, a spare colour)
    label: ClassVar[str | None] = None
    colour: ClassVar[str | None] = None
    #: staleness of the model this rank used in the current iteration (-1: not applicable)
    staleness: int = -1
    #: whether ``staleness`` at iteration t is the contribution staleness of the rank's
    #: wait-avoiding round t (one round per iteration); a trace-driven simulation with values
    #: then makes each round contribute what the real run's did (``harness.sim.payload.Published``)
    round_staleness: ClassVar[bool] = False

    def __init__(self, params: AlgorithmParams, ctx: AlgorithmContext) -> None:
        self.params = params
        self.ctx = ctx
        self.name = params.name  # one class may run under several scenario names

    def before_forward(self, t: int) -> None:  # noqa: B027  (an optional hook: a no-op unless overridden)
        """Before the injected delay and the forward pass of iteration t."""

    def after_backward(self, t: int) -> None:  # noqa: B027  (an optional hook: a no-op unless overridden)
        """After the gradient of iteration t is in ``ctx.grads``, before the optimizer step."""

    def after_step(self, t: int) -> None:  # noqa: B027  (an optional hook: a no-op unless overridden)
        """After the optimizer step of iteration t."""

    def end_iteration(self, t: int) -> None:  # noqa: B027  (an optional hook: a no-op unless overridden)
        """Last thing in iteration t."""

    def finish(self) -> None:  # noqa: B027  (an optional hook: a no-op unless overridden)
        """After the last iteration: complete in-flight communication (collective)."""

    def eval_params(self) -> Any:
        """The flat model this rank would deploy (e.g. push-sum's de-biased model)."""
        return self.ctx.params
