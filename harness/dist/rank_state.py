"""This rank's state, published every tick for its peers' look for a missing collective.

``state/RANK`` in the store (:mod:`harness.dist.watch_store`): ``counts`` (per group, how many
collectives of its main sequence it posted), ``sent`` and ``received`` ([peer, tag, how many]),
``stuck`` (its collectives of a main sequence pending longer than ``after_s``), ``blocked`` (the
operation its main thread waits in, read from the thread's innermost frame when that is the
backend's ``wait()``), ``end`` (how it finished: a key of
:data:`harness.dist.missing.FINISHED`), ``gone`` (the groups it destroyed), and ``seq``.
The counts and the groups destroyed are brought up to date from the batches as they are
published (:meth:`RankState.count`), so a state never claims an operation its batches do not.
The rules that read these states are :mod:`harness.dist.missing`.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from harness.dist.fingerprints import place_of, summary
from harness.dist.missing import FROM_ROOT, TO_ROOT
from harness.dist.posted import DESTROYED, PostedLog
from harness.dist.watch_store import PREFIX, WatchStore
from harness.dist.work import HarnessWork


class RankState:
    """This rank's state (module doc), kept by the watch thread from the batches it drains."""

    def __init__(self, rank: int, log: PostedLog, link: WatchStore, after_s: float) -> None:
        self.rank = rank
        self._log, self._link = log, link
        self.after_s = after_s
        main = threading.main_thread().ident
        assert main is not None  # the main thread has started
        self._main = main
        self._end: str | None = None  # how this rank finished: a key of harness.dist.missing.FINISHED
        self._counts: dict[str, int] = {}  # group -> collectives of its main sequence posted
        self._gone: set[str] = set()  # groups destroyed
        self._seq = 0

    def finished(self, how: str) -> None:
        """This rank's script has ended (``how``: a key of :data:`harness.dist.missing.FINISHED`): it
        posts nothing more. The first word stands."""
        if self._end is None:
            self._end = how

    def count(self, group: str, batch: list) -> list:
        """A group's batch as published; counts its main sequence, notes where it was destroyed."""
        entries = []
        count = self._counts.get(group, 0)
        for entry in batch:
            if entry[0] == DESTROYED:
                self._gone.add(group)
                if entry[1]:
                    self.finished("destroy_process_group")
                continue
            lineage, op, dtype, n = entry
            if group in self._gone:  # a group made again under the name of one destroyed
                self._gone.discard(group)
                count = 0
                if self._end == "destroy_process_group":
                    self._end = None
            if len(lineage) == 1 and lineage[0] >= count:
                count = lineage[0] + 1
            entries.append([place_of(lineage), op, dtype, n])
        self._counts[group] = count
        return entries

    def blocked(self) -> dict | None:
        """The operation this rank's main thread waits in, if it waits in the backend's ``wait()``
        (read from the thread's innermost frame); None while it does anything else."""
        frame = sys._current_frames().get(self._main)
        if frame is None or frame.f_code is not _wait_code():
            return None
        work = frame.f_locals.get("self")
        del frame
        if work is None or not work._handles or all(h.done() for h in work._handles):
            return None
        now = time.monotonic()
        p2p = getattr(work, "_p2p", None)
        if p2p is not None:
            peer, tag, n = p2p
            dtype, count = summary(work._result)
            src, dst = (peer, self.rank) if work._op == "recv" else (self.rank, peer)
            return {"kind": "m", "op": work._op, "src": src, "dst": dst, "tag": tag, "n": n, "dtype": dtype,
                    "count": int(count), "age": round(now - work._handles[0].times()[0], 2)}
        member = work.shapes[0][2] if work._op in FROM_ROOT | TO_ROOT and work.shapes else None
        return self._log.waited_collective(work._handles[0], now, member)

    def sample(self, publish: Callable[[], None]) -> dict:
        """This rank's state, published for its peers' watches. ``publish()`` (the batches) comes
        between what the state says this rank did and what it says it posted, so that whatever
        it posted before it finished, or began to wait, is counted."""
        end = self._end  # first: whatever this rank posted before it finished is in the batches drained below
        blocked = self.blocked()  # then: whatever it posted before it began to wait is too
        publish()
        stuck, sent, received = self._log.stuck_and_message_counts(time.monotonic(), self.after_s)
        self._seq += 1
        state = {"rank": self.rank, "seq": self._seq, "end": end, "gone": sorted(self._gone),
                 "counts": dict(self._counts), "sent": sent, "received": received, "stuck": stuck, "blocked": blocked}
        store = self._link.get()
        if store is not None:
            store.set(f"{PREFIX}/state/{self.rank}", json.dumps(state))
        return state


_WAIT_CODE: Any = None


def _wait_code() -> Any:
    """The code of ``HarnessWork._complete``: a thread whose innermost frame runs it waits in a work."""
    global _WAIT_CODE
    if _WAIT_CODE is None:
        _WAIT_CODE = HarnessWork._complete.__code__
    return _WAIT_CODE
