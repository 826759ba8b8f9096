"""The step programs of the native layer, as the simulator runs them: which member sends
how many bytes to which in every step (``kernels/step_program.cpp`` for the allreduces and the
barrier, ``kernels/group.cpp`` for the torch.distributed backend's group operations). Pure:
no time here; :func:`harness.sim.collective_timing.run_program` times a program on a simulated network.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from harness.schedules import RING_THRESHOLD_BYTES, TREE_CHUNK_BYTES

FLOAT_BYTES = 4

# One step's rows, a value per member: send_to (-1: none), bytes sent, recv_from (-1: none).
StepRows = tuple[Sequence[int] | np.ndarray, Sequence[float] | np.ndarray, Sequence[int] | np.ndarray]


@dataclass(frozen=True)
class StepProgram:
    """A collective as aligned steps over its members (indices 0..p-1 into the member list).

    ``send_to[i, m]`` is the member that m sends to in step i (-1: none), ``send_bytes[i, m]``
    its size, ``recv_from[i, m]`` the member m receives from (-1: none). Each member sends and
    receives at most one message per step; the message m receives in step i is the one its
    source sends in step i. ``bytes_sent[m]``: what m sends over the whole collective.

    A member runs the steps one after another: it posts a step's send when it finished the
    previous step, and finishes the step when its send is released and its message has arrived.
    ``continues_round`` (None: every step a round of its own) joins steps into rounds in which a
    member sends and receives several messages at once, as a native step that posts several:
    ``continues_round[i]`` says that step i belongs to the round of step i - 1. A member posts
    the sends of all of a round's steps when it finished the previous round, and finishes the
    round when all of them are released and all its messages of the round have arrived.
    """

    send_to: np.ndarray
    send_bytes: np.ndarray
    recv_from: np.ndarray
    recursive_doubling: bool = False  # the native recursive-doubling allreduce (its order of additions)
    tree: tuple[int, ...] | None = None  # the native tree allreduce over members on these nodes (its additions)
    continues_round: tuple[bool, ...] | None = None  # per step: it joins the previous step's round
    bytes_sent: np.ndarray = field(init=False)
    compiled: tuple = field(init=False, repr=False)  # per step: senders, their dst and bytes, receivers, their src
    compiled_lists: tuple = field(init=False, repr=False)  # per step, as lists: receivers, sources, source bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "bytes_sent", np.where(self.send_to >= 0, self.send_bytes, 0).sum(axis=0))
        steps = []
        for i in range(self.send_to.shape[0]):
            senders = np.flatnonzero(self.send_to[i] >= 0)
            receivers = np.flatnonzero(self.recv_from[i] >= 0)
            sources = self.recv_from[i, receivers]
            steps.append(
                (
                    senders,
                    self.send_to[i, senders],
                    self.send_bytes[i, senders],
                    receivers,
                    sources,
                    self.send_bytes[i, sources],
                )
            )
        object.__setattr__(self, "compiled", tuple(steps))
        object.__setattr__(
            self, "compiled_lists", tuple((r.tolist(), s.tolist(), b.tolist()) for _, _, _, r, s, b in steps)
        )

    @property
    def steps(self) -> int:
        return self.send_to.shape[0]

    @property
    def rounds(self) -> list[range]:
        """The steps of every round, in order (a step of its own each without ``continues_round``)."""
        joined = self.continues_round or (False,) * self.steps
        starts = [i for i in range(self.steps) if not joined[i]]
        return [range(a, b) for a, b in zip(starts, [*starts[1:], self.steps])]


def _program(
    steps: Sequence[StepRows],
    p: int,
    recursive_doubling: bool = False,
    tree: tuple[int, ...] | None = None,
    continues_round: list[bool] | None = None,
) -> StepProgram:
    if not steps:
        empty = np.zeros((0, p), dtype=np.int64)
        return StepProgram(empty, empty.astype(float), empty, recursive_doubling, tree)
    send_to = np.array([s[0] for s in steps], dtype=np.int64)
    send_bytes = np.array([s[1] for s in steps], dtype=float)
    recv_from = np.array([s[2] for s in steps], dtype=np.int64)
    for array in (send_to, send_bytes, recv_from):
        array.setflags(write=False)
    rounds: tuple[bool, ...] | None = None
    if continues_round is not None:
        if len(continues_round) != len(steps) or continues_round[0]:
            raise ValueError("continues_round: one flag per step, the first step starting a round")
        rounds = tuple(bool(c) for c in continues_round) if any(continues_round) else None
    return StepProgram(send_to, send_bytes, recv_from, recursive_doubling, tree, rounds)


def _rd_steps(p: int, count: int) -> list[tuple[list[int], list[int], list[int]]]:
    """Recursive doubling as ``rd_allreduce`` in kernels/step_program.cpp (fold, exchanges, unfold)."""
    nbytes = count * FLOAT_BYTES
    pow2 = 1 << (p.bit_length() - 1)
    rem = p - pow2
    steps = []
    if rem:
        send = [m + 1 if m < 2 * rem and m % 2 == 0 else -1 for m in range(p)]
        recv = [m - 1 if m < 2 * rem and m % 2 == 1 else -1 for m in range(p)]
        steps.append((send, [nbytes] * p, recv))

    def real(v: int) -> int:
        return 2 * v + 1 if v < rem else v + rem

    virtual = [(-1 if m % 2 == 0 else m // 2) if m < 2 * rem else m - rem for m in range(p)]
    mask = 1
    while mask < pow2:
        partner = [real(v ^ mask) if v >= 0 else -1 for v in virtual]
        steps.append((partner, [nbytes] * p, partner))
        mask <<= 1
    if rem:
        send = [m - 1 if m < 2 * rem and m % 2 == 1 else -1 for m in range(p)]
        recv = [m + 1 if m < 2 * rem and m % 2 == 0 else -1 for m in range(p)]
        steps.append((send, [nbytes] * p, recv))
    return steps


def _ring_chunk_bytes(p: int, count: int) -> list[int]:
    """Bytes of each of the ring's p chunks (the first ``count % p`` one float longer)."""
    base, extra = divmod(count, p)
    return [(base + (1 if k < extra else 0)) * FLOAT_BYTES for k in range(p)]


def _ring_steps(p: int, count: int) -> list[tuple[list[int], list[int], list[int]]]:
    """Ring reduce-scatter then allgather as ``ring_allreduce`` in kernels/step_program.cpp."""
    sizes = _ring_chunk_bytes(p, count)
    right = [(m + 1) % p for m in range(p)]
    left = [(m - 1) % p for m in range(p)]
    steps = []
    for st in range(p - 1):  # reduce-scatter: send chunk (me - st)
        steps.append((right, [sizes[(m - st) % p] for m in range(p)], left))
    for st in range(p - 1):  # allgather: send chunk (me + 1 - st)
        steps.append((right, [sizes[(m + 1 - st) % p] for m in range(p)], left))
    return steps


ALLREDUCE_ALGORITHMS = ("auto", "ring", "recursive_doubling", "reduce_broadcast", "hierarchical", "tree")
"""The names of ``harness.scenario.network_fields.AllreduceAlgorithm``, as the native layer knows them."""


@lru_cache(maxsize=256)
def allreduce_program(
    p: int,
    count: int,
    ring_threshold_bytes: int = RING_THRESHOLD_BYTES,
    algorithm: str = "auto",
    member_nodes: tuple[int, ...] = (),
    tree_chunk_bytes: int = TREE_CHUNK_BYTES,
) -> StepProgram | RingProgram:
    """The native ``allreduce_program`` (kernels/step_program.cpp) for ``algorithm``: ``auto`` is a
    ring for p > 2, count >= p and at least ``ring_threshold_bytes``, recursive doubling
    otherwise; ``ring`` is a ring whenever p > 2 and count >= p; ``reduce_broadcast`` is the
    hierarchical allreduce on one node; ``hierarchical`` goes by ``member_nodes``; ``tree`` is
    :func:`tree_program` by ``member_nodes`` (empty: every member a node of its own) in chunks of
    ``tree_chunk_bytes``. Nothing for p == 1. ``tests/test_sim_model.py`` compares it, member by
    member, with the native builder (``harness._core.allreduce_steps``)."""
    if p < 1 or count < 0:
        raise ValueError(f"allreduce of {count} floats over {p} members")
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise ValueError(f"unknown allreduce algorithm {algorithm!r}")
    if p == 1:
        return _program([], 1)
    if algorithm == "tree":
        nodes = tuple(member_nodes) or tuple(range(p))
        if len(nodes) != p:
            raise ValueError(f"tree allreduce: {len(nodes)} node ids for {p} members")
        return tree_program(nodes, count, tree_chunk_bytes)
    if algorithm == "hierarchical":
        return hierarchical_program(tuple(member_nodes), count, ring_threshold_bytes)
    if algorithm == "reduce_broadcast":
        return hierarchical_program((0,) * p, count, ring_threshold_bytes)
    ring_fits = p > 2 and count >= p
    if algorithm == "ring" and ring_fits:
        return RingProgram(p, count)
    if algorithm == "auto" and ring_fits and count * FLOAT_BYTES >= ring_threshold_bytes:
        return RingProgram(p, count)
    return _program(_rd_steps(p, count), p, recursive_doubling=True)


@lru_cache(maxsize=256)
def hierarchical_program(
    member_nodes: tuple[int, ...], count: int, ring_threshold_bytes: int = RING_THRESHOLD_BYTES
) -> StepProgram:
    """The native ``hierarchical_allreduce`` (kernels/step_program.cpp) as aligned steps: a binomial
    reduce inside every node to its first member, the leaders' allreduce (ring or recursive
    doubling, as :func:`allreduce_program` picks for them), a binomial broadcast inside every
    node. ``member_nodes[m]``: the node of member m."""
    p = len(member_nodes)
    if p == 1:
        return _program([], 1)
    nbytes = count * FLOAT_BYTES
    local: dict[int, list[int]] = {}
    for m, node in enumerate(member_nodes):
        local.setdefault(node, []).append(m)
    leaders = [members[0] for members in local.values()]  # in order of first appearance
    widest = max(len(members) for members in local.values())
    steps = []

    def step(pairs: list[tuple[int, int]]) -> None:  # (sender, receiver) member pairs of one step
        send, recv = [-1] * p, [-1] * p
        for a, b in pairs:
            send[a], recv[b] = b, a
        steps.append((send, [nbytes] * p, recv))

    mask = 1
    while mask < widest:  # reduce: local index li with bit `mask` sends to li - mask
        step(
            [(ms[li], ms[li - mask]) for ms in local.values() for li in range(len(ms)) if li & mask and li % mask == 0]
        )
        mask <<= 1
    if len(leaders) > 1:
        for send_l, sizes, recv_l in _allreduce_steps(len(leaders), count, ring_threshold_bytes):
            send, recv = [-1] * p, [-1] * p
            size = [nbytes] * p
            for i, leader in enumerate(leaders):
                send[leader] = leaders[send_l[i]] if send_l[i] >= 0 else -1
                recv[leader] = leaders[recv_l[i]] if recv_l[i] >= 0 else -1
                size[leader] = sizes[i]
            steps.append((send, size, recv))
    top = 1
    while top * 2 < widest:
        top *= 2
    mask = top
    while mask >= 1 and widest > 1:  # broadcast: li with li % 2mask == 0 sends to li + mask
        step(
            [
                (ms[li], ms[li + mask])
                for ms in local.values()
                for li in range(0, len(ms), 2 * mask)
                if li + mask < len(ms)
            ]
        )
        mask >>= 1
    return _program(steps, p)


@dataclass(frozen=True)
class TreeShape:
    """The tree of the tree allreduce (``tree_shape`` in kernels/step_program.cpp): every member's
    ``parent`` (-1: the root, member 0), its ``children`` in order (its chain successor, then its
    tree children in heap order) and the ``colour`` of its edge to its parent (-1: the root),
    ``colours`` of them."""

    parent: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]
    colour: tuple[int, ...]
    colours: int


def tree_shape(member_nodes: tuple[int, ...]) -> TreeShape:
    """The tree allreduce's tree over members on ``member_nodes``: inside each node a chain of its
    members in member order (local member i's parent is local member i - 1), across nodes a
    binary tree over the nodes' first members in order of first appearance (head j's parent is
    head (j - 1) // 2); colours by greedy edge colouring in BFS order from the root (each edge to
    a child takes the smallest colour no coloured edge at the parent has)."""
    p = len(member_nodes)
    local: dict[int, list[int]] = {}
    for m, node in enumerate(member_nodes):
        local.setdefault(node, []).append(m)
    chains = list(local.values())  # in order of first appearance
    parent = [-1] * p
    children: list[list[int]] = [[] for _ in range(p)]
    for ms in chains:
        for a, b in itertools.pairwise(ms):
            parent[b] = a
            children[a].append(b)
    for j in range(1, len(chains)):
        head, up = chains[j][0], chains[(j - 1) // 2][0]
        parent[head] = up
        children[up].append(head)
    colour = [-1] * p
    queue = [0]
    for u in queue:  # grows as it goes: BFS
        used = {colour[u]} if colour[u] >= 0 else set()
        for v in children[u]:
            c = 0
            while c in used:
                c += 1
            colour[v] = c
            used.add(c)
            queue.append(v)
    return TreeShape(tuple(parent), tuple(tuple(c) for c in children), tuple(colour), max(colour) + 1 if p > 1 else 0)


def tree_chunks(count: int, tree_chunk_bytes: int = TREE_CHUNK_BYTES) -> int:
    """How many chunks the tree allreduce pipelines ``count`` floats in:
    ``max(1, min(count, ceil(bytes / tree_chunk_bytes)))``."""
    if tree_chunk_bytes <= 0:
        raise ValueError(f"tree allreduce: chunks of {tree_chunk_bytes} bytes")
    return max(1, min(count, -(-count * FLOAT_BYTES // tree_chunk_bytes)))


@lru_cache(maxsize=64)
def tree_program(member_nodes: tuple[int, ...], count: int, tree_chunk_bytes: int = TREE_CHUNK_BYTES) -> StepProgram:
    """The native ``tree_allreduce`` (kernels/step_program.cpp) as rounds of aligned steps: NCCL's
    pipelined tree (:func:`tree_shape`: a chain inside each node, a binary tree across nodes),
    ``count`` floats in :func:`tree_chunks` chunks (split as the ring's), reduced up the tree and
    broadcast back down, each edge carrying the buffer once each way.

    In every round every edge of the tree carries, at once, the child's next reduced chunk up
    (once the child has it from all its children; a child sends chunk c only after its earlier
    siblings did, so the parent adds in child order) and the parent's next final chunk down (the
    root's once reduced, the others' once received), all decided on the round's starting
    counters: a member sends and receives on all its edges together, as NCCL's tree does. A round
    is stored as one step per colour of :func:`tree_shape`'s edge colouring (each member has at
    most one edge of a colour: one send and one receive per step), joined by ``continues_round``;
    steps in which nothing moves are left out. A member's native steps are its rounds that move
    something, each with the sends and receives of its steps in colour order. One tree carries
    everything (NCCL runs two complementary binary trees, each with half of the buffer)."""
    p = len(member_nodes)
    if p == 1:
        return _program([], 1, tree=member_nodes)
    shape = tree_shape(member_nodes)
    k = tree_chunks(count, tree_chunk_bytes)
    sizes = np.array(_ring_chunk_bytes(k, count), dtype=float)
    parent = np.array(shape.parent)
    # Counters, with two sentinels: up[p] = k (what a leaf has reduced), up[p + 1] = k + 1 (the
    # "earlier sibling" of a first child, never waited for).
    up = np.zeros(p + 2, dtype=np.int64)
    up[p], up[p + 1] = k, k + 1
    down = np.zeros(p, dtype=np.int64)
    last_child = np.array([c[-1] if c else p for c in shape.children])
    before = np.full(p, p + 1)
    for c in shape.children:
        before[list(c[1:])] = c[:-1]
    # Every edge (by its child v), in colour order: colour col's are v[lanes[col]].
    v = np.array(sorted(range(1, p), key=lambda m: shape.colour[m]), dtype=np.int64)
    colour = np.array([shape.colour[m] for m in v])
    lanes = [
        slice(int(np.searchsorted(colour, col)), int(np.searchsorted(colour, col, side="right")))
        for col in range(shape.colours)
    ]
    a = parent[v]
    lc, bf, to_root, a_lc = last_child[v], before[v], a == 0, last_child[a]
    steps, joined = [], []
    unfinished = p - 1
    while unfinished:
        go_up = (up[v] < up[lc]) & (up[v] < up[bf])
        go_down = down[v] < np.where(to_root, up[a_lc], down[a])
        if not (go_up.any() or go_down.any()):
            raise RuntimeError("tree allreduce: the pipeline stalled (a bug)")
        first = True
        for lane in lanes:
            gu, gd = go_up[lane], go_down[lane]
            if not (gu.any() or gd.any()):
                continue
            send, size, recv = np.full(p, -1), np.zeros(p), np.full(p, -1)
            vu, au = v[lane][gu], a[lane][gu]
            send[vu], size[vu], recv[au] = au, sizes[up[vu]], vu
            vd, ad = v[lane][gd], a[lane][gd]
            send[ad], size[ad], recv[vd] = vd, sizes[down[vd]], ad
            steps.append((send, size, recv))
            joined.append(not first)
            first = False
        vu, vd = v[go_up], v[go_down]
        up[vu] += 1
        down[vd] += 1
        unfinished -= int(np.count_nonzero(down[vd] == k))
    return _program(steps, p, tree=member_nodes, continues_round=joined)


def _allreduce_steps(p: int, count: int, ring_threshold_bytes: int) -> list[tuple[list[int], list[int], list[int]]]:
    """The flat allreduce's steps (send_to, bytes, recv_from), as :func:`allreduce_program` picks."""
    if p > 2 and count >= p and count * FLOAT_BYTES >= ring_threshold_bytes:
        return _ring_steps(p, count)
    return _rd_steps(p, count)


class RingProgram:
    """The ring allreduce of ``count`` floats over ``p`` members, without its 2(p-1) x p step
    table unless someone asks for it (``steps_program``): at 16,384 members the table would
    hold half a billion entries.

    Member m sends every chunk but chunk m+1 in the reduce-scatter and every chunk but m+2 in
    the allgather (``_ring_steps``), which gives ``bytes_sent`` directly; on the base network
    :func:`run_program` uses the closed form of the ring's max-plus recurrence
    (:func:`_ring_completion`) instead of walking the steps.
    """

    def __init__(self, p: int, count: int) -> None:
        self.p = p
        self.count = count
        sizes = np.array(_ring_chunk_bytes(p, count), dtype=float)
        self.sizes = sizes  # bytes of each chunk
        members = np.arange(p)
        self.bytes_sent = 2 * sizes.sum() - sizes[(members + 1) % p] - sizes[(members + 2) % p]
        self.chunk_bytes = float(sizes.max())  # chunks differ by at most one float
        self.steps = 2 * (p - 1)

    @functools.cached_property
    def steps_program(self) -> StepProgram:
        return _program(_ring_steps(self.p, self.count), self.p)


@lru_cache(maxsize=64)
def barrier_program(p: int) -> StepProgram:
    """The native dissemination barrier (``dissemination_barrier`` in kernels/step_program.cpp):
    in step d = 1, 2, 4, ... < p member m sends an empty message to m + d and receives one from m - d."""
    steps = []
    d = 1
    while d < p:
        steps.append(([(m + d) % p for m in range(p)], [0] * p, [(m - d) % p for m in range(p)]))
        d <<= 1
    return _program(steps, p)


# The native group operations of the torch.distributed backend (kernels/group.cpp), by name.
GROUP_KINDS = ("allgather", "reduce_scatter", "reduce", "gather", "scatter", "alltoall")


@lru_cache(maxsize=64)  # a script posts the same few operations every step, at up to thousands of members
def group_program(kind: str, p: int, count: int, root: int = 0) -> StepProgram:
    """The native layer's program of a group operation of the torch.distributed backend over p
    members (``kernels/group.cpp``), ``count`` floats as collectives.csv sizes it
    (``harness.dist.sequence``): allgather and reduce_scatter in a ring, reduce down a binomial
    tree, gather, scatter and alltoall as direct messages. The native layer posts a gather's,
    scatter's or alltoall's messages at once; here they take p - 1 steps (the root's, or each
    member's, link carries them one after another), which a program of one message per member
    and step needs."""
    if kind not in GROUP_KINDS:
        raise ValueError(f"unknown group operation {kind!r} (known: {', '.join(GROUP_KINDS)})")
    nbytes = count * FLOAT_BYTES
    none = [-1] * p
    steps: list[tuple[list[int], list[int], list[int]]] = []
    if kind in ("allgather", "reduce_scatter"):
        piece = nbytes if kind == "allgather" else -(-count // p) * FLOAT_BYTES
        for _ in range(p - 1):
            steps.append(([(m + 1) % p for m in range(p)], [piece] * p, [(m - 1) % p for m in range(p)]))
    elif kind == "reduce":
        mask = 1
        while mask < p:  # virtual rank v = (m - root) mod p sends to v - mask when its lowest set bit is mask
            send, recv = none[:], none[:]
            for v in range(p):
                if v & mask and not v & (mask - 1):
                    src, dst = (v + root) % p, (v - mask + root) % p
                    send[src], recv[dst] = dst, src
            steps.append((send, [nbytes] * p, recv))
            mask <<= 1
    elif kind in ("gather", "scatter"):
        for other in (m for m in range(p) if m != root):
            send, recv = none[:], none[:]
            src, dst = (other, root) if kind == "gather" else (root, other)
            send[src], recv[dst] = dst, src
            steps.append((send, [nbytes] * p, recv))
    else:  # alltoall: in step k member m sends its piece for m + k and receives m - k's piece for it
        piece = -(-count // p) * FLOAT_BYTES
        for k in range(1, p):
            steps.append(([(m + k) % p for m in range(p)], [piece] * p, [(m - k) % p for m in range(p)]))
    return _program(steps, p)
