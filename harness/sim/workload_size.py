"""How many floats an algorithm communicates, computed without torch.

The simulator must not import torch, so the parameter count of each model of
``harness.workload.models`` is derived here from the layer shapes;
``tests/test_sim_workload_size.py`` pins every (model, dataset) pair to the count of the real
torch model, so the two cannot drift apart.
"""

from __future__ import annotations

from harness.scenario.schema import Scenario

# (channels, height, width), classes of each dataset as harness.workload.data loads it
DATASET_SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {
    "mnist5k": ((1, 28, 28), 10),
    "digits": ((1, 8, 8), 10),
    "synthetic": ((1, 28, 28), 10),  # make_synthetic's defaults, which scenarios use
}
MLP_HIDDEN = (128, 128)  # harness.workload.models.MLP_HIDDEN (pinned by the test)


def _linear(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def _conv(c_in: int, c_out: int, k: int = 3, bias: bool = True) -> int:
    return c_in * c_out * k * k + (c_out if bias else 0)


def _resnet20(c: int, classes: int) -> int:
    total = _conv(c, 16, bias=False) + 2 * 16  # stem conv + BatchNorm weight and bias
    in_planes = 16
    for planes in (16, 32, 64):
        for _ in range(3):
            total += _conv(in_planes, planes, bias=False) + 2 * planes
            total += _conv(planes, planes, bias=False) + 2 * planes
            in_planes = planes
    return total + _linear(64, classes)


def parameter_count(model: str, dataset: str) -> int:
    """Trainable parameters of ``model`` built for ``dataset`` (flat buffer length)."""
    if dataset not in DATASET_SHAPES:
        raise ValueError(f"unknown dataset {dataset!r} (valid: {', '.join(DATASET_SHAPES)})")
    (c, h, w), classes = DATASET_SHAPES[dataset]
    if model == "logreg":
        return _linear(c * h * w, classes)
    if model == "mlp":
        total, width = 0, c * h * w
        for hidden in MLP_HIDDEN:
            total += _linear(width, hidden)
            width = hidden
        return total + _linear(width, classes)
    if model == "tiny_cnn":
        return _conv(c, 8) + _conv(8, 16) + _linear(16 * (h // 4) * (w // 4), classes)
    if model == "mnist_cnn":
        return _conv(c, 32) + _conv(32, 64) + _linear(64 * ((h - 4) // 2) * ((w - 4) // 2), 128) + _linear(128, classes)
    if model == "resnet20":
        return _resnet20(c, classes)
    raise ValueError(f"unknown model {model!r}")


def communicated_floats(scenario: Scenario) -> int:
    """Length of the flat buffer the algorithms communicate (``workload.params`` if set)."""
    w = scenario.workload
    return w.params or parameter_count(w.model, w.dataset)
