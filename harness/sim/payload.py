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
from typing import Any, TypeVar

import torch

from harness.sim.sums import native_sum, write_all

_Persistent = TypeVar("_Persistent", "Published", "Pairwise")  # a persistent operation's values


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

    def track(self, state: _Persistent) -> _Persistent:
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
    def combine(
        kind: str, buffers: list, reduce: str, root: int, in_place: bool, schedule: Any = None
    ) -> torch.Tensor | None:
        """The values of a collective whose members all joined (``buffers`` in member order):
        the result, also written into every buffer when ``in_place``; an allreduce adds in the
        order of its native ``schedule`` (:func:`harness.sim.sums.native_sum`)."""
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
        for r in [round] if round is not None else sorted(box):
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

    __slots__ = ("_on_filled", "rank", "round", "values")

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
        created = torch.zeros_like(initial) if self.accumulate else initial.clone()
        self.buffers[rank] = created
        if self.recorded and not self.accumulate:
            self._history[rank][-1] = created.clone()

    def _buffer(self, rank: int) -> torch.Tensor:
        """``rank``'s published buffer (it created its op before it uses it)."""
        buf = self.buffers[rank]
        assert buf is not None, f"rank {rank} has not created the operation"
        return buf

    def publish(self, rank: int, buf: torch.Tensor, round: int) -> None:
        if self.accumulate:
            self._buffer(rank).add_(buf)
        else:
            self._buffer(rank).copy_(buf)
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
        buf = self._buffer(rank)
        taken = buf.clone()
        if self.accumulate:
            buf.zero_()
        return taken

    def _take(self, rank: int, target: int) -> torch.Tensor:
        history = self._history[rank]
        if not self.accumulate:
            return history[max(r for r in history if r <= target)].clone()
        total = torch.zeros_like(self._buffer(rank))
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
        published = initial.detach().clone()
        self.published[rank] = published
        self.correction[rank] = torch.zeros_like(published)

    def _view(self, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``rank``'s agent: its view and its correction (it exists once created or answered)."""
        view, correction = self.published[rank], self.correction[rank]
        assert view is not None and correction is not None, f"rank {rank} has no agent"
        return view, correction

    def publish(self, rank: int, buf: torch.Tensor) -> None:
        view, correction = self._view(rank)
        torch.add(buf, correction, out=view)

    def answer(self, peer: int, request: torch.Tensor) -> torch.Tensor:
        """``peer``'s agent serves a request carrying ``request``: the reply, and its view moved
        half-way (the move recorded as a correction)."""
        if self.published[peer] is None:
            # A request served before the peer created its side (ranks start at different
            # times): the peer's model is still the initial one, which every rank shares.
            assert self._initial is not None  # a request comes from a rank that created its side
            self._agent(peer, self._initial)
        view, correction = self._view(peer)
        reply = view.clone()
        half = (request - view).mul_(0.5)
        correction.add_(half)
        view.add_(half)
        self.answered[peer] += 1
        return reply

    def drain(self, rank: int, out: torch.Tensor) -> int:
        _, correction = self._view(rank)
        out.add_(correction)
        correction.zero_()
        count, self.answered[rank] = self.answered[rank], 0
        return count
