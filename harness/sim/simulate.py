"""The SimPy model of a scenario: every rank runs the training loop's structure in simulated time.

Iteration t on rank r, in the order of ``harness.runner.loop.train``::

    start -> before_forward -> injected sleep -> local work (compute) -> after_backward
          -> after_step -> end -> [evaluation point | bookkeeping until the next start]

Hooks are the algorithm's timing model (``harness.sim.algorithms``); the injected sleeps and
compute factors come from the scenario's ``InjectionPlan`` (the real run's pure function); the
local work from a timing source (``harness.sim.timing``). ``comm_blocked_s`` is the time spent
in the hooks, as in the real loop. The result is a steps frame with the real run's columns.

Example::

    frames, stats = simulate_scenario(scenario, network_model, timing_for)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.injection import InjectionPlan
from harness.scenario.network import link_table
from harness.scenario.schema import Scenario
from harness.sim.algorithms import MODELS, SimAlgorithm, SimContext
from harness.sim.calibration import NetworkModel
from harness.sim.network import SimNetwork
from harness.sim.primitives import Collective, CountingEnvironment, wait_until
from harness.sim.workload_size import communicated_floats
from harness.results.records import STEP_COLUMNS


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


class _Evaluation:
    """Evaluation points: a global collective, then (predictive) rank 0 tests alone, or
    (trace-driven) each rank resumes after its measured time past the last arrival."""

    def __init__(self, env, ranks: int, count: int, base: NetworkModel, timing) -> None:
        self.env = env
        self.count = count
        self.network = SimNetwork(ranks, base)  # the evaluation communicator: no emulated links
        self.timing = timing
        self.points: dict[tuple[int, int], Collective] = {}
        self.ranks = ranks

    def _collective(self, t: int, part: int, count: int) -> Collective:
        op = self.points.get((t, part))
        if op is None:
            op = self.points[(t, part)] = Collective(self.env, self.network, range(self.ranks), count)
        return op

    def run(self, r: int, t: int):
        if self.timing.trace_driven:
            barrier = self._collective(t, 0, 0)
            barrier.join(r)
            if barrier.done_at is None:
                yield barrier.complete
            yield from wait_until(self.env, max(barrier.join_at) + self.timing.after_eval(t, r))
            return
        for part, count in ((0, self.count), (1, 1)):  # the averaged model, then the consensus distance
            op = self._collective(t, part, count)
            op.join(r)
            yield from op.wait(r)
        if r == 0 and self.timing.eval_s > 0:
            yield self.env.timeout(self.timing.eval_s)


def simulate_algorithm(scenario: Scenario, params, timing, base: NetworkModel,
                       delays: np.ndarray | None = None) -> tuple[pd.DataFrame, SimStats]:
    """Simulate one algorithm of ``scenario``; returns its steps frame (STEP_COLUMNS) and stats."""
    if delays is None:
        delays, _ = injection_arrays(scenario)
    ranks, iterations = scenario.ranks, scenario.workload.iterations
    eval_every = scenario.workload.eval_every
    count = communicated_floats(scenario)
    env = CountingEnvironment()
    network = SimNetwork(ranks, base, link_table(scenario))
    ctx = SimContext(env, network, ranks, count, scenario.seed)
    model = MODELS[params.name](params, ctx)
    evaluation = _Evaluation(env, ranks, count, base, timing)
    rows: list[list[tuple]] = [[] for _ in range(ranks)]  # per rank: (start, end, compute, blocked, sent, staleness)
    delay_of = delays.T.tolist()  # plain lists: numpy scalar indexing would dominate the inner loop
    base_hooks = SimAlgorithm
    before_forward = model.before_forward if type(model).before_forward is not base_hooks.before_forward else None
    after_backward = model.after_backward if type(model).after_backward is not base_hooks.after_backward else None
    after_step = model.after_step if type(model).after_step is not base_hooks.after_step else None
    finished = [0]

    def rank_process(r: int):
        offset = timing.start_offset(r)
        if offset > 0:
            yield env.timeout(offset)
        record, my_delays, bytes_sent, staleness = rows[r].append, delay_of[r], model.bytes_sent, model.staleness
        for t in range(iterations):
            t_start = env.now
            if before_forward is not None:
                yield from before_forward(r, t)
            waited = env.now - t_start
            delay = my_delays[t]
            if delay > 0:
                yield env.timeout(delay)
            local = timing.compute(t, r)
            network.computing += 1
            yield env.timeout(local)
            network.computing -= 1
            h0 = env.now
            if after_backward is not None:
                yield from after_backward(r, t)
            if after_step is not None:
                yield from after_step(r, t)
            now = env.now
            record((t_start, now, local, waited + now - h0, bytes_sent[r], staleness[r]))
            bytes_sent[r] = 0
            if t + 1 < iterations:
                if (t + 1) % eval_every == 0:
                    yield from evaluation.run(r, t)
                else:
                    gap = timing.between(t, r)
                    if gap > 0:
                        yield env.timeout(gap)
        finished[0] += 1

    for r in range(ranks):
        env.process(rank_process(r))
    host0 = time.perf_counter()
    env.run()
    host_s = time.perf_counter() - host0
    unfinished = ranks - finished[0]
    if unfinished:
        raise RuntimeError(f"simulation of {params.name} deadlocked: {unfinished} ranks did not finish")
    table = np.array(rows, dtype=float).reshape(ranks, iterations, 6).transpose(1, 0, 2)  # [t, r, field]
    start, end, compute, blocked = (table[:, :, i] for i in range(4))
    sent, staleness = table[:, :, 4].astype(np.int64), table[:, :, 5].astype(np.int64)
    frame = pd.DataFrame({
        "algorithm": params.name,
        "rank": np.tile(np.arange(ranks), iterations),
        "iteration": np.repeat(np.arange(iterations), ranks),
        "start_s": start.ravel(),
        "end_s": end.ravel(),
        "compute_s": compute.ravel(),
        "injected_delay_s": delays.ravel(),
        "comm_blocked_s": blocked.ravel(),
        "loss": np.nan,
        "bytes_sent": sent.ravel(),
        "staleness": staleness.ravel(),
    }, columns=list(STEP_COLUMNS))
    return frame, SimStats(params.name, env.events_scheduled, host_s)


def simulate_scenario(scenario: Scenario, base: NetworkModel, timing_for: Callable[[str], object],
                      on_done: Callable[[str, pd.DataFrame, SimStats], None] | None = None,
                      ) -> tuple[dict[str, pd.DataFrame], list[SimStats]]:
    """Simulate every algorithm of ``scenario``; ``timing_for(name)`` gives its timing source."""
    delays, _ = injection_arrays(scenario)
    frames: dict[str, pd.DataFrame] = {}
    stats: list[SimStats] = []
    for params in scenario.algorithms:
        frame, stat = simulate_algorithm(scenario, params, timing_for(params.name), base, delays)
        frames[params.name] = frame
        stats.append(stat)
        if on_done is not None:
            on_done(params.name, frame, stat)
    return frames, stats
