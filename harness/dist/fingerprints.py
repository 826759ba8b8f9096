"""Fingerprints of the operations a rank posts, and what two ranks' fingerprints may not disagree on.

A fingerprint is what the ranks of one operation must agree on: its operation, the dtype and the
element count of its tensors; with, for the messages, the group, its world ranks and the place
(the lineage tag of :mod:`harness.dist.lineage`, e.g. ``"7"``, ``"7.0"`` for a hook's). Pure
functions, kept apart from the watch (:mod:`harness.dist.mismatch`) that records and compares
them so that what counts as a difference, and how the error words it, has one definition that
every rank applies alike.
"""

from __future__ import annotations

from typing import Any

import torch

# Operations whose ranks must give the same element count (the others: uneven splits, root-only buffers).
SAME_COUNT = frozenset({"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
                        "reduce_scatter", "reduce_scatter_tensor", "barrier"})
POINT_TO_POINT = frozenset({"send", "recv"})


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
    return as_fingerprint(op, group, world_ranks, lineage, *summary(result))


def as_fingerprint(op: str, group: str, world_ranks: list[int], lineage: tuple[int, ...], dtype: str,
                   count: int) -> dict:
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
    """The error for two ranks whose fingerprints at place ``key[1]`` of group ``key[0]`` differ in ``what``."""
    first, second = sorted([a, b], key=lambda x: x[0])
    return (f"ranks {first[0]} and {second[0]} called different collectives at collective #{key[1]} of group "
            f"{key[0]}: {describe(*first)}, {describe(*second)} ({what} differs)")


def p2p_message(sender: int, receiver: int, send: dict, recv: dict, what: str) -> str:
    """The error for a send (``tag``, its number ``n`` among the sender's) and the receive that took it."""
    return (f"rank {sender}'s send #{send['n']} to rank {receiver} (tag {send['tag']}) carries "
            f"{send['count']} {send['dtype']} elements, and rank {receiver}'s receive of it expects "
            f"{recv['count']} {recv['dtype']} elements ({what} differs)")
