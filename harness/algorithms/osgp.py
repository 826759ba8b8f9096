"""Overlap SGP (tau-OSGP): push-sum whose gossip overlaps computation (Assran et al., ICML 2019).

Same push-sum state, graph and de-biasing as ``harness.algorithms.sgp`` (gradient at z = x / w,
the optimizer step updates the numerator). A gossip round is one push of [x, w] to the round's
exponential-graph out-peers plus the arrival of the round's k in-peer messages; rounds are
numbered alike on every rank (so each is a permutation) and at most one is in flight per rank:
the next round is pushed only once the previous one is complete (counted, as in SGP). At the
end of iteration t (``after_step``), with s = synch_freq::

    absorb whatever has arrived (never waits)
    if fewer than t // (s+1) + 1 rounds have been pushed and the round in flight is incomplete:
        wait until it is complete                  # the only place OSGP waits for gossip
    if the round in flight is complete (or none was pushed yet): push the next round

so a push runs during the next iteration's forward/backward, and a rank takes at most s + 1
iterations per gossip round (counted from the start of the run). s = 0 is 1-OSGP: the round
pushed at the end of iteration t-1 must have completed at the end of iteration t. Rounds
complete by message count, so messages of fast in-peers' later rounds stand in for a
straggler's late one (its mass is absorbed whenever it arrives): with s >= 1 fast ranks mostly
stop waiting for a straggler. With s = 0 and one peer each iteration needs one more message and
every rank produces one per iteration, so in the long run nobody outpaces the straggler.

Deliberate difference from the reference code, whose counter blocks after s *consecutive*
iterations without a completed round: there a rank may wait for a round that an in-peer will
only push after its own next iteration boundary; if that in-peer is inside a collective (the
loop's mid-run evaluation, or ``finish``) that waits for the blocked rank, the run deadlocks.
Here the rule is a function of t alone, so every rank that has finished iteration t-1 has
pushed every round a rank at iteration t can wait for (round t // (s+1) - 1 at most): no wait
can deadlock, and ``finish()`` only needs the channel flush. The price: after a stretch where
rounds ran ahead (no straggler), a later stall is waited out only once the rank's iterations
catch up with s + 1 per round. Pushing every iteration regardless of arrivals (also
deadlock-free) was rejected: irregular arrivals make the push-sum weights random-walk far from
1 and the numerator update lr * g then acts on z as lr * g / w, which diverged in tests.

OSGP is timing-dependent by design: it mixes whatever has arrived (of any round) when it
looks, so two runs of the same scenario differ in the last bits and beyond (blocking SGP, which
mixes exactly round t in iteration t, is bit-reproducible).

``staleness`` (recorded per iteration): iterations since this rank last completed a gossip
round (counting from iteration 0 before the first), plus one for the overlap (the reference's
``num_updates`` + 1): 1 for an on-time rank and always 1 at s = 0. It exceeds s + 1 only while a
rank is ahead of its round schedule (its rounds completed earlier than due), e.g. fast ranks
whose fast in-peers stood in for a straggler.

Example scenario entry: ``{name: osgp, peers: 1, synch_freq: 0}``.
"""

from __future__ import annotations

from harness.algorithms.params import OSGPParams
from harness.algorithms.sgp import SGP
from harness.schedules import osgp_rounds_due


class OSGP(SGP):
    name = "osgp"
    params: OSGPParams

    def __init__(self, params: OSGPParams, ctx) -> None:
        super().__init__(params, ctx)
        self.completed_at = 0  # iteration in which the newest round completed (0 before the first)

    def after_step(self, t: int) -> None:
        if not self.peers:
            return
        self.absorb()
        if self.rounds < osgp_rounds_due(t, self.params.synch_freq) and self.missing():
            self.absorb(min_messages=self.missing())
        if not self.missing():
            if self.rounds:
                self.completed_at = t
            self.push()
        self.staleness = t - self.completed_at + 1
