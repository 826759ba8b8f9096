"""A dataset of the example's own: seeded synthetic images of CIFAR's shape (3 x 32 x 32).

scenario.yaml names it as ``dataset: "data:textures"``. The harness calls it on every rank as

    textures(seed=S, **dataset_args)

and every rank must get the same data: draw everything from ``seed`` (the harness also seeds
torch, NumPy and random around the call). It returns (train_x, train_y, test_x, test_y):
inputs float N x C x H x W, labels int64 in 0 .. K-1. Returning a pair (train, test) of
map-style torch Datasets of (input, label) items works too (e.g. torchvision.datasets.CIFAR10
with a ToTensor transform, on data already on disk); they are read into memory once.

Each class is a striped texture at its own angle; every image has a random stripe frequency,
phase and colour, plus noise, so a CNN has to learn orientation (colour tells nothing).
"""

from __future__ import annotations

import math

import torch


def textures(seed: int, num_samples: int = 2000, num_classes: int = 6, noise: float = 2.5,
             size: int = 32, test_fraction: float = 0.2) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(num_samples) % num_classes
    labels = labels[torch.randperm(num_samples, generator=g)]
    angle = labels * math.pi / num_classes + 0.1 * torch.randn(num_samples, generator=g)
    freq = 0.08 + 0.12 * torch.rand(num_samples, generator=g)  # cycles per pixel
    phase = 2 * math.pi * torch.rand(num_samples, generator=g)
    colour = torch.rand(num_samples, 3, generator=g) + 0.2

    yy, xx = torch.meshgrid(torch.arange(size, dtype=torch.float32), torch.arange(size, dtype=torch.float32),
                            indexing="ij")
    along = xx * torch.cos(angle)[:, None, None] + yy * torch.sin(angle)[:, None, None]  # N x H x W
    stripes = torch.sin(2 * math.pi * freq[:, None, None] * along + phase[:, None, None])
    images = colour[:, :, None, None] * stripes[:, None] + noise * torch.randn(num_samples, 3, size, size, generator=g)

    cut = int(num_samples * (1 - test_fraction))
    return images[:cut], labels[:cut], images[cut:], labels[cut:]
