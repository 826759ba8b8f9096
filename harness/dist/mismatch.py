"""Ranks that call different collectives: named, not hung, not silently wrong.

Every operation a rank posts on the ``harness`` backend has a fingerprint: its operation, its
group, its place in the group's program order (the lineage tag, ``harness.dist.lineage``; for
point-to-point, its peer, tag and number among the messages between the two with that tag), the
dtype and element count of its tensors. One watch per process (:func:`current`; installed when
the backend creates its first group, under ``launch --scenario`` by the session, which also
tells the watchdog) checks them in two ways, on a thread of its own that sleeps between looks
(``tick_s``) and talks through the torch.distributed store (the TCP store of
``init_process_group``, a channel that no stuck collective can block):

- **Stuck**: a collective still not complete after ``after_s`` (a rank waits for a peer that
  posted something else, or nothing) makes this rank publish its fingerprint and a question
  naming the place; every rank answers questions with its fingerprint at that place, if it
  has posted one, and the asking rank compares.
- **Audit**: operations that complete can still disagree (a float32 and an int32 allreduce of
  the same size: nothing waits, the results are garbage; a receive larger than the message
  sent). Each rank publishes the fingerprints it posted, in batches per group (per peer for
  sends), every tick; in each group the member at group rank i reads and compares the batches
  of the member at i + 1 (each batch read by exactly one rank, which deletes it), and a
  receiver the sends it received.

A difference in operation, dtype or (for operations whose ranks must agree on it) element
count makes the rank that found it print an error naming both ranks, the place, the operation
and what differed, and end the process (``launch`` then ends the job with that message; a bare
``mpiexec`` ends the job when a rank exits). A difference is found within a tick or two of both
ranks posting. Not caught: a rank that never posts the collective its peers wait in (it is only
"not there yet"; under ``launch`` the watchdog's timeout names the stuck ranks), and outside
``launch`` a difference in the last tick before the program exits (``launch``'s session flushes
the audit at the end).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from typing import Any

import torch

# Operations whose ranks must give the same element count (the others: uneven splits, root-only buffers).
SAME_COUNT = frozenset({"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
                        "reduce_scatter", "reduce_scatter_tensor", "barrier"})
POINT_TO_POINT = frozenset({"send", "recv"})
_KEEP = 1 << 16  # own fingerprints kept per rank (the audit compares within a few ticks)
_PREFIX = "harness/mismatch"
_FLUSH_WAIT_S = 3.0  # at the end of a launch: how long to wait for a peer's last batch


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def summary(result: Any) -> tuple[str, int]:
    """(dtype name, element count) of an operation's tensors: what ranks must agree on. On the
    posting path of every collective, so the common case (a list of tensors) is direct."""
    if type(result) is list and len(result) == 1 and isinstance(result[0], torch.Tensor):
        tensors = result
        count = result[0].numel()
    else:
        tensors = _tensors(result)
        if not tensors:
            return "", 0
        count = sum(t.numel() for t in tensors)
    dtype = tensors[0].dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name, count


def place_of(lineage: tuple[int, ...]) -> str:
    return ".".join(str(i) for i in lineage)


def lineage_of(place: str) -> tuple[int, ...]:
    return tuple(int(i) for i in place.split(".")) if place else ()


def fingerprint(op: str, group: str, world_ranks: list[int], lineage: tuple[int, ...], result: Any) -> dict:
    return _as_dict(op, group, world_ranks, lineage, *summary(result))


def _as_dict(op: str, group: str, world_ranks: list[int], lineage: tuple[int, ...], dtype: str, count: int) -> dict:
    """A fingerprint as the messages and the store show it."""
    return {"op": op, "group": group, "ranks": list(world_ranks), "place": place_of(lineage), "dtype": dtype,
            "count": int(count)}


def difference(mine: dict, theirs: dict) -> str | None:
    """What differs between two ranks' fingerprints of one place; None when they agree."""
    if mine["op"] != theirs["op"]:
        return "the operation"
    if mine["dtype"] and theirs["dtype"] and mine["dtype"] != theirs["dtype"]:
        return "the dtype"
    if mine["op"] in SAME_COUNT and mine["count"] != theirs["count"]:
        return "the element count"
    return None


def p2p_difference(send: dict, recv: dict) -> str | None:
    """What differs between a send and the receive that took it; None when they agree."""
    if send["dtype"] != recv["dtype"]:
        return "the dtype"
    if send["count"] != recv["count"]:
        return "the element count"
    return None


def describe(rank: int, fp: dict) -> str:
    if fp["op"] == "barrier":
        return f"rank {rank} called barrier"
    return f"rank {rank} called {fp['op']} on {fp['count']} {fp['dtype']} elements"


def collective_message(key: tuple[str, str], a: tuple[int, dict], b: tuple[int, dict], what: str) -> str:
    first, second = sorted([a, b], key=lambda x: x[0])
    return (f"ranks {first[0]} and {second[0]} called different collectives at collective #{key[1]} of group "
            f"{key[0]}: {describe(*first)}, {describe(*second)} ({what} differs)")


class MismatchWatch:
    """One per process: records fingerprints, asks, answers and audits through the store (module doc).

    ``on_mismatch(message)`` is called on the watch thread when a difference is found.
    """

    def __init__(self, rank: int, on_mismatch: Callable[[str], None], after_s: float = 1.0,
                 tick_s: float = 0.5) -> None:
        self.rank = rank
        self.on_mismatch = on_mismatch
        self.after_s, self.tick_s = after_s, tick_s
        self._lock = threading.Lock()
        # (group, lineage) -> (op, dtype, count), oldest first; a group's world ranks and channel
        self._history: dict[tuple[str, tuple[int, ...]], tuple[str, str, int]] = {}
        self._groups: dict[str, tuple[list[int], str | None]] = {}
        self._pending: dict[tuple[str, tuple[int, ...]], tuple[list, float]] = {}
        self._asked: set[tuple[str, tuple[int, ...]]] = set()
        self._answered = 0  # questions of the store read so far
        # the audit: what this rank publishes, and whose batches it reads
        self._out: dict[str, list] = defaultdict(list)  # channel -> fingerprints not yet published
        self._published: dict[str, int] = defaultdict(int)  # channel -> batches published
        self._reads: dict[str, tuple[int, str]] = {}  # channel read -> (its writer, what kind)
        self._read: dict[str, int] = defaultdict(int)  # channel -> batches read
        self._waiting: dict[tuple, tuple[int, dict]] = {}  # a peer's fingerprint this rank has not posted yet
        self._sent: dict[tuple[int, int], int] = defaultdict(int)  # (dst, tag) -> sends posted
        self._received: dict[tuple[int, int], int] = defaultdict(int)  # (src, tag) -> receives posted
        self._recvs: OrderedDict[tuple[int, int, int], dict] = OrderedDict()  # (src, tag, n) -> fingerprint
        self._store: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the posting threads -----------------------------------------------------------------------
    def posted(self, group: Any, group_name: str, work: Any) -> None:
        """``group`` (a HarnessProcessGroup) just made ``work``: remember its fingerprint."""
        if work._op in POINT_TO_POINT:
            _, _, peer, tag = work.shapes[0]
            self._posted_p2p(work, group.world_ranks[peer], tag)
            return
        op = work._op
        dtype, count = summary(work._result)
        lineage = work.lineage
        key = (group_name, lineage)
        known = self._groups.get(group_name)
        with self._lock:
            if known is None:
                known = self._group(group_name, list(group.world_ranks))
            self._history[key] = (op, dtype, count)  # trimmed to _KEEP by the watch thread
            self._pending[key] = (work._handles, time.monotonic())
            if known[1] is not None:
                self._out[known[1]].append((lineage, op, dtype, count))
            if self._thread is None:
                self._start()

    def _group(self, name: str, ranks: list[int]) -> tuple[list[int], str | None]:
        """A group seen for the first time (under the lock): its channel, and its successor's to read."""
        channel = None
        if len(ranks) > 1:
            channel = f"c/{name}/{self.rank}"
            successor = ranks[(ranks.index(self.rank) + 1) % len(ranks)]
            self._reads.setdefault(f"c/{name}/{successor}", (successor, name))
        known = self._groups[name] = (ranks, channel)
        return known

    def _fingerprint(self, key: tuple[str, tuple[int, ...]]) -> dict | None:
        """This rank's fingerprint at ``key`` as the messages and the store show it; None if not posted."""
        with self._lock:
            entry = self._history.get(key)
        if entry is None:
            return None
        return _as_dict(entry[0], key[0], self._groups[key[0]][0], key[1], entry[1], entry[2])

    def _posted_p2p(self, work: Any, peer: int, tag: int) -> None:
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
            if self._thread is None:
                self._start()

    def _start(self) -> None:  # under the lock
        if self._thread is None:
            # Taken now, on the posting thread: a script that destroys its process group before
            # the first tick would otherwise leave the watch without the store (on rank 0, the
            # store's server: held here, it stays up for the peers' last batches).
            store = self._get_store()
            if store is not None:
                store.add(f"{_PREFIX}/watching", 1)  # rank 0 keeps the store up until this one stopped
            self._thread = threading.Thread(target=self._run, name="harness.dist mismatch watch", daemon=True)
            self._thread.start()
            atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        """Before the interpreter finalizes. The thread must not be inside a store call then (a
        C++ store torn down under it aborts the process), and rank 0, whose process holds the
        store's server, waits (up to ``_FLUSH_WAIT_S``) until every rank's watch has stopped
        using it (else their last calls fail with torch's warnings)."""
        self._stop_thread()
        store, self._store = self._store, None
        if store is None:
            return
        try:
            stopped = store.add(f"{_PREFIX}/stopped", 1)
            if self.rank == 0:
                deadline = time.monotonic() + _FLUSH_WAIT_S
                while stopped < store.add(f"{_PREFIX}/watching", 0) and time.monotonic() < deadline:
                    time.sleep(0.05)
                    stopped = store.add(f"{_PREFIX}/stopped", 0)
        except Exception:  # noqa: BLE001  the server is gone already: nothing left to protect
            pass

    def close(self, flush: bool = False) -> None:
        """Stop watching. ``flush`` (every rank at once, the store still up): publish what is
        left and read the peers' last batches first (up to ``_FLUSH_WAIT_S``)."""
        if flush and self._get_store() is not None:
            try:
                self._flush()
            except Exception as exc:  # noqa: BLE001  a store gone (a peer ended): the last batches go unread
                print(f"note: the collective mismatch audit could not read the last batches ({exc})",
                      file=sys.stderr)
        self._stop.set()

    def _flush(self) -> None:
        """Publish what is left, mark each channel's end, read the peers' last batches."""
        self._stop_thread()
        self._publish()
        store = self._store
        with self._lock:
            readers = list(self._reads)
        for channel in self._published:
            store.set(f"{_PREFIX}/end/{channel}", str(self._published[channel]))
        deadline = time.monotonic() + _FLUSH_WAIT_S
        for channel in readers:
            while time.monotonic() < deadline:
                self._audit()
                end = f"{_PREFIX}/end/{channel}"
                if store.check([end]) and self._read[channel] >= int(store.get(end)):
                    break
                time.sleep(self.tick_s / 5)
        self._audit()

    # -- the watch thread ------------------------------------------------------------------------
    def _stop_thread(self) -> None:
        """End the watch thread (its current look done: at most a few store calls)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=4 * self.tick_s)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self._look()
                self._publish()
                self._audit()
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

    def _publish(self) -> None:
        """This rank's fingerprints since the last tick, one batch per channel."""
        store = self._get_store()
        if store is None:
            return
        with self._lock:
            out, self._out = self._out, defaultdict(list)
            if len(self._history) > 2 * _KEEP:  # the oldest go, in one pass now and then
                self._history = dict(list(self._history.items())[-_KEEP:])
        for channel, batch in out.items():
            k = self._published[channel]
            if channel.startswith("c/"):
                batch = [[place_of(lineage), op, dtype, count] for lineage, op, dtype, count in batch]
            store.set(f"{_PREFIX}/log/{channel}/{k}", json.dumps(batch))
            self._published[channel] = k + 1

    def _audit(self) -> None:
        """Compare the batches of the ranks this rank reads with its own fingerprints."""
        store = self._get_store()
        if store is None:
            return
        with self._lock:
            reads = list(self._reads.items())
        for channel, (writer, group) in reads:
            while True:
                name = f"{_PREFIX}/log/{channel}/{self._read[channel]}"
                if not store.check([name]):
                    break
                batch = json.loads(store.get(name))
                store.delete_key(name)
                self._read[channel] += 1
                for entry in batch:
                    if group:
                        place, op, dtype, count = entry
                        self._waiting[("c", group, lineage_of(place))] = (writer, {"op": op, "dtype": dtype,
                                                                                  "count": count})
                    else:
                        tag, n, dtype, count = entry
                        self._waiting[("p", writer, tag, n)] = (writer, {"op": "send", "dtype": dtype, "count": count,
                                                                         "tag": tag, "n": n})
        done = []
        for key, (writer, theirs) in self._waiting.items():
            if key[0] == "c":
                mine = self._fingerprint(key[1:])
            else:
                with self._lock:
                    mine = self._recvs.get(key[1:])
            if mine is None:
                continue
            done.append(key)
            if key[0] == "c":
                what = difference(mine, theirs)
                if what is not None:
                    where = (key[1], place_of(key[2]))
                    self.on_mismatch(collective_message(where, (self.rank, mine), (writer, theirs), what))
                    return
            else:
                what = p2p_difference(theirs, mine)
                if what is not None:
                    self.on_mismatch(
                        f"rank {writer}'s send #{theirs['n']} to rank {self.rank} (tag {theirs['tag']}) carries "
                        f"{theirs['count']} {theirs['dtype']} elements, and rank {self.rank}'s receive of it expects "
                        f"{mine['count']} {mine['dtype']} elements ({what} differs)")
                    return
        for key in done:
            del self._waiting[key]

    def _look(self) -> None:
        store = self._get_store()
        if store is None:
            return
        now = time.monotonic()
        with self._lock:
            for key in [k for k, (handles, _) in self._pending.items() if all(h.done() for h in handles)]:
                del self._pending[key]
            stuck = [k for k, (_, t) in self._pending.items() if now - t > self.after_s and k not in self._asked]
        for key in stuck:  # ask the peers about this place
            fp = self._fingerprint(key)
            if fp is None:
                continue
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
            mine = self._fingerprint((group, lineage_of(place)))
            if mine is None or who == self.rank:
                continue
            store.set(f"{_PREFIX}/fp/{group}/{place}/{self.rank}", json.dumps(mine))
        for key in list(self._asked):  # compare the answers to this rank's questions
            mine = self._fingerprint(key)
            if mine is None:
                continue
            for peer in mine["ranks"]:
                name = f"{_PREFIX}/fp/{key[0]}/{mine['place']}/{peer}"
                if peer == self.rank or not store.check([name]):
                    continue
                theirs = json.loads(store.get(name))
                what = difference(mine, theirs)
                if what is not None:
                    self.on_mismatch(collective_message((key[0], mine["place"]), (self.rank, mine), (peer, theirs),
                                                        what))
                    return


class CollectiveMismatchError(RuntimeError):
    """Ranks called different collectives at the same place of a group's program order."""


def fail(message: str, beat: Any = None) -> None:
    """On the watch thread: print the error, tell the watchdog (under ``launch``), end this rank
    (the job follows)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    if beat is not None:
        beat.failed(CollectiveMismatchError(message))
    sys.stdout.flush()
    os._exit(1)


_watch: MismatchWatch | None = None


def current() -> MismatchWatch | None:
    """The process's watch (None until the backend made its first group)."""
    return _watch


def install(watch: MismatchWatch) -> MismatchWatch:
    """Make ``watch`` the process's (``launch``'s session: its failures reach the watchdog)."""
    global _watch
    _watch = watch
    return watch


def ensure(rank: int) -> MismatchWatch:
    """The process's watch, made with :func:`fail` as its action if there is none yet."""
    return _watch if _watch is not None else install(MismatchWatch(rank, fail))
