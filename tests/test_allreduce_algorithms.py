"""network.allreduce's whole-buffer algorithms and the local costs of harness.local_costs in real
runs: what each rank sends is the simulator's schedule to the byte, and the run takes about what
its trace-driven simulation says. (The step tables against the native builder:
tests/test_sim_model.py; sums against MPI: tests/mpi/topology_checks.py.)"""

from __future__ import annotations

import pandas as pd
import pytest

from conftest import save_test_calibration
from harness.testing.real_runs import run_and_compare
from harness.testing.scenarios import (
    ALLREDUCE_RUN_COMPUTE,
    ALLREDUCE_RUN_HOP_S,
    ALLREDUCE_RUNS,
    allreduce_run_scenario,
)
from harness.local_costs import iteration_overhead_s
from harness.scenario import scenario_from_dict
from harness.schedules import RING_THRESHOLD_BYTES
from harness.sim.step_programs import allreduce_program


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm,ranks", ALLREDUCE_RUNS)
def test_a_run_sends_what_the_schedule_says_and_takes_about_its_simulated_time(tmp_path, algorithm, ranks) -> None:
    """Allreduce-SGD with ``network.allreduce`` set, 1 MB buffers through 0.2 Gb/s links, every
    rank a node agent with emulated staging. Every rank sends, every iteration, exactly the bytes
    the simulator's schedule says (recursive doubling: the whole buffer at each of its steps;
    reduce + broadcast: the root once per child); no iteration is shorter than the compute, the
    local costs and the two hops any member waits for at least (a bound load cannot break); and
    the trace-driven simulation is within a factor of 2 of the run (a coarse check that catches a
    broken model; `python -m harness bench agreement --only allreduce_runs` says how close)."""
    doc = allreduce_run_scenario(algorithm, ranks)
    scenario = scenario_from_dict(doc)
    floats = doc["workload"]["params"]
    local_s = 0.010 + iteration_overhead_s(scenario.workload, floats)
    assert local_s == pytest.approx(0.010 + 0.020 + 0.010, rel=0.01)  # the docstring's numbers
    cal = save_test_calibration(tmp_path / "cal.json", ranks, ALLREDUCE_RUN_COMPUTE)
    compared = run_and_compare(doc, tmp_path, cal, mode="trace")
    steps = pd.read_csv(compared.run / "steps.csv")
    schedule = allreduce_program(ranks, floats, RING_THRESHOLD_BYTES, algorithm)
    per_rank = steps[steps["iteration"] > 0].groupby("rank")["bytes_sent"].agg(["min", "max"])
    expected = [int(b) for b in schedule.bytes_sent]
    assert per_rank["min"].tolist() == expected and per_rank["max"].tolist() == expected, (per_rank, expected)
    longest = (steps["end_s"] - steps["start_s"]).groupby(steps["iteration"]).max()
    assert longest.min() > local_s + 2 * ALLREDUCE_RUN_HOP_S, longest.tolist()
    (row,) = compared.table.itertuples()
    assert 0.5 < row.measured_iter_s / row.predicted_iter_s < 2.0, compared.output
