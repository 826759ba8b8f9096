"""Fingerprints exchanged through the store and compared: the mismatch watch's first two looks.

- **Stuck** (:meth:`FingerprintExchange.ask_and_answer`): a collective still not complete after
  ``after_s`` makes this rank publish its fingerprint and a question naming the place; every
  rank answers questions with its fingerprint at that place, if it has posted one (else, if it
  is a member, it owes the place: the look for a missing collective judges it), and the asking
  rank compares.
- **Audit** (:meth:`FingerprintExchange.publish`, :meth:`FingerprintExchange.audit`): operations
  that complete can still disagree (a float32 and an int32 allreduce of the same size: nothing
  waits, the results are garbage; a receive larger than the message sent). Each rank publishes
  the fingerprints it posted, in batches per group (per peer for sends), every tick; in each
  group the member at group rank i reads and compares the batches of the member at i + 1 (each
  batch read by exactly one rank, which deletes it), and a receiver the sends it received.

A difference is reported through ``report(message)`` (:mod:`harness.dist.fingerprints` words it).
The watch (:mod:`harness.dist.mismatch`) calls these on its thread, once per tick.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable

from harness.dist.fingerprints import (
    collective_message,
    difference,
    lineage_of,
    p2p_difference,
    p2p_message,
    place_of,
)
from harness.dist.posted import Key, PostedLog
from harness.dist.watch_store import PREFIX, WatchStore


class FingerprintExchange:
    """This rank's side of the questions and the audit (module doc). ``owe(group, place, who,
    ranks)`` is told of a question about a place this rank has not posted."""

    def __init__(self, rank: int, log: PostedLog, link: WatchStore, report: Callable[[str], None], after_s: float,
                 owe: Callable[[str, str, int, list[int]], None]) -> None:
        self.rank = rank
        self._log, self._link, self._report, self._owe = log, link, report, owe
        self.after_s = after_s
        self._asked: set[Key] = set()
        self._answered = 0  # questions of the store read so far
        self._published: dict[str, int] = defaultdict(int)  # channel -> batches published
        self._read: dict[str, int] = defaultdict(int)  # channel -> batches read
        self._waiting: dict[tuple, tuple[int, dict]] = {}  # a peer's fingerprint this rank has not posted yet

    def publish(self, count: Callable[[str, list], list]) -> None:
        """This rank's fingerprints since the last tick, one batch per channel; a group's batch as
        ``count(group, batch)`` makes it (which brings this rank's state up to date with it)."""
        store = self._link.get()
        if store is None:
            return
        for channel, batch in self._log.drain().items():
            if channel.startswith("c/"):
                batch = count(channel[2:].rsplit("/", 1)[0], batch)
                if not batch:
                    continue
            k = self._published[channel]
            store.set(f"{PREFIX}/log/{channel}/{k}", json.dumps(batch))
            self._published[channel] = k + 1

    def audit(self) -> None:
        """Compare the batches of the ranks this rank reads with its own fingerprints."""
        store = self._link.get()
        if store is None:
            return
        for channel, (writer, group) in self._log.channels_to_read():
            while True:
                name = f"{PREFIX}/log/{channel}/{self._read[channel]}"
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
            mine = self._log.fingerprint(key[1:]) if key[0] == "c" else self._log.receive(key[1:])
            if mine is None:
                continue
            done.append(key)
            if key[0] == "c":
                what = difference(mine, theirs)
                if what is not None:
                    where = (key[1], place_of(key[2]))
                    self._report(collective_message(where, (self.rank, mine), (writer, theirs), what))
                    return
            else:
                what = p2p_difference(theirs, mine)
                if what is not None:
                    self._report(p2p_message(writer, self.rank, theirs, mine, what))
                    return
        for key in done:
            del self._waiting[key]

    def ask_and_answer(self) -> None:
        """Ask about this rank's collectives newly stuck, answer the peers' questions, compare the answers."""
        store = self._link.get()
        if store is None:
            return
        for key in self._log.newly_stuck(self.after_s, self._asked):  # ask the peers about this place
            fp = self._log.fingerprint(key)
            if fp is None:
                continue
            self._asked.add(key)
            store.set(f"{PREFIX}/fp/{fp['group']}/{fp['place']}/{self.rank}", json.dumps(fp))
            n = store.add(f"{PREFIX}/questions", 1)
            store.set(f"{PREFIX}/question/{n}", json.dumps([fp["group"], fp["place"], self.rank, fp["ranks"]]))
        asked = store.add(f"{PREFIX}/questions", 0)
        while self._answered < asked:  # answer every question whose place this rank has posted
            n = self._answered + 1
            if not store.check([f"{PREFIX}/question/{n}"]):
                break
            group, place, who, *rest = json.loads(store.get(f"{PREFIX}/question/{n}"))
            self._answered = n
            if who == self.rank:
                continue
            mine = self._log.fingerprint((group, lineage_of(place)))
            if mine is None:  # not (yet) posted here: owed, if this rank is a member
                self._owe(group, place, who, rest[0] if rest else [])
                continue
            store.set(f"{PREFIX}/fp/{group}/{place}/{self.rank}", json.dumps(mine))
        for key in list(self._asked):  # compare the answers to this rank's questions
            mine = self._log.fingerprint(key)
            if mine is None:
                continue
            for peer in mine["ranks"]:
                name = f"{PREFIX}/fp/{key[0]}/{mine['place']}/{peer}"
                if peer == self.rank or not store.check([name]):
                    continue
                theirs = json.loads(store.get(name))
                what = difference(mine, theirs)
                if what is not None:
                    self._report(collective_message((key[0], mine["place"]), (self.rank, mine), (peer, theirs),
                                                    what))
                    return

    def read_to_the_end(self, wait_s: float, poll_s: float) -> None:
        """At the end of a launch (every rank at once, everything published): mark each channel's
        end, then audit until every channel read has been read to its end (up to ``wait_s``)."""
        store = self._link.store
        readers = [channel for channel, _ in self._log.channels_to_read()]
        for channel in self._published:
            store.set(f"{PREFIX}/end/{channel}", str(self._published[channel]))
        deadline = time.monotonic() + wait_s
        for channel in readers:
            while time.monotonic() < deadline:
                self.audit()
                end = f"{PREFIX}/end/{channel}"
                if store.check([end]) and self._read[channel] >= int(store.get(end)):
                    break
                time.sleep(poll_s)
        self.audit()
