"""The local optimizer's section of a scenario: ``optimizer:``, and an algorithm entry's own.

``optimizer: {name: ...}`` picks the local optimizer; ``name`` defaults to ``sgd``, and a bare
string (``optimizer: adamw``) is short for ``{name: adamw}``. Every form has a float ``lr``, the
algorithms' ``ctx.lr``. The scenario's ``optimizer:`` applies to every algorithm; an ``algorithms``
entry may give its own (``harness.algorithms.params.AlgorithmParams.optimizer``), and the DiLoCo
family defaults to AdamW, its papers' inner optimizer. harness/runner/optimizers.py builds them.

Here rather than in ``harness.scenario.schema`` because the algorithms' parameter models use it
too, and the schema imports those.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag, field_validator, model_validator

from harness.errors import ParamError
from harness.strict_model import NonNegativeFloat, PositiveFloat, StrictModel
from harness.user_code import UserCodeError, check_reference, is_reference

BUILT_IN_OPTIMIZERS = ("sgd", "adam", "adamw")
Beta = Annotated[float, Field(ge=0.0, lt=1.0)]


class SGDOptimizer(StrictModel):
    """Local momentum SGD, the default: ``m <- mu*m + g + wd*x; x <- x - lr*m`` (optionally Nesterov)."""

    name: Literal["sgd"] = "sgd"
    """``sgd`` (the default when ``name`` is left out)."""
    lr: PositiveFloat = 0.05
    """Learning rate; also the algorithms' own learning rate where they use one."""
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    """Momentum factor mu; 0 is plain SGD."""
    nesterov: bool = False
    """Nesterov momentum (needs ``momentum`` > 0)."""
    weight_decay: NonNegativeFloat = 1e-4
    """L2 penalty wd, added to the gradient."""

    @model_validator(mode="after")
    def _nesterov_needs_momentum(self) -> SGDOptimizer:
        if self.nesterov and self.momentum == 0.0:
            raise ParamError("nesterov", "needs momentum > 0", self.nesterov).to_pydantic()
        return self


class AdamOptimizer(StrictModel):
    """``torch.optim.Adam`` with torch's parameters and defaults (weight decay added to the gradient)."""

    name: Literal["adam"]
    """``adam``."""
    lr: PositiveFloat = 1e-3
    """Learning rate; also the algorithms' own learning rate where they use one."""
    betas: Annotated[list[Beta], Field(min_length=2, max_length=2)] = [0.9, 0.999]  # noqa: RUF012  (pydantic copies it)
    """Decay rates of the running averages of the gradient and of its square, each in [0, 1)."""
    eps: NonNegativeFloat = 1e-8
    """Added to the denominator for numerical stability."""
    weight_decay: NonNegativeFloat = 0.0
    """L2 penalty, added to the gradient."""
    amsgrad: bool = False
    """Use the AMSGrad variant (the maximum of past squared-gradient averages)."""


class AdamWOptimizer(AdamOptimizer):
    """``torch.optim.AdamW``: Adam's parameters, with decoupled weight decay (torch's default 0.01)."""

    # The union's tag, narrowed to this class's own: a subclass on purpose (an AdamW spec is an
    # Adam spec with another default; harness.runner.optimizers checks isinstance AdamOptimizer).
    name: Literal["adamw"]  # type: ignore[assignment]
    """``adamw``."""
    weight_decay: NonNegativeFloat = 1e-2
    """Decoupled weight decay: the parameters shrink by lr * weight_decay each step."""


class ReferenceOptimizer(StrictModel):
    """The user's optimizer: ``name: "module:callable"``, called as ``callable(params, lr=lr, **args)``
    with the list of the model's parameters; it returns a ``torch.optim.Optimizer`` over them.

    ``lr`` is required: it is passed on and is the algorithms' ``ctx.lr``, so both agree.
    """

    name: str
    """The optimizer factory as an import reference ``"module:callable"`` (the module is looked
    up in the scenario's ``python_path`` first)."""
    lr: PositiveFloat
    """Learning rate, passed to the callable as ``lr=`` (required); also the algorithms' own
    learning rate where they use one."""
    args: dict[str, Any] = {}  # noqa: RUF012  (a pydantic field: each model copies its default)
    """Further keyword arguments of the callable (not ``params`` or ``lr``)."""

    @field_validator("name")
    @classmethod
    def _reference_form(cls, value: str) -> str:
        try:
            return check_reference(value)
        except UserCodeError as exc:
            raise ParamError((), str(exc), value).to_pydantic() from None

    @field_validator("args")
    @classmethod
    def _no_reserved_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        reserved = {"params": "the model's parameters are passed by the harness", "lr": "give it as optimizer.lr"}
        for key in value:
            if key in reserved:
                raise ParamError(key, reserved[key], value[key]).to_pydantic()
        return value


_OPTIMIZER_TAGS = {
    SGDOptimizer: "(sgd)",
    AdamOptimizer: "(adam)",
    AdamWOptimizer: "(adamw)",
    ReferenceOptimizer: "(reference)",
}


def _optimizer_name(value: Any) -> Any:
    """A bare name stands for ``{name: NAME}``; a ``name`` that is neither built in nor an import
    reference is refused here, by name (the union below could only say "no form matched")."""
    if isinstance(value, str):
        value = {"name": value}
    if isinstance(value, dict) and "name" in value:
        name = value["name"]
        if not (isinstance(name, str) and (name in BUILT_IN_OPTIMIZERS or is_reference(name))):
            reason = f"unknown optimizer (valid: {', '.join(BUILT_IN_OPTIMIZERS)}, or 'module:callable')"
            raise ParamError("name", reason, name).to_pydantic()
    return value


def _optimizer_form(value: Any) -> str | None:
    if isinstance(value, StrictModel):
        return _OPTIMIZER_TAGS.get(type(value))
    if not isinstance(value, dict):
        return None
    name = value.get("name", "sgd")
    return "(reference)" if is_reference(name) else f"({name})"


OptimizerSpec = Annotated[
    Annotated[
        Annotated[SGDOptimizer, Tag("(sgd)")]
        | Annotated[AdamOptimizer, Tag("(adam)")]
        | Annotated[AdamWOptimizer, Tag("(adamw)")]
        | Annotated[ReferenceOptimizer, Tag("(reference)")],
        Discriminator(
            _optimizer_form,
            custom_error_type="optimizer_form",
            custom_error_message="must be an optimizer name (sgd, adam, adamw or 'module:callable') "
            "or a mapping with `name:` and its parameters",
        ),
    ],
    BeforeValidator(_optimizer_name),
]
