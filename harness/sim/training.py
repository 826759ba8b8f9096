"""Simulated runs that train (``simulate --train``): every simulated rank holds a real model.

Without training the simulator predicts what an iteration costs; with it, it also predicts what
that buys. Every simulated rank holds its own model replica and local optimizer, trains on its
own shard in its own batch order (the real run's provenance: the same seeded initial model,
``harness.workload.shard_indices``, ``harness.workload.batch_indices``), and its communicator
carries real values (:mod:`harness.sim.payload`), combined when the simulated network delivers
them. So staleness, WAGMA-SGD's group rounds, SGP's push-sum weights, AD-PSGD's pairings and
eager-SGD's partial reductions follow the simulated timing, as they would on that cluster, and
evaluations happen at the scenario's evaluation points in simulated time.

How the numbers are computed: rank r's gradient at iteration t is computed when its local work
starts (on its model as it is then; a rank's model cannot change while it computes), with the
real run's own operations: its module's forward and backward pass on its batch, then its
optimizer's step. The timing is the simulator's and never depends on the values (the stand-in
rule), so a run with ``--train`` has exactly the timing of one without.

Memory: the replicas' parameters and gradients are rows of two ``[ranks, n]`` tensors (an
allreduce over every rank is then one ``sum(0)``), each rank adds its optimizer state and its
algorithm's buffers; :func:`memory_estimate` bounds the whole before anything is allocated, and
the commands refuse a run that does not fit.

Equality with a real run: the simulator runs the same algorithm code on the same batches from
the same initial model; where an algorithm's numerics do not depend on the order messages arrive
in, a trace-driven simulation with values ends with the real run's final models (up to the
order of floating-point sums in an allreduce); docs/algorithms/index.md says, per algorithm,
which ones do.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from harness.device import unavailable_reason
from harness.results.columns import EvalRecord
from harness.results.provenance import human_bytes
from harness.runner.evaluate import test_metrics
from harness.runner.optimizers import build_optimizer
from harness.scenario.schema import Scenario
from harness.sim.payload import Payload
from harness.sim.simulate import SimulatedWork
from harness.sim.step_programs import allreduce_program
from harness.sim.sums import native_sum
from harness.workload import ShardBatches, communicated_floats, dataset_facts, scenario_dataset, shard_indices
from harness.workload.models import flat_params, scenario_model, seat_flat


class TrainingError(RuntimeError):
    """A simulation with values that cannot run (it does not fit in memory, no GPU, ...)."""


def _random(model: torch.nn.Module) -> bool:
    """Whether the model draws from torch's RNG in training (dropout)."""
    return any(isinstance(m, torch.nn.modules.dropout._DropoutNd) for m in model.modules())


class Replicas:
    """Every simulated rank's model, gradient, optimizer and data for one algorithm's run.

    ``params[r]`` and ``grads[r]`` are rank r's flat buffers (the algorithm's ``ctx.params`` and
    ``ctx.grads``), rows of ``[ranks, n]`` tensors on ``device``.
    """

    def __init__(self, scenario: Scenario, dataset: Any, optimizer: Any, device: torch.device) -> None:
        ranks, w = scenario.ranks, scenario.workload
        template = scenario_model(scenario, dataset)
        initial = flat_params(template).detach().clone()
        self.initial = initial
        self.device = device
        self.params = initial.to(device).repeat(ranks, 1)
        self.grads = torch.zeros_like(self.params)
        self.data = dataset
        self.shards = [shard_indices(dataset.num_train, ranks, r, scenario.seed) for r in range(ranks)]
        self.batches = [ShardBatches(shard, w.batch_size, scenario.seed, r) for r, shard in enumerate(self.shards)]
        template.to(device)
        self.models: list[torch.nn.Module] = []
        self.optimizers: list[Any] = []
        for r in range(ranks):
            model = copy.deepcopy(template)  # buffers (BatchNorm statistics) stay each rank's own
            seat_flat(model, self.params[r], self.grads[r])
            model.train()
            self.models.append(model)
            self.optimizers.append(build_optimizer(optimizer, model, scenario.python_path))
        # Dropout draws from torch's RNG: each rank draws from a stream of its own (seed, rank).
        self._rng_states = None
        if _random(template):
            states = []
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                for r in range(ranks):
                    torch.manual_seed(int(np.random.SeedSequence([scenario.seed, 5, r]).generate_state(1)[0]))
                    states.append(_rng_state(device))
            self._rng_states = states
        self.template = template

    def gradient(self, rank: int, t: int) -> float:
        """Rank ``rank``'s forward and backward pass of iteration t, on its model as it is now:
        the gradient lands in ``grads[rank]``; returns the loss (``LocalWork.gradient``'s steps)."""
        model, optimizer = self.models[rank], self.optimizers[rank]
        idx = torch.from_numpy(self.batches[rank].at(t))
        idx = idx.to(self.data.train_x.device)
        x, y = self.data.train_x[idx], self.data.train_y[idx]
        optimizer.zero_grad(set_to_none=False)
        if self._rng_states is not None:
            _set_rng_state(self.device, self._rng_states[rank])
        out = torch.nn.functional.cross_entropy(model(x), y)
        out.backward()
        if self._rng_states is not None:
            self._rng_states[rank] = _rng_state(self.device)
        return float(out.detach())

    def step(self, rank: int) -> None:
        """Rank ``rank``'s local optimizer step."""
        self.optimizers[rank].step()

    def test(self, flat: torch.Tensor) -> tuple[float, float]:
        """Test loss and accuracy of the model with flat parameters ``flat`` (rank 0's module and
        BatchNorm statistics, as the real run's rank 0 tests)."""
        model = self.models[0]
        return test_metrics(model, flat, self.params[0], self.data)


def _rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


@dataclass
class EvaluationPoint:
    """One evaluation point's values: every rank's deployable model as it arrived, combined once
    the last rank has arrived (the others wait for it there, as in a real run's allreduce)."""

    models: list
    time_s: float = math.nan  # rank 0's, as a real run's records have it
    records: list[EvalRecord] = field(default_factory=list)


class Evaluations:
    """The values of every evaluation point of one algorithm's simulated run: what the real
    ``harness.runner.evaluate.evaluate`` computes (the averaged model, the consensus distance,
    the test metrics of the average and of rank 0's model), in the same records."""

    def __init__(self, replicas: Replicas, algorithm: str) -> None:
        self.replicas = replicas
        self.algorithm = algorithm
        self._points: dict[int, EvaluationPoint] = {}
        self.records: list[EvalRecord] = []

    def arrive(self, rank: int, iteration: int, time_s: float, model: torch.Tensor) -> EvaluationPoint:
        point = self._points.get(iteration)
        if point is None:
            point = self._points[iteration] = EvaluationPoint([None] * self.replicas.params.shape[0])
        point.models[rank] = model
        if rank == 0:
            point.time_s = time_s
        if all(m is not None for m in point.models):
            self._combine(iteration, point)
        return point

    def _combine(self, iteration: int, point: EvaluationPoint) -> None:
        models = point.models
        avg = evaluation_average(models)
        distance = sum(float(torch.sum((m - avg) ** 2)) for m in models) / len(models)
        consensus = float(torch.tensor([distance], dtype=torch.float32)[0])
        for which, flat in (("average", avg), ("rank0", models[0])):
            loss, acc = self.replicas.test(flat)
            point.records.append(EvalRecord(self.algorithm, iteration, point.time_s, which, loss, acc, consensus))
        self.records += point.records
        point.models = []  # the point holds no model once combined
        del self._points[iteration]


def evaluation_average(models: list) -> torch.Tensor:
    """The average of the ranks' deployable models as a real run's evaluation averages them: an
    allreduce (mean) on its evaluation communicator, which has no emulated network, so the
    default allreduce program's order of additions."""
    return native_sum(models, allreduce_program(len(models), models[0].numel())).div_(len(models))


def final_average(algorithms: list) -> torch.Tensor:
    """The average of every rank's final deployable model, on the CPU, as the final evaluation
    averaged it (a real run's ``final_average_<algorithm>.pt``)."""
    return evaluation_average([a.eval_params().detach() for a in algorithms]).cpu()


def final_models(algorithms: list) -> torch.Tensor:
    """``[ranks, n]`` on the CPU: every rank's final deployable model (a real run's
    ``final_models_<algorithm>.pt``), filled row by row (no second copy of them all)."""
    first = algorithms[0].eval_params()
    out = torch.empty((len(algorithms), first.numel()), dtype=first.dtype)
    for r, a in enumerate(algorithms):
        out[r].copy_(a.eval_params().detach())
    return out


class TrainingWork(SimulatedWork):
    """A simulated rank's side of the training loop with values: the simulated timing of
    :class:`~harness.sim.simulate.SimulatedWork`, plus the rank's real gradient, optimizer step
    and evaluations."""

    def __init__(self, training: SimTraining, *args: Any) -> None:
        super().__init__(*args)
        self.training = training

    def gradient(self, t: int, factor: float) -> tuple[float, float]:
        loss = self.training.live_replicas.gradient(self.rank, t)  # on the model as it is when the work starts
        local, _ = super().gradient(t, factor)
        return local, loss

    def step(self, t: int, factor: float, gradient_s: float) -> float:
        self.training.live_replicas.step(self.rank)
        return 0.0  # timed with the gradient

    def evaluate(self, iteration: int, time_s: float, params, final: bool) -> list[EvalRecord]:
        point = self.training.evaluations.arrive(self.rank, iteration, time_s, params)
        if final:  # after the run: the values only (the simulated steps are over)
            comm = self._evaluations.comms[self.rank]
            comm.barrier()
            comm.drain_records()
        else:
            self._evaluations.run(self.rank, iteration - 1)
        return list(point.records) if self.rank == 0 else []


class SimTraining:
    """One algorithm's simulated run with values: its replicas, its evaluations and, once the
    run is over, the average of the ranks' final models (``final_average``) and every rank's
    (``final_models``, ``[ranks, n]`` on the CPU, when kept)."""

    def __init__(
        self,
        scenario: Scenario,
        algorithm: Any,
        dataset: Any,
        device: torch.device,
        recorded_staleness: dict[tuple[int, int], int] | None = None,
        keep_rank_models: bool = True,
    ) -> None:
        """``recorded_staleness``: a replay's ``{(rank, round): staleness}`` of the real run's
        wait-avoiding rounds, which the simulated rounds then contribute as
        (``harness.sim.payload.Published``). ``keep_rank_models``: keep every rank's final
        model (``final_models``; else only their average, ``final_average``)."""
        replicas = Replicas(scenario, dataset, scenario.optimizer_of(algorithm), device)
        self.replicas: Replicas | None = replicas  # None once the run is over (``finished``)
        self.evaluations = Evaluations(replicas, algorithm.name)
        self.final_models: torch.Tensor | None = None
        self.final_average: torch.Tensor | None = None
        self.keep_rank_models = keep_rank_models
        self.recorded_staleness = recorded_staleness
        self.rank_state_bytes = 0
        self._payload: Payload | None = None

    @property
    def live_replicas(self) -> Replicas:
        """The replicas, while the run lasts."""
        replicas = self.replicas
        assert replicas is not None, "the run is over: its replicas are gone"
        return replicas

    def payload(self) -> Payload:
        """The values side of the simulated communicator."""
        self._payload = Payload(self.recorded_staleness)
        return self._payload

    def buffers(self, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank ``rank``'s ``ctx.params`` and ``ctx.grads``."""
        replicas = self.live_replicas
        return replicas.params[rank], replicas.grads[rank]

    def work(self, *args: Any) -> TrainingWork:
        """Rank's work (``SimulatedWork``'s arguments)."""
        return TrainingWork(self, *args)

    def finished(self, algorithms: list) -> None:
        """The run is over: keep every rank's final model and what the ranks' own state weighed
        (``rank_state_bytes``), let go of the replicas."""
        self.final_average = final_average(algorithms)
        if self.keep_rank_models:
            self.final_models = final_models(algorithms)
        self.rank_state_bytes = rank_state_bytes(self.live_replicas, algorithms, self._payload)
        self.replicas = None


# -- memory --------------------------------------------------------------------------------------


def rank_state_bytes(replicas: Replicas, algorithms: list, payload: Payload | None) -> int:
    """Bytes of what every simulated rank holds as a real rank would: its parameters, gradients
    and optimizer state, its algorithm's tensors (attributes, and tensors in list or dict
    attributes) and its persistent operations' buffers (the native layer's copies). What a
    simulation holds beyond it is the simulator's own (``bench training``)."""
    tensors: list[torch.Tensor] = [replicas.params, replicas.grads]
    for optimizer in replicas.optimizers:
        state = getattr(optimizer, "state", None)
        if isinstance(state, dict):  # torch.optim: per-parameter dicts
            tensors += [v for s in state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        else:  # FlatSGD
            tensors += [v for v in vars(optimizer).values() if isinstance(v, torch.Tensor)]
    for algorithm in algorithms:
        for value in vars(algorithm).values():
            items = (
                value if isinstance(value, (list, tuple)) else value.values() if isinstance(value, dict) else [value]
            )
            tensors += [t for t in items if isinstance(t, torch.Tensor)]
    if payload is not None:
        tensors += payload.persistent_tensors()
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


@dataclass(frozen=True)
class MemoryEstimate:
    """What a simulation with values will hold at most, in bytes."""

    replicas: int  # parameters, gradients and optimizer state of every rank
    algorithm: int  # the algorithm's buffers of every rank, and messages in flight
    data: int  # the dataset
    overhead: int  # per-rank modules and the simulator's own state

    @property
    def total(self) -> int:
        return self.replicas + self.algorithm + self.data + self.overhead


# Model-sized buffers beyond params and grads, per rank: the optimizer's state (momentum SGD 1,
# Adam 2) and an allowance for the algorithm's own buffers and messages in flight (the built-in
# algorithms hold at most 4: SGP's send and receive buffers and weight, WAGMA's out and
# published copy, AD-PSGD's sent model, reply and the agent's view and correction).
OPTIMIZER_BUFFERS = {"sgd": 1, "adam": 3, "adamw": 3}  # Adam: its moments, and amsgrad's maximum
ALGORITHM_BUFFERS = 5
PER_RANK_OVERHEAD = 64 * 1024  # a module's Python objects, the optimizer's, the greenlet's


def memory_estimate(scenario: Scenario, floats: int, dataset_bytes: int) -> MemoryEstimate:
    """An upper bound of what training ``scenario`` with values holds at once (one algorithm at a
    time: each starts from fresh replicas)."""
    ranks, model = scenario.ranks, 4 * floats
    optimizer = OPTIMIZER_BUFFERS.get(getattr(scenario.optimizer, "name", ""), 2)
    replicas = ranks * model * (2 + optimizer)
    algorithm = ranks * model * ALGORITHM_BUFFERS
    return MemoryEstimate(replicas, algorithm, dataset_bytes, ranks * PER_RANK_OVERHEAD + model * 8)


def available_bytes(device: torch.device) -> int:
    """Memory a run may take on ``device``: the GPU's free memory, or the host's available memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def training_device(scenario: Scenario) -> torch.device:
    """Where a simulation with values computes: the CPU, or with ``workload.device: cuda`` the
    first GPU (all replicas and every simulated message live there); TrainingError when there
    is none."""
    if scenario.workload.device == "cpu":
        return torch.device("cpu")
    reason = unavailable_reason(scenario.workload.device)
    if reason is not None:
        raise TrainingError(f"workload.device: {reason}")
    return torch.device("cuda", 0)


def fit_problem(scenario: Scenario, device: torch.device) -> str | None:
    """Why a simulation with values of ``scenario`` would not fit in memory on ``device`` (with
    the estimate), or None when it fits. Checked before anything is allocated."""
    floats = communicated_floats(scenario)
    facts = dataset_facts(scenario)
    sample = 4 * int(np.prod(facts.input_shape)) + 8
    estimate = memory_estimate(scenario, floats, facts.samples * sample)
    free = available_bytes(device)
    if estimate.total <= 0.9 * free:
        return None
    where = "this GPU" if device.type == "cuda" else "this machine"
    return (
        f"simulation.train: {scenario.ranks:,} simulated ranks of a {floats:,}-parameter model need about "
        f"{human_bytes(estimate.total)} (replicas: parameters, gradients and optimizer state "
        f"{human_bytes(estimate.replicas)}; the algorithms' buffers and messages "
        f"{human_bytes(estimate.algorithm)}; "
        f"data {human_bytes(estimate.data)}; the rest {human_bytes(estimate.overhead)}), but {where} has "
        f"{human_bytes(free)} available; simulate fewer ranks or a smaller model, or train on a GPU "
        "(workload.device: cuda)"
    )


def training_problem(scenario: Scenario) -> str | None:
    """Why ``scenario`` cannot be simulated with values on this machine (no model to train, a
    device it lacks, not enough memory: with the estimate), or None when it can."""
    if scenario.workload.compute != "real":
        return "simulation.train: the workload has no model to train (emulated compute)"
    try:
        device = training_device(scenario)
    except TrainingError as exc:
        return str(exc)
    problem = fit_problem(scenario, device)
    if problem is not None:
        return problem
    samples = scenario_dataset(scenario).num_train
    if samples < scenario.ranks:
        return (
            f"workload.dataset: {scenario.workload.dataset} has {samples:,} training samples, fewer than the "
            f"{scenario.ranks:,} simulated ranks that each train on a shard of them: give a dataset that grows "
            "with the ranks (the built-in teacher, as scenarios/at_scale.yaml does)"
        )
    return None
