"""Timing models of the twelve algorithms: what each one sends, when, and what it waits for.

Each model mirrors its real algorithm (``harness/algorithms/<name>.py``) hook by hook, with the
same hooks the training loop calls (``before_forward``, ``after_backward``, ``after_step``),
and takes peers, groups, initiators and sync points from the same pure functions of
``harness.schedules``. Models move no data: they post simulated messages and collectives of
the right sizes and wait where the real algorithm blocks. Hooks are generators (SimPy
processes' ``yield from``) over one rank ``r``; every rank's state lives in per-rank lists.

Per (rank, iteration) a model accumulates ``bytes_sent[r]`` (payload it posted) and sets
``staleness[r]`` where the real algorithm defines one.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import ClassVar

from harness.schedules import (
    bipartite_exponential_shift,
    bipartite_peer,
    exponential_out_peers,
    majority_initiator,
    mixing_row,
    osgp_rounds_due,
    periodic_sync,
    wagma_group,
)
from harness.sim.network import FLOAT_BYTES
from harness.sim.primitives import Collective, Mailboxes, WaitAvoiding, wait_until


class SimContext:
    """What a model may use: the SimPy env, the network, mailboxes and the run's constants."""

    def __init__(self, env, network, ranks: int, count: int, seed: int) -> None:
        self.env = env
        self.network = network
        self.ranks = ranks
        self.count = count  # floats in the model (the communicated buffer)
        self.seed = seed
        self.mail = Mailboxes(env, network, ranks)

    def collective(self) -> Collective:
        """An allreduce of the model over all ranks."""
        return Collective(self.env, self.network, range(self.ranks), self.count)


def _nothing() -> Generator:
    return
    yield  # noqa: unreachable - makes this a generator


class SimAlgorithm:
    """Base: every hook does nothing; subclasses override the ones their algorithm uses."""

    name: ClassVar[str]

    def __init__(self, params, ctx: SimContext) -> None:
        self.params = params
        self.ctx = ctx
        self.bytes_sent = [0] * ctx.ranks
        self.staleness = [-1] * ctx.ranks

    def before_forward(self, r: int, t: int) -> Generator:
        return _nothing()

    def after_backward(self, r: int, t: int) -> Generator:
        return _nothing()

    def after_step(self, r: int, t: int) -> Generator:
        return _nothing()


class _GlobalRounds:
    """Blocking or overlapped allreduces over all ranks, one per sync index (shared by ranks)."""

    def __init__(self, ctx: SimContext) -> None:
        self.ctx = ctx
        self.ops: dict[int, Collective] = {}

    def join(self, r: int, index: int) -> Collective:
        op = self.ops.get(index)
        if op is None:
            op = self.ops[index] = self.ctx.collective()
        op.join(r)
        return op

    def blocking(self, r: int, index: int, bytes_sent: list[int]) -> Generator:
        """Join allreduce ``index`` and wait for it, counting ``r``'s bytes."""
        op = self.join(r, index)
        bytes_sent[r] += op.sent_by(r)
        yield from op.wait(r)


class AllreduceSGD(SimAlgorithm):
    """Blocking allreduce of the gradient every iteration."""

    name = "allreduce_sgd"

    def __init__(self, params, ctx) -> None:
        super().__init__(params, ctx)
        self.rounds = _GlobalRounds(ctx)

    def after_backward(self, r, t):
        return self.rounds.blocking(r, t, self.bytes_sent)


class LocalSGD(SimAlgorithm):
    """Blocking model allreduce after the step of every ``periodic_sync`` iteration (BMUF too)."""

    name = "local_sgd"

    def __init__(self, params, ctx) -> None:
        super().__init__(params, ctx)
        self.rounds = _GlobalRounds(ctx)

    def after_step(self, r, t):
        if periodic_sync(t, self.params.period):
            yield from self.rounds.blocking(r, t, self.bytes_sent)


class BMUF(LocalSGD):
    name = "bmuf"


class OverlapLocalSGD(SimAlgorithm):
    """At a sync point: wait for the allreduce started at the previous one, start the next.

    Overlap Local SGD, CoCoD-SGD and overlapped EASGD have this timing; blocking EASGD waits at once.
    """

    name = "overlap_local_sgd"
    overlapped = True

    def __init__(self, params, ctx) -> None:
        super().__init__(params, ctx)
        self.rounds = _GlobalRounds(ctx)
        self.pending: list[Collective | None] = [None] * ctx.ranks

    def after_step(self, r, t):
        if not periodic_sync(t, self.params.period):
            self.staleness[r] = -1
            return
        if self.pending[r] is not None:
            yield from self.pending[r].wait(r)
        op = self.rounds.join(r, t)
        self.bytes_sent[r] += op.sent_by(r)
        self.pending[r] = op
        if not self.overlapped:
            yield from op.wait(r)
            self.pending[r] = None
        self.staleness[r] = self.params.period


class CoCoDSGD(OverlapLocalSGD):
    name = "cocod_sgd"


class EASGD(OverlapLocalSGD):
    name = "easgd"

    def __init__(self, params, ctx) -> None:
        super().__init__(params, ctx)
        self.overlapped = bool(params.overlap)


class SGP(SimAlgorithm):
    """Push-sum: push one round per iteration, then wait for this round's in-messages."""

    name = "sgp"
    by_round = True  # mixes exactly round t's messages (OSGP: whatever has arrived)

    def __init__(self, params, ctx) -> None:
        super().__init__(params, ctx)
        self.peers = params.peers if ctx.ranks > 1 else 0
        self.message_bytes = (ctx.count + 1) * FLOAT_BYTES  # numerator and weight together
        self.rounds = [0] * ctx.ranks
        self.send_done = [0.0] * ctx.ranks  # completion of each rank's newest push
        self.expected = [0] * ctx.ranks  # messages addressed to each rank in the rounds it pushed
        if self.peers:
            self.staleness = [0] * ctx.ranks

    def push(self, r: int) -> Generator:
        yield from wait_until(self.ctx.env, self.send_done[r])  # at most one push in flight
        done = 0.0
        round_ = self.rounds[r]
        for peer in exponential_out_peers(r, self.ctx.ranks, round_, self.peers):
            if peer == r:  # a self-addressed share is kept, not sent
                continue
            done = max(done, self.ctx.mail.push(r, peer, self.message_bytes, round_ if self.by_round else None))
            self.bytes_sent[r] += self.message_bytes
            self.expected[r] += 1  # as many messages of this round are addressed to r
        self.send_done[r] = done
        self.rounds[r] += 1

    def after_step(self, r, t):
        if not self.peers:
            return
        before = self.expected[r]
        yield from self.push(r)
        yield from self.ctx.mail.wait_count(r, self.expected[r] - before, round=self.rounds[r] - 1)


class OSGP(SGP):
    """Overlap SGP: wait for the round in flight only when the schedule says it is due."""

    name = "osgp"
    by_round = False

    def __init__(self, params, ctx) -> None:
        super().__init__(params, ctx)
        self.completed_at = [0] * ctx.ranks

    def after_step(self, r, t):
        if not self.peers:
            return
        needed = self.expected[r]
        if self.ctx.mail.delivered[r] < needed and self.rounds[r] < osgp_rounds_due(t, self.params.synch_freq):
            yield from self.ctx.mail.wait_count(r, needed)
        if self.ctx.mail.delivered[r] >= needed:
            if self.rounds[r]:
                self.completed_at[r] = t
            yield from self.push(r)
        self.staleness[r] = t - self.completed_at[r] + 1


class DPSGD(SimAlgorithm):
    """Blocking model exchange with every ring neighbour, or (``bipartite_exponential``) a push
    to the iteration's out-peer and a wait for the in-peer's push of the same iteration."""

    name = "dpsgd"

    def __init__(self, params, ctx) -> None:
        super().__init__(params, ctx)
        self.exchanged: dict[tuple[int, int], int] = {}  # messages sent per ordered pair

    def after_backward(self, r, t):
        nbytes = self.ctx.count * FLOAT_BYTES
        if self.params.graph == "bipartite_exponential":  # push half to one rank, wait for one
            if self.ctx.ranks > 1:
                out = (r + bipartite_exponential_shift(self.ctx.ranks, t)) % self.ctx.ranks
                self.ctx.mail.push(r, out, nbytes, t)
                self.bytes_sent[r] += nbytes
                yield from self.ctx.mail.wait_count(r, 1, round=t)
            return
        peers = [j for j in mixing_row(r, self.ctx.ranks, t, self.params.graph) if j != r]
        waits = []
        for j in peers:  # every exchange posted before any is waited for
            seq = self.exchanged.get((r, j), 0)
            self.exchanged[(r, j)] = seq + 1
            waits.append((j, seq, self.ctx.mail.send(r, j, nbytes)))
            self.bytes_sent[r] += nbytes
        for j, seq, released in waits:
            yield from self.ctx.mail.receive(j, r, seq)
            yield from wait_until(self.ctx.env, released)


class ADPSGD(SimAlgorithm):
    """Active ranks request a pairwise average before computing; passive progress threads answer."""

    name = "adpsgd"

    def __init__(self, params, ctx) -> None:
        super().__init__(params, ctx)
        self.reply_at = [0.0] * ctx.ranks

    def before_forward(self, r, t):
        if r % 2 == 0:
            peer = bipartite_peer(r, self.ctx.ranks, t)
            nbytes = self.ctx.count * FLOAT_BYTES
            _, request = self.ctx.network.message(r, peer, nbytes, self.ctx.env.now)
            _, self.reply_at[r] = self.ctx.network.message(peer, r, nbytes, request)  # answered on arrival
            self.bytes_sent[r] += nbytes
        return _nothing()

    def after_step(self, r, t):
        if r % 2 == 0:
            yield from wait_until(self.ctx.env, self.reply_at[r])
            self.staleness[r] = 1


class WAGMA(SimAlgorithm):
    """One wait-avoiding group round per iteration, between backward and the step."""

    name = "wagma"

    def __init__(self, params, ctx) -> None:
        super().__init__(params, ctx)
        size = params.group_size

        def group_of(rank: int, k: int) -> list[int]:
            return wagma_group(rank, ctx.ranks, size, k)

        self.op = WaitAvoiding(ctx.env, ctx.network, ctx.ranks, ctx.count, params.sync_period + 1, group_of,
                               lambda rank, k: True)

    def after_backward(self, r, t):
        staleness, sent = yield from self.op.round(r, t)
        self.staleness[r] = staleness
        self.bytes_sent[r] += sent


class EagerSGD(SimAlgorithm):
    """Partial allreduce of the gradient over all ranks: solo or majority activation."""

    name = "eager_sgd"

    def __init__(self, params, ctx) -> None:
        super().__init__(params, ctx)
        everyone = list(range(ctx.ranks))
        if params.mode == "solo":
            def may_activate(rank: int, k: int) -> bool:
                return True
        else:
            def may_activate(rank: int, k: int) -> bool:
                return rank == majority_initiator(ctx.seed, k, ctx.ranks)
        self.op = WaitAvoiding(ctx.env, ctx.network, ctx.ranks, ctx.count, params.sync_period,
                               lambda rank, k: everyone, may_activate)

    def after_backward(self, r, t):
        staleness, sent = yield from self.op.round(r, t)
        self.staleness[r] = staleness
        self.bytes_sent[r] += sent


MODELS: dict[str, type[SimAlgorithm]] = {
    cls.name: cls
    for cls in (AllreduceSGD, LocalSGD, OverlapLocalSGD, EASGD, CoCoDSGD, BMUF, SGP, OSGP, DPSGD, ADPSGD,
                WAGMA, EagerSGD)
}
