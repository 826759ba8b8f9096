"""The local optimizer a scenario's ``optimizer:`` names, built over the model's flat parameters.

- ``sgd`` (the default): :class:`~harness.runner.flat_sgd.FlatSGD`, momentum SGD on the flat
  buffers themselves, with the numbers of ``torch.optim.SGD``.
- ``adam``, ``adamw``: ``torch.optim.Adam`` / ``AdamW`` over ``model.parameters()``, with the
  scenario's parameters and torch's choice of implementation (a loop over parameters on the CPU,
  ``foreach`` on a GPU).
- ``"module:callable"``: the user's, called as ``callable(params, lr=lr, **args)`` with the list of
  the model's parameters; it must return a ``torch.optim.Optimizer`` over (some of) them.

Why a torch optimizer works on the flat buffers: every parameter (and ``.grad``) of the model is a
view into one flat tensor (``harness.workload.flat_params`` / ``flat_grads``; on a GPU the device
side of ``harness.device.Staging``). torch optimizers update ``param`` in place (``add_``,
``addcdiv_``, ``_foreach_*_``, the fused kernels), and the loop zeroes gradients with
``zero_grad(set_to_none=False)``, which zeroes ``.grad`` in place, so the views survive and the
algorithms keep seeing the model through ``ctx.params``. Their state (Adam's moments) lives beside
the parameters on the model's device, is rank-local, and no algorithm touches it
(``harness.algorithms.base``). A user's optimizer is checked for that once, before a run
(:func:`check_optimizer`): one step on a small model must leave parameters and gradients views.

Cost: constructing the first ``torch.optim`` optimizer in a process imports ``torch._dynamo``
(about 1.5 s of CPU, once per rank process), which ``sgd`` never pays; ``adam``, ``adamw`` and a
user's optimizer pay it while the state is built, before any timed iteration. The first step of a
built-in one is also taken once per process on a throwaway tensor, so iteration 0 is not slower
for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from harness.errors import ParamError
from harness.runner.flat_sgd import FlatSGD
from harness.scenario.schema import (
    AdamOptimizer,
    ReferenceOptimizer,
    SGDOptimizer,
)
from harness.user_code import UserCodeError, first_line, load_reference
from harness.workload import flat_grads, flat_params

FIELD = ("optimizer", "name")
LocalOptimizer = FlatSGD | torch.optim.Optimizer

_TORCH_CLASSES = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
_warmed: set[tuple[str, str]] = set()  # (optimizer name, device type) whose first step was taken


def build_optimizer(spec: Any, model: torch.nn.Module, search_path: Sequence[str] = ()) -> LocalOptimizer:
    """The local optimizer ``spec`` (``scenario.optimizer``) names, over ``model``'s parameters,
    which must already be views into its flat buffers (``flat_params``/``flat_grads``; ``build_state``
    and ``Staging.of`` seat them). ``search_path`` is ``scenario.python_path``, where a user's module
    is looked for first. A user's optimizer that cannot be built raises ParamError at ``optimizer.name``."""
    if isinstance(spec, SGDOptimizer):
        return FlatSGD(
            flat_params(model),
            flat_grads(model),
            lr=spec.lr,
            momentum=spec.momentum,
            nesterov=spec.nesterov,
            weight_decay=spec.weight_decay,
        )
    if isinstance(spec, AdamOptimizer):  # AdamWOptimizer too; spec.name picks the torch class
        options = {
            "lr": spec.lr,
            "betas": tuple(spec.betas),
            "eps": spec.eps,
            "weight_decay": spec.weight_decay,
            "amsgrad": spec.amsgrad,
        }
        _warm_up(spec.name, options, flat_params(model).device)
        return _TORCH_CLASSES[spec.name](list(model.parameters()), **options)
    if isinstance(spec, ReferenceOptimizer):
        try:
            return _user_optimizer(spec, list(model.parameters()), search_path)
        except UserCodeError as exc:
            raise ParamError(FIELD, str(exc), spec.name) from None
    raise TypeError(f"not an optimizer section of a scenario: {spec!r}")


def _warm_up(name: str, options: dict[str, Any], device: torch.device) -> None:
    """Take the first step of a built-in optimizer kind, once per process and device type, on a
    throwaway parameter (the step's one-time set-up then falls outside the timed iterations)."""
    if (name, device.type) in _warmed:
        return
    w = torch.zeros(4, device=device, requires_grad=True)
    w.grad = torch.zeros_like(w)
    _TORCH_CLASSES[name]([w], **options).step()
    _warmed.add((name, device.type))


def _user_optimizer(
    spec: ReferenceOptimizer, params: list[torch.nn.Parameter], search_path: Sequence[str]
) -> torch.optim.Optimizer:
    """Import and call the user's callable; UserCodeError (one line) for everything that goes wrong."""
    factory = load_reference(spec.name, search_path)
    if not callable(factory):
        raise UserCodeError(f"{spec.name!r} is {_describe(factory)}, not a callable")
    try:
        optimizer = factory(params, lr=spec.lr, **spec.args)
    except (Exception, SystemExit) as exc:  # noqa: BLE001  a user's callable may raise anything
        raise UserCodeError(f"{spec.name}(params, lr={spec.lr!r}, **args) raised {first_line(exc)}") from None
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserCodeError(f"returned {_describe(optimizer)}, not a torch.optim.Optimizer")
    given = {id(p) for p in params}
    foreign = sum(id(p) not in given for group in optimizer.param_groups for p in group["params"])
    if foreign:
        raise UserCodeError(
            f"returned an optimizer over {foreign} tensor(s) that are not the model parameters it "
            "was given (optimize the given tensors themselves, not copies)"
        )
    return optimizer


def _describe(value: Any, limit: int = 60) -> str:
    text = repr(value)
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"a {type(value).__module__}.{type(value).__qualname__} ({text})"


# ---------------------------------------------------------------------------------------------
# the check before a run


def small_model() -> torch.nn.Module:
    """What :func:`check_optimizer` tries a user's optimizer on: weights and biases of two layers,
    seated as views into flat buffers like a run's model."""
    with torch.random.fork_rng(devices=[]):  # the same model every time, the caller's generator untouched
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    flat_params(model)
    flat_grads(model)
    return model


def check_optimizer(scenario: Any, model: torch.nn.Module | None = None) -> None:
    """Try a scenario's own optimizer (``optimizer.name: "module:callable"``) before any rank starts:
    import it, build it over ``model``'s parameters (default :func:`small_model`), take one step and
    zero the gradients as the loop does. Raises ParamError at ``optimizer.name`` when the module does
    not import, the attribute is missing, the callable raises or returns something other than a
    ``torch.optim.Optimizer`` over the parameters, its step raises, or the step or ``zero_grad``
    replaces parameter or gradient tensors instead of updating them in place. Built-in optimizers
    need no check."""
    _check_user_optimizer(scenario.optimizer, scenario.python_path, model)
    for i, algorithm in enumerate(scenario.algorithms):  # an entry's own optimizer (AlgorithmParams.optimizer)
        try:
            _check_user_optimizer(algorithm.optimizer, scenario.python_path, model)
        except ParamError as exc:
            raise exc.within("algorithms", i) from None


def _check_user_optimizer(spec: Any, search_path: Sequence[str], model: torch.nn.Module | None) -> None:
    if not isinstance(spec, ReferenceOptimizer):
        return
    model = small_model() if model is None else model
    grads = flat_grads(model)
    optimizer = build_optimizer(spec, model, search_path)
    views = _views(model)
    try:
        optimizer.zero_grad(set_to_none=False)
        grads.copy_(torch.randn(grads.shape, generator=torch.Generator().manual_seed(0)))  # as backward would
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    except (Exception, SystemExit) as exc:  # noqa: BLE001  a user's optimizer may raise anything
        raise ParamError(FIELD, f"the optimizer's step or zero_grad raised {first_line(exc)}", spec.name) from None
    if _views(model) != views:
        reason = (
            "the optimizer's step or zero_grad(set_to_none=False) replaced parameter or gradient tensors "
            "instead of updating them in place (they are views into the flat buffers the algorithms "
            "communicate)"
        )
        raise ParamError(FIELD, reason, spec.name)


def _views(model: torch.nn.Module) -> list[tuple[int, int | None]]:
    """Where each parameter and its gradient live: unchanged as long as both stay views."""
    return [(p.data_ptr(), None if p.grad is None else p.grad.data_ptr()) for p in model.parameters()]
