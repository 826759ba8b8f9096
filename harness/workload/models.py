"""Models: the built-in model callables, building any model callable, flat parameter views.

A scenario's ``workload.model`` names a model callable: a built-in name or the user's own
``"module:callable"`` (``harness.workload.names``). :func:`build_model` calls it as
``callable(input_shape=(C, H, W), num_classes=K, **model_args)`` with torch seeded, so every
rank builds the same initial model; built-ins and the user's callables go through this one
path, and :func:`check_model` checks what a callable built.

Built-ins: ``logreg``, ``mlp``, ``tiny_cnn`` (a few thousand parameters, a few ms per step on
one core), ``mnist_cnn`` (the classic two-conv PyTorch MNIST example net) and ``resnet20``
(the CIFAR ResNet-20 of He et al. 2016, option A shortcuts, global average pooling so it
takes any input channels and size >= 4).

BatchNorm's running mean/var (``resnet20``'s, or a user model's) are buffers, not parameters:
they stay local to each rank and are never communicated (the flat parameter view holds
parameters only), so after model averaging each rank keeps its own statistics.
``mnist_cnn`` uses dropout, which draws from torch's global RNG (seed it per rank).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from harness.workload import names
from harness.workload.calls import call
from harness.workload.data import dataset_facts
from harness.workload.names import WorkloadCodeError

MODEL_NAMES: tuple[str, ...] = tuple(names.MODELS)

MLP_HIDDEN = (128, 128)


def logreg(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Multinomial logistic regression: one linear layer on the flattened input."""
    c, h, w = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, num_classes))


def mlp(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Two hidden ReLU layers of MLP_HIDDEN units."""
    c, h, w = input_shape
    layers: list[nn.Module] = [nn.Flatten()]
    width = c * h * w
    for hidden in MLP_HIDDEN:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def tiny_cnn(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Two narrow 3x3 convs with 2x2 pooling: about 9k parameters on MNIST, 2.5k on digits."""
    c, h, w = input_shape
    if min(h, w) < 4:
        raise ValueError(f"tiny_cnn needs inputs of at least 4x4, got {h}x{w}")
    return nn.Sequential(
        nn.Conv2d(c, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * (h // 4) * (w // 4), num_classes),
    )


def mnist_cnn(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """pytorch/examples mnist: conv32-conv64-maxpool-dropout-fc128-dropout-fc."""
    c, h, w = input_shape
    if min(h, w) < 6:
        raise ValueError(f"mnist_cnn needs inputs of at least 6x6, got {h}x{w}")
    return nn.Sequential(
        nn.Conv2d(c, 32, 3),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(0.25),
        nn.Flatten(),
        nn.Linear(64 * ((h - 4) // 2) * ((w - 4) // 2), 128),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(128, num_classes),
    )


class _BasicBlock(nn.Module):
    """ResNet basic block; option A shortcut (strided identity, zero-padded channels)."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.stride = stride
        self.extra_channels = planes - in_planes

    def _shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1 and self.extra_channels == 0:
            return x
        x = x[:, :, :: self.stride, :: self.stride]
        half = self.extra_channels // 2
        return F.pad(x, (0, 0, 0, 0, half, self.extra_channels - half))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self._shortcut(x))


class ResNet20(nn.Module):
    """CIFAR-style ResNet-20: 3 stages of 3 basic blocks (16/32/64 channels), ~0.27M params."""

    def __init__(self, in_channels: int, num_classes: int, blocks_per_stage: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        stages = []
        in_planes = 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(blocks_per_stage):
                stages.append(_BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
        self.stages = nn.Sequential(*stages)
        # Adaptive pooling makes the head independent of the input size.
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn(self.conv(x)))
        out = self.pool(self.stages(out))
        return self.fc(torch.flatten(out, 1))


def resnet20(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """:class:`ResNet20`, Kaiming-normal initialized."""
    c, h, w = input_shape
    if min(h, w) < 4:
        raise ValueError(f"resnet20 needs inputs of at least 4x4, got {h}x{w}")
    model = ResNet20(c, num_classes)
    for module in model.modules():
        # Kaiming-normal convs and head as in the reference CIFAR implementations.
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(module.weight)
    return model


def build_model(
    model: str,
    input_shape: Sequence[int],
    num_classes: int,
    seed: int,
    model_args: Mapping[str, Any] | None = None,
    search_path: Sequence[str] = (),
) -> nn.Module:
    """Build the model ``model`` names (a built-in name or ``"module:callable"``, its module
    looked up in ``search_path`` first) as ``callable(input_shape=(C, H, W),
    num_classes=num_classes, **model_args)``; its initial parameters depend only on the
    arguments and ``seed``.

    Torch's global RNG state is left as it was, so building a model does not perturb other
    seeded draws on the calling rank. Raises WorkloadCodeError naming the workload field at
    fault (the callable does not resolve, take these arguments or return a ``torch.nn.Module``,
    or raises).
    """
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 3:
        raise ValueError(f"input_shape must be (C, H, W), got {input_shape!r}")
    fn = names.resolve("model", model, search_path)
    built = call("model", model, fn, seed, {"input_shape": shape, "num_classes": int(num_classes)}, model_args or {})
    if not isinstance(built, nn.Module):
        raise WorkloadCodeError("model", f"{model} returned a {type(built).__name__}, not a torch.nn.Module")
    return built


def check_model(model: nn.Module, name: str, sample: torch.Tensor, num_classes: int) -> None:
    """WorkloadCodeError (field ``model``) unless ``model`` has float32 parameters (at least one)
    and maps ``sample`` (a batch of inputs) to ``(batch, num_classes)`` outputs."""
    params = list(model.named_parameters())
    if not params:
        raise WorkloadCodeError("model", f"{name} built a model without parameters: there is nothing to train")
    for pname, p in params:
        if p.dtype != torch.float32:
            raise WorkloadCodeError(
                "model",
                f"{name}: parameter {pname!r} is {p.dtype}; parameters must be "
                "float32 (the algorithms communicate float32 buffers)",
            )
    try:
        with torch.no_grad():
            out = model(sample)
    except Exception as exc:  # noqa: BLE001  the user's forward may raise anything
        text = str(exc).strip().splitlines()
        raise WorkloadCodeError(
            "model",
            f"{name}: forward pass on {len(sample)} training samples of shape "
            f"{tuple(sample.shape[1:])} raised {type(exc).__name__}"
            f"{': ' + text[0] if text else ''}",
        ) from None
    want = (len(sample), num_classes)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want or not out.is_floating_point():
        got = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else f"a {type(out).__name__}"
        raise WorkloadCodeError(
            "model",
            f"{name}: output for {len(sample)} samples is {got}; it must be float "
            f"logits of shape (batch, num_classes) = {want}",
        )


def scenario_model(scenario: Any, dataset: Any) -> nn.Module:
    """``scenario``'s initial model for ``dataset`` (its input shape and classes): the same on
    every rank, built on the CPU."""
    w = scenario.workload
    return build_model(
        w.model, tuple(dataset.input_shape), dataset.num_classes, scenario.seed, w.model_args, scenario.python_path
    )


def parameter_count(
    model: str,
    input_shape: Sequence[int],
    num_classes: int,
    model_args: Mapping[str, Any] | None = None,
    search_path: Sequence[str] = (),
) -> int:
    """Trainable parameters of ``model`` (its flat buffer's length), counted on a model built on
    the meta device (no memory, no arithmetic), or on the CPU when the callable cannot build on
    the meta device."""
    shape = tuple(int(s) for s in input_shape)
    model_args = dict(model_args or {})
    key = (model, shape, int(num_classes), tuple(search_path), json.dumps(model_args, sort_keys=True, default=repr))
    if key not in _PARAMETER_COUNTS:
        try:
            with torch.device("meta"):
                built = build_model(model, shape, num_classes, 0, model_args, search_path)
        except WorkloadCodeError:  # e.g. an initialization that reads tensor values; a real error recurs below
            built = build_model(model, shape, num_classes, 0, model_args, search_path)
        _PARAMETER_COUNTS[key] = sum(p.numel() for p in built.parameters())
    return _PARAMETER_COUNTS[key]


_PARAMETER_COUNTS: dict[tuple[Any, ...], int] = {}


def communicated_floats(scenario: Any) -> int:
    """Length of the flat buffer the algorithms communicate for ``scenario``: the workload's
    ``params`` if set (emulated compute at paper scale), else the model's own, sized for the
    dataset's input shape and classes (``dataset_facts``: a user's dataset is loaded for it,
    once per process).

    A bare ``Workload`` (no scenario around it) works for built-in datasets and the modules of
    ``sys.path``.
    """
    w = getattr(scenario, "workload", scenario)
    if w.params:
        return int(w.params)
    if not hasattr(scenario, "workload"):  # a bare workload: seed 0, no python_path
        scenario = SimpleNamespace(workload=w, seed=0, python_path=[])
    facts = dataset_facts(scenario)
    return parameter_count(w.model, facts.input_shape, facts.num_classes, w.model_args, scenario.python_path)


# --- Flat parameter and gradient buffers -----------------------------------------------------
#
# A communication layer wants the whole model (or gradient) as one contiguous buffer so that
# one allreduce/send moves it zero-copy. The helpers below re-seat every parameter (and
# gradient) as a view into one flat float32 tensor. In-place updates keep the views intact:
# torch.optim.SGD steps, ``load_state_dict`` (copies in place) and autograd accumulation into
# an existing ``.grad``. What breaks them is replacing the tensors: ``model.to(...)`` or
# ``optimizer.zero_grad(set_to_none=True)`` (torch's default). Both helpers detect that and
# re-seat the views, copying the current values in, so their result is always correct and
# zero-copy in steady state; use ``zero_grad(set_to_none=False)`` to stay zero-copy.

_FLAT_PARAMS_ATTR = "_harness_flat_params"
_FLAT_GRADS_ATTR = "_harness_flat_grads"


def _is_view(tensor: torch.Tensor | None, view: torch.Tensor) -> bool:
    return (
        tensor is not None
        and tensor.data_ptr() == view.data_ptr()
        and tensor.shape == view.shape
        and tensor.stride() == view.stride()
    )


def _flat_buffer(model: nn.Module, attr: str, params: list[nn.Parameter]) -> torch.Tensor:
    numel = sum(p.numel() for p in params)
    device = params[0].device if params else torch.device("cpu")
    flat = model.__dict__.get(attr)
    if not (isinstance(flat, torch.Tensor) and flat.numel() == numel and flat.device == device):
        flat = torch.zeros(numel, dtype=torch.float32, device=device)
        model.__dict__[attr] = flat  # plain attribute: not a buffer, not in state_dict
    return flat


def _params(model: nn.Module) -> list[nn.Parameter]:
    params = list(model.parameters())
    for p in params:
        if p.dtype != torch.float32 or p.device != params[0].device:
            raise TypeError("flat views need float32 parameters, all on one device")
    return params


def flat_params(model: nn.Module) -> torch.Tensor:
    """One contiguous float32 1-D tensor that every parameter of ``model`` is a view into.

    Writing to it changes the parameters and vice versa; order is ``model.parameters()``.
    """
    params = _params(model)
    flat = _flat_buffer(model, _FLAT_PARAMS_ATTR, params)
    offset = 0
    for p in params:
        view = flat[offset : offset + p.numel()].view_as(p)
        if not _is_view(p.data, view):
            view.copy_(p.data)
            p.data = view
        offset += p.numel()
    return flat


def flat_grads(model: nn.Module) -> torch.Tensor:
    """One contiguous float32 1-D tensor that every parameter's ``.grad`` is a view into.

    Parameters without a gradient get zeros; the layout matches :func:`flat_params`.
    """
    params = _params(model)
    flat = _flat_buffer(model, _FLAT_GRADS_ATTR, params)
    offset = 0
    for p in params:
        view = flat[offset : offset + p.numel()].view_as(p)
        if not _is_view(p.grad, view):
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad)
            p.grad = view
        offset += p.numel()
    return flat


def seat_flat(model: nn.Module, params: torch.Tensor, grads: torch.Tensor) -> None:
    """Make ``model``'s parameters and gradients views into the given flat buffers (1-D float32,
    the model's length; their values become the model's): what :func:`flat_params` and
    :func:`flat_grads` do with buffers of the model's own. The simulator seats every simulated
    rank's model into a row of its stacked replicas this way."""
    model.__dict__[_FLAT_PARAMS_ATTR] = params
    model.__dict__[_FLAT_GRADS_ATTR] = grads
    flat_params(model)
    flat_grads(model)


def configure_torch_threads(n: int) -> int:
    """Set torch's intra-op thread count (the runner uses 1 per rank) and return it."""
    if n < 1:
        raise ValueError(f"thread count must be >= 1, got {n}")
    torch.set_num_threads(int(n))
    return torch.get_num_threads()
