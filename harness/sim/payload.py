"""Values on simulated operations: what ``simulate --train`` adds to the simulated communicator.

By default the simulator's operations move no data (buffers are stand-ins,
:mod:`harness.sim.standin`). With a :class:`Payload` on the fabric, every simulated rank's
buffers are real float32 tensors and each operation moves and combines values at the moment
the simulated network says it happens, with the native layer's arithmetic
(``harness.comm.communicator`` documents each operation):

- **collectives** (allreduce, broadcast; a wait-avoiding round's group allreduce): the
  contributions are read when the last member joins, the result (sum, or sum / size for
  ``mean``) is written into every member's buffer then. An algorithm may not touch a buffer
  between posting an operation and its completion (the native layer's rule too), so reading at
  the last join is reading at the post.
- **exchange**: the send buffer is copied when it is posted; it lands in the receiver's buffer
  when the receiver's handle is seen complete (``wait()``, or ``done()`` returning True), the
  only moments a well-behaved algorithm may read it.
- **push channel**: ``send`` copies the buffer once (the native channel snapshots it too);
  ``drain(out)`` adds the messages arrived by now into ``out`` in the native order (round,
  source rank, sequence from that source), so equal message sets give bit-equal sums.
- **wait-avoiding** (:class:`Published`): each rank's published buffer (WAGMA: overwritten by
  every round; eager-SGD's ``accumulate``: added to, and zeroed when a contribution takes it);
  a join contributes a copy of it, whenever the join happens (the caller's own, or its
  progress thread's on an activation); the round's sum lands in the caller's ``out`` when its
  handle completes.
- **pairwise averaging** (:class:`Pairwise`): the passive rank's agent answers at the simulated
  moment the request is served, with its view of the model (last published plus corrections
  not drained), and moves that view half-way to the requester's model, recording the move;
  ``drain`` adds the recorded moves to the caller's model.

Communication never depends on values in the timing model, so the discrete-event timing of a
run with values is the timing without them: ``--train`` adds numbers, it moves no event.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


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
        if (b.dim() != 1 or b.numel() != n or b.stride(0) != 1 or b.untyped_storage().data_ptr() != storage
                or b.storage_offset() != base + i * step):
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
    of kernels/schedule.cpp: p chunks, the first ``n % p`` one element longer) is accumulated
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
        out[wrap:wrap + src.shape[0]].copy_(src) if first else out[wrap:wrap + src.shape[0]].add_(src)


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


def native_sum(buffers: Sequence[torch.Tensor], schedule: Any) -> torch.Tensor:
    """The allreduce sum of ``buffers`` (member order) in the order the native schedule adds
    (``schedule``: the collective's, :mod:`harness.sim.network`): a ring or recursive doubling,
    so a simulation ends with the real run's numbers bit for bit; the hierarchical schedules
    (node-local reduce, leaders' allreduce) are summed in plain order, within rounding of them."""
    from harness.sim.network import RingSchedule

    if len(buffers) == 1:
        return buffers[0].clone()
    if isinstance(schedule, RingSchedule):
        return ring_sum(buffers)
    if getattr(schedule, "recursive_doubling", False):
        return doubling_sum(buffers)
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


class Payload:
    """The values side of one simulated fabric: messages in flight and the persistent
    operations' per-rank state (see the module docstring)."""

    def __init__(self, recorded_staleness: dict[tuple[int, int], int] | None = None) -> None:
        # A replay's recorded wait-avoiding staleness, {(rank, round): staleness} (see Published).
        self.recorded_staleness = recorded_staleness or {}
        self._messages: dict[tuple[int, int, int], torch.Tensor] = {}  # (src, dst, seq) -> exchange payload
        # dst -> round -> [(arrival, src, seq from src, values)] of push messages not drained
        self._pushes: dict[int, dict[int, list[tuple[float, int, int, torch.Tensor]]]] = {}
        self._push_seq: dict[tuple[int, int], int] = {}
        self._persistent: list = []  # the wait-avoiding and pairwise ops' per-rank state

    def track(self, state: "Published | Pairwise") -> "Published | Pairwise":
        """Keep ``state`` (a persistent operation's per-rank values) for :meth:`persistent_tensors`."""
        self._persistent.append(state)
        return state

    def persistent_tensors(self) -> list[torch.Tensor]:
        """Every tensor the persistent operations hold for the ranks (a real rank's native layer
        holds its own copy of each: a published buffer, an agent's view and correction)."""
        out = []
        for state in self._persistent:
            for value in vars(state).values():
                if isinstance(value, list):
                    out += [t for t in value if isinstance(t, torch.Tensor)]
                    out += [t for d in value if isinstance(d, dict) for t in d.values() if isinstance(t, torch.Tensor)]
        return out

    # -- collectives ------------------------------------------------------------------------------
    @staticmethod
    def combine(kind: str, buffers: list, reduce: str, root: int, in_place: bool,
                schedule: Any = None) -> torch.Tensor | None:
        """The values of a collective whose members all joined (``buffers`` in member order):
        the result, also written into every buffer when ``in_place``; an allreduce adds in the
        order of its native ``schedule`` (:func:`native_sum`)."""
        if kind == "allreduce":
            total = native_sum(buffers, schedule)
            if reduce == "mean":
                total.div_(len(buffers))
            if in_place:
                write_all(buffers, total)
            return total
        if kind == "broadcast":
            source = buffers[root]
            if in_place:
                write_all(buffers, source, skip=source)
            return source
        return None  # a barrier carries nothing

    # -- exchange -----------------------------------------------------------------------------------
    def sent(self, src: int, dst: int, seq: int, buf: torch.Tensor) -> None:
        self._messages[(src, dst, seq)] = buf.detach().clone()

    def delivered(self, src: int, dst: int, seq: int, recv: torch.Tensor) -> None:
        recv.copy_(self._messages.pop((src, dst, seq)))

    # -- push channel -------------------------------------------------------------------------------
    def pushed(self, src: int, dsts: Sequence[int], arrivals: Sequence[float], round: int, buf: torch.Tensor) -> None:
        snapshot = buf.detach().clone()
        for dst, arrival in zip(dsts, arrivals):
            seq = self._push_seq.get((src, dst), 0)
            self._push_seq[(src, dst)] = seq + 1
            self._pushes.setdefault(dst, {}).setdefault(round, []).append((arrival, src, seq, snapshot))

    def drained(self, rank: int, round: int | None, now: float, out: torch.Tensor) -> None:
        """Add the push messages arrived at ``rank`` by ``now`` (of ``round``, or of every
        round) into ``out``, in the native order, and forget them."""
        box = self._pushes.get(rank)
        if not box:
            return
        taken = []
        for r in ([round] if round is not None else sorted(box)):
            messages = box.get(r)
            if not messages:
                continue
            later = [m for m in messages if m[0] > now]
            taken += [(r, src, seq, values) for arrival, src, seq, values in messages if arrival <= now]
            if later:
                box[r] = later
            else:
                del box[r]
        for _, _, _, values in sorted(taken, key=lambda m: m[:3]):
            out[: values.numel()].add_(values)


class Deferred:
    """A wait-avoiding contribution that a recorded staleness says was fresher than what the
    simulated rank has published yet (:class:`Published`): its values are filled in when the
    rank publishes that round, and its collective is combined once none is left open."""

    __slots__ = ("rank", "round", "values", "_on_filled")

    def __init__(self, rank: int, round: int) -> None:
        self.rank, self.round = rank, round
        self.values: torch.Tensor | None = None
        self._on_filled: list = []

    def when_filled(self, callback) -> None:
        self._on_filled.append(callback)

    def fill(self, values: torch.Tensor) -> None:
        self.values = values
        for callback in self._on_filled:
            callback()


class Published:
    """A wait-avoiding op's published buffers, one per rank (``kernels/wait_avoiding.hpp``).

    ``recorded`` (a trace-driven replay of a real run, ``{(rank, round): staleness}`` from its
    steps.csv): a join of round k contributes what the real run's did, the buffer published for
    round ``k - staleness`` (WAGMA's overwrite; eager-SGD's accumulate: every publish not taken
    yet up to that round, added in order), whatever the simulated timing published by then; so
    the exchanges follow the real run's where it recorded them. A contribution the simulated
    rank has not published yet is :class:`Deferred` until it does. Without ``recorded`` a join
    contributes what is published when it happens (the simulated timing decides).
    """

    def __init__(self, ranks: int, accumulate: bool, recorded: dict[tuple[int, int], int] | None = None) -> None:
        self.accumulate = accumulate
        self.buffers: list[torch.Tensor | None] = [None] * ranks
        self.recorded = recorded or {}
        # With recorded staleness: every rank's publishes by round (accumulate: those not taken
        # yet), its latest round, and the contributions waiting for a later publish.
        self._history: list[dict[int, torch.Tensor]] = [{} for _ in range(ranks)]
        self._latest = [-1] * ranks
        self._deferred: list[list[Deferred]] = [[] for _ in range(ranks)]
        self._keep = 1 + max(self.recorded.values(), default=0)  # rounds of history a join may reach back

    def create(self, rank: int, initial: torch.Tensor) -> None:
        initial = initial.detach()
        self.buffers[rank] = torch.zeros_like(initial) if self.accumulate else initial.clone()
        if self.recorded and not self.accumulate:
            self._history[rank][-1] = self.buffers[rank].clone()

    def publish(self, rank: int, buf: torch.Tensor, round: int) -> None:
        if self.accumulate:
            self.buffers[rank].add_(buf)
        else:
            self.buffers[rank].copy_(buf)
        if not self.recorded:
            return
        history = self._history[rank]
        history[round] = buf.detach().clone()
        self._latest[rank] = round
        if not self.accumulate:
            for old in [r for r in history if r < round - self._keep]:
                del history[old]
        waiting = self._deferred[rank]
        while waiting and waiting[0].round <= round:
            deferred = waiting.pop(0)
            deferred.fill(self._take(rank, deferred.round))

    def contribution(self, rank: int, round: int) -> torch.Tensor | Deferred:
        """What a join of ``rank`` in ``round`` contributes now: a copy of its published buffer
        (which eager-SGD's accumulate mode then zeroes), or with a recorded staleness the
        buffer of the recorded round (see the class docstring)."""
        staleness = self.recorded.get((rank, round))
        if staleness is None and self.recorded:  # a round the run did not record: what is published now
            staleness = round - self._latest[rank]
        if staleness is not None:
            target = round - staleness
            if target > self._latest[rank]:
                deferred = Deferred(rank, target)
                self._deferred[rank].append(deferred)
                return deferred
            return self._take(rank, target)
        buf = self.buffers[rank]
        taken = buf.clone()
        if self.accumulate:
            buf.zero_()
        return taken

    def _take(self, rank: int, target: int) -> torch.Tensor:
        history = self._history[rank]
        if not self.accumulate:
            return history[max(r for r in history if r <= target)].clone()
        total = torch.zeros_like(self.buffers[rank])
        for r in sorted(r for r in history if r <= target):
            total.add_(history.pop(r))  # in the order the rank published them, as the native buffer adds
        return total


class Pairwise:
    """A pairwise averager's agents, one per rank (``kernels/async_pairwise*.cpp``)."""

    def __init__(self, ranks: int) -> None:
        self.published: list[torch.Tensor | None] = [None] * ranks
        self.correction: list[torch.Tensor | None] = [None] * ranks
        self.answered = [0] * ranks
        self._initial: torch.Tensor | None = None

    def create(self, rank: int, initial: torch.Tensor) -> None:
        if self._initial is None:
            self._initial = initial.detach().clone()
        if self.published[rank] is None:  # else answered before it created its side (see answer)
            self._agent(rank, initial)

    def _agent(self, rank: int, initial: torch.Tensor) -> None:
        self.published[rank] = initial.detach().clone()
        self.correction[rank] = torch.zeros_like(self.published[rank])

    def publish(self, rank: int, buf: torch.Tensor) -> None:
        torch.add(buf, self.correction[rank], out=self.published[rank])

    def answer(self, peer: int, request: torch.Tensor) -> torch.Tensor:
        """``peer``'s agent serves a request carrying ``request``: the reply, and its view moved
        half-way (the move recorded as a correction)."""
        if self.published[peer] is None:
            # A request served before the peer created its side (ranks start at different
            # times): the peer's model is still the initial one, which every rank shares.
            self._agent(peer, self._initial)
        view = self.published[peer]
        reply = view.clone()
        half = (request - view).mul_(0.5)
        self.correction[peer].add_(half)
        view.add_(half)
        self.answered[peer] += 1
        return reply

    def drain(self, rank: int, out: torch.Tensor) -> int:
        correction = self.correction[rank]
        out.add_(correction)
        correction.zero_()
        count, self.answered[rank] = self.answered[rank], 0
        return count

