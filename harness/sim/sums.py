"""The native layer's arithmetic of a sum over members, rounding for rounding.

A simulation with values (:mod:`harness.sim.payload`) must add what an allreduce adds in the
order the native program adds it (``kernels/step_program.cpp``): float addition is commutative
but not associative, so only the same order gives the real run's numbers bit for bit. The ring
accumulates every chunk along the ring from its own member; recursive doubling folds the
members beyond a power of two and then adds partners' sums; the tree adds children's partial
sums up a tree. ``tests/test_sim_training.py`` checks them against a literal step-by-step
replay of the native programs.

Buffers that are equally spaced rows of one tensor (every simulated rank's ``ctx.params`` or
``ctx.grads``: rows of the replicas' stacked tensors) are read and written as one strided view.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from harness.sim.step_programs import RingProgram


def stacked_rows(buffers: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The ``[len(buffers), n]`` view whose rows are ``buffers``, when they are equally spaced
    rows of one storage (every rank's ``ctx.params`` or ``ctx.grads``: rows of the replicas'
    stacked tensors), else None: an allreduce over every rank then reads and writes them in place,
    with no stacked copy."""
    first = buffers[0]
    if len(buffers) < 2 or first.dim() != 1 or first.stride(0) != 1:
        return None
    storage = first.untyped_storage().data_ptr()
    n, base = first.numel(), first.storage_offset()
    step = buffers[1].storage_offset() - base
    if step < n:
        return None
    for i, b in enumerate(buffers):
        if (
            b.dim() != 1
            or b.numel() != n
            or b.stride(0) != 1
            or b.untyped_storage().data_ptr() != storage
            or b.storage_offset() != base + i * step
        ):
            return None
    return first.as_strided((len(buffers), n), (step, 1), base)


def reduce_sum(buffers: Sequence[torch.Tensor]) -> torch.Tensor:
    """A new tensor holding the element-wise sum of ``buffers`` (in no particular order)."""
    rows = stacked_rows(buffers)
    if rows is not None:
        return rows.sum(0)
    total = buffers[0].clone()
    for b in buffers[1:]:
        total.add_(b)
    return total


def _rows(buffers: Sequence[torch.Tensor]) -> torch.Tensor:
    rows = stacked_rows(buffers)
    return rows if rows is not None else torch.stack(list(buffers))


def ring_sum(buffers: Sequence[torch.Tensor]) -> torch.Tensor:
    """The sum the native ring allreduce computes, rounding for rounding: chunk c (``chunk_begin``
    of kernels/step_program.cpp: p chunks, the first ``n % p`` one element longer) is accumulated
    along the ring from member c, ``acc = x[c + j] + acc`` for j = 1 .. p-1 (its
    reduce-scatter), so every chunk's additions happen in that order. Chunk c of member c + j,
    for every c at once, is a (wrapped) diagonal of the ``[members, chunks, length]`` view of
    the rows: two strided views per step and chunk length, no copies."""
    if len(buffers) <= 8 and stacked_rows(buffers) is None:
        return _ring_sum_by_chunk(buffers)
    rows = _rows(buffers)
    p, n = rows.shape
    base, extra = divmod(n, p)
    total = torch.empty(n, dtype=rows.dtype, device=rows.device)
    # The chunks of one length, as [members, chunks, length] views of the rows and the result.
    regions = [(0, extra, base + 1), (extra, p, base)]
    for first, last, length in regions:
        if last == first or length == 0:
            continue
        start = first * (base + 1) if first == 0 else extra * (base + 1)
        end = start + (last - first) * length
        part = rows[:, start:end].unflatten(1, (last - first, length))
        out = total[start:end].view(last - first, length)
        for j in range(p):
            _add_diagonals(out, part, (first + j) % p, p, first=j == 0)
    return total


def _add_diagonals(out: torch.Tensor, part: torch.Tensor, shift: int, p: int, first: bool) -> None:
    """``out[c] (+)= part[(c + shift) % p, c]`` for every chunk c of ``out`` (``[chunks, length]``;
    ``part``: ``[members, chunks, length]``); ``first``: copy instead of adding."""
    k = out.shape[0]
    below = min(k, p - shift)  # chunks c with c + shift < p: the diagonal at -shift
    if below > 0:
        src = torch.diagonal(part, offset=-shift, dim1=0, dim2=1)[:, :below].T
        out[:below].copy_(src) if first else out[:below].add_(src)
    wrap = p - shift  # chunks c >= p - shift wrap to member c + shift - p: the diagonal at p - shift
    if shift > 0 and wrap < k:
        src = torch.diagonal(part, offset=wrap, dim1=0, dim2=1).T
        out[wrap : wrap + src.shape[0]].copy_(src) if first else out[wrap : wrap + src.shape[0]].add_(src)


def _ring_sum_by_chunk(buffers: Sequence[torch.Tensor]) -> torch.Tensor:
    """:func:`ring_sum` of a few separate buffers, chunk by chunk (no stacked copy of them)."""
    p, n = len(buffers), buffers[0].numel()
    base, extra = divmod(n, p)
    total = torch.empty_like(buffers[0])
    for c in range(p):
        chunk = slice(c * base + min(c, extra), (c + 1) * base + min(c + 1, extra))
        out = total[chunk]
        out.copy_(buffers[c][chunk])
        for j in range(1, p):
            out.add_(buffers[(c + j) % p][chunk])
    return total


def doubling_sum(buffers: Sequence[torch.Tensor]) -> torch.Tensor:
    """The sum the native recursive-doubling allreduce computes, rounding for rounding: the
    members beyond the largest power of two fold into their even neighbours (``x[m] + x[m-1]``
    for odd m < 2 * rem), then log2 butterfly steps add partners' sums (float addition is
    commutative, so both partners hold the same)."""
    p = len(buffers)
    pow2 = 1 << (p.bit_length() - 1)
    rem = p - pow2
    virtual = [buffers[2 * v + 1] + buffers[2 * v] if v < rem else buffers[v + rem] for v in range(pow2)]
    level = torch.stack(virtual)
    mask = 1
    while mask < pow2:
        partner = torch.arange(pow2, device=level.device) ^ mask
        level = level + level[partner]
        mask <<= 1
    return level[0]


def tree_sum(buffers: Sequence[torch.Tensor], member_nodes: Sequence[int]) -> torch.Tensor:
    """The sum the native tree allreduce computes (``tree_allreduce`` in kernels/step_program.cpp),
    rounding for rounding, over members on ``member_nodes``: every member adds to its own buffer
    its children's partial sums in child order, ``((x[m] + s[c1]) + s[c2]) + ...``, and the
    root's sum comes back down unchanged. Its chunks all add alike, so the sum does not depend on
    the chunk size. The tree (:func:`harness.sim.step_programs.tree_shape`): a chain
    inside each node, so a chain's partial sum is ``x[l1] + (x[l2] + (... + x[tail]))``, and a
    binary heap over the nodes' heads, whose head j adds its chain, then heads 2j + 1 and 2j + 2.
    Computed a chain position at a time and a heap level at a time, over all nodes at once."""
    p = len(buffers)
    if p == 1:
        return buffers[0].clone()
    local: dict[int, list[int]] = {}
    for m, node in enumerate(member_nodes):
        local.setdefault(node, []).append(m)
    chains = list(local.values())  # in order of first appearance: heap order of the heads
    rows = _rows(buffers)
    device = rows.device

    def index(members: list[int]) -> torch.Tensor:
        return torch.tensor(members, dtype=torch.long, device=device)

    # chain[j]: the partial sum node j's second member sends its head (nodes of one member: none).
    widest = max(len(ms) for ms in chains)
    chain: torch.Tensor | None = None
    if widest > 1:
        chain = torch.empty((len(chains), rows.shape[1]), dtype=rows.dtype, device=device)
        for i in range(widest - 1, 0, -1):  # chain position i, from the tails up
            tails = [j for j, ms in enumerate(chains) if len(ms) == i + 1]
            inner = [j for j, ms in enumerate(chains) if len(ms) > i + 1]
            if tails:
                chain[index(tails)] = rows[index([chains[j][i] for j in tails])]
            if inner:
                at = index(inner)
                chain[at] = rows[index([chains[j][i] for j in inner])] + chain[at]
    # The heads a heap level at a time, from the deepest: level d holds heads [2^d - 1, 2^(d+1) - 1).
    heads = len(chains)
    levels = []
    first = 0
    while first < heads:
        levels.append((first, min(heads, 2 * first + 1)))
        first = 2 * first + 1
    below = None  # the partial sums of the level under the current one
    for lo, hi in reversed(levels):
        level = rows[index([chains[j][0] for j in range(lo, hi)])]  # a copy: gathered rows
        if chain is not None:
            with_chain = [j - lo for j in range(lo, hi) if len(chains[j]) > 1]
            if with_chain:
                at = index(with_chain)
                level[at] = level[at] + chain[at + lo]
        if below is not None:  # head lo + i's tree children are below's 2i and 2i + 1
            left = below[0::2]
            level[: left.shape[0]] += left
            right = below[1::2]
            level[: right.shape[0]] += right
        below = level
    assert below is not None  # at least one node: at least one level
    return below[0]


def native_sum(buffers: Sequence[torch.Tensor], program: Any) -> torch.Tensor:
    """The allreduce sum of ``buffers`` (member order) in the order the native program adds
    (``program``: the collective's, :mod:`harness.sim.network`): a ring, recursive doubling or
    the tree, so a simulation ends with the real run's numbers bit for bit; the hierarchical
    programs (node-local reduce, leaders' allreduce) are summed in plain order, within rounding
    of them."""
    if len(buffers) == 1:
        return buffers[0].clone()
    if isinstance(program, RingProgram):
        return ring_sum(buffers)
    if getattr(program, "recursive_doubling", False):
        return doubling_sum(buffers)
    tree = getattr(program, "tree", None)
    if tree is not None:
        return tree_sum(buffers, tree)
    return reduce_sum(buffers)


def write_all(buffers: Sequence[torch.Tensor], value: torch.Tensor, skip: torch.Tensor | None = None) -> None:
    """Copy ``value`` into every buffer (but ``skip``)."""
    rows = stacked_rows(buffers) if skip is None else None
    if rows is not None:
        rows.copy_(value.expand_as(rows))
        return
    for b in buffers:
        if b is not skip:
            b.copy_(value)
