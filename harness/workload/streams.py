"""The random streams of a run: every one derived from the run seed and a fixed tag.

Each use (the train/test split, the shards, a rank's batch order, the synthetic data, the
teacher's parts) draws from ``numpy.random.SeedSequence([seed, tag, ...])`` with a tag of its
own, listed here once so that no two uses share a stream; every rank can recompute any other
rank's shard and batch order from them.
"""

from __future__ import annotations

import numpy as np

SPLIT_TAG = 1
SHARD_TAG = 2
BATCH_TAG = 3
SYNTHETIC_TAG = 4
TEACHER_WEIGHTS_TAG = 5  # the teacher network
TEACHER_BALANCE_TAG = 6  # the inputs its class offsets are fitted on
TEACHER_TEST_TAG = 7  # the test set
TEACHER_TRAIN_TAG = 8  # the training set, one stream per block: (TEACHER_TRAIN_TAG, block)


def stream(seed: int, *tags: int) -> np.random.Generator:
    """A generator for one purpose, independent of the streams with other tags."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), *map(int, tags)]))
