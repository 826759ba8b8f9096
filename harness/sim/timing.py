"""Where a simulated rank's local time comes from: a calibrated model, or a real run's records.

A timing source answers, per (iteration t, rank r):

- ``compute(t, r)``: the local work of the iteration (forward, backward, optimizer step, loop
  bookkeeping inside the iteration, and ``harness.local_costs``' node combine and staging),
  without the injected sleep and without communication;
- ``between(t, r)``: time from the end of iteration t to the start of t + 1 on a rank that does
  not evaluate there (the loop's per-iteration bookkeeping after ``end_s``);
- ``start_offset(r)``: when rank r starts iteration 0, relative to the earliest rank;
- evaluation points: :class:`PredictiveTiming` models them as the real loop runs them (an
  allreduce of the model, one of one float, then rank 0 alone tests two models);
  :class:`TraceTiming` replays ``after_eval(t, r)``, the measured time from the moment the last
  rank reached the evaluation until rank r started iteration t + 1.

Injected delays and compute factors never come from here: both sources take them from the
scenario's :class:`harness.injection.InjectionPlan` (the same pure function the real run used).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.compute_time import emulated_compute_s
from harness.errors import HarnessError
from harness.local_costs import iteration_overhead_s
from harness.scenario.schema import Scenario
from harness.sim.calibration import CalibrationEntry, CalibrationError
from harness.workload.names import workload_labels


class TimingError(HarnessError):
    """A timing source that cannot serve this scenario (missing calibration or trace rows)."""


class PredictiveTiming:
    """Local work from the calibration: a per-workload median, times the injected factor.

    The median was measured with every rank computing at once, so on a machine with more ranks
    than cores it holds the contention of a fully loaded machine (docs/guides/simulation.md).
    """

    trace_driven = False

    def __init__(
        self, scenario: Scenario, entry: CalibrationEntry, factors: np.ndarray, floats: int | None = None
    ) -> None:
        """``floats``: the communicated buffer's length (``communicated_floats``), for the local
        costs of ``harness.local_costs``; None: computed here."""
        w = scenario.workload
        if floats is None and (w.node is not None or w.staging is not None):
            from harness.workload.models import communicated_floats  # noqa: PLC0415  (torch: timing loads without it)

            floats = communicated_floats(scenario)
        # A real GPU run's staging is real (in the calibrated compute); emulated everywhere else.
        overhead = iteration_overhead_s(w, floats or 0, staged_for_real=w.compute == "real" and w.device != "cpu")
        if w.compute == "real":
            model, dataset = workload_labels(w)  # as harness.calibrate measured them
            median = entry.compute_s(model, dataset, w.batch_size)
            if median is None:
                raise CalibrationError(
                    f"the calibration for {entry.ranks} ranks has no compute time for model {model}, dataset "
                    f"{dataset}, batch {w.batch_size}: run `python -m harness calibrate --scenario FILE`"
                )
            local = median * factors
            self.eval_s = entry.evaluation_s(model, dataset) or 0.0
        else:
            ranks = factors.shape[1]
            local = (
                np.array(
                    [
                        emulated_compute_s(w.compute.emulate_ms, w.compute.jitter, scenario.seed, t, ranks, factors[t])
                        for t in range(factors.shape[0])
                    ]
                )
                + entry.loop_overhead_s
            )
            self.eval_s = 0.0
        self._local = (local + overhead).tolist()  # plain lists: fast indexing in the simulator's inner loop

    def start_offset(self, r: int) -> float:
        return 0.0

    def compute(self, t: int, r: int) -> float:
        return self._local[t][r]

    def between(self, t: int, r: int) -> float:
        return 0.0  # the calibrated median already spans iteration start to iteration start


class TraceTiming:
    """Local work replayed from one algorithm's rows of a real run's steps.csv."""

    trace_driven = True

    def __init__(self, steps: pd.DataFrame, ranks: int, iterations: int) -> None:
        if len(steps) != ranks * iterations:
            raise TimingError(
                f"the real run recorded {len(steps)} steps, a replay needs all "
                f"{ranks} x {iterations}: the run is incomplete"
            )
        frame = steps.sort_values(["iteration", "rank"])
        shape = (iterations, ranks)
        start = frame["start_s"].to_numpy(float).reshape(shape)
        end = frame["end_s"].to_numpy(float).reshape(shape)
        injected = frame["injected_delay_s"].to_numpy(float).reshape(shape)
        blocked = frame["comm_blocked_s"].to_numpy(float).reshape(shape)
        gap, eval_gap = np.zeros(shape), np.zeros(shape)
        gap[:-1] = np.maximum(start[1:] - end[:-1], 0.0)
        eval_gap[:-1] = np.maximum(start[1:] - end.max(axis=1, keepdims=True)[:-1], 0.0)  # after the last arrival
        # Plain lists: fast indexing in the simulator's inner loop.
        self._local = np.maximum(end - start - injected - blocked, 0.0).tolist()
        self._gap, self._eval_gap = gap.tolist(), eval_gap.tolist()
        self._offset = (start[0] - start[0].min()).tolist()

    def start_offset(self, r: int) -> float:
        return self._offset[r]

    def compute(self, t: int, r: int) -> float:
        return self._local[t][r]

    def between(self, t: int, r: int) -> float:
        return self._gap[t][r]

    def after_eval(self, t: int, r: int) -> float:
        return self._eval_gap[t][r]
