"""Ranks that call different collectives: named, not hung, not silently wrong.

Every operation a rank posts on the ``harness`` backend has a fingerprint
(:mod:`harness.dist.fingerprints`): its operation, its group, its place in the group's program
order (the lineage tag, ``harness.dist.lineage``; for point-to-point, its peer, tag and number
among the messages between the two with that tag), the dtype and element count of its tensors.
One watch per process (:func:`current`; installed when the backend creates its first group,
under ``launch --scenario`` by the session, which also tells the watchdog) records them
(:mod:`harness.dist.posted`) and looks at them on a thread of its own that sleeps ``tick_s``
between looks and talks through the torch.distributed store (:mod:`harness.dist.watch_store`,
a channel that no stuck collective can block). This module is the watch's entry points, its
thread and its end; each look has a module of its own:

- **Stuck** and **Audit** (:mod:`harness.dist.exchange`): a collective still not complete after
  ``after_s`` makes its rank ask its peers for their fingerprints at that place; and every rank
  publishes the fingerprints it posted, in batches, for one peer to compare with its own, so
  operations that complete yet disagree (a float32 and an int32 allreduce of the same size, a
  receive larger than the message sent) are found too.
- **Missing** (:mod:`harness.dist.missing_look`): a rank that never posts the collective its
  peers wait in (it skipped a call, returned early, destroyed its group, or waits in another
  group's collective or a receive). Every rank publishes its state every tick
  (:mod:`harness.dist.rank_state`); a rank that has not posted a place is named only on
  positive evidence that it never will (:func:`harness.dist.missing.why`): it finished, or it
  waits in an operation that cannot complete because a rank that operation surely needs never
  posts it (a cycle of such waits is a deadlock). A rank that computes or sleeps (a
  straggler, an injected delay) is never named, nor one that posted (a slow link); after
  ``NOTE_AFTER_S`` of waiting for one, the lowest waiting rank prints a note naming it as a
  possible cause; the rank named reports it, else its waiting peers do ``DEFER_TICKS`` ticks later.

A difference in operation, dtype or (for operations whose ranks must agree on it) element
count, or a missing collective, makes the rank that found it print an error naming the ranks,
the place, the operation and what differed, and end the process (:func:`fail`; ``launch`` then
ends the job with that message; a bare ``mpiexec`` ends the job when a rank exits). A difference
is found within a tick or two of both ranks posting. Not caught: outside ``launch`` a difference
in the last tick before the program exits (``launch``'s session flushes the audit at the end,
:meth:`MismatchWatch.close`). A rank that finishes its script goes on looking at exit
(:meth:`MismatchWatch._at_exit`, before ``MPI_Finalize``, which waits for its peers anyway)
until every rank is exiting, so it names itself instead of hanging silently while a peer waits
in a collective it never posted. Not judged (such a rank counts as computing): collectives
posted from a communication hook's callbacks (not numbered in the main sequence), waits the
watch cannot see (inside torch's C++, such as DDP's reducer; on a future), and collectives
posted by threads other than the main one.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from harness.dist.exchange import FingerprintExchange
from harness.dist.fingerprints import POINT_TO_POINT
from harness.dist.missing_look import MissingLook
from harness.dist.posted import PostedLog
from harness.dist.rank_state import RankState
from harness.dist.watch_store import PREFIX, WatchStore

AFTER_S = 1.0  # a collective pending longer than this is stuck: its rank asks, and is a waiting rank
TICK_S = 0.5  # the watch's period: it looks, publishes and audits once per tick
_FLUSH_WAIT_S = 3.0  # at the end of a launch: how long to wait for a peer's last batch
_EXIT_POLL_S = 0.05  # at exit: how often a rank looks whether every rank is exiting


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
        self._link = WatchStore()
        self._log = PostedLog(rank, on_post=self._start)
        self._state = RankState(rank, self._log, self._link, after_s)
        self._missing = MissingLook(rank, self._link, self._report, after_s, tick_s)
        self._exchange = FingerprintExchange(rank, self._log, self._link, self._report, after_s,
                                             owe=self._missing.owe)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        atexit.register(self._at_exit)

    # -- the posting threads -----------------------------------------------------------------------
    def posted(self, group: Any, group_name: str, work: Any) -> None:
        """``group`` (a HarnessProcessGroup) just made ``work``: remember its fingerprint."""
        if work._op in POINT_TO_POINT:
            _, _, peer, tag = work.shapes[0]
            self._log.message(work, group.world_ranks[peer], tag)
            return
        self._log.collective(group, group_name, work)

    def destroyed(self, group: Any) -> None:
        """torch's ``destroy_process_group`` shuts ``group`` (a HarnessProcessGroup) down: this rank
        posts on it no more (on no group, for the default one)."""
        self._log.destroyed(group, group is dist.distributed_c10d.GroupMember.WORLD)

    def finished(self, how: str) -> None:
        """This rank's script has ended (``"returned"``: ``launch``'s session, once the script
        returned): it posts nothing more."""
        self._state.finished(how)

    def _report(self, message: str) -> None:
        self.on_mismatch(message)

    def _start(self) -> None:  # under the posting log's lock, after each post
        if self._thread is None:
            # Taken now, on the posting thread: a script that destroys its process group before
            # the first tick would otherwise leave the watch without the store (on rank 0, the
            # store's server: held here, it stays up for the peers' last batches).
            self._link.get()
            self._thread = threading.Thread(target=self._run, name="harness.dist mismatch watch", daemon=True)
            self._thread.start()

    # -- the end -----------------------------------------------------------------------------------
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
            store = self._link.get()
        except Exception:  # noqa: BLE001  the server is gone already
            return
        if store is None:
            return
        try:
            self._publish()  # a destroy_process_group not yet drained says how this rank finished
            self.finished("exit")
            store.add(f"{PREFIX}/exiting", 1)
            self._tick()  # this rank's last state, at once: a peer that starts waiting later still reads it
            next_tick = time.monotonic() + self.tick_s
            while store.add(f"{PREFIX}/exiting", 0) < max(self._link.expect, store.add(f"{PREFIX}/watching", 0)):
                if time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + self.tick_s
                    self._tick()
                time.sleep(_EXIT_POLL_S)
            left = store.add(f"{PREFIX}/left", 1)
            if self.rank == 0:
                deadline = time.monotonic() + _FLUSH_WAIT_S
                while left < store.add(f"{PREFIX}/watching", 0) and time.monotonic() < deadline:
                    time.sleep(_EXIT_POLL_S)
                    left = store.add(f"{PREFIX}/left", 0)
        except Exception:  # noqa: BLE001  the server is gone already: nothing left to watch or protect
            pass

    def close(self, flush: bool = False) -> None:
        """Stop watching. ``flush`` (every rank at once, the store still up): publish what is
        left and read the peers' last batches first (up to ``_FLUSH_WAIT_S``)."""
        if flush and self._link.get() is not None:
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
        self._exchange.read_to_the_end(_FLUSH_WAIT_S, self.tick_s / 5)

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
                if self._link.store is not None and self._stop.is_set():
                    return

    def _tick(self) -> None:
        """One look: ask and answer, publish the batches and the state, audit, look for a missing collective."""
        self._exchange.ask_and_answer()
        mine = self._state.sample(self._publish)
        self._exchange.audit()
        self._missing.look(mine)

    def _publish(self) -> None:
        """This rank's fingerprints since the last tick, one batch per channel; the counts of each
        group's main sequence, and the groups destroyed, brought up to date with them."""
        self._exchange.publish(self._state.count)


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
