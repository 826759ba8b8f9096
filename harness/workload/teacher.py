"""The built-in dataset ``teacher``: standard normal inputs labelled by a fixed random teacher
network, as large as the run needs.

Its training set is fixed per rank by default (weak scaling: 256 samples per rank; it takes the
scenario's rank count through its ``ranks`` parameter, ``harness.workload.data.with_ranks``) or
in total (``num_samples``); its test set is the same whatever the size, so that accuracies
compare across a sweep over ranks: what simulating thousands of training ranks needs.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.workload.names import DatasetFacts, WorkloadCodeError
from harness.workload.streams import (
    TEACHER_BALANCE_TAG,
    TEACHER_TEST_TAG,
    TEACHER_TRAIN_TAG,
    TEACHER_WEIGHTS_TAG,
    stream,
)

Splits = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

TEACHER_SAMPLES_PER_RANK = 256  # teacher's training samples per rank when dataset_args set no size
# Training samples are drawn in blocks of this many, block b from its own stream, so sample i
# is the same whatever the total: a larger run's training set extends a smaller one's.
TEACHER_BLOCK = 4096
# Standard deviation of the teacher's hidden pre-activations: tanh is mildly nonlinear there.
# Larger makes the task harder for the built-in models (on 65,536 samples mlp reaches about 70%
# after 1,000 iterations at 1.0, 78% at 0.5).
TEACHER_GAIN = 0.5
# The teacher's class offsets are fitted on this many seeded inputs, in this many rounds.
TEACHER_BALANCE_SAMPLES = 16384
TEACHER_BALANCE_ROUNDS = 30


@dataclass(frozen=True)
class _Teacher:
    """A one-hidden-layer tanh network whose argmax labels the inputs: logits
    ``tanh(x @ w1) @ w2 - offsets`` (float64)."""

    w1: np.ndarray  # (features, hidden)
    w2: np.ndarray  # (hidden, classes)
    offsets: np.ndarray  # (classes,)

    def logits(self, x: np.ndarray) -> np.ndarray:
        return np.tanh(x.astype(np.float64) @ self.w1) @ self.w2 - self.offsets

    def labels(self, x: np.ndarray) -> np.ndarray:
        return self.logits(x).argmax(axis=1).astype(np.int64)


def _make_teacher(seed: int, features: int, num_classes: int, hidden: int) -> _Teacher:
    """The teacher of ``seed``: random weights, then class offsets that balance its classes.

    The argmax of a random network favours some classes: centred logits alone still give one
    class of ten about 16% of the inputs and another 6%. So the offsets start at the mean
    logits and are then moved, round by round, by the log of each class's share over its fair
    share, measured on a fixed seeded sample; after that every class of ten holds 9-11% of
    fresh inputs (seeds 0-5, 16,384 inputs each). Nothing here depends on the training set's
    size or the ranks.

    The arithmetic is float64 so that a label does not flip between machines whose BLAS sums
    in another order: every rank labels its own copy, and in float32 the top two logits of a
    near-tie can swap with the rounding.
    """
    rng = stream(seed, TEACHER_WEIGHTS_TAG)
    w1 = rng.standard_normal((features, hidden)) * (TEACHER_GAIN / np.sqrt(features))
    w2 = rng.standard_normal((hidden, num_classes)) / np.sqrt(hidden)
    teacher = _Teacher(w1, w2, np.zeros(num_classes))
    inputs = stream(seed, TEACHER_BALANCE_TAG).standard_normal((TEACHER_BALANCE_SAMPLES, features))
    logits = teacher.logits(inputs)
    offsets, scale = logits.mean(axis=0), logits.std()
    for _ in range(TEACHER_BALANCE_ROUNDS):
        share = np.bincount((logits - offsets).argmax(axis=1), minlength=num_classes) / len(logits)
        offsets = offsets + 0.5 * scale * np.log(np.maximum(share, 1.0 / len(logits)) * num_classes)
    return _Teacher(w1, w2, offsets)


def _teacher_error(message: str) -> WorkloadCodeError:
    return WorkloadCodeError("dataset_args", f"teacher's dataset_args {message}")


def _count(name: str, value: Any) -> int:
    """``value`` as a positive int; WorkloadCodeError naming ``name`` when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise _teacher_error(f"need {name} to be an integer >= 1, got {value!r}")
    return int(value)


def teacher_train_size(num_samples: int | None, samples_per_rank: int | None, ranks: int | None) -> int:
    """Training samples of :func:`teacher`: ``num_samples`` when given (fixed in total, strong
    scaling), else ``samples_per_rank`` (default :data:`TEACHER_SAMPLES_PER_RANK`) times
    ``ranks`` (None: one rank), fixed per rank (weak scaling)."""
    if num_samples is not None and samples_per_rank is not None:
        raise _teacher_error(
            f"give both num_samples ({num_samples!r}) and samples_per_rank "
            f"({samples_per_rank!r}); give one: the total or the share of each rank"
        )
    ranks = 1 if ranks is None else _count("ranks", ranks)
    if num_samples is not None:
        total = _count("num_samples", num_samples)
        if total < ranks:
            raise _teacher_error(
                f"give num_samples={total}, fewer than the {ranks} ranks that each train on a shard of them"
            )
        return total
    per_rank = TEACHER_SAMPLES_PER_RANK if samples_per_rank is None else _count("samples_per_rank", samples_per_rank)
    return per_rank * ranks


def _teacher_shape(input_shape: Sequence[int]) -> tuple[int, int, int]:
    shape = tuple(input_shape) if isinstance(input_shape, (list, tuple)) else ()
    if len(shape) != 3 or not all(
        isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 1 for s in shape
    ):
        raise _teacher_error(f"need input_shape to be [C, H, W] of positive integers, got {input_shape!r}")
    return tuple(int(s) for s in shape)  # type: ignore[return-value]


def _teacher_train(
    seed: int, teacher: _Teacher, total: int, features: int, num_classes: int, label_noise: float
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``total`` training samples: inputs (float32, total x features) and labels.

    Block ``b`` (samples ``b * TEACHER_BLOCK`` on) comes from its own stream, which draws the
    block's inputs, then a uniform number and a random class per sample whatever
    ``label_noise``: so a sample's input never depends on the noise, and a larger noise
    relabels a superset of the samples a smaller one does. Memory: the result, plus one
    block's float64 temporaries.
    """
    x = np.empty((total, features), dtype=np.float32)
    y = np.empty(total, dtype=np.int64)
    for start in range(0, total, TEACHER_BLOCK):
        rng = stream(seed, TEACHER_TRAIN_TAG, start // TEACHER_BLOCK)
        block = rng.standard_normal((TEACHER_BLOCK, features), dtype=np.float32)
        relabel = rng.random(TEACHER_BLOCK) < label_noise
        random_labels = rng.integers(0, num_classes, TEACHER_BLOCK)
        labels = np.where(relabel, random_labels, teacher.labels(block))
        stop = min(start + TEACHER_BLOCK, total)
        x[start:stop] = block[: stop - start]
        y[start:stop] = labels[: stop - start]
    return x, y


def teacher(
    seed: int,
    input_shape: Sequence[int] = (1, 8, 8),
    num_classes: int = 10,
    num_samples: int | None = None,
    samples_per_rank: int | None = None,
    ranks: int | None = None,
    test_samples: int = 2000,
    hidden: int = 32,
    label_noise: float = 0.0,
) -> Splits:
    """Standard normal inputs labelled by a fixed random teacher network: a classification task
    as large as the run needs, whose test set is the same at every rank count.

    The built-in datasets hold a few thousand samples, a handful per rank at 1,024 ranks; this
    one grows with the ranks. Inputs are ``N x C x H x W`` float32 draws of a standard normal
    (not standardized further: already so, and the test set must not depend on the training
    set). A label is the argmax of a one-hidden-layer tanh network of ``hidden`` units, with
    offsets that balance its ``num_classes`` classes (:func:`_make_teacher`); ``label_noise``
    is the fraction of training labels replaced by uniformly random classes (which may be the
    right one). Test labels are the teacher's own, so test accuracy is agreement with it.

    Size: ``num_samples`` training samples in total (strong scaling), or ``samples_per_rank``
    times ``ranks`` (weak scaling; the harness passes the scenario's ``ranks``), never both;
    neither: 256 per rank. The teacher and the ``test_samples`` test samples come from streams
    of their own, and the training set is drawn in blocks of :data:`TEACHER_BLOCK` from
    streams of their own, so the test set is the same whatever the training size or ranks, and
    a larger training set begins with a smaller one.

    Memory and time: ``4 * C * H * W + 8`` bytes per sample, 264 at the default 1x8x8, and every
    rank holds the whole training set: 1,024 ranks x 256 samples is 262,144 samples, 69 MB,
    generated in 0.34 s on one core (1.3 us per sample); 65,536 ranks would be 4.4 GB.

    Learnability, measured with the built-in ``mlp`` on one rank, batch 32, momentum SGD at the
    scenario defaults (lr 0.05, momentum 0.9, weight decay 1e-4), seeds 0, 1 and 2, test
    accuracy (chance: 10%):

    ==========================  ================  =================
    training samples            300 iterations    1,000 iterations
    ==========================  ================  =================
    4,096 (16 ranks' worth)     70-73%            70-73%
    16,384                      70-72%            75-78%
    65,536                      68-72%            78-79%
    256 (one rank's share)      43-46%            44-47% (overfits)
    ==========================  ================  =================

    lr 0.1 (momentum 0.9) is noisier: 59-71% after 1,000 iterations. ``logreg`` learns it
    faster (84-87% after 1,000): the teacher is only mildly nonlinear (:data:`TEACHER_GAIN`).
    """
    shape = _teacher_shape(input_shape)
    classes = _count("num_classes", num_classes)
    if classes < 2:
        raise _teacher_error(f"need num_classes >= 2, got {num_classes!r}")
    if (
        isinstance(label_noise, bool)
        or not isinstance(label_noise, (int, float, np.integer, np.floating))
        or not 0.0 <= label_noise <= 1.0
    ):
        raise _teacher_error(f"need label_noise to be a fraction in [0, 1], got {label_noise!r}")
    total = teacher_train_size(num_samples, samples_per_rank, ranks)
    tests = _count("test_samples", test_samples)
    features = int(np.prod(shape))
    net = _make_teacher(seed, features, classes, _count("hidden", hidden))
    train_x, train_y = _teacher_train(seed, net, total, features, classes, float(label_noise))
    test_x = stream(seed, TEACHER_TEST_TAG).standard_normal((tests, features), dtype=np.float32)
    test_y = net.labels(test_x)
    return (
        torch.from_numpy(train_x.reshape(total, *shape)),
        torch.from_numpy(train_y),
        torch.from_numpy(test_x.reshape(tests, *shape)),
        torch.from_numpy(test_y),
    )


def teacher_facts(seed: int = 0, **dataset_args: Any) -> DatasetFacts:
    """What :func:`teacher` returns with ``dataset_args`` (``ranks`` among them), in numbers,
    without generating anything: what the simulator and the provenance estimate need at any
    rank count. TypeError or WorkloadCodeError where teacher would raise them for the sizes."""
    bound = inspect.signature(teacher).bind(seed, **dataset_args)
    bound.apply_defaults()
    a = bound.arguments
    train = teacher_train_size(a["num_samples"], a["samples_per_rank"], a["ranks"])
    return DatasetFacts(
        _teacher_shape(a["input_shape"]),
        _count("num_classes", a["num_classes"]),
        train + _count("test_samples", a["test_samples"]),
    )
