"""Simulated runs: pick the network and timing for a scenario, simulate, write a run directory.

A simulated run directory has the real run's layout (``results/README.md``): steps.csv,
summary.csv/summary.txt with the same columns, trace.json, scenario.resolved.yaml and
run.json, which says ``"simulated": true`` and how (mode, calibration). Its run id starts with
``sim-``. Without ``simulation.train`` simulated steps have no loss (``NaN``) and there are no
evaluations: the model predicts time, not accuracy. With it (``simulate --train``,
:mod:`harness.sim.training`) the simulated ranks train, and the directory also has the real
run's losses, evals.csv and ``provenance/`` (initial model, shards, final models), in the same
formats. When the scenario sets ``results.comm_calls``, every simulated rank's communicator is
wrapped in a call log (``harness.comm.call_log``) and the run directory gets comm_calls.csv, as
a real run's does.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from harness.algorithms import algorithm_class, scenario_facts
from harness.comm.call_log import CallLog  # needs neither MPI nor the native layer
from harness.device import dataset_on
from harness.results.columns import COMM_CALL_COLUMNS, CommCallRecord, to_frame
from harness.results.layout import PROVENANCE_DIR
from harness.results.provenance import ProvenanceWriter, level
from harness.results.records import RunDirectory
from harness.scenario.network import NodeTopology
from harness.scenario.schema import Scenario
from harness.sim.calibration import (
    DEFAULT_PATH,
    Calibration,
    CalibrationEntry,
    CalibrationError,
    EntryChoice,
    NetworkModel,
    calibrate_command,
)
from harness.sim.hosts import SimTopology
from harness.sim.simulate import SimStats, injection_arrays, simulate_scenario
from harness.sim.timing import PredictiveTiming, TraceTiming
from harness.sim.training import SimTraining, training_device
from harness.workload import configure_torch_threads, scenario_dataset
from harness.workload.names import workload_labels

# Used when no calibration file exists and the workload's compute is emulated: a cluster
# network of the InfiniBand class (documented in docs/guides/simulation.md), not this machine.
DEFAULT_NETWORK = NetworkModel(latency_s=2e-6, bandwidth_bytes_per_s=12.5e9)
DEFAULT_TRACE_RANKS = 64  # trace.json of a 1,024-rank simulation would be hundreds of MB


READINGS = ("cluster", "machine")
"""Which system a simulation predicts (``simulate --reading``; run.json ``reading``):

- ``machine``: this machine, as a real run here runs: the calibration entry's network (its cores
  shared when the ranks outnumber them) and compute measured with every rank computing at once,
  scaled to the simulated rank count on the same cores. What ``compare`` uses for a run made
  here.
- ``cluster``: every rank has cores (or a GPU) of its own, on a network: compute as one rank
  measured it alone (``ComputePoint.alone_s``; emulated compute as the scenario says), the
  default cluster network (:data:`DEFAULT_NETWORK`) under the scenario's links and topology, no
  shared cores.

Default (:func:`default_reading`): ``machine`` when the calibration has an entry measured at
the simulated rank count (a run here is what it predicts), else ``cluster``.
"""


def default_reading(scenario: Scenario, calibration: Calibration | None) -> str:
    """``machine`` if ``calibration`` measured ``scenario``'s rank count, else ``cluster``."""
    if calibration is not None and any(e.ranks == scenario.ranks for e in calibration.entries):
        return "machine"
    return "cluster"


def describe_reading(reading: str) -> str:
    """One line for the commands' notes and the summary's header."""
    if reading == "cluster":
        net = DEFAULT_NETWORK
        return (
            f"cluster reading: every rank with cores of its own, compute as one rank measured it alone, the "
            f"default cluster network ({net.latency_s * 1e6:g} us, {net.bandwidth_bytes_per_s / 1e9:g} GB/s) "
            "under the scenario's links and topology (--reading machine: this machine, oversubscribed)"
        )
    return (
        "machine reading: the ranks share this machine's cores as a run here does (calibrated network and "
        "compute with every rank computing at once)"
    )


def calibration_entry(
    scenario: Scenario,
    calibration: Calibration | None,
    scenario_file: str | Path,
    calibration_file: Path = DEFAULT_PATH,
    needs_compute: bool = True,
    reading: str = "machine",
) -> EntryChoice:
    """The entry to simulate ``scenario`` with in ``reading`` (:data:`READINGS`), and the note to
    print about it: the calibration's choice (:meth:`Calibration.choose`, among the entries that
    measured what the simulation needs), or without a calibration the default network (emulated
    compute only).

    A real-compute workload needs its calibrated compute time (``needs_compute``: false for a
    trace-driven replay, which takes it from the run): CalibrationError otherwise, ending with
    the exact ``calibrate`` command for ``scenario_file`` that measures it into ``calibration_file``.
    In the cluster reading that is the time of one rank computing alone.
    """
    if reading not in READINGS:
        raise ValueError(f"unknown reading {reading!r} (one of {', '.join(READINGS)})")
    w = scenario.workload
    real = needs_compute and w.compute == "real"
    alone = reading == "cluster"
    model, dataset = workload_labels(w)  # as harness.calibrate measured them
    workload = f"model {model}, dataset {dataset}, batch {w.batch_size}"
    if calibration is None:
        if reading == "machine" or real:
            command = calibrate_command(scenario_file, scenario.ranks, calibration_file)
            if not real:
                raise CalibrationError(
                    f"{calibration_file}: no calibration file; the machine reading simulates this "
                    f"machine and needs its measurements: measure them with (or pass "
                    f"--calibration FILE, or --reading cluster):\n  {command}"
                )
            raise CalibrationError(
                f"{calibration_file}: no calibration file, and real compute ({workload}) needs "
                f"its measured time; measure it with (or pass --calibration FILE):\n  {command}"
            )
        net = DEFAULT_NETWORK
        return EntryChoice(
            CalibrationEntry(ranks=scenario.ranks, network=net),
            f"no calibration file: simulating on the default network ({net.latency_s * 1e6:g} us, "
            f"{net.bandwidth_bytes_per_s / 1e9:g} GB/s)",
        )

    def has(entry: CalibrationEntry) -> bool:
        return not real or entry.compute_s(model, dataset, w.batch_size, alone=alone) is not None

    choice = calibration.choose(scenario.ranks, has, scale_shared_cores=not alone)
    if not has(choice.entry):
        command = calibrate_command(scenario_file, choice.entry.ranks, calibration_file)
        what = (
            "compute time of one rank alone"
            if alone and choice.entry.compute_s(model, dataset, w.batch_size) is not None
            else "compute time"
        )
        raise CalibrationError(
            f"{calibration_file}: the calibration for {choice.entry.ranks} ranks has no {what} for "
            f"{workload} (real compute, {reading} reading; nor has another entry); measure it "
            f"with:\n  {command}"
        )
    if not alone:
        return choice
    return EntryChoice(cluster_entry(choice.entry), choice.note)


def cluster_entry(entry: CalibrationEntry) -> CalibrationEntry:
    """``entry`` as the cluster reading uses it: the default cluster network (no shared cores)
    and each workload's compute as one rank measured it alone (its ``ranks`` stay the measured
    ones, which run.json records as ``calibration_ranks``)."""
    alone = [
        p.model_copy(
            update={
                "median_s": p.alone_s,
                "p95_s": max(p.alone_s, p.p95_s * p.alone_s / p.median_s) if p.median_s > 0 else p.alone_s,
            }
        )
        for p in entry.compute
        if p.alone_s is not None
    ]
    return CalibrationEntry(
        ranks=entry.ranks,
        network=DEFAULT_NETWORK,
        network_source="default cluster network",
        compute=alone,
        evaluation=entry.evaluation,
        loop_overhead_s=entry.loop_overhead_s,
    )


class SimulatedFrames(dict):
    """What :func:`predict` and :func:`replay` return first: algorithm name -> steps frame (as
    ``simulate_scenario`` returns them), ``comm_calls``: algorithm name -> every simulated
    rank's calls to its communicator (``COMM_CALL_COLUMNS``), only when the scenario sets
    ``results.comm_calls`` (else empty), and ``trained``: the :class:`TrainedRun` of a
    simulation with values (else None). :func:`write_simulated_run` writes all of them."""

    def __init__(
        self, frames: dict[str, pd.DataFrame], comm_calls: dict[str, pd.DataFrame], trained: TrainedRun | None = None
    ) -> None:
        super().__init__(frames)
        self.comm_calls = comm_calls
        self.trained = trained


class TrainedRun:
    """What a simulation with values keeps of each algorithm as it finishes: its evaluations,
    and its final models written into ``provenance/`` (at the scenario's ``results.provenance``
    level, as a real run's worker writes them) inside ``staging``, a folder of its own until
    :func:`write_simulated_run` moves it into the run directory (or :meth:`discard` removes it)."""

    def __init__(self, scenario: Scenario, staging: Path, recorded: pd.DataFrame | None = None) -> None:
        """``recorded``: the steps of the real run a trace-driven simulation replays; the
        algorithms that record their wait-avoiding rounds' staleness in it
        (``Algorithm.round_staleness``) then contribute as the real run did."""
        # One compute thread, as every real rank computes (harness.runner.worker): the same
        # kernels, so a simulated rank's arithmetic is a real rank's, bit for bit.
        configure_torch_threads(1)
        self.scenario = scenario
        self.staging = staging
        self.device = training_device(scenario)
        self.dataset = dataset_on(scenario_dataset(scenario), self.device)
        self.provenance = ProvenanceWriter(staging / PROVENANCE_DIR, level(scenario))
        self.evals: dict[str, list] = {}
        self.recorded = recorded
        self._current: SimTraining | None = None

    def training_for(self, entry):
        """The values side of algorithm ``entry``'s simulation (``simulate_scenario``'s ``training_for``)."""
        training = SimTraining(
            self.scenario,
            entry,
            self.dataset,
            self.device,
            self._staleness(entry),
            keep_rank_models=self.provenance.keeps_rank_models,
        )
        self._current = training
        if not self.evals and self.provenance.keeps_anything:
            self.provenance.write_start(training.live_replicas.shards, training.live_replicas.initial)
        return training

    def _staleness(self, entry) -> dict[tuple[int, int], int] | None:
        """The replayed run's ``{(rank, round): staleness}`` of ``entry``'s wait-avoiding rounds,
        when its class records them as its steps' staleness (one round per iteration)."""
        if self.recorded is None or not getattr(algorithm_class(entry.name), "round_staleness", False):
            return None
        rows = self.recorded[(self.recorded["algorithm"] == entry.name) & (self.recorded["staleness"] >= 0)]
        return dict(zip(zip(rows["rank"].astype(int), rows["iteration"].astype(int)), rows["staleness"].astype(int)))

    def finished(self, name: str) -> None:
        """Algorithm ``name`` finished: keep its evaluations, write its final models."""
        training, self._current = self._current, None
        assert training is not None  # training_for made it
        self.evals[name] = training.evaluations.records
        if self.provenance.keeps_anything:
            self.provenance.write_final(name, training.final_average, training.final_models)

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


def _simulate(
    scenario: Scenario,
    network: NetworkModel,
    timing_for,
    on_done,
    hosts: NodeTopology | None,
    trained: TrainedRun | None = None,
) -> tuple[SimulatedFrames, list[SimStats]]:
    """``simulate_scenario``, with a call log around every rank's communicator if the scenario
    asks, and with values when ``trained`` is given."""
    logs: dict[str, dict[int, CallLog]] = {}

    def log_calls(name: str, rank: int, comm) -> CallLog:
        log = CallLog(comm)
        logs.setdefault(name, {})[rank] = log
        return log

    def done(name: str, frame: pd.DataFrame, stat: SimStats) -> None:
        if trained is not None:
            trained.finished(name)
        if on_done is not None:
            on_done(name, frame, stat)

    try:
        frames, stats = simulate_scenario(
            scenario,
            network,
            timing_for,
            done,
            hosts=hosts,
            wrap_comm=log_calls if scenario.results.comm_calls else None,
            training_for=trained.training_for if trained is not None else None,
        )
    except BaseException:
        if trained is not None:
            trained.discard()
        raise
    calls = {
        name: to_frame(
            [CommCallRecord(name, rank, *call) for rank in sorted(by_rank) for call in by_rank[rank].calls],
            COMM_CALL_COLUMNS,
        )
        for name, by_rank in logs.items()
    }
    return SimulatedFrames(frames, calls, trained), stats


def predict(
    scenario: Scenario,
    entry: CalibrationEntry,
    on_done=None,
    hosts: NodeTopology | None = None,
    trained: TrainedRun | None = None,
) -> tuple[SimulatedFrames, list[SimStats]]:
    """Predictive simulation: calibrated network and compute, the scenario's injection;
    ``hosts``: the hosts of a multi-host run as nodes (``harness.sim.hosts.simulated_topology``);
    ``trained``: simulate with values (``simulation.train``)."""
    _, factors = injection_arrays(scenario)
    timing = PredictiveTiming(scenario, entry, factors)
    return _simulate(scenario, entry.network, lambda _name: timing, on_done, hosts, trained)


def replay(
    scenario: Scenario,
    real_steps: pd.DataFrame,
    network: NetworkModel,
    on_done=None,
    hosts: NodeTopology | None = None,
    trained: TrainedRun | None = None,
) -> tuple[SimulatedFrames, list[SimStats]]:
    """Trace-driven simulation: each rank's local work as the real run measured it; ``hosts``
    and ``trained`` as :func:`predict`."""

    def timing_for(name: str) -> TraceTiming:
        return TraceTiming(real_steps[real_steps["algorithm"] == name], scenario.ranks, scenario.workload.iterations)

    return _simulate(scenario, network, timing_for, on_done, hosts, trained)


def write_simulated_run(
    path: Path,
    scenario: Scenario,
    frames: dict[str, pd.DataFrame],
    stats: list[SimStats],
    mode: str,
    calibration: str | None,
    trace_ranks: int = DEFAULT_TRACE_RANKS,
    run_id: str | None = None,
    *,
    calibration_ranks: int | None,
    topology: SimTopology | None = None,
    reading: str | None = None,
) -> RunDirectory:
    """Write a simulated run directory at ``path`` (created; must not exist); ``run_id``
    defaults to the directory's name. ``calibration_ranks``: the rank count of the calibration
    entry used (None: the default network). comm_calls.csv is written when ``frames`` (from
    :func:`predict` or :func:`replay`) holds call logs. ``topology``: the choice of
    ``harness.sim.hosts.simulated_topology``, recorded as ``network_topology`` when there was
    one to make (a scenario topology or a run's hosts). ``reading``: which system a predictive
    simulation predicts (:data:`READINGS`), recorded and said in summary.txt's first line."""
    path.mkdir(parents=True)
    run = RunDirectory(
        path, scenario.name, run_id or path.name, datetime.now(timezone.utc).isoformat(timespec="seconds")
    )
    run.write_resolved_scenario(scenario.resolved_dict())
    trained = getattr(frames, "trained", None)
    for name, frame in frames.items():
        run.append_algorithm(name, frame, trained.evals.get(name, ()) if trained is not None else ())
    if trained is not None and (trained.staging / PROVENANCE_DIR).is_dir():
        (trained.staging / PROVENANCE_DIR).rename(path / PROVENANCE_DIR)
    if trained is not None:
        trained.discard()
    for name, calls in getattr(frames, "comm_calls", {}).items():
        run.append_comm_calls(name, calls)
    w = scenario.workload
    run.write_summary(
        w.batch_size,
        w.iterations,
        ranks=scenario.ranks,
        target_accuracy=scenario.results.target_accuracy,  # evaluations only with values
        target_loss=scenario.results.target_loss,
        header=f"simulated ({mode}), {describe_reading(reading)}" if reading else None,
    )
    run.write_trace(include_comm_ops=False, max_ranks=trace_ranks)
    run.write_run_json(
        "complete",
        list(frames),
        ranks=scenario.ranks,
        extra={
            "simulated": True,
            "mode": mode,
            "calibration": calibration,
            "calibration_ranks": calibration_ranks,
            **({"reading": reading} if reading else {}),
            "trace_ranks": min(trace_ranks, scenario.ranks),
            **(
                {"trained": True, "provenance": trained.provenance.keep, "device": str(trained.device)}
                if trained is not None
                else {}
            ),
            "events": sum(s.events for s in stats),
            "host_s": sum(s.host_s for s in stats),
            **scenario_facts(scenario),
            **({"network_topology": topology.record()} if topology is not None and topology.worth_recording else {}),
        },
    )
    return run


def new_simulated_run_path(out_root: Path, scenario_name: str) -> Path:
    """``out_root/<scenario>/sim-YYYYmmdd-HHMMSS[-n]``, not yet existing."""
    base = out_root / scenario_name / f"sim-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path
