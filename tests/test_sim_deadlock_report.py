"""The simulator's deadlock report names what each stuck rank waits for: a sequenced message
(an exchange whose peer never posts), a collective a member never joins, push messages that
never come. (The blocking paths differ: the sequenced receive parks its rank without an event
object, the others wait on SimPy events.)"""

from __future__ import annotations

import pytest

from harness.sim.calibration import NetworkModel
from harness.sim.comm import SimFabric
from harness.sim.engine import SimDeadlock, SimEngine
from harness.sim.network import SimNetwork
from harness.sim.standin import StandIn

NET = NetworkModel(latency_s=1e-4, bandwidth_bytes_per_s=1e9)


def _run(ranks: int, bodies) -> None:
    engine = SimEngine()
    fabric = SimFabric(engine, SimNetwork(ranks, NET), ranks)
    comms = fabric.communicators()
    for r, body in enumerate(bodies):
        engine.spawn(r, lambda body=body, comm=comms[r]: body(comm))
    engine.run()


def test_an_exchange_whose_peer_never_posts_names_the_message() -> None:
    def exchanges(comm) -> None:
        comm.exchange(StandIn(8), StandIn(8), 1)

    def idle(comm) -> None:
        comm.engine.sleep(1.0)

    with pytest.raises(SimDeadlock, match=r"1 ranks wait forever: rank 0 waits for message 0 from rank 1$"):
        _run(2, [exchanges, idle])


def test_a_collective_a_member_never_joins_names_the_collective() -> None:
    def reduces(comm) -> None:
        comm.allreduce(StandIn(8))

    with pytest.raises(SimDeadlock, match=r"rank 0 waits for a allreduce over 3 ranks \(1 have not joined\), rank 1 "):
        _run(3, [reduces, reduces, lambda comm: None])


def test_push_messages_that_never_come_are_named() -> None:
    def drains(comm) -> None:
        channel = comm.push_channel(8)
        channel.drain(StandIn(8), min_messages=1, round=0)

    with pytest.raises(SimDeadlock, match=r"2 ranks wait forever: rank 0 waits for 1 push messages of round 0, rank 1"):
        _run(2, [drains, drains])


def test_a_message_sent_late_wakes_the_receiver_at_its_arrival() -> None:
    """The parked receiver of a sequenced message resumes when the message arrives."""
    ends: dict[int, float] = {}

    def early(comm) -> None:
        comm.exchange(StandIn(250), StandIn(250), 1)
        ends[0] = comm.engine.now()

    def late(comm) -> None:
        comm.engine.sleep(0.5)
        comm.exchange(StandIn(250), StandIn(250), 0)
        ends[1] = comm.engine.now()

    _run(2, [early, late])
    assert ends[0] == pytest.approx(0.5 + 1e-4 + 1000 / 1e9)  # rank 1's message, posted at 0.5 s
    assert ends[1] == 0.5  # rank 0's message arrived long before; its own send leaves at once
