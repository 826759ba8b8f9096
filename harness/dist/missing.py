"""The evidence rules that name a rank that never posts an operation its peers wait in.

Pure functions of the states the ranks publish (:mod:`harness.dist.rank_state`: per group, how
many collectives of its main sequence a rank posted; its sends and receives per peer and tag;
its collectives pending past the threshold; the operation its main thread waits in; whether it
finished), read through ``state(rank)`` (None: the rank published none yet). An operation is a
dict: a collective ``{"kind": "c", "group", "ranks", "place", "op", "dtype", "count", "root",
"age"}`` or a message ``{"kind": "m", "op", "src", "dst", "tag", "n", "dtype", "count", "age"}``.

A rank that has not posted an operation is named only on positive evidence that it never will
(:func:`why`): it finished, or it waits in another operation that cannot complete because a rank
that operation surely needs (:func:`needs`) never posts it, by the same evidence, recursively; a
cycle of such waits is a deadlock. A rank that computes or sleeps gives no evidence and is never
named. Kept apart from the look that applies them (:mod:`harness.dist.missing_look`) so that
they can be checked on hand-made states.
"""

from __future__ import annotations

from collections.abc import Callable

# Collectives each of whose members needs every other member's contribution to complete; a
# rooted one surely needs only the root (broadcast, scatter: a non-root) or every member (reduce,
# gather: the root), sends nothing (they may complete eagerly).
SYMMETRIC = frozenset({"all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_into_tensor_coalesced",
                       "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "barrier",
                       "all_to_all", "all_to_all_single"})
FROM_ROOT = frozenset({"broadcast", "scatter"})
TO_ROOT = frozenset({"reduce", "gather"})
# How a rank finished (a state's "end") -> what the messages say of it.
FINISHED = {"exit": "has finished the script (the interpreter is exiting)",
            "destroy_process_group": "has finished the script (destroy_process_group)",
            "returned": "has finished the script (it returned)"}

StateOf = Callable[[int], "dict | None"]  # a rank's last published state; None: none yet


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
        return FINISHED[state["end"]]
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
    """Whether the rank of ``state`` waits in ``x`` (pending past the threshold, or its main thread in it)."""
    key = op_key(x)
    blocked = state.get("blocked")
    return (blocked is not None and op_key(blocked) == key) or any(op_key(s) == key for s in state["stuck"])


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "its peers wait"
    if len(ranks) == 1:
        return f"rank {ranks[0]} waits"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]} wait"


def why(state: StateOf, q: int, x: dict, after_s: float, path: list, failed: set) -> list | None:
    """Evidence that rank ``q`` never posts ``x``: a chain of (rank, operation it never posts,
    why), each why a ("waits", operation it waits in) but the last, ("end", how it finished)
    or ("cycle", operation it waits in) for a rank already in the chain; None without evidence.
    A wait younger than ``after_s`` is no evidence yet; ``path`` is the chain so far, ``failed``
    the (rank, operation) pairs already found without evidence (shared by one look's calls)."""
    st = state(q)
    if st is None or has_posted(st, x):
        return None
    reason = finish_reason(st, x)
    if reason is not None:
        return [(q, x, ("end", reason))]
    blocked = st.get("blocked")
    if blocked is None or blocked["age"] < after_s or op_key(blocked) == op_key(x):
        return None  # computing, sleeping or waiting elsewhere: it may still post it
    if any(r == q for r, _, _ in path):
        return [(q, x, ("cycle", blocked))]
    step = (q, x, ("waits", blocked))
    for r in needs(q, blocked):
        if (r, op_key(blocked)) in failed:
            continue
        rest = why(state, r, blocked, after_s, [*path, step], failed)
        if rest is not None:
            return [step, *rest]
        failed.add((r, op_key(blocked)))
    return None


def waiters(state: StateOf, x: dict, culprit: int) -> list[int]:
    """The ranks that wait in ``x`` (else those that posted it)."""
    if x["kind"] == "m":
        return [x["dst"]]
    peers = [(r, st) for r in x["ranks"] if r != culprit and (st := state(r)) is not None]
    return [r for r, st in peers if waits_in(st, x)] or [r for r, st in peers if has_posted(st, x)]


def verdict(state: StateOf, chain: list) -> tuple[int, dict, str]:
    """(the rank named, the operation it never posts, the message) from a chain of :func:`why`:
    the rank that finished at its end, or the rank of a cycle that the most ranks wait for
    (then a collective before a message, the larger group, the lower rank)."""
    rank, op, (kind, detail) = chain[-1]
    if kind == "end":
        message = f"{_never(state, rank, op)}: rank {rank} {detail}"
        for q, x, (_, b) in reversed(chain[:-1]):  # what follows from it, back to the first
            message += (f"; rank {q}, waiting in {'it' if op_key(b) == op_key(op) else name_op(b)}, cannot post "
                        f"{name_op(x)}, which {_ranks(waiters(state, x, q))} in")
        return rank, op, message
    start = next(i for i, (q, _, _) in enumerate(chain) if q == rank)
    cycle = chain[start + 1:]  # (rank, operation it never posts) around the cycle

    def weight(i: int) -> tuple:
        q, x, _ = cycle[i]
        return (-len(waiters(state, x, q)), x["kind"] != "c", -len(x.get("ranks", ())), q)

    first = min(range(len(cycle)), key=weight)
    culprit, op, _ = cycle[first]
    parts = [_never(state, culprit, op)]
    for k in range(len(cycle)):
        q, _, _ = cycle[(first + k) % len(cycle)]
        nxt, b, _ = cycle[(first + k + 1) % len(cycle)]
        st = state(q)
        assert st is not None  # every rank of the chain has a state: why() read it
        waiting = st["blocked"]
        if op_key(b) == op_key(op):
            parts.append(f"rank {q} is waiting in the {'collective' if b['kind'] == 'c' else 'message'} rank "
                         f"{culprit} never {'posted' if b['kind'] == 'c' else 'sent'} (a deadlock)")
            break
        where = name_op(waiting) if waiting["kind"] == "c" else f"a {waiting['op']} of {name_op(waiting)}"
        parts.append(f"rank {q} is waiting in {where} since {waiting['age']:.1f} s, which rank {nxt} never "
                     f"{'posted' if b['kind'] == 'c' else 'sent'}")
    return culprit, op, ": ".join(parts)


def _never(state: StateOf, rank: int, x: dict) -> str:
    verb = "posted" if x["kind"] == "c" else "sent"
    return f"rank {rank} never {verb} {name_op(x)} that {_ranks(waiters(state, x, rank))} in"
