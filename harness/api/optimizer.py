"""``DistributedOptimizer``: any ``torch.optim`` optimizer, made one of the harness's algorithms.

It drives the harness's loop order (``harness.runner.loop.Iterations``) from the calls a
PyTorch loop already makes:

- the first forward pass with gradients enabled after a step begins iteration t: an injected
  fault strikes, the algorithm's ``before_forward`` runs, the injected delay is slept;
- ``step()`` ends it: the gradient goes to the algorithm (``after_backward``, e.g. an
  allreduce), your optimizer steps, the injected compute factor stretches the local work,
  ``after_step``/``end_iteration`` run (e.g. model averaging), and the iteration is recorded.

Forward passes without gradients (``torch.no_grad()``, evaluation) and further forward passes
in the same iteration (gradient accumulation) do not begin an iteration.

The model's parameters and gradients become views into two flat buffers (zero-copy for the
communication; ``harness.workload.flat_params``), staged to and from the GPU on a GPU run as
the runner does (``harness.device.Staging``). The optimizer's state stays local: no algorithm
averages or resets it (docs/algorithms.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, NoReturn, overload

import torch

from harness.algorithms import algorithm_class
from harness.algorithms.base import AlgorithmContext
from harness.api.session import Run, ScriptError
from harness.comm.call_log import CallLog
from harness.device import Staging
from harness.local_costs import iteration_overhead_s
from harness.runner.clock import Clock
from harness.runner.evaluate import evaluate as evaluate_models
from harness.runner.evaluate import testing
from harness.runner.loop import Iterations
from harness.workload import flat_grads, flat_params

_WRAPPED = "_harness_distributed_optimizer"  # set on a wrapped model: wrapping twice is refused


class DistributedOptimizer(torch.optim.Optimizer):
    """Wrap ``optimizer`` (over ``model``'s parameters) as the algorithm of the open :class:`Run`.

    - ``zero_grad()`` zeroes the flat gradient in place (``.grad`` stay views; ``set_to_none``
      is accepted and ignored).
    - ``step(loss=None)``: the optimizer step with the algorithm's communication around it;
      ``loss`` (a tensor or float) goes into steps.csv.
    - ``synchronize()``: run the algorithm's gradient communication now, e.g. to clip the
      averaged gradient (as with Horovod); ``step()`` then does not run it again. Without it,
      clipping between ``backward()`` and ``step()`` clips this rank's own gradient.
    - ``evaluate(test)``: collective; averages the ranks' models and calls ``test(model)`` ->
      ``(loss, accuracy)`` on rank 0 for the averaged model and for rank 0's own, as the
      harness's evaluations do; the last one is the summary's final accuracy.
    - ``param_groups``, ``state``, ``state_dict()``/``load_state_dict()`` are the wrapped
      optimizer's, so learning-rate schedulers and checkpoints work as usual; the algorithms
      that use the learning rate (BMUF, Overlap Local SGD) see the current one of the first group.

    At construction (collective) every rank checks that all ranks have the same parameter shapes,
    and rank 0's parameters and buffers are broadcast so that every rank starts from one model.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, run: Run | None = None) -> None:
        if isinstance(optimizer, DistributedOptimizer):
            raise ScriptError("this optimizer is already a harness.api.DistributedOptimizer: wrap it once")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ScriptError(f"DistributedOptimizer wraps a torch.optim.Optimizer (got {type(optimizer).__name__})")
        if not isinstance(model, torch.nn.Module):
            raise ScriptError(
                f"DistributedOptimizer needs the model (a torch.nn.Module) too (got {type(model).__name__})"
            )
        if getattr(model, _WRAPPED, False):
            raise ScriptError("this model already has a DistributedOptimizer: wrap one optimizer per model, once")
        run = run if run is not None else Run.current()
        if run.optimizer is not None:
            raise ScriptError("this Run already has a DistributedOptimizer: one per Run (one algorithm, one model)")
        self.run, self.model, self.inner = run, model, optimizer
        _check_optimizer_covers(optimizer, model)
        try:
            params, grads = flat_params(model), flat_grads(model)
        except TypeError as exc:
            raise ScriptError(f"the model's parameters: {exc}") from None
        _check_same_model(run, model)
        self.staging = Staging.of(params, grads)
        self._broadcast_model(params)
        self.model_floats = int(params.numel())
        s = run.scenario
        # workload.node / workload.staging: slept after the gradient, as the harness's own loop does
        self._overhead_s = iteration_overhead_s(s.workload, self.model_floats, self.staging.staged)
        striking = run.faults.striking(run.comm, run.algorithm)  # strikes after posting (during: communication)
        self.call_log = CallLog(striking) if s.results.comm_calls else None
        comm = striking if self.call_log is None else self.call_log
        self.ctx = AlgorithmContext(comm, self.staging.host_params, self.staging.host_grads, self._lr(), s.seed)
        self.algorithm = algorithm_class(run.algorithm)(run.algorithm_params, self.ctx)
        self.evals: list = []
        self.t = 0  # the iteration under way (or next)
        self._began = self._backward = self._synchronized = self._finished = False
        self._local_costs_paid = False
        self._delay = 0.0
        self._factor = 1.0
        self._compute_start = 0.0
        self._hooks = [model.register_forward_pre_hook(self._on_forward)]
        self._hooks += [
            p.register_post_accumulate_grad_hook(self._on_gradient) for p in model.parameters() if p.requires_grad
        ]
        setattr(model, _WRAPPED, True)
        run.optimizer = self
        self.clock = Clock.synchronize(run.world)  # every rank's offset from rank 0's clock, for run.json too
        run.comm.barrier()
        self.t0 = self.clock.origin()  # one instant on every rank: times - t0 are on rank 0's clock
        self.loop = Iterations(self.algorithm, comm, time.monotonic, run.beat, run.faults)  # drops set-up records

    # -- what torch.optim users expect ---------------------------------------------------------
    @property
    def param_groups(self):  # schedulers read and set the learning rate here
        return self.inner.param_groups

    @param_groups.setter
    def param_groups(self, value) -> None:
        self.inner.param_groups = value

    @property
    def state(self):
        return self.inner.state

    @property
    def defaults(self):
        return self.inner.defaults

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise ScriptError(
            "add_param_group: the algorithm communicates the parameters the model had when it was "
            "wrapped; build the optimizer with all its groups before wrapping it"
        )

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.run.algorithm}, {self.inner!r})"

    def zero_grad(self, set_to_none: bool = True) -> None:
        flat_grads(self.model).zero_()  # re-seats .grad as views if something set them to None

    # -- the iteration ---------------------------------------------------------------------------
    def _on_forward(self, module, args) -> None:
        if self._began or not torch.is_grad_enabled():
            return
        if self._finished:
            raise ScriptError("a training forward pass after the run finished (finish() or the end of the Run)")
        t = self.t
        delays, factors = self.run.plan.at(t)
        self._delay, self._factor = float(delays[self.run.rank]), float(factors[self.run.rank])
        self.ctx.lr = self._lr()
        self.loop.begin(t)
        self.staging.params_to_device()  # before_forward may have changed the parameters
        if self._delay > 0:
            self.loop.beat.expect(self._delay)
            time.sleep(self._delay)
        self._began, self._backward, self._synchronized = True, False, False
        self._local_costs_paid = False
        self._compute_start = time.monotonic()

    def _on_gradient(self, param) -> None:
        self._backward = True

    def _check_ready(self, what: str) -> None:
        if not self._began:
            raise ScriptError(
                f"{what} without a forward pass since the last step (iteration {self.t}): run the "
                "model on a batch with gradients enabled first"
            )
        if not self._backward:
            raise ScriptError(
                f"{what} without a backward pass since the forward pass of iteration {self.t}: call "
                "loss.backward() first"
            )

    def synchronize(self) -> None:
        """The algorithm's gradient communication (``after_backward``) now, before ``step()``."""
        self._check_ready("synchronize()")
        if self._synchronized:
            raise ScriptError(f"synchronize() called twice in iteration {self.t}")
        self._gradient_to_algorithm()
        self._synchronized = True

    def _pay_local_costs(self) -> None:
        """Sleep ``harness.local_costs``' node combine and staging, once per iteration."""
        if self._overhead_s > 0 and not self._local_costs_paid:
            time.sleep(self._overhead_s)
        self._local_costs_paid = True

    def _gradient_to_algorithm(self) -> None:
        self._pay_local_costs()
        flat_grads(self.model)  # .grad replaced (zero_grad(set_to_none=True) elsewhere): copied back in
        self.staging.grads_to_host()
        self.loop.after_backward(self.t)
        self.staging.grads_to_device()

    # torch's Optimizer.step also takes a closure that re-evaluates the loss: refused here.
    @overload
    def step(self, closure: None = None, *, loss: Any = None) -> None: ...
    @overload
    def step(self, closure: Callable[[], float], *, loss: Any = None) -> NoReturn: ...
    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, *, loss: Any = None) -> None:
        if closure is not None:
            raise ScriptError("step(closure): optimizers that re-evaluate the loss (LBFGS) are not supported")
        self._check_ready("step()")
        t, staging = self.t, self.staging
        self._pay_local_costs()  # part of the gradient's local time, as in the harness's own loop
        gradient_s = time.monotonic() - self._compute_start
        if not self._synchronized:
            self._gradient_to_algorithm()
        s0 = time.monotonic()
        self.inner.step()
        staging.params_to_host()
        compute = gradient_s + time.monotonic() - s0
        if self._factor != 1.0:  # injected slowdown / jitter: stretch this rank's local work
            extra = compute * (self._factor - 1.0)
            if extra > 0:
                time.sleep(extra)
                compute += extra
        self.loop.after_step(t)
        staging.params_to_device()  # after_step may have averaged the parameters
        self.loop.end(t, compute, self._delay, _number(loss))
        self.t += 1
        self._began = False

    # -- evaluation and the end ------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, test) -> list:
        """Collective: test the ranks' averaged model and rank 0's own with ``test(model) -> (loss,
        accuracy)`` (called on rank 0 only); recorded as the harness's evaluations are."""
        if self._began:
            raise ScriptError(
                f"evaluate() inside iteration {self.t} (after its forward pass, before step()): evaluate between steps"
            )
        self.loop.evaluation(self.t)
        local = self.algorithm.eval_params()
        params, model = self.staging.device_params, self.model

        def test_flat(flat):
            with testing(model, params, flat.to(params.device)):
                loss, accuracy = test(model)
            return float(loss), float(accuracy)

        records = evaluate_models(
            self.run.eval_comm, self.run.algorithm, self.t, time.monotonic() - self.t0, local, test_flat
        )
        self.evals += records
        return records

    def finish(self) -> None:
        """Complete the algorithm's communication in flight (collective); the model then holds the
        model this rank would deploy (e.g. push-sum's de-biased one). The Run calls it at its end."""
        if self._finished:
            return
        self._finished = True
        self.loop.finish()
        final = self.algorithm.eval_params()
        if final is not self.staging.host_params:
            self.staging.host_params.copy_(final)
        self.staging.params_to_device()
        for hook in self._hooks:
            hook.remove()

    # -- helpers ---------------------------------------------------------------------------------
    def _lr(self) -> float:
        lr = self.inner.param_groups[0].get("lr", 0.0)
        return float(lr.item() if isinstance(lr, torch.Tensor) else lr)

    def _broadcast_model(self, params: torch.Tensor) -> None:
        """Rank 0's parameters and floating-point buffers to every rank: one starting model."""
        comm, staging = self.run.comm, self.staging
        staging.params_to_host()
        comm.broadcast(staging.host_params, root=0)
        staging.params_to_device()
        for buffer in self.model.buffers():
            if buffer.is_floating_point() and buffer.numel() > 0:
                host = buffer.detach().to("cpu", torch.float32).contiguous()
                comm.broadcast(host, root=0)
                buffer.copy_(host.to(buffer.device, buffer.dtype))


def _number(loss: Any) -> float:
    if loss is None:
        return math.nan
    return float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)


def _check_optimizer_covers(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    """The optimizer steps the model's trainable parameters (frozen ones it may leave alone) and
    nothing else: the algorithm communicates the model's parameters."""
    mine = {id(p) for p in model.parameters() if p.requires_grad}
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if stepped - {id(p) for p in model.parameters()}:
        raise ScriptError("the optimizer steps parameters that are not the model's: wrap the optimizer of this model")
    if mine - stepped:
        raise ScriptError(
            f"the optimizer leaves {len(mine - stepped)} of the model's trainable parameters alone: "
            "build it over model.parameters()"
        )


def _check_same_model(run: Run, model: torch.nn.Module) -> None:
    """Every rank has parameters of the same names and shapes (collective); ScriptError naming the
    first rank and parameter that differ from rank 0's."""
    mine = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    everyone = run.world.allgather(mine)
    for rank, theirs in enumerate(everyone):
        if theirs == everyone[0]:
            continue
        for i in range(max(len(theirs), len(everyone[0]))):
            a = everyone[0][i] if i < len(everyone[0]) else None
            b = theirs[i] if i < len(theirs) else None
            if a != b:
                raise ScriptError(
                    f"ranks have different models: parameter {i} is {_show(a)} on rank 0 but "
                    f"{_show(b)} on rank {rank}; every rank must build the same model"
                )


def _show(entry) -> str:
    return "missing" if entry is None else f"{entry[0]} {list(entry[1])}"
