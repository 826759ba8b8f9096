"""What this rank posted on the ``harness`` backend, as the mismatch watch's looks read it.

The posting threads write it (on the path of every operation: kept to a few dict updates under
one lock), the watch thread reads it (:mod:`harness.dist.mismatch`); the lock is this module's
alone, so every read and write of these records is here. Per collective: its fingerprint
(``(group, lineage)`` -> operation, dtype, element count; the last ``_KEEP`` or so) and, until
it completes, its handles and when it was posted. Per group: its world ranks and the channel its
batches go to. Per channel: the fingerprints not yet published (the audit's batches, drained by
:meth:`PostedLog.drain`). Per peer and tag: the sends and receives posted, and the fingerprints
of the last receives. And the peers' channels this rank reads: the batches of its successor in
each group, the sends to it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from typing import Any

from harness.dist.fingerprints import as_fingerprint, place_of, summary

DESTROYED = "destroyed"  # in a group's batch: the group was destroyed here (torch's destroy_process_group)
_KEEP = 1 << 16  # own fingerprints kept per rank (the audit compares within a few ticks)

Key = tuple[str, tuple[int, ...]]  # a collective: (group, lineage)


class PostedLog:
    """This rank's operations (module doc). ``on_post()`` is called, under the lock, after each
    operation or destroyed group is recorded (the watch starts its thread then)."""

    def __init__(self, rank: int, on_post: Callable[[], None]) -> None:
        self.rank = rank
        self._on_post = on_post
        self._lock = threading.Lock()
        # (group, lineage) -> (op, dtype, count), oldest first; a group's world ranks and channel
        self._history: dict[Key, tuple[str, str, int]] = {}
        self._groups: dict[str, tuple[list[int], str | None]] = {}
        self._pending: dict[Key, tuple[list, float]] = {}
        self._out: dict[str, list] = defaultdict(list)  # channel -> fingerprints not yet published
        self._reads: dict[str, tuple[int, str]] = {}  # channel read -> (its writer, its group; "": sends)
        self._sent: dict[tuple[int, int], int] = defaultdict(int)  # (dst, tag) -> sends posted
        self._received: dict[tuple[int, int], int] = defaultdict(int)  # (src, tag) -> receives posted
        self._recvs: OrderedDict[tuple[int, int, int], dict] = OrderedDict()  # (src, tag, n) -> fingerprint

    # -- the posting threads -----------------------------------------------------------------------
    def collective(self, group: Any, group_name: str, work: Any) -> None:
        """``group`` (a HarnessProcessGroup) just made ``work``, a collective: remember its fingerprint."""
        op = work._op
        dtype, count = summary(work._result)
        lineage = work.lineage
        key = (group_name, lineage)
        known = self._groups.get(group_name)
        with self._lock:
            if known is None:
                known = self._group(group_name, list(group.world_ranks))
            self._history[key] = (op, dtype, count)  # trimmed to _KEEP by drain
            self._pending[key] = (work._handles, time.monotonic())
            if known[1] is not None:
                self._out[known[1]].append((lineage, op, dtype, count))
            self._on_post()

    def message(self, work: Any, peer: int, tag: int) -> None:
        """A send to, or receive from, world rank ``peer`` with ``tag``: numbered among the two's."""
        dtype, count = summary(work._result)
        fp = {"op": work._op, "dtype": dtype, "count": int(count), "tag": int(tag)}
        with self._lock:
            if work._op == "send":
                n = self._sent[(peer, tag)]
                self._sent[(peer, tag)] = n + 1
                self._out[f"p/{self.rank}/{peer}"].append([tag, n, fp["dtype"], fp["count"]])
            else:
                n = self._received[(peer, tag)]
                self._received[(peer, tag)] = n + 1
                self._recvs[(peer, tag, n)] = fp
                if len(self._recvs) > _KEEP:
                    self._recvs.popitem(last=False)
                self._reads.setdefault(f"p/{peer}/{self.rank}", (peer, ""))
            work._p2p = (peer, int(tag), n)  # which message a wait in it waits for (RankState.blocked)
            self._on_post()

    def destroyed(self, group: Any, default: bool) -> None:
        """``group`` (a HarnessProcessGroup; ``default``: the default group) was destroyed: noted in
        order with the group's fingerprints, so a group made again under the same name starts afresh."""
        with self._lock:
            self._out[f"c/{group.description()}/{self.rank}"].append((DESTROYED, default))
            self._on_post()

    def _group(self, name: str, ranks: list[int]) -> tuple[list[int], str | None]:
        """A group seen for the first time (under the lock): its channel, and its successor's to read."""
        channel = None
        if len(ranks) > 1:
            channel = f"c/{name}/{self.rank}"
            successor = ranks[(ranks.index(self.rank) + 1) % len(ranks)]
            self._reads.setdefault(f"c/{name}/{successor}", (successor, name))
        known = self._groups[name] = (ranks, channel)
        return known

    # -- the watch thread ----------------------------------------------------------------------------
    def fingerprint(self, key: Key) -> dict | None:
        """This rank's fingerprint at ``key`` as the messages and the store show it; None if not posted."""
        with self._lock:
            entry = self._history.get(key)
        if entry is None:
            return None
        return as_fingerprint(entry[0], key[0], self._groups[key[0]][0], key[1], entry[1], entry[2])

    def receive(self, key: tuple[int, int, int]) -> dict | None:
        """The fingerprint of receive ``(src, tag, n)``, if posted (and still kept)."""
        with self._lock:
            return self._recvs.get(key)

    def channels_to_read(self) -> list[tuple[str, tuple[int, str]]]:
        """(channel, (its writer, its group; "" for sends)) of every peer's channel this rank reads."""
        with self._lock:
            return list(self._reads.items())

    def drain(self) -> dict[str, list]:
        """The fingerprints not yet published, per channel (now taken), oldest first; the oldest
        fingerprints beyond ``_KEEP`` go, in one pass now and then."""
        with self._lock:
            out, self._out = self._out, defaultdict(list)
            if len(self._history) > 2 * _KEEP:
                self._history = dict(list(self._history.items())[-_KEEP:])
        return out

    def newly_stuck(self, after_s: float, asked: set[Key]) -> list[Key]:
        """Forget the collectives completed; those pending longer than ``after_s`` not in ``asked``."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, (handles, _) in self._pending.items() if all(h.done() for h in handles)]:
                del self._pending[key]
            return [k for k, (_, t) in self._pending.items() if now - t > after_s and k not in asked]

    def stuck_and_message_counts(self, now: float, after_s: float) -> tuple[list[dict], list[list], list[list]]:
        """For this rank's state: its collectives of a main sequence pending longer than ``after_s``
        (as :meth:`_as_op` shows them), its [peer, tag, sends posted], its [peer, tag, receives posted]."""
        with self._lock:
            stuck = [self._as_op(key, now - t) for key, (handles, t) in self._pending.items()
                     if now - t > after_s and len(key[1]) == 1 and not all(h.done() for h in handles)]
            sent = [[peer, tag, n] for (peer, tag), n in self._sent.items()]
            received = [[peer, tag, n] for (peer, tag), n in self._received.items()]
        return [x for x in stuck if x is not None], sent, received

    def waited_collective(self, handle: Any, now: float, member: int | None) -> dict | None:
        """The pending collective one of whose handles is ``handle``, as the states show it (its
        root: the world rank of group rank ``member``, if given); None if none, or it is a hook's."""
        with self._lock:
            for key, (handles, t) in self._pending.items():
                if not any(h is handle for h in handles):
                    continue
                if len(key[1]) != 1:  # a hook's collective: not judged
                    return None
                root = -1
                if member is not None:
                    ranks = self._groups[key[0]][0]
                    root = ranks[member] if 0 <= member < len(ranks) else -1
                return self._as_op(key, now - t, root)
        return None

    def _as_op(self, key: Key, age: float, root: int = -1) -> dict | None:
        """A collective this rank posted, as the states show it (under the lock)."""
        entry = self._history.get(key)
        if entry is None:
            return None
        return {"kind": "c", "group": key[0], "ranks": self._groups[key[0]][0], "place": place_of(key[1]),
                "op": entry[0], "dtype": entry[1], "count": entry[2], "root": root, "age": round(age, 2)}
