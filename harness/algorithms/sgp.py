"""SGP: stochastic gradient push (Assran, Loizou, Ballas, Rabbat, ICML 2019).

Push-sum gossip over the directed time-varying exponential graph of the reference code
(``harness.schedules.exponential_out_peers``: k = ``peers`` out-peers per round, hops
j * (k+1)^(t mod L)). Each rank holds a numerator x (``ctx.params``, which the optimizer
updates) and a weight w (init 1); the model it deploys and computes gradients at is the
de-biased z = x / w. Iteration t on rank i::

    before_forward:  keep x aside, ctx.params <- z = x / w     (the gradient is taken at z)
    after_backward:  ctx.params <- x                            (the step updates the numerator)
    <optimizer step> x <- OPT(x, g(z))
    after_step:      x, w <- x / (k+1), w / (k+1); push [x, w] to the k out-peers of round t
                     (non-blocking); wait until round t's k messages have arrived and add
                     them: x += sum received, w += sum received

The push channel (``Communicator.push_channel``) keeps arrivals by itself, per round: numerator
and weight travel in one buffer of n+1 floats tagged with their round, so mass and weight stay
together, and round t mixes exactly round t's messages, added in a fixed order (source rank),
never in arrival order. Blocking SGP is therefore deterministic: the same scenario gives
bit-identical models run after run (a test checks it at 3, 4 and 6 ranks), however the ranks'
timing varies. A fast in-peer's message of a later round waits in the channel for its round.
Where the graph names the rank itself (a hop that is a multiple of P), that share is kept, and
a rank named twice gets two shares: mass stays exact (the reference has no such case in its
experiments). Every rank pushes exactly one round per iteration and waits for its own previous
push before the next (at most one in flight). A rank only ever waits for round t's messages,
which its in-peers push at the end of their iteration t, before any later iteration boundary,
so the waits cannot deadlock, also not against a collective (evaluation, ``finish``) that other
ranks entered at an iteration boundary. Invariants at quiescent points (after ``finish()``):
sum_i w_i = P and sum_i x_i equals what a plain average would preserve.

``staleness``: 0 (the gossip of iteration t is mixed in iteration t); -1 on a single rank. The
overlap variant records iterations since it last mixed gossip (``harness.algorithms.osgp``).

Example scenario entry: ``{name: sgp, peers: 1}``.
"""

from __future__ import annotations

import torch

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.params import SGPParams
from harness.schedules import exponential_out_peers


class SGP(Algorithm):
    name = "sgp"
    params: SGPParams

    def __init__(self, params: SGPParams, ctx: AlgorithmContext) -> None:
        super().__init__(params, ctx)
        self.peers = params.peers if ctx.size > 1 else 0
        self.weight = 1.0
        n = ctx.params.numel()
        self.numerator = torch.empty_like(ctx.params)  # x, kept aside while ctx.params holds z
        self.message = ctx.params.new_empty(n + 1)  # derived from the model: a stand-in in the simulator
        self.inbox = ctx.params.new_zeros(n + 1)
        self.channel = ctx.comm.push_channel(n + 1) if self.peers else None  # collective
        self.rounds = 0  # rounds pushed so far; every rank pushes rounds 0, 1, 2, ... in this order
        self.expected = 0  # messages addressed to this rank in the rounds pushed so far
        self.received = 0  # messages absorbed so far
        self.send = None  # handle of the newest push: at most one in flight
        self.debiased = False
        self.staleness = 0 if self.peers else -1

    # -- hooks ---------------------------------------------------------------------------------
    def before_forward(self, t: int) -> None:
        if self.weight != 1.0:
            self.numerator.copy_(self.ctx.params)
            self.ctx.params.div_(self.weight)
            self.debiased = True

    def after_backward(self, t: int) -> None:
        if self.debiased:
            # Copy back rather than multiply by w: the numerator stays bit-exact.
            self.ctx.params.copy_(self.numerator)
            self.debiased = False

    def after_step(self, t: int) -> None:
        if not self.peers:
            return
        round_t = self.rounds
        others = self.push()  # round t
        self.absorb(round=round_t, min_messages=others)
        self.staleness = 0

    def finish(self) -> None:
        if self.channel is None:
            return
        self.channel.flush()  # collective: every push of every rank is in its receiver's accumulator
        self.absorb()
        self.channel.close()
        self.channel = None
        self.send = None

    def eval_params(self) -> torch.Tensor:
        """The de-biased model z = x / w."""
        return self.ctx.params if self.weight == 1.0 else self.ctx.params / self.weight

    # -- push-sum ------------------------------------------------------------------------------
    def push(self) -> int:
        """Keep 1/(k+1) of [x, w] per self-addressed peer plus one; push 1/(k+1) to each other
        out-peer of the next round (``self.rounds``). Returns how many messages were pushed,
        which is also how many of that round are addressed to this rank."""
        if self.send is not None:
            self.send.wait()
        out = exponential_out_peers(self.ctx.rank, self.ctx.size, self.rounds, self.peers)
        others = [p for p in out if p != self.ctx.rank]
        share = 1.0 / (self.peers + 1)
        x = self.ctx.params
        n = x.numel()
        if len(others) == len(out):
            x.mul_(share)
            self.weight *= share
            self.message[:n].copy_(x)
            self.message[n] = self.weight
        else:  # the graph names this rank itself: it keeps those shares
            kept = (len(out) - len(others) + 1) * share
            torch.mul(x, share, out=self.message[:n])
            self.message[n] = self.weight * share
            x.mul_(kept)
            self.weight *= kept
        # snapshots the message; a round of self-addressed shares only sends nothing
        assert self.channel is not None  # rounds are pushed only with peers
        self.send = self.channel.send(self.message, others, round=self.rounds) if others else None
        self.rounds += 1
        self.expected += len(others)
        return len(others)

    def missing(self) -> int:
        """Messages addressed to this rank in rounds 0 .. rounds-1 that it has not absorbed yet."""
        return max(0, self.expected - self.received)

    def absorb(self, round: int | None = None, min_messages: int = 0) -> int:
        """Add what has arrived (of ``round``, or of every round) into [x, w], waiting for at
        least ``min_messages`` messages."""
        assert self.channel is not None  # absorbed only with peers, before finish() closes the channel
        if not min_messages and not self.channel.pending(round):
            return 0  # skip clearing and adding n floats of nothing
        self.inbox.zero_()
        got = self.channel.drain(self.inbox, min_messages=min_messages, round=round)
        if got:
            n = self.ctx.params.numel()
            self.ctx.params.add_(self.inbox[:n])
            self.weight += float(self.inbox[n])
            self.received += got
        return got
