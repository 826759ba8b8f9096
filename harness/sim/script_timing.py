"""A torch.distributed script's local work, modelled from what its run measured (predictive).

The built-in algorithms' predictive simulations take their compute from the calibration, which
measured the harness's own workloads. A script's model and data are its own, so its model is
made from its run (``steps.csv`` and ``script_structure.json``), per recorded rank:

- the local work of a step: the median over the steps after the first (the first holds the
  lazy set-ups) of its local work without the time the script's main thread waited for the
  backend's operations (``local_s`` of ``script_structure.json``: ``compute_s`` less the waits in
  ``wait()``, such as FSDP2's for its all-gathers inside the forward pass, that
  ``comm_blocked_s`` does not count), divided by the injected compute factor (the simulation
  applies the scenario's factors again). The simulation then makes those waits itself: an
  operation the script waited for before posting its next holds the computation up until it
  ends. (Runs noted before ``local_s``: end - start - injected delay - blocked time per step,
  which keeps the waits inside the work.)
- the time between two steps (loading data, logging): the median gap;
- the optimizer step's window (its pre-hook to the step's end). With FSDP2 the optimizer works
  on the rank's shard, so that part scales with the shard: ``ScriptStructure.shard_ratio``.

Simulated rank r takes recorded rank r mod R's model (as the collective sequence does,
:mod:`harness.sim.script_scaling`), times the reading's factor (:func:`reading_scales`): the
machine reading at another rank count shares this machine's C cores among more ranks
(``max(1, N / C) / max(1, R / C)``); the cluster reading gives every rank cores of its own (the
run's work divided by max(1, R / C)).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.sim.calibration import core_share_factor
from harness.sim.script_scaling import ScriptStructure
from harness.sim.timing import TimingError


def reading_scale(recorded_ranks: int, ranks: int, cpus: int, reading: str) -> float:
    """The factor on a script's modelled local work at ``ranks`` ranks in ``reading``, its run
    having had ``recorded_ranks`` ranks on this machine's ``cpus`` (module doc)."""
    if reading == "machine":
        return core_share_factor(recorded_ranks, ranks, cpus)
    return core_share_factor(recorded_ranks, 1, cpus)  # every rank a core of its own: as one alone


class ScriptComputeModel:
    """A predictive timing source (``harness.sim.timing``'s interface) for a script (module doc)."""

    trace_driven = False

    def __init__(
        self,
        steps: pd.DataFrame,
        recorded_ranks: int,
        recorded_factors: np.ndarray,
        factors: np.ndarray,
        structure: ScriptStructure,
        scale: float = 1.0,
        shard_ratio: float = 1.0,
    ) -> None:
        """``steps``: the script's rows of the run's steps.csv; ``recorded_factors``
        [iterations, R]: the compute factors the run injected; ``factors`` [iterations, n]: those
        of the simulation; ``scale``: :func:`reading_scale`."""
        if steps.empty:
            raise TimingError("the script run recorded no steps: nothing to model its compute on")
        local = np.maximum(steps["end_s"] - steps["start_s"] - steps["injected_delay_s"] - steps["comm_blocked_s"], 0.0)
        t = steps["iteration"].to_numpy(int)
        r = steps["rank"].to_numpy(int)
        shape = recorded_factors.shape
        known = (t < shape[0]) & (r < shape[1])
        frame = pd.DataFrame(
            {
                "rank": r[known],
                "iteration": t[known],
                "local": local.to_numpy(float)[known] / recorded_factors[t[known], r[known]],
            }
        )
        steady = frame[frame["iteration"] >= 1] if frame["iteration"].max() >= 1 else frame
        per_rank = steady.groupby("rank")["local"].median()
        stretch = (
            pd.Series(recorded_factors[steady["iteration"], steady["rank"]]).groupby(steady["rank"].to_numpy()).median()
        )  # the injected factors the noted medians hold
        ends = steps.sort_values(["rank", "iteration"])
        gaps = (ends.groupby("rank")["start_s"].shift(-1) - ends["end_s"]).clip(lower=0.0)
        gap = gaps.groupby(ends["rank"]).median().fillna(0.0)
        self._ranks = recorded_ranks
        self._local = []
        for b in range(recorded_ranks):
            if b not in per_rank.index:
                raise TimingError(f"the script run recorded no steps of rank {b}: nothing to model its compute on")
            if len(structure.local_s) == recorded_ranks:  # the local work without the waits
                work = structure.local_s[b] / float(stretch.get(b, 1.0))
            else:  # a run from before it was noted: the wall-clock split, which keeps the waits
                work = float(per_rank[b])
            optimizer = min(work, structure.after_step_s[b] if b < len(structure.after_step_s) else 0.0)
            self._local.append((work - optimizer + optimizer * shard_ratio) * scale)
        self._gap = [float(gap.get(b, 0.0)) * scale for b in range(recorded_ranks)]
        self._factors = factors.tolist()

    def start_offset(self, r: int) -> float:
        return 0.0

    def compute(self, t: int, r: int) -> float:
        return self._local[r % self._ranks] * self._factors[t][r]

    def between(self, t: int, r: int) -> float:
        return self._gap[r % self._ranks]

    def after_eval(self, t: int, r: int) -> float:
        return 0.0  # a script run has no evaluation points of the harness's
