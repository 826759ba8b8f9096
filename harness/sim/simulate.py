"""The SimPy model of a scenario: every simulated rank runs the real training loop and the real
algorithm, on a simulated communicator, in simulated time.

Each rank is a greenlet (:mod:`harness.sim.engine`) running ``harness.runner.loop.train`` with
the algorithm class the scenario names, constructed exactly as on a real rank but on stand-in
buffers of the model's length (:mod:`harness.sim.standin`) and a
:class:`harness.sim.comm.SimCommunicator`. What a real rank computes, a simulated rank waits
for: :class:`SimulatedWork` takes the local work of each iteration from a timing source
(:mod:`harness.sim.timing`), the injected sleeps and compute factors from the scenario's
``InjectionPlan`` (the real run's pure function), and models evaluation points. The result is a
steps frame with the real run's columns, made by the same loop code.

Example::

    frames, stats = simulate_scenario(scenario, network_model, timing_for)
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from harness.algorithms import algorithm_class
from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.injection import InjectionPlan
from harness.results.columns import STEP_COLUMNS
from harness.runner.loop import train
from harness.scenario.network import NodeTopology, link_table, node_topology
from harness.scenario.schema import Scenario
from harness.sim.calibration import NetworkModel
from harness.sim.comm import SimCommunicator, SimFabric
from harness.sim.engine import SimEngine
from harness.sim.network import SimNetwork
from harness.sim.standin import StandIn
from harness.workload.models import communicated_floats


@dataclass
class SimStats:
    """What one algorithm's simulation cost: events scheduled and host seconds."""

    algorithm: str
    events: int
    host_s: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.host_s if self.host_s > 0 else float("nan")


def injection_arrays(scenario: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """[iterations, ranks] injected delays (s) and compute factors from the scenario's plan."""
    plan = InjectionPlan.from_scenario(scenario)
    pairs = [plan.at(t) for t in range(scenario.workload.iterations)]
    delays = np.array([d for d, _ in pairs], dtype=float).reshape(-1, scenario.ranks)
    factors = np.array([f for _, f in pairs], dtype=float).reshape(-1, scenario.ranks)
    return delays, factors


class _Evaluations:
    """Evaluation points, on a communicator of their own (no emulated links, as in a real run).

    Predictive: what the real ``evaluate`` does (an allreduce of the model, one of one float,
    then rank 0 tests alone for the calibrated time). Trace-driven: every rank meets the others,
    then resumes after the time it took in the real run past the last arrival.
    """

    def __init__(self, engine: SimEngine, ranks: int, count: int, base: NetworkModel, timing) -> None:
        self.fabric = SimFabric(engine, SimNetwork(ranks, base), ranks)
        self.comms = self.fabric.communicators()
        self.engine = engine
        self.count = count
        self.timing = timing

    def run(self, r: int, t: int) -> None:
        """Rank r's part of the evaluation point after iteration t (0-based)."""
        comm = self.comms[r]
        if self.timing.trace_driven:
            handle = comm.ibarrier()
            handle.wait()
            op = handle.op
            self.engine.sleep_until(max(op.join_at) + self.timing.after_eval(t, r))
        else:
            comm.allreduce(StandIn(self.count), op="mean")  # the averaged model
            comm.allreduce(StandIn(1), op="mean")  # the consensus distance
            if r == 0:
                self.engine.sleep(self.timing.eval_s)
        comm.drain_records()  # evaluation traffic is in no record, as in a real run


class SimulatedWork:
    """A simulated rank's side of the training loop (``harness.runner.loop.Work``)."""

    def __init__(
        self,
        engine: SimEngine,
        network: SimNetwork,
        rank: int,
        timing,
        delays: list[float],
        factors: list[float],
        evaluations: _Evaluations,
    ) -> None:
        self.engine = engine
        self.network = network
        self.rank = rank
        self.timing = timing
        self._delays = delays
        self._factors = factors
        self._evaluations = evaluations
        self.now = engine.now
        self.sleep = engine.sleep

    def injected(self, t: int) -> tuple[float, float]:
        return self._delays[t], self._factors[t]

    def gradient(self, t: int, factor: float) -> tuple[float, float]:
        local = self.timing.compute(t, self.rank)  # the whole iteration's local work, factor included
        network = self.network
        network.computing += 1  # shared cores: progress threads slow down while ranks compute
        self.engine.sleep(local)
        network.computing -= 1
        return local, float("nan")

    def step(self, t: int, factor: float, gradient_s: float) -> float:
        return 0.0  # timed with the gradient

    def evaluate(self, iteration: int, time_s: float, params, final: bool) -> list:
        if not final:
            self._evaluations.run(self.rank, iteration - 1)
        return []

    def between(self, t: int) -> None:
        gap = self.timing.between(t, self.rank)
        if gap > 0:
            self.engine.sleep(gap)


def simulate_algorithm(
    scenario: Scenario,
    params,
    timing,
    base: NetworkModel,
    delays: np.ndarray | None = None,
    factors: np.ndarray | None = None,
    wrap_comm: Callable[[int, SimCommunicator], Any] | None = None,
    hosts: NodeTopology | None = None,
    make_algorithm: Callable[[int, AlgorithmContext], Algorithm] | None = None,
    training=None,
) -> tuple[pd.DataFrame, SimStats]:
    """Simulate one algorithm of ``scenario``; returns its steps frame (STEP_COLUMNS) and stats.

    ``make_algorithm(rank, ctx)``, if given, makes each rank's algorithm instead of the class
    ``params.name`` names (a torch.distributed script's replay, ``harness.sim.script_replay``).

    ``wrap_comm(rank, comm)``, if given, returns what the rank's algorithm and loop use instead
    of its simulated communicator (e.g. a call log). ``hosts``: the hosts of a multi-host run
    as nodes (``harness.sim.hosts``), for a scenario without ``network.topology``.

    ``training`` (``harness.sim.training.SimTraining``), if given, makes the run carry values:
    every rank trains its replica with its own buffers and work, the communicator moves values
    (``harness.sim.payload``), and ``training`` collects the evaluations and final models.
    """
    if delays is None or factors is None:
        delays, factors = injection_arrays(scenario)
    ranks = scenario.ranks
    count = communicated_floats(scenario)
    engine = SimEngine()
    network = SimNetwork(
        ranks,
        base,
        link_table(scenario),
        topology=node_topology(scenario),
        clock=engine.now,
        hosts=hosts,
        allreduce=scenario.network.allreduce,
    )
    fabric = SimFabric(engine, network, ranks, payload=training.payload() if training is not None else None)
    evaluations = _Evaluations(engine, ranks, count, base, timing)
    if make_algorithm is None:
        cls = algorithm_class(params.name)

        def make_algorithm(r: int, ctx: AlgorithmContext) -> Algorithm:
            return cls(params, ctx)

    delay_of, factor_of = delays.T.tolist(), factors.T.tolist()  # plain lists: fast indexing per rank
    steps: list[np.ndarray] = [np.empty((0, len(_VALUE_COLUMNS)))] * ranks
    algorithms: list = [None] * ranks

    def rank_body(r: int, comm) -> Callable[[], None]:
        def body() -> None:
            x, g = (StandIn(count), StandIn(count)) if training is None else training.buffers(r)
            ctx = AlgorithmContext(comm, x, g, scenario.optimizer_of(params).lr, scenario.seed)
            algorithm = algorithms[r] = make_algorithm(r, ctx)
            args = (engine, network, r, timing, delay_of[r], factor_of[r], evaluations)
            work = SimulatedWork(*args) if training is None else training.work(*args)
            records, _, _ = train(scenario, algorithm, comm, work, 0.0, keep_ops=False)
            steps[r] = np.array([record[_FIRST_VALUE:] for record in records], dtype=float)  # compact at once

        return body

    for r, sim_comm in enumerate(fabric.communicators()):
        comm = sim_comm if wrap_comm is None else wrap_comm(r, sim_comm)
        engine.spawn(r, rank_body(r, comm), at=timing.start_offset(r))
    host0 = time.perf_counter()
    # The ranks allocate millions of small objects and create almost no reference cycles; the
    # cyclic collector's full passes over that heap would cost more than everything else.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        engine.run()
    finally:
        if gc_was_enabled:
            gc.enable()
    if training is not None:
        training.finished(algorithms)
    host_s = time.perf_counter() - host0
    return _steps_frame(params.name, steps, scenario), SimStats(params.name, engine.env.events_scheduled, host_s)


_FIRST_VALUE = STEP_COLUMNS.index("start_s")  # step records: algorithm, rank, iteration, then values
_VALUE_COLUMNS = STEP_COLUMNS[_FIRST_VALUE:]


def _steps_frame(name: str, steps: list[np.ndarray], scenario: Scenario) -> pd.DataFrame:
    """The steps frame in the real run's row order (iteration-major, then rank), from each rank's
    [iteration, value column] array."""
    ranks, iterations = scenario.ranks, scenario.workload.iterations
    table = np.stack(steps).transpose(1, 0, 2)  # [iteration, rank, column]
    columns = {f: table[:, :, i].ravel() for i, f in enumerate(_VALUE_COLUMNS)}
    for f in ("bytes_sent", "staleness"):
        columns[f] = columns[f].astype(np.int64)
    frame = pd.DataFrame(
        {
            "algorithm": name,
            "rank": np.tile(np.arange(ranks), iterations),
            "iteration": np.repeat(np.arange(iterations), ranks),
            **columns,
        },
        columns=list(STEP_COLUMNS),
    )
    return frame


def simulate_scenario(
    scenario: Scenario,
    base: NetworkModel,
    timing_for: Callable[[str], object],
    on_done: Callable[[str, pd.DataFrame, SimStats], None] | None = None,
    wrap_comm: Callable[[str, int, object], object] | None = None,
    hosts: NodeTopology | None = None,
    training_for: Callable[[object], object] | None = None,
) -> tuple[dict[str, pd.DataFrame], list[SimStats]]:
    """Simulate every algorithm of ``scenario``; ``timing_for(name)`` gives its timing source,
    ``wrap_comm(name, rank, comm)`` optionally wraps each rank's communicator; ``hosts`` as
    :func:`simulate_algorithm`. ``training_for(entry)``, if given, makes each algorithm's
    ``harness.sim.training.SimTraining`` just before it runs (values; the caller keeps it to
    read the evaluations and final models, in ``on_done`` at the latest)."""
    delays, factors = injection_arrays(scenario)
    frames: dict[str, pd.DataFrame] = {}
    stats: list[SimStats] = []
    for params in scenario.algorithms:
        wrap = None if wrap_comm is None else (lambda r, c, name=params.name: wrap_comm(name, r, c))
        training = training_for(params) if training_for is not None else None
        frame, stat = simulate_algorithm(
            scenario, params, timing_for(params.name), base, delays, factors, wrap, hosts=hosts, training=training
        )
        frames[params.name] = frame
        stats.append(stat)
        if on_done is not None:
            on_done(params.name, frame, stat)
    return frames, stats
