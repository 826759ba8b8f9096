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
ranks posting. Not caught: outside ``launch`` a difference in the last tick before the program
exits (``launch``'s session flushes the audit at the end).

A third look finds a rank that never posts the collective its peers wait in (it skipped a call,
returned early, destroyed its group, or waits in another group's collective or a receive). Every
rank publishes its state every tick (``state/RANK``: per group, how many collectives of its main
sequence it posted; its sends and receives per peer and tag; its collectives pending longer than
``after_s``; the operation its main thread waits in, read from the thread's innermost frame when
that is the backend's ``wait()``; whether it finished: a group destroyed, the script returned
under ``launch``, the interpreter exiting). A rank that has not posted a place is named only on
positive evidence that it never will (:meth:`MismatchWatch._why`): it finished, or it waits in
another operation that cannot complete because a rank that operation surely needs (:func:`needs`:
every member, for the collectives whose results depend on all; the root, for a broadcast's or a
scatter's others; the sender, for a receive) never posts it (by the same evidence, recursively;
a cycle of such waits is a deadlock). A rank that computes or
sleeps (a straggler, an injected delay) is never named, nor one that posted (a slow link); after
``_NOTE_AFTER_S`` of waiting for one, the lowest waiting rank prints a note naming it as a
possible cause. Both sides look: a waiting rank reads the states of its collective's missing
members, and a rank asked about a place it has not posted (the questions above) checks itself.
The rank named reports it (under ``launch`` the watchdog's verdict then names it), else its
waiting peers do ``DEFER_TICKS`` ticks later; the first to claim the verdict in the store prints
it. A rank that finishes its script goes on looking at exit (:meth:`MismatchWatch._at_exit`,
before ``MPI_Finalize``, which waits for its peers anyway) until every rank is exiting, so it
names itself instead of hanging silently while a peer waits in a collective it never posted.
Not judged (such a rank counts as computing): collectives posted from a communication hook's
callbacks (not numbered in the main sequence), waits the watch cannot see (inside torch's C++,
such as DDP's reducer; on a future), and collectives posted by threads other than the main one.
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
# Collectives each of whose members needs every other member's contribution to complete; a
# rooted one surely needs only the root (broadcast, scatter: a non-root) or every member (reduce,
# gather: the root), sends nothing (they may complete eagerly).
SYMMETRIC = frozenset({"all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_into_tensor_coalesced",
                       "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "barrier",
                       "all_to_all", "all_to_all_single"})
FROM_ROOT = frozenset({"broadcast", "scatter"})
TO_ROOT = frozenset({"reduce", "gather"})
AFTER_S = 1.0  # a collective pending longer than this is stuck: its rank asks, and is a waiting rank
TICK_S = 0.5  # the watch's period: it looks, publishes and audits once per tick
DEFER_TICKS = 2  # a waiting rank leaves naming a missing rank to that rank for this many ticks
_KEEP = 1 << 16  # own fingerprints kept per rank (the audit compares within a few ticks)
_PREFIX = "harness/mismatch"
BACKEND = "harness"  # harness.dist.process_group.BACKEND (which imports this module)
_FLUSH_WAIT_S = 3.0  # at the end of a launch: how long to wait for a peer's last batch
_EXIT_POLL_S = 0.05  # at exit: how often a rank looks whether every rank is exiting
_NOTE_AFTER_S = 60.0  # a collective waited in this long for a rank that is not waiting: a note
_DESTROYED = "destroyed"  # in a group's batch: the group was destroyed here (torch's destroy_process_group)
_REASONS = {"exit": "has finished the script (the interpreter is exiting)",
            "destroy_process_group": "has finished the script (destroy_process_group)",
            "returned": "has finished the script (it returned)"}


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


# -- a missing collective: what the states say ---------------------------------------------------
def op_key(x: dict) -> tuple:
    """An operation's identity across ranks: (group, place) of a collective, (src, dst, tag, n) of a message."""
    if x["kind"] == "c":
        return ("c", x["group"], x["place"])
    return ("m", x["src"], x["dst"], x["tag"], x["n"])


def name_op(x: dict) -> str:
    """An operation as the messages name it, e.g. ``collective #7 of group default_pg [0 1] (all_reduce
    on 16 float32 elements)``, ``message #0 from rank 0 to rank 1 (tag 3: 4 float32 elements)``."""
    if x["kind"] == "c":
        body = "barrier" if x["op"] == "barrier" else f"{x['op']} on {x['count']} {x['dtype']} elements"
        return f"collective #{x['place']} of group {x['group']} ({body})"
    return (f"message #{x['n']} from rank {x['src']} to rank {x['dst']} (tag {x['tag']}: {x['count']} {x['dtype']} "
            f"elements)")


def _count(pairs: list, peer: int, tag: int) -> int:
    for p, t, n in pairs:
        if p == peer and t == tag:
            return n
    return 0


def has_posted(state: dict, x: dict) -> bool:
    """Whether the rank of ``state`` had posted ``x`` when it published ``state``."""
    if x["kind"] == "c":
        return state["counts"].get(x["group"], 0) > int(x["place"])
    if state["rank"] == x["src"]:
        return _count(state["sent"], x["dst"], x["tag"]) > x["n"]
    if state["rank"] == x["dst"]:
        return _count(state["received"], x["src"], x["tag"]) > x["n"]
    return True  # not its operation


def finish_reason(state: dict, x: dict) -> str | None:
    """Why the rank of ``state`` can post ``x`` no more ("has finished the script (...)"), or None."""
    if state["end"]:
        return _REASONS[state["end"]]
    if x["kind"] == "c" and x["group"] in state["gone"]:
        return f"has destroyed group {x['group']} (destroy_process_group)"
    return None


def needs(rank: int, x: dict) -> list[int]:
    """The ranks whose posting ``x`` its rank ``rank`` surely needs for ``x`` to complete there."""
    if x["kind"] == "m":
        return [x["src"]] if x["op"] == "recv" else []
    op, ranks, root = x["op"], x["ranks"], x.get("root", -1)
    if op in SYMMETRIC or (op in TO_ROOT and rank == root):
        return [r for r in ranks if r != rank]
    if op in FROM_ROOT and 0 <= root != rank:
        return [root]
    return []


def waits_in(state: dict, x: dict) -> bool:
    """Whether the rank of ``state`` waits in ``x`` (pending past ``after_s``, or its main thread in it)."""
    key = op_key(x)
    blocked = state.get("blocked")
    return (blocked is not None and op_key(blocked) == key) or any(op_key(s) == key for s in state["stuck"])


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "its peers wait"
    if len(ranks) == 1:
        return f"rank {ranks[0]} waits"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]} wait"


class MismatchWatch:
    """One per process: records fingerprints, asks, answers, audits and looks for missing
    collectives through the store (module doc).

    ``on_mismatch(message)`` is called on the watch thread (at exit: on the main thread) when a
    difference or a missing collective is found.
    """

    def __init__(self, rank: int, on_mismatch: Callable[[str], None], after_s: float = AFTER_S,
                 tick_s: float = TICK_S) -> None:
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
        # a missing collective: this rank's state (kept by the watch thread, from the batches it drains)
        self._main = threading.main_thread().ident
        self._end: str | None = None  # how this rank finished: a key of _REASONS
        self._counts: dict[str, int] = {}  # group -> collectives of its main sequence posted
        self._gone: set[str] = set()  # groups destroyed
        self._owed: dict[tuple[str, str], dict] = {}  # places peers asked about that this rank has not posted
        self._found: dict[tuple, float] = {}  # a verdict left to the rank it names -> when first found
        self._posted_by: dict[tuple, set[int]] = {}  # an operation this rank waits in -> members seen posting it
        self._noted: set[tuple] = set()  # operations a note was decided on
        self._named = False  # a verdict was claimed (by this rank or another): nothing more to name
        self._seq = 0
        self._expect = 0  # how many ranks watch, when known (the default group is the backend's)
        self._store: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        atexit.register(self._at_exit)

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

    def destroyed(self, group: Any) -> None:
        """torch's ``destroy_process_group`` shuts ``group`` (a HarnessProcessGroup) down: this rank
        posts on it no more (on no group, for the default one). Noted in order with the group's
        fingerprints, so a group made again under the same name starts afresh."""
        import torch.distributed as dist

        default = group is dist.distributed_c10d.GroupMember.WORLD
        with self._lock:
            self._out[f"c/{group.description()}/{self.rank}"].append((_DESTROYED, default))
            if self._thread is None:
                self._start()

    def finished(self, how: str) -> None:
        """This rank's script has ended (``"returned"``: ``launch``'s session, once the script
        returned): it posts nothing more."""
        if self._end is None:
            self._end = how

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
            work._p2p = (peer, int(tag), n)  # which message a wait in it waits for (_blocked)
            if self._thread is None:
                self._start()

    def _start(self) -> None:  # under the lock
        if self._thread is None:
            # Taken now, on the posting thread: a script that destroys its process group before
            # the first tick would otherwise leave the watch without the store (on rank 0, the
            # store's server: held here, it stays up for the peers' last batches).
            self._get_store()
            self._thread = threading.Thread(target=self._run, name="harness.dist mismatch watch", daemon=True)
            self._thread.start()

    def _at_exit(self) -> None:
        """Before the interpreter finalizes (and MPI with it). The thread must not be inside a store
        call then (a C++ store torn down under it aborts the process): it is stopped, and this
        rank, finished, goes on looking on the main thread, a tick at a time, until every rank that
        watches is exiting too: a peer may wait in a collective this rank never posted, which it
        then names (``MPI_Finalize`` would wait for the peers anyway, silently). Last, rank 0,
        whose process holds the store's server, waits (up to ``_FLUSH_WAIT_S``) until every rank
        has made its last store call (else those fail with torch's warnings)."""
        self._stop_thread()
        if _watch is not self:  # replaced (install): the installed watch does this
            return
        try:
            store = self._get_store()
        except Exception:  # noqa: BLE001  the server is gone already
            return
        if store is None:
            return
        try:
            self._publish()  # a destroy_process_group not yet drained says how this rank finished
            self.finished("exit")
            store.add(f"{_PREFIX}/exiting", 1)
            self._tick()  # this rank's last state, at once: a peer that starts waiting later still reads it
            next_tick = time.monotonic() + self.tick_s
            while store.add(f"{_PREFIX}/exiting", 0) < max(self._expect, store.add(f"{_PREFIX}/watching", 0)):
                if time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + self.tick_s
                    self._tick()
                time.sleep(_EXIT_POLL_S)
            left = store.add(f"{_PREFIX}/left", 1)
            if self.rank == 0:
                deadline = time.monotonic() + _FLUSH_WAIT_S
                while left < store.add(f"{_PREFIX}/watching", 0) and time.monotonic() < deadline:
                    time.sleep(_EXIT_POLL_S)
                    left = store.add(f"{_PREFIX}/left", 0)
        except Exception:  # noqa: BLE001  the server is gone already: nothing left to watch or protect
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
                self._tick()
            except Exception:  # noqa: BLE001  (the store is gone: the group was destroyed; nothing to watch)
                if self._store is not None and self._stop.is_set():
                    return

    def _tick(self) -> None:
        """One look: ask and answer, publish the batches and the state, audit, look for a missing collective."""
        self._look()
        mine = self._sample()
        self._audit()
        self._missing(mine)

    def _get_store(self) -> Any:
        if self._store is None:
            import torch.distributed as dist

            if not dist.is_initialized():
                return None
            store = dist.distributed_c10d._get_default_store()  # kept: it outlives destroy_process_group
            store.add(f"{_PREFIX}/watching", 1)  # the ranks that watch: each waits at exit for the others
            if dist.get_backend() == BACKEND:  # then every rank watches (each made the default group)
                self._expect = dist.get_world_size()
            self._store = store
        return self._store

    def _publish(self) -> None:
        """This rank's fingerprints since the last tick, one batch per channel; the counts of each
        group's main sequence, and the groups destroyed, brought up to date with them."""
        store = self._get_store()
        if store is None:
            return
        with self._lock:
            out, self._out = self._out, defaultdict(list)
            if len(self._history) > 2 * _KEEP:  # the oldest go, in one pass now and then
                self._history = dict(list(self._history.items())[-_KEEP:])
        for channel, batch in out.items():
            if channel.startswith("c/"):
                batch = self._count(channel[2:].rsplit("/", 1)[0], batch)
                if not batch:
                    continue
            k = self._published[channel]
            store.set(f"{_PREFIX}/log/{channel}/{k}", json.dumps(batch))
            self._published[channel] = k + 1

    def _count(self, group: str, batch: list) -> list:
        """A group's batch as published; counts its main sequence, notes where it was destroyed."""
        entries = []
        count = self._counts.get(group, 0)
        for entry in batch:
            if entry[0] == _DESTROYED:
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
            store.set(f"{_PREFIX}/question/{n}", json.dumps([fp["group"], fp["place"], self.rank, fp["ranks"]]))
        asked = store.add(f"{_PREFIX}/questions", 0)
        while self._answered < asked:  # answer every question whose place this rank has posted
            n = self._answered + 1
            if not store.check([f"{_PREFIX}/question/{n}"]):
                break
            group, place, who, *rest = json.loads(store.get(f"{_PREFIX}/question/{n}"))
            self._answered = n
            if who == self.rank:
                continue
            mine = self._fingerprint((group, lineage_of(place)))
            if mine is None:  # not (yet) posted here: owed, if this rank is a member
                self._owe(group, place, who, rest[0] if rest else [])
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

    # -- a missing collective ------------------------------------------------------------------------
    def _owe(self, group: str, place: str, who: int, ranks: list[int]) -> None:
        """Rank ``who`` waits in ``place`` of ``group``, which this rank has not posted: remember it
        (a place of the main sequence, of a group this rank is a member of)."""
        if self.rank not in ranks or "." in place:
            return
        name = f"{_PREFIX}/fp/{group}/{place}/{who}"  # set before the question
        theirs = json.loads(self._store.get(name)) if self._store.check([name]) else {}
        self._owed[(group, place)] = {"kind": "c", "group": group, "ranks": list(ranks), "place": place,
                                      "op": theirs.get("op", "?"), "dtype": theirs.get("dtype", ""),
                                      "count": theirs.get("count", 0)}

    def _op(self, key: tuple[str, tuple[int, ...]], age: float, root: int = -1) -> dict | None:
        """A collective this rank posted, as the states show it (under the lock)."""
        entry = self._history.get(key)
        if entry is None:
            return None
        return {"kind": "c", "group": key[0], "ranks": self._groups[key[0]][0], "place": place_of(key[1]),
                "op": entry[0], "dtype": entry[1], "count": entry[2], "root": root, "age": round(age, 2)}

    def _blocked(self) -> dict | None:
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
        first = work._handles[0]
        with self._lock:
            for key, (handles, t) in self._pending.items():
                if not any(h is first for h in handles):
                    continue
                if len(key[1]) != 1:  # a hook's collective: not judged
                    return None
                root = -1
                if work._op in FROM_ROOT | TO_ROOT and work.shapes:
                    ranks, member = self._groups[key[0]][0], work.shapes[0][2]
                    root = ranks[member] if 0 <= member < len(ranks) else -1
                return self._op(key, now - t, root)
        return None

    def _sample(self) -> dict:
        """This rank's state (module doc), published for its peers' watches."""
        end = self._end  # first: whatever this rank posted before it finished is in the batches drained below
        blocked = self._blocked()  # then: whatever it posted before it began to wait is too
        self._publish()
        now = time.monotonic()
        with self._lock:
            stuck = [self._op(key, now - t) for key, (handles, t) in self._pending.items()
                     if now - t > self.after_s and len(key[1]) == 1 and not all(h.done() for h in handles)]
            sent = [[peer, tag, n] for (peer, tag), n in self._sent.items()]
            received = [[peer, tag, n] for (peer, tag), n in self._received.items()]
        self._seq += 1
        state = {"rank": self.rank, "seq": self._seq, "end": end, "gone": sorted(self._gone),
                 "counts": dict(self._counts), "sent": sent, "received": received,
                 "stuck": [x for x in stuck if x is not None], "blocked": blocked}
        store = self._get_store()
        if store is not None:
            store.set(f"{_PREFIX}/state/{self.rank}", json.dumps(state))
        return state

    def _missing(self, mine: dict) -> None:
        """Name a rank that never posts an operation its peers wait in, on evidence (module doc):
        this rank waits in it (its peers' states say who has not posted it), or a peer asked
        about a place this rank has not posted (its own state says whether it ever will)."""
        if self._named:
            return
        entries = [(q, x) for x in mine["stuck"] for q in x["ranks"] if q != self.rank]
        blocked = mine["blocked"]
        if blocked is not None and blocked["kind"] == "m" and blocked["op"] == "recv" and blocked["age"] > self.after_s:
            entries.append((blocked["src"], blocked))
        for key, x in list(self._owed.items()):
            if has_posted(mine, x):
                del self._owed[key]
            else:
                entries.append((self.rank, x))
        if not entries:
            self._found.clear()
            self._posted_by.clear()
            return
        store, states = self._store, {self.rank: mine}

        def state(rank: int) -> dict | None:
            if rank not in states:
                name = f"{_PREFIX}/state/{rank}"
                states[rank] = json.loads(store.get(name)) if store.check([name]) else None
            return states[rank]

        failed: set[tuple] = set()
        now = time.monotonic()
        current = {op_key(x) for _, x in entries}
        self._posted_by = {k: v for k, v in self._posted_by.items() if k in current}
        for q, x in entries:
            seen = self._posted_by.setdefault(op_key(x), set())
            if q in seen:  # read once: a waiting rank reads only the states of the members still missing
                continue
            st = state(q)
            if st is not None and has_posted(st, x):
                seen.add(q)
                continue
            chain = self._why(state, q, x, [], failed)
            if chain is None:
                self._note(state, q, x)
                continue
            culprit, op, message = self._verdict(state, chain)
            if culprit != self.rank and op["kind"] == "c":  # that rank reports it (launch's watchdog names it)
                first = self._found.setdefault((culprit, op_key(op)), now)
                if now - first < (DEFER_TICKS - 0.5) * self.tick_s:
                    continue
            self._claim(message)
            return

    def _why(self, state: Callable[[int], dict | None], q: int, x: dict, path: list, failed: set) -> list | None:
        """Evidence that rank ``q`` never posts ``x``: a chain of (rank, operation it never posts,
        why), each why a ("waits", operation it waits in) but the last, ("end", how it finished)
        or ("cycle", operation it waits in) for a rank already in the chain; None without evidence."""
        st = state(q)
        if st is None or has_posted(st, x):
            return None
        reason = finish_reason(st, x)
        if reason is not None:
            return [(q, x, ("end", reason))]
        blocked = st.get("blocked")
        if blocked is None or blocked["age"] < self.after_s or op_key(blocked) == op_key(x):
            return None  # computing, sleeping or waiting elsewhere: it may still post it
        if any(r == q for r, _, _ in path):
            return [(q, x, ("cycle", blocked))]
        step = (q, x, ("waits", blocked))
        for r in needs(q, blocked):
            if (r, op_key(blocked)) in failed:
                continue
            rest = self._why(state, r, blocked, [*path, step], failed)
            if rest is not None:
                return [step, *rest]
            failed.add((r, op_key(blocked)))
        return None

    def _waiters(self, state: Callable[[int], dict | None], x: dict, culprit: int) -> list[int]:
        """The ranks that wait in ``x`` (else those that posted it)."""
        if x["kind"] == "m":
            return [x["dst"]]
        peers = [(r, st) for r in x["ranks"] if r != culprit and (st := state(r)) is not None]
        return [r for r, st in peers if waits_in(st, x)] or [r for r, st in peers if has_posted(st, x)]

    def _verdict(self, state: Callable[[int], dict | None], chain: list) -> tuple[int, dict, str]:
        """(the rank named, the operation it never posts, the message) from a chain of ``_why``:
        the rank that finished at its end, or the rank of a cycle that the most ranks wait for
        (then a collective before a message, the larger group, the lower rank)."""
        rank, op, (kind, detail) = chain[-1]
        if kind == "end":
            message = f"{self._never(state, rank, op)}: rank {rank} {detail}"
            for q, x, (_, b) in reversed(chain[:-1]):  # what follows from it, back to the first
                message += (f"; rank {q}, waiting in {'it' if op_key(b) == op_key(op) else name_op(b)}, cannot post "
                            f"{name_op(x)}, which {_ranks(self._waiters(state, x, q))} in")
            return rank, op, message
        start = next(i for i, (q, _, _) in enumerate(chain) if q == rank)
        cycle = chain[start + 1:]  # (rank, operation it never posts) around the cycle

        def weight(i: int) -> tuple:
            q, x, _ = cycle[i]
            return (-len(self._waiters(state, x, q)), x["kind"] != "c", -len(x.get("ranks", ())), q)

        first = min(range(len(cycle)), key=weight)
        culprit, op, _ = cycle[first]
        parts = [self._never(state, culprit, op)]
        for k in range(len(cycle)):
            q, _, _ = cycle[(first + k) % len(cycle)]
            nxt, b, _ = cycle[(first + k + 1) % len(cycle)]
            waiting = state(q)["blocked"]
            if op_key(b) == op_key(op):
                parts.append(f"rank {q} is waiting in the {'collective' if b['kind'] == 'c' else 'message'} rank "
                             f"{culprit} never {'posted' if b['kind'] == 'c' else 'sent'} (a deadlock)")
                break
            where = name_op(waiting) if waiting["kind"] == "c" else f"a {waiting['op']} of {name_op(waiting)}"
            parts.append(f"rank {q} is waiting in {where} since {waiting['age']:.1f} s, which rank {nxt} never "
                         f"{'posted' if b['kind'] == 'c' else 'sent'}")
        return culprit, op, ": ".join(parts)

    def _never(self, state: Callable[[int], dict | None], rank: int, x: dict) -> str:
        verb = "posted" if x["kind"] == "c" else "sent"
        return f"rank {rank} never {verb} {name_op(x)} that {_ranks(self._waiters(state, x, rank))} in"

    def _note(self, state: Callable[[int], dict | None], q: int, x: dict) -> None:
        """``x`` waited in for ``_NOTE_AFTER_S`` for rank ``q``, which gives no evidence either way:
        a note (not an error), once, by the lowest rank that waits in it."""
        if x["kind"] != "c" or q == self.rank or x.get("age", 0.0) < _NOTE_AFTER_S or op_key(x) in self._noted:
            return
        if state(q) is None:
            return
        self._noted.add(op_key(x))
        if min(self._waiters(state, x, q), default=self.rank) != self.rank:
            return
        print(f"note: rank {self.rank} has waited {x['age']:.0f} s in {name_op(x)}, which rank {q} has not "
              f"posted; rank {q} is not waiting in an operation of the harness backend (it computes, sleeps or waits "
              f"elsewhere): if it never posts it, it skipped it", file=sys.stderr, flush=True)

    def _claim(self, message: str) -> None:
        """Report ``message``, unless another rank claimed a verdict first (one error per job)."""
        self._named = True
        try:
            first = self._store.add(f"{_PREFIX}/named", 1) == 1
        except Exception:  # noqa: BLE001  the store is gone: report it here
            first = True
        if first:
            self.on_mismatch(message)


_WAIT_CODE: Any = None


def _wait_code() -> Any:
    """The code of ``HarnessWork._complete``: a thread whose innermost frame runs it waits in a work."""
    global _WAIT_CODE
    if _WAIT_CODE is None:
        from harness.dist.work import HarnessWork

        _WAIT_CODE = HarnessWork._complete.__code__
    return _WAIT_CODE


class CollectiveMismatchError(RuntimeError):
    """Ranks called different collectives at the same place of a group's program order."""


def fail(message: str, beat: Any = None) -> None:
    """On the watch thread (at exit: the main thread): print the error, tell the watchdog (under
    ``launch``), end this rank (the job follows)."""
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
