"""Which training samples each rank trains on, and in which order: shards and batch order.

Pure functions of the run seed (``harness.workload.streams``: a fixed tag per use), so every rank
can recompute any other rank's shard and batch order, and the simulator replays the real run's
batches without being told them.
"""

from __future__ import annotations

import numpy as np

from harness.workload.streams import BATCH_TAG, SHARD_TAG, stream


def shard_indices(num_train: int, ranks: int, rank: int, seed: int) -> np.ndarray:
    """Training-set indices of ``rank``'s shard: a seeded permutation cut into near-equal parts.

    The shards of all ranks are disjoint, cover ``range(num_train)`` and differ in size by at
    most one; any rank can compute any other rank's shard from the same arguments.
    """
    if ranks < 1 or not 0 <= rank < ranks:
        raise ValueError(f"need 0 <= rank < ranks, got rank={rank}, ranks={ranks}")
    if num_train < ranks:
        raise ValueError(f"{num_train} training samples cannot be split over {ranks} ranks")
    perm = stream(seed, SHARD_TAG).permutation(num_train)
    return np.array_split(perm, ranks)[rank].astype(np.int64)


def _epoch_order(shard: np.ndarray, epoch: int, seed: int, rank: int) -> np.ndarray:
    return shard[stream(seed, BATCH_TAG, rank, epoch).permutation(len(shard))]


def batch_indices(shard: np.ndarray, batch_size: int, iteration: int, seed: int, rank: int) -> np.ndarray:
    """Training-set indices of ``rank``'s minibatch at ``iteration``: a pure function.

    Sample position ``iteration * batch_size`` in an endless stream in which every epoch is
    a fresh seeded permutation of the shard; a batch that crosses an epoch boundary takes the
    tail of one epoch and the head of the next, so every sample is seen once per epoch.
    """
    return ShardBatches(shard, batch_size, seed, rank).at(iteration)


class ShardBatches:
    """:func:`batch_indices` of one rank, iteration after iteration, keeping the permutation of
    the epoch it is in: the simulator asks for thousands of ranks' batches every iteration, and
    a fresh permutation per batch cost more than a small model's step."""

    def __init__(self, shard: np.ndarray, batch_size: int, seed: int, rank: int) -> None:
        self.shard = np.asarray(shard)
        if batch_size < 1 or len(self.shard) == 0:
            raise ValueError("need batch_size >= 1, iteration >= 0 and a non-empty shard")
        self.batch_size, self.seed, self.rank = batch_size, seed, rank
        self._epoch, self._order = -1, self.shard

    def _order_of(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._epoch, self._order = epoch, _epoch_order(self.shard, epoch, self.seed, self.rank)
        return self._order

    def at(self, iteration: int) -> np.ndarray:
        """The training-set indices of the batch of ``iteration``."""
        if iteration < 0:
            raise ValueError("need batch_size >= 1, iteration >= 0 and a non-empty shard")
        n = len(self.shard)
        epoch, offset = divmod(iteration * self.batch_size, n)
        parts = []
        remaining = self.batch_size
        while remaining > 0:
            take = self._order_of(epoch)[offset : offset + remaining]
            parts.append(take)
            remaining -= len(take)
            epoch, offset = epoch + 1, 0
        return (parts[0] if len(parts) == 1 else np.concatenate(parts)).astype(np.int64)
