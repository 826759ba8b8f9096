"""Which tag a collective gets: its place in the program, the same on every rank.

Ranks must post a group's collectives in the same order, and each collective's messages are
matched by its MPI tag. Collectives posted by the program's own thread are numbered in the order
it posts them (per group). But a future's callbacks (DDP's communication hooks: PowerSGD posts
collectives from them) run on whichever thread completes the future, at a time that differs
across ranks; numbering their collectives in posting order would interleave them differently
with the main thread's on every rank. So a collective posted inside a callback of operation L
is child k of L (the k-th posted inside L's callbacks), whatever thread or time it runs at: its
lineage L + (k,). Futures of the backend run their callbacks inside their operation's lineage
(:class:`LineageFuture`), both when the completion thread completes them and when a callback is
added to a future already complete.

Tags: a main-sequence collective n gets ``n mod H``; a child gets ``H + (root * 64 + hash(path)
mod 64) mod H`` (H: half the MPI tag range), unique while fewer than H / 64 root collectives
are in flight and a root's subtree holds few collectives.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

Lineage = tuple[int, ...]

_local = threading.local()
_lock = threading.Lock()
_children: OrderedDict[Lineage, int] = OrderedDict()
_MAX_PARENTS = 4096  # child counters kept (oldest dropped: their callbacks ran long ago)
_SUBTREE = 64


def _stack() -> list[Lineage]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


@contextmanager
def inside(lineage: Lineage) -> Iterator[None]:
    """Collectives posted in this block (on this thread) are children of ``lineage``."""
    stack = _stack()
    stack.append(lineage)
    try:
        yield
    finally:
        stack.pop()


def next_lineage(group_counter: Callable[[], int]) -> Lineage:
    """The lineage of a collective posted now: a child of the enclosing callback's operation, or
    the next of the group's main sequence (``group_counter()``)."""
    stack = _stack()
    if not stack:
        return (group_counter(),)
    parent = stack[-1]
    with _lock:
        k = _children.get(parent, 0) + 1
        _children[parent] = k
        _children.move_to_end(parent)
        while len(_children) > _MAX_PARENTS:
            _children.popitem(last=False)
    return (*parent, k)


def tag_of(lineage: Lineage, tag_ub: int) -> int:
    half = (tag_ub + 1) // 2
    if len(lineage) == 1:
        return lineage[0] % half
    return half + (lineage[0] * _SUBTREE + hash(lineage[1:]) % _SUBTREE) % half


class LineageFuture(torch.futures.Future):
    """A future whose callbacks run inside its operation's lineage, on any thread."""

    def __init__(self, lineage: Lineage) -> None:
        super().__init__()
        self.lineage = lineage

    def then(self, callback: Callable[[torch.futures.Future], Any]) -> LineageFuture:
        out = LineageFuture(self.lineage)

        def run(fut: torch.futures.Future) -> None:
            with inside(self.lineage):
                try:
                    value = callback(fut)
                except BaseException as exc:  # noqa: BLE001  the chained future carries it
                    out.set_exception(exc)
                    return
            out.set_result(value)

        super().add_done_callback(run)
        return out

    def add_done_callback(self, callback: Callable[[torch.futures.Future], None]) -> None:
        def run(fut: torch.futures.Future) -> None:
            with inside(self.lineage):
                callback(fut)

        super().add_done_callback(run)
