"""Ranks that call different collectives: named, not hung (under ``launch --scenario``).

Every collective a rank posts on the ``harness`` backend has a fingerprint: its operation, its
group, its place in the group's program order (the lineage tag, ``harness.dist.lineage``), the
dtype and element count of its tensors. Each rank keeps the fingerprints of its recent
collectives; nothing is exchanged while collectives complete.

A collective still not complete after ``after_s`` (a rank waits for a peer that posted something
else, or nothing) makes this rank ask its peers, through the torch.distributed store (the TCP
store of ``init_process_group``, a channel of its own that the stuck collective cannot block):
it publishes its fingerprint and a question naming the place. Every rank's watch thread (it
sleeps between looks, ``tick_s``) answers questions with the fingerprint of its collective at
that place, if it has posted one. When an answer differs in operation, dtype or (for operations
whose ranks must agree on it) element count, the rank prints an error naming both ranks, the
place, the operation and what differed, tells the watchdog it failed, and exits, so that
``launch`` ends the job with that message instead of waiting for the watchdog's timeout.

Not caught: point-to-point operations (they match by tag, not by place); ranks whose collectives differ only in dtype of the same byte size and complete
(nothing waits; the results are garbage), and a rank that never posts the collective at all
(it is only "not there yet"; the watchdog's timeout then names the stuck ranks).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

# Operations whose ranks must give the same element count (the others: uneven splits, root-only buffers).
SAME_COUNT = frozenset({"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
                        "reduce_scatter", "reduce_scatter_tensor", "barrier"})
POINT_TO_POINT = frozenset({"send", "recv"})
_KEEP = 4096  # fingerprints kept per rank
_PREFIX = "harness/mismatch"


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def fingerprint(op: str, group: str, world_ranks: list[int], lineage: tuple[int, ...], result: Any) -> dict:
    tensors = _tensors(result)
    return {"op": op, "group": group, "ranks": list(world_ranks), "place": ".".join(str(i) for i in lineage),
            "dtype": str(tensors[0].dtype).removeprefix("torch.") if tensors else "",
            "count": int(sum(t.numel() for t in tensors))}


def difference(mine: dict, theirs: dict) -> str | None:
    """What differs between two ranks' fingerprints of one place; None when they agree."""
    if mine["op"] != theirs["op"]:
        return "the operation"
    if mine["dtype"] and theirs["dtype"] and mine["dtype"] != theirs["dtype"]:
        return "the dtype"
    if mine["op"] in SAME_COUNT and mine["count"] != theirs["count"]:
        return "the element count"
    return None


def describe(rank: int, fp: dict) -> str:
    if fp["op"] == "barrier":
        return f"rank {rank} called barrier"
    return f"rank {rank} called {fp['op']} on {fp['count']} {fp['dtype']} elements"


class MismatchWatch:
    """One per process: records fingerprints, asks and answers through the store (module doc)."""

    def __init__(self, rank: int, on_mismatch: Callable[[str], None], after_s: float = 1.0,
                 tick_s: float = 0.5) -> None:
        self.rank = rank
        self.on_mismatch = on_mismatch
        self.after_s, self.tick_s = after_s, tick_s
        self._lock = threading.Lock()
        self._history: OrderedDict[tuple[str, str], dict] = OrderedDict()
        self._pending: dict[tuple[str, str], tuple[dict, list, float]] = {}
        self._asked: set[tuple[str, str]] = set()
        self._answered = 0  # questions of the store read so far
        self._store: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def posted(self, group: Any, group_name: str, work: Any) -> None:
        """``group`` (a HarnessProcessGroup) just made ``work``: remember its fingerprint.
        Point-to-point operations have no place in the program order (they match by tag): skipped."""
        if work._op in POINT_TO_POINT:
            return
        fp = fingerprint(work._op, group_name, group.world_ranks, work.lineage, work._result)
        key = (fp["group"], fp["place"])
        with self._lock:
            self._history[key] = fp
            if len(self._history) > _KEEP:
                self._history.popitem(last=False)
            self._pending[key] = (fp, list(work._handles), time.monotonic())
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="harness.dist mismatch watch", daemon=True)
                self._thread.start()

    def close(self) -> None:
        self._stop.set()

    # -- the watch thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self._look()
            except Exception:  # noqa: BLE001  (the store is gone: the group was destroyed; nothing to watch)
                if self._store is not None and self._stop.is_set():
                    return

    def _get_store(self) -> Any:
        if self._store is None:
            import torch.distributed as dist

            if not dist.is_initialized():
                return None
            self._store = dist.distributed_c10d._get_default_store()  # kept: it outlives destroy_process_group
        return self._store

    def _look(self) -> None:
        store = self._get_store()
        if store is None:
            return
        now = time.monotonic()
        with self._lock:
            for key in [k for k, (_, handles, _) in self._pending.items() if all(h.done() for h in handles)]:
                del self._pending[key]
            stuck = [(k, fp) for k, (fp, _, t) in self._pending.items() if now - t > self.after_s
                     and k not in self._asked]
        for key, fp in stuck:  # ask the peers about this place
            self._asked.add(key)
            store.set(f"{_PREFIX}/fp/{fp['group']}/{fp['place']}/{self.rank}", json.dumps(fp))
            n = store.add(f"{_PREFIX}/questions", 1)
            store.set(f"{_PREFIX}/question/{n}", json.dumps([fp["group"], fp["place"], self.rank]))
        asked = store.add(f"{_PREFIX}/questions", 0)
        while self._answered < asked:  # answer every question whose place this rank has posted
            n = self._answered + 1
            if not store.check([f"{_PREFIX}/question/{n}"]):
                break
            group, place, who = json.loads(store.get(f"{_PREFIX}/question/{n}"))
            self._answered = n
            with self._lock:
                mine = self._history.get((group, place))
            if mine is None or who == self.rank:
                continue
            store.set(f"{_PREFIX}/fp/{group}/{place}/{self.rank}", json.dumps(mine))
        for key in list(self._asked):  # compare the answers to this rank's questions
            with self._lock:
                mine = self._history.get(key)
            if mine is None:
                continue
            for peer in mine["ranks"]:
                name = f"{_PREFIX}/fp/{key[0]}/{key[1]}/{peer}"
                if peer == self.rank or not store.check([name]):
                    continue
                theirs = json.loads(store.get(name))
                what = difference(mine, theirs)
                if what is not None:
                    first, second = sorted([(self.rank, mine), (peer, theirs)], key=lambda x: x[0])
                    self.on_mismatch(
                        f"ranks {first[0]} and {second[0]} called different collectives at collective #{key[1]} of "
                        f"group {key[0]}: {describe(*first)}, {describe(*second)} ({what} differs)")
                    return


class CollectiveMismatchError(RuntimeError):
    """Ranks called different collectives at the same place of a group's program order."""


def fail(message: str, beat: Any) -> None:
    """On the watch thread: print the error, tell the watchdog, end this rank (the job follows)."""
    import os

    print(f"error: {message}", file=sys.stderr, flush=True)
    beat.failed(CollectiveMismatchError(message))
    sys.stdout.flush()
    os._exit(1)
