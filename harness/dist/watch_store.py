"""The mismatch watch's channel between ranks: the torch.distributed store.

The TCP store of ``init_process_group``: a channel that no stuck collective can block. Taken on
first use, once torch.distributed is initialized, and kept: it outlives ``destroy_process_group``
(on rank 0, whose process holds the store's server, it stays up for the peers' last batches).
Every key of the watch is under ``PREFIX``:

- ``watching``, ``exiting``, ``left``: how many ranks watch, are exiting, have made their last
  store call (:meth:`harness.dist.mismatch.MismatchWatch._at_exit`);
- ``log/CHANNEL/K``, ``end/CHANNEL``: the audit's batches and how many a channel holds
  (:mod:`harness.dist.exchange`); ``questions``, ``question/N``, ``fp/GROUP/PLACE/RANK``: the
  questions about stuck collectives and their answers (ibid.);
- ``state/RANK``: each rank's state (:mod:`harness.dist.rank_state`); ``named``: how many ranks
  claimed a verdict on a missing collective (:mod:`harness.dist.missing_look`).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

PREFIX = "harness/mismatch"
BACKEND = "harness"  # harness.dist.process_group.BACKEND (which imports the watch)


class WatchStore:
    """The store, taken on first use (:meth:`get`); ``store`` stays None until then."""

    def __init__(self) -> None:
        self.store: Any = None
        self.expect = 0  # how many ranks watch, when known (the default group is the backend's)

    def get(self) -> Any:
        """The store; None while torch.distributed is not initialized. Taking it counts this rank
        among those that watch (each waits at exit for the others)."""
        if self.store is None:
            if not dist.is_initialized():
                return None
            store = dist.distributed_c10d._get_default_store()  # kept: it outlives destroy_process_group
            store.add(f"{PREFIX}/watching", 1)  # the ranks that watch: each waits at exit for the others
            if dist.get_backend() == BACKEND:  # then every rank watches (each made the default group)
                self.expect = dist.get_world_size()
            self.store = store
        return self.store
