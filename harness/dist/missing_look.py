"""The mismatch watch's third look: a rank that never posts an operation its peers wait in.

Once per tick, with this rank's fresh state (:mod:`harness.dist.rank_state`), from both sides: a
waiting rank (a collective stuck past ``after_s``, or a receive waited in that long) reads the
states of the members still missing, and a rank asked about a place it has not posted (the
questions of :mod:`harness.dist.exchange`; it owes the place) checks itself. The evidence rules
are :mod:`harness.dist.missing`'s. The rank named reports it (under ``launch`` the watchdog's
verdict then names it), else its waiting peers do ``DEFER_TICKS`` ticks later; the first to
claim the verdict in the store reports it, so a job gets one error. After ``NOTE_AFTER_S`` of
waiting for a rank that gives no evidence either way (it computes, sleeps or waits elsewhere),
the lowest waiting rank prints a note naming it as a possible cause.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from harness.dist.missing import StateOf, has_posted, name_op, op_key, verdict, waiters, why
from harness.dist.watch_store import PREFIX, WatchStore

DEFER_TICKS = 2  # a waiting rank leaves naming a missing rank to that rank for this many ticks
NOTE_AFTER_S = 60.0  # a collective waited in this long for a rank that is not waiting: a note


class MissingLook:
    """This rank's look for a missing operation (module doc); a verdict goes to ``report(message)``."""

    def __init__(self, rank: int, link: WatchStore, report: Callable[[str], None], after_s: float,
                 tick_s: float) -> None:
        self.rank = rank
        self._link, self._report = link, report
        self.after_s, self.tick_s = after_s, tick_s
        self._owed: dict[tuple[str, str], dict] = {}  # places peers asked about that this rank has not posted
        self._found: dict[tuple, float] = {}  # a verdict left to the rank it names -> when first found
        self._posted_by: dict[tuple, set[int]] = {}  # an operation this rank waits in -> members seen posting it
        self._noted: set[tuple] = set()  # operations a note was decided on
        self._named = False  # a verdict was claimed (by this rank or another): nothing more to name

    def owe(self, group: str, place: str, who: int, ranks: list[int]) -> None:
        """Rank ``who`` waits in ``place`` of ``group``, which this rank has not posted: remember it
        (a place of the main sequence, of a group this rank is a member of)."""
        if self.rank not in ranks or "." in place:
            return
        store = self._link.store
        name = f"{PREFIX}/fp/{group}/{place}/{who}"  # set before the question
        theirs = json.loads(store.get(name)) if store.check([name]) else {}
        self._owed[(group, place)] = {"kind": "c", "group": group, "ranks": list(ranks), "place": place,
                                      "op": theirs.get("op", "?"), "dtype": theirs.get("dtype", ""),
                                      "count": theirs.get("count", 0)}

    def look(self, mine: dict) -> None:
        """Name a rank that never posts an operation its peers wait in, on evidence (module doc):
        this rank waits in it (its peers' states say who has not posted it), or a peer asked
        about a place this rank has not posted (its own state, ``mine``, says whether it ever will)."""
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
        store = self._link.store
        states: dict[int, dict | None] = {self.rank: mine}

        def state(rank: int) -> dict | None:
            if rank not in states:
                name = f"{PREFIX}/state/{rank}"
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
            chain = why(state, q, x, self.after_s, [], failed)
            if chain is None:
                self._note(state, q, x)
                continue
            culprit, op, message = verdict(state, chain)
            if culprit != self.rank and op["kind"] == "c":  # that rank reports it (launch's watchdog names it)
                first = self._found.setdefault((culprit, op_key(op)), now)
                if now - first < (DEFER_TICKS - 0.5) * self.tick_s:
                    continue
            self._claim(message)
            return

    def _note(self, state: StateOf, q: int, x: dict) -> None:
        """``x`` waited in for ``NOTE_AFTER_S`` for rank ``q``, which gives no evidence either way:
        a note (not an error), once, by the lowest rank that waits in it."""
        if x["kind"] != "c" or q == self.rank or x.get("age", 0.0) < NOTE_AFTER_S or op_key(x) in self._noted:
            return
        if state(q) is None:
            return
        self._noted.add(op_key(x))
        if min(waiters(state, x, q), default=self.rank) != self.rank:
            return
        print(f"note: rank {self.rank} has waited {x['age']:.0f} s in {name_op(x)}, which rank {q} has not "
              f"posted; rank {q} is not waiting in an operation of the harness backend (it computes, sleeps or waits "
              f"elsewhere): if it never posts it, it skipped it", file=sys.stderr, flush=True)

    def _claim(self, message: str) -> None:
        """Report ``message``, unless another rank claimed a verdict first (one error per job)."""
        self._named = True
        try:
            first = self._link.store.add(f"{PREFIX}/named", 1) == 1
        except Exception:  # noqa: BLE001  the store is gone: report it here
            first = True
        if first:
            self._report(message)
