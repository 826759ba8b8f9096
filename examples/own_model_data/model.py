"""A small ResNet-style CNN, defined here and nowhere in the harness.

scenario.yaml names it as ``model: "model:small_resnet"`` (this file, function small_resnet).
The harness calls it on every rank as

    small_resnet(input_shape=(C, H, W), num_classes=K, **model_args)

with torch seeded, so every rank starts from the same weights; it must return a torch.nn.Module
with float32 parameters whose output for a batch of N inputs is (N, K) logits. BatchNorm is
fine: its running statistics are buffers, which stay local to each rank (only parameters are
averaged or exchanged by the algorithms).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Two 3x3 convolutions with BatchNorm, plus a shortcut (a 1x1 projection where the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def small_resnet(input_shape: tuple[int, int, int], num_classes: int, width: int = 16, blocks: int = 1) -> nn.Module:
    """A stem, three stages of ``blocks`` blocks (``width``, 2x and 4x channels; the last two
    halve the resolution), global average pooling and a linear head. ``width`` and ``blocks``
    come from the scenario's ``model_args``."""
    channels = input_shape[0]
    layers: list[nn.Module] = [nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    cin = width
    for stage, cout in enumerate((width, 2 * width, 4 * width)):
        for b in range(blocks):
            layers.append(Block(cin, cout, stride=2 if stage > 0 and b == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)
