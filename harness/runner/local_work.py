"""A real rank's side of the training loop (``harness.runner.loop.Work``): wall clock, real or
emulated compute, real evaluations.

- Real compute: forward and backward on the rank's batch, the local optimizer step on the flat
  buffers (staged to and from the device), and an injected compute factor f stretching both by
  sleeping (f - 1) times their duration after the step.
- Emulated compute: a sleep of the scenario's emulated time (with the factor and jitter
  already in it); no optimizer.

Either way the gradient phase ends with a sleep of ``harness.local_costs.iteration_overhead_s``:
a node agent's combine across its GPUs and the emulated staging of the buffer (0 unless the
scenario has ``workload.node`` or ``workload.staging``).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from harness.compute_time import emulated_compute_s
from harness.injection import InjectionPlan
from harness.local_costs import iteration_overhead_s
from harness.results.columns import EvalRecord
from harness.runner.evaluate import evaluate, test_metrics
from harness.runner.workload_state import TrainState
from harness.scenario.schema import EmulatedCompute, Scenario


class LocalWork:
    """One real rank's clock, local work and evaluations for one algorithm."""

    def __init__(
        self, scenario: Scenario, state: TrainState, rank: int, plan: InjectionPlan, eval_comm, algorithm: str
    ) -> None:
        self.scenario = scenario
        self.state = state
        self.rank = rank
        self.plan = plan
        self.eval_comm = eval_comm
        self.algorithm = algorithm
        self._factors: np.ndarray | None = None
        self._overhead_s = iteration_overhead_s(scenario.workload, int(state.params.numel()), state.staging.staged)

    now = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)

    def injected(self, t: int) -> tuple[float, float]:
        delays, factors = self.plan.at(t)
        self._factors = factors  # emulated compute draws every rank's jitter from them
        return float(delays[self.rank]), float(factors[self.rank])

    def gradient(self, t: int, factor: float) -> tuple[float, float]:
        c0 = time.monotonic()
        s, w, state = self.scenario, self.scenario.workload, self.state
        if state.model is None:
            compute = w.compute
            # no model: emulated compute, with this iteration's factors (injected() ran first)
            assert isinstance(compute, EmulatedCompute) and self._factors is not None
            sleeps = emulated_compute_s(compute.emulate_ms, compute.jitter, s.seed, t, s.ranks, self._factors)
            time.sleep(float(sleeps[self.rank]) + self._overhead_s)
            return time.monotonic() - c0, math.nan
        state.staging.params_to_device()  # the algorithm may have changed them (no-op on the CPU)
        x, y = state.batch(t, w.batch_size, s.seed, self.rank)
        assert state.optimizer is not None  # real compute has one (harness.runner.workload_state.build_state)
        state.optimizer.zero_grad(set_to_none=False)  # keep .grad as views into the flat buffer
        out = torch.nn.functional.cross_entropy(state.model(x), y)
        out.backward()
        loss = float(out.detach())
        state.staging.grads_to_host()
        if self._overhead_s > 0:
            time.sleep(self._overhead_s)
        return time.monotonic() - c0, loss

    def step(self, t: int, factor: float, gradient_s: float) -> float:
        state = self.state
        if state.optimizer is None:
            return 0.0
        s0 = time.monotonic()
        state.staging.params_to_device()
        state.staging.grads_to_device()
        state.optimizer.step()
        state.staging.params_to_host()
        spent = time.monotonic() - s0
        if factor != 1.0:
            # Injected slowdown / jitter: stretch this rank's compute by the factor.
            extra = (gradient_s + spent) * (factor - 1.0)
            if extra > 0:
                time.sleep(extra)
                spent += extra
        return spent

    def evaluate(self, iteration: int, time_s: float, params, final: bool) -> list[EvalRecord]:
        state, model = self.state, self.state.model
        test = (
            None if model is None else (lambda flat: test_metrics(model, flat, state.staging.device_params, state.data))
        )
        return evaluate(self.eval_comm, self.algorithm, iteration, time_s, params, test)

    def between(self, t: int) -> None:
        pass  # the real loop's own bookkeeping is the gap
