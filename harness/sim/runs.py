"""Simulated runs: pick the network and timing for a scenario, simulate, write a run directory.

A simulated run directory has the real run's layout (``results/README.md``): steps.csv,
summary.csv/summary.txt with the same columns, trace.json, scenario.resolved.yaml and
run.json, which says ``"simulated": true`` and how (mode, calibration). Its run id starts with
``sim-``. Simulated steps have no loss (``NaN``) and there are no evaluations: the model
predicts time, not accuracy.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from harness.results.records import RunDirectory
from harness.scenario.schema import Scenario
from harness.sim.calibration import Calibration, CalibrationEntry, CalibrationError, NetworkModel
from harness.sim.simulate import SimStats, injection_arrays, simulate_scenario
from harness.sim.timing import PredictiveTiming, TraceTiming

# Used when no calibration file exists and the workload's compute is emulated: a cluster
# network of the InfiniBand class (documented in the README), not this machine.
DEFAULT_NETWORK = NetworkModel(latency_s=2e-6, bandwidth_bytes_per_s=12.5e9)
DEFAULT_TRACE_RANKS = 64  # trace.json of a 1,024-rank simulation would be hundreds of MB


def calibration_entry(scenario: Scenario, calibration: Calibration | None) -> CalibrationEntry:
    """The calibration entry to simulate ``scenario`` with (or the default network, emulated compute only)."""
    if calibration is not None:
        return calibration.entry_for(scenario.ranks)
    if scenario.workload.compute == "real":
        raise CalibrationError(
            "no calibration file: a workload with real compute needs measured compute times; "
            "run `python -m harness calibrate` first (or pass --calibration FILE)"
        )
    return CalibrationEntry(ranks=scenario.ranks, network=DEFAULT_NETWORK)


def predict(scenario: Scenario, entry: CalibrationEntry, on_done=None) -> tuple[dict[str, pd.DataFrame], list[SimStats]]:
    """Predictive simulation: calibrated network and compute, the scenario's injection."""
    _, factors = injection_arrays(scenario)
    timing = PredictiveTiming(scenario, entry, factors)
    return simulate_scenario(scenario, entry.network, lambda _name: timing, on_done)


def replay(scenario: Scenario, real_steps: pd.DataFrame, network: NetworkModel,
           on_done=None) -> tuple[dict[str, pd.DataFrame], list[SimStats]]:
    """Trace-driven simulation: each rank's local work as the real run measured it."""
    def timing_for(name: str) -> TraceTiming:
        return TraceTiming(real_steps[real_steps["algorithm"] == name], scenario.ranks, scenario.workload.iterations)

    return simulate_scenario(scenario, network, timing_for, on_done)


def write_simulated_run(path: Path, scenario: Scenario, frames: dict[str, pd.DataFrame], stats: list[SimStats],
                        mode: str, calibration: str | None, trace_ranks: int = DEFAULT_TRACE_RANKS,
                        run_id: str | None = None) -> RunDirectory:
    """Write a simulated run directory at ``path`` (created; must not exist); ``run_id``
    defaults to the directory's name."""
    path.mkdir(parents=True)
    run = RunDirectory(path, scenario.name, run_id or path.name, datetime.now(timezone.utc).isoformat(timespec="seconds"))
    run.write_resolved_scenario(scenario.resolved_dict())
    for name, frame in frames.items():
        run.append_algorithm(name, frame)
    w = scenario.workload
    run.write_summary(w.batch_size, w.iterations, ranks=scenario.ranks)
    run.write_trace(include_comm_ops=False, max_ranks=trace_ranks)
    run.write_run_json("complete", list(frames), ranks=scenario.ranks, extra={
        "simulated": True,
        "mode": mode,
        "calibration": calibration,
        "trace_ranks": min(trace_ranks, scenario.ranks),
        "events": sum(s.events for s in stats),
        "host_s": sum(s.host_s for s in stats),
    })
    return run


def new_simulated_run_path(out_root: Path, scenario_name: str) -> Path:
    """``out_root/<scenario>/sim-YYYYmmdd-HHMMSS[-n]``, not yet existing."""
    base = out_root / scenario_name / f"sim-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path
