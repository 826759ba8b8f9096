"""The quorum rule of the wait-avoiding allreduce: a round is activated once ``quorum`` callers arrived.

* Native layer under mpiexec at 3, 5 and 4 ranks (``tests/mpi/quorum_checks.py``): identical,
  exact sums with quorum ceil(P/2); quorum P waits for the slow rank, ceil(P/2) does not;
  out-of-range quorums are refused.
* One process: validation in a world of one rank, the call log, the simulator's rule.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from conftest import mpi_check_suite
from harness.comm.call_log import CallLog
from harness.sim.calibration import NetworkModel
from harness.sim.comm import SimCommError, SimFabric
from harness.sim.engine import SimEngine
from harness.sim.network import SimNetwork
from harness.sim.standin import StandIn

CHECKS_SCRIPT = "quorum_checks.py"


# -- native layer under mpiexec ---------------------------------------------------------------------

TestQuorumChecks = mpi_check_suite(CHECKS_SCRIPT, (3, 5, 4), checks=3, timeout=200)


# -- one process ------------------------------------------------------------------------------------

def test_quorum_is_checked_in_a_world_of_one():
    from harness.comm import Communicator

    with Communicator() as comm:
        x = np.zeros(4, dtype=np.float32)
        for bad in (0, 2, "1"):
            with pytest.raises(ValueError, match="quorum"):
                comm.wait_avoiding(x, phases=[[0]], sync_every=0, quorum=bad)
        out = np.zeros(4, dtype=np.float32)
        wa = comm.wait_avoiding(x, phases=[[0]], sync_every=0, accumulate=True, quorum=1)
        wa.round(np.ones(4, dtype=np.float32), out)  # quorum 1: the old rule
        wa.close()
        assert out.tolist() == [1.0] * 4


def test_call_log_passes_quorum_and_records_it_when_not_one():
    comm = mock.MagicMock(rank=0, size=4)
    log = CallLog(comm)
    x = np.zeros(3, dtype=np.float32)
    log.wait_avoiding(x, phases=[[0, 1, 2, 3]], sync_every=0, accumulate=True, quorum=3)
    log.wait_avoiding(x, phases=[[0, 1]], sync_every=2)
    assert comm.wait_avoiding.call_args_list[0].kwargs["quorum"] == 3
    assert comm.wait_avoiding.call_args_list[1].kwargs["quorum"] == 1
    assert [c.detail for c in log.calls] == ["sync_every=0 accumulate=1 phases=0;1;2;3 quorum=3",
                                             "sync_every=2 accumulate=0 phases=0;1"]


# -- the simulator ------------------------------------------------------------------------------------

ALPHA = 1e-3
ARRIVALS = [0.0, 0.01, 0.02, 1.0]  # rank 3 is the slow one


def simulate_round(quorum: int, arrivals=ARRIVALS, rounds: int = 1) -> list[list[dict]]:
    """Ranks arrive at round 0 at ``arrivals[r]`` (later rounds back to back); returns each
    rank's infos."""
    p = len(arrivals)
    engine = SimEngine()
    fabric = SimFabric(engine, SimNetwork(p, NetworkModel(latency_s=ALPHA, bandwidth_bytes_per_s=1e9)), p)
    infos: list[list[dict]] = [[] for _ in range(p)]

    def body(comm):
        def run():
            wa = comm.wait_avoiding(StandIn(8), phases=[list(range(p))], sync_every=0, accumulate=True, quorum=quorum)
            engine.sleep(arrivals[comm.rank])
            for _ in range(rounds):
                infos[comm.rank].append(wa.round(StandIn(8), StandIn(8), may_activate=True))
            wa.close()
        return run

    for comm in fabric.communicators():
        engine.spawn(comm.rank, body(comm))
    engine.run()
    return infos


def test_sim_quorum_of_all_completes_after_the_last_arrival():
    infos = simulate_round(quorum=4)
    assert all(i[0]["t_done"] >= ARRIVALS[-1] for i in infos), [i[0]["t_done"] for i in infos]
    assert all(i[0]["staleness"] == 0 and not i[0]["joined_early"] for i in infos)


def test_sim_quorum_of_one_completes_after_the_first_arrival():
    infos = simulate_round(quorum=1)
    done = [i[0]["t_done"] for i in infos]
    assert max(done[:3]) < ARRIVALS[1] + 0.005, done  # activated at 0: the others join on the activation
    assert infos[3][0]["joined_early"]


def test_sim_quorum_two_activates_at_the_second_arrival():
    infos = simulate_round(quorum=2)
    done = [i[0]["t_done"] for i in infos]
    assert min(done) >= ARRIVALS[1] and max(done[:3]) < ARRIVALS[2] + 0.005, done
    assert infos[3][0]["joined_early"]  # the slow rank's progress thread joined for it


def test_sim_quorum_keeps_the_fast_ranks_going_for_many_rounds():
    infos = simulate_round(quorum=3, rounds=5)
    assert all(i["t_done"] < ARRIVALS[-1] for r in range(3) for i in infos[r])
    assert all(i["joined_early"] for i in infos[3])


def test_sim_quorum_mismatch_and_range_are_refused():
    fabric = SimFabric(SimEngine(), SimNetwork(3, NetworkModel(latency_s=ALPHA, bandwidth_bytes_per_s=1e9)), 3)
    comms = fabric.communicators()
    for bad in (0, 4):
        with pytest.raises(ValueError, match="quorum"):
            comms[0].wait_avoiding(StandIn(2), phases=[[0, 1, 2]], sync_every=0, quorum=bad)
    comms[0].wait_avoiding(StandIn(2), phases=[[0, 1, 2]], sync_every=0, quorum=2)
    with pytest.raises(SimCommError, match="quorum"):
        comms[1].wait_avoiding(StandIn(2), phases=[[0, 1, 2]], sync_every=0, quorum=3)
