"""The scenario file's schema: frozen, strict models; every default of a scenario lives here.

Checks that need the rank count (rank indices, ``count``, ``group_size``) run in ``Scenario``,
the only model that knows ``ranks``; they raise errors that carry the field path, which the
loader turns into one line per error.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    SerializeAsAny,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from harness.algorithms import user_class, variant
from harness.algorithms.params import AlgorithmParams
from harness.algorithms.registry import names, params_model
from harness.errors import ParamError
from harness.optimizer_spec import (  # noqa: F401  (re-exported: scenario code imports them from here)
    BUILT_IN_OPTIMIZERS,
    AdamOptimizer,
    AdamWOptimizer,
    OptimizerSpec,
    ReferenceOptimizer,
    SGDOptimizer,
)
from harness.scenario.fault_fields import AnyFaultSpec, SlowStartFault
from harness.scenario.imbalance_fields import AnyInjectorSpec
from harness.scenario.network_fields import HostStaging, Network, NodeAgent
from harness.scenario.ranks import MAX_RANKS, check_each
from harness.strict_model import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, StrictModel
from harness.user_code import UserCodeError, check_reference, is_reference
from harness.workload.names import unknown_name

Device = Literal["cpu", "cuda"]  # cuda: each rank takes the GPU of its local rank (harness/device.py)

_NAME = re.compile(r"[A-Za-z0-9_-]+")

# ---------------------------------------------------------------------------------------------
# workload


class EmulatedCompute(StrictModel):
    """Emulated compute (``workload.compute: {emulate_ms: MS, jitter: SIGMA}``): every iteration each
    rank sleeps instead of computing a forward and backward pass, and still communicates a buffer
    of ``workload.params`` floats (nothing is trained, so there is no accuracy to speak of)."""

    emulate_ms: NonNegativeFloat
    """One iteration's compute time in milliseconds; injected compute factors (``imbalance``
    kinds ``jitter``, ``slowdown``) multiply it."""
    jitter: NonNegativeFloat = 0.0
    """Sigma of a lognormal factor exp(N(0, sigma)) drawn per rank and iteration (from the
    scenario's ``seed``) on ``emulate_ms``; 0: every iteration takes exactly ``emulate_ms``."""


def _compute_form(value: Any) -> str | None:
    if isinstance(value, str):
        return "(real)"
    if isinstance(value, (dict, EmulatedCompute)):
        return "(emulated)"
    return None


Compute = Annotated[
    Annotated[Literal["real"], Tag("(real)")] | Annotated[EmulatedCompute, Tag("(emulated)")],
    Discriminator(
        _compute_form,
        custom_error_type="compute_form",
        custom_error_message="must be 'real' or a mapping {emulate_ms: MS, jitter: SIGMA}",
    ),
]


def _workload_schema(schema: dict[str, Any]) -> None:
    """What the validators below add to the JSON Schema: ``eval_every`` may be left out (its
    default depends on ``iterations``); ``model`` and ``dataset`` come together; ``params`` only
    with emulated compute."""
    schema["required"].remove("eval_every")
    given = {"model": {"type": "string"}, "dataset": {"type": "string"}}
    schema["allOf"] = [
        *(
            {
                "if": {"properties": {a: given[a]}, "required": [a]},
                "then": {"properties": {b: given[b]}, "required": [b]},
            }
            for a, b in (("model", "dataset"), ("dataset", "model"))
        ),
        {"if": {"properties": {"compute": {"const": "real"}}}, "then": {"properties": {"params": {"type": "null"}}}},
    ]


class Workload(StrictModel):
    """What each rank trains: model, data, batch, iterations per algorithm, real or emulated compute.

    Without ``model`` and ``dataset`` the workload is a training script's own (``harness.api``):
    ``python -m harness run`` refuses such a scenario, ``python -m harness launch`` runs it.
    """

    model_config = ConfigDict(json_schema_extra=_workload_schema)

    # harness.workload.names states the contract of the user's callables; harness.scenario.checks
    # checks them.
    model: str | None = None
    """The model: a built-in name or your own callable as ``"module:callable"``, called as
    ``callable(input_shape=(C, H, W), num_classes=K, **model_args)``. Give ``model`` and ``dataset``
    together, or neither (a training script's own workload, run by ``python -m harness launch``)."""
    dataset: str | None = None
    """The data: a built-in name or your own callable as ``"module:callable"``, called as
    ``callable(seed=SEED, **dataset_args)``, plus ``ranks=RANKS`` when it has a parameter named
    ``ranks`` (``teacher`` does: 256 training samples per rank by default); the training set is
    sharded across the ranks."""
    model_args: dict[str, Any] = {}  # noqa: RUF012  (a pydantic field: each model copies its default)
    """Keyword arguments of the model callable."""
    dataset_args: dict[str, Any] = {}  # noqa: RUF012  (a pydantic field: each model copies its default)
    """Keyword arguments of the dataset callable."""
    num_classes: PositiveInt | None = None
    """The model's number of outputs; null: 1 + the dataset's largest label."""
    batch_size: PositiveInt
    """Samples per rank and iteration (so the global batch is ``ranks`` times this)."""
    iterations: PositiveInt
    """Training iterations of each algorithm (every algorithm runs this many, in turn)."""
    compute: Compute = "real"
    """``real``: forward and backward passes of the model; or ``{emulate_ms: MS, jitter:
    SIGMA}``: sleep instead (emulated compute)."""
    params: PositiveInt | None = None
    """Emulated compute only: the number of float32 values communicated (e.g. ``25.6e6`` for a
    ResNet-50); null: the model's own parameter count."""
    eval_every: PositiveInt  # the default is filled in by _default_eval_every
    """Evaluate the averaged model on the test set every this many iterations (and after the
    last). Default: max(1, iterations // 6)."""
    device: Device = "cpu"
    """Where each rank computes: ``cpu``, or ``cuda`` (each rank takes the GPU of its local rank;
    no index)."""
    node: NodeAgent | None = None
    """Make every rank stand for a node of several GPUs driven by one process (``{gpus: N, link:
    ...}``); null: a rank is one worker."""
    staging: HostStaging | None = None
    """Make the ranks communicate from host memory: the communicated buffer crosses PCIe every
    iteration (``{bandwidth_gbps: B, latency_us: L}``); null: no staging."""

    @model_validator(mode="before")
    @classmethod
    def _default_eval_every(cls, data: Any) -> Any:
        if isinstance(data, dict) and "eval_every" not in data:
            iterations = data.get("iterations")
            # A bad `iterations` is reported on its own; 1 only keeps this field quiet meanwhile.
            every = max(1, iterations // 6) if type(iterations) is int else 1
            data = {**data, "eval_every": every}
        return data

    @field_validator("model", "dataset")
    @classmethod
    def _known_or_reference(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        field_name = info.field_name
        assert field_name is not None  # always set for a field validator
        reason = unknown_name(field_name, value)
        if reason is None and is_reference(value):
            try:
                check_reference(value)
            except UserCodeError as exc:
                reason = str(exc)
        if reason is not None:
            raise ParamError((), reason, value).to_pydantic()
        return value

    @field_validator("params", mode="before")
    @classmethod
    def _integral_float(cls, value: Any) -> Any:
        # YAML has no integer exponent notation: `params: 25.6e6` arrives as a float.
        if type(value) is float and value.is_integer():
            return int(value)
        return value

    @field_validator("device", mode="before")
    @classmethod
    def _no_device_index(cls, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("cuda:"):
            reason = "give 'cuda' without an index: each rank takes the GPU of its local rank"
            raise ParamError((), reason, value).to_pydantic()
        return value

    @property
    def of_script(self) -> bool:
        """Whether this is a training script's own workload (no model or dataset named here)."""
        return self.model is None

    @model_validator(mode="after")
    def _model_and_dataset(self) -> Workload:
        if (self.model is None) != (self.dataset is None):
            missing, given = ("model", "dataset") if self.model is None else ("dataset", "model")
            reason = f"required when {given} is given (leave out both for a training script's own workload)"
            raise ParamError(missing, reason, None).to_pydantic()
        return self

    @model_validator(mode="after")
    def _params_need_emulation(self) -> Workload:
        if self.params is not None and self.compute == "real":
            raise ParamError(
                "params", "only with emulated compute; real compute communicates the model itself", self.params
            ).to_pydantic()
        return self


class WatchdogSettings(StrictModel):
    """When ``python -m harness run`` declares the job stuck and stops it.

    A rank is stuck when it has made no progress (started an iteration or a phase) for longer
    than its timeout. In training iterations the timeout is ``stall_timeout_s``, or, when that
    is None, ``factor`` times the slowest iteration any rank has finished so far (at least
    ``min_timeout_s``). Start-up, per-algorithm set-up, evaluation and writing results, and
    iterations before any has finished, get ``startup_timeout_s`` (or the iteration timeout if
    that is longer).
    """

    stall_timeout_s: PositiveFloat | None = None
    """Seconds without progress in training iterations after which a rank is stuck; null: the
    timeout follows the iteration times (``factor``, ``min_timeout_s``)."""
    factor: Annotated[float, Field(ge=1.0)] = 20.0
    """Without ``stall_timeout_s``: the timeout is this many times the slowest iteration any rank
    has finished so far."""
    min_timeout_s: PositiveFloat = 10.0
    """Without ``stall_timeout_s``: the timeout is at least this many seconds."""
    startup_timeout_s: PositiveFloat = 120.0
    """Seconds allowed for start-up, each algorithm's set-up, evaluations, writing results and the
    iterations before any has finished (or the iteration timeout, if longer)."""


ProvenanceSetting = Literal["auto", "full", "final", "none"]


class ResultsSettings(StrictModel):
    """What a run keeps and how its summary judges the algorithms (``results/README.md`` describes
    the files; ``harness/results/provenance.py`` writes ``provenance/``)."""

    provenance: ProvenanceSetting = "auto"
    """What ``provenance/`` keeps: ``final`` the initial model, the data shards and per algorithm
    the average of the ranks' final models (the model ``final_accuracy`` was measured on);
    ``full`` also every rank's final model of each algorithm; ``none`` nothing; ``auto`` is
    ``full`` with real compute and ``none`` with emulated compute. ``run --provenance``
    overrides it."""
    target_accuracy: Annotated[float, Field(gt=0.0, le=1.0)] = 0.9
    """A test accuracy (a fraction): summary.csv's ``time_to_target_s`` is the training time
    (evaluations excluded) until an evaluation of the averaged model first reached it."""
    target_loss: Annotated[float, Field(allow_inf_nan=False)] | None = None
    """A test loss: summary.csv's ``time_to_target_loss_s`` is the training time (evaluations
    excluded) until an evaluation of the averaged model first had a test loss at or below it (a
    ``torch.distributed`` script's evaluations: ``harness.dist.record(..., evaluation=True)``);
    null: no loss target."""
    comm_calls: bool = False
    """Also write ``comm_calls.csv``: every call each rank's algorithm made to its communicator,
    per iteration (real and simulated runs alike)."""


class SimulationSettings(StrictModel):
    """How ``python -m harness simulate`` and ``compare`` run this scenario (a real run ignores it)."""

    train: bool = False
    """Simulated ranks train for real (``simulate --train``): every simulated rank holds its own
    model replica and optimizer, trains on its shard in its batch order, and every simulated
    message carries real values, combined when the simulated network delivers it. The summary's
    accuracy columns are then filled at any rank count. Needs a model and dataset (real compute);
    costs about one training step per rank and iteration, and memory for every rank's replica
    (the commands refuse a run that would not fit)."""


# ---------------------------------------------------------------------------------------------
# scenario


def _fit_ranks(value: Any, info: ValidationInfo) -> Any:
    """Check a list of entries (or one object) against the already validated ``ranks``."""
    ranks = info.data.get("ranks")
    if ranks is not None:
        try:
            if isinstance(value, list):
                check_each(value, ranks)
            else:
                value.check(ranks)
        except ParamError as exc:
            raise exc.to_pydantic() from None
    return value


class _Named(BaseModel):
    """What an ``algorithms`` entry needs before its parameter model can be picked: a string ``name``."""

    model_config = ConfigDict(strict=True, extra="ignore")
    name: str


def _algorithm_entry(value: Any, info: ValidationInfo) -> AlgorithmParams:
    """A bare algorithm name or a mapping with ``name``, validated by that algorithm's registered
    parameter model (``harness.algorithms.registry``), so algorithms registered at run time count.
    A mapping with ``class: "module:Class"`` names the user's class, imported from the scenario's
    ``python_path`` and registered under ``name`` first (``harness.algorithms.user_class``); one
    with ``algorithm: BUILT_IN`` runs that built-in under the label ``name``, registered first
    (``harness.algorithms.variant``)."""
    if isinstance(value, AlgorithmParams) and isinstance(value, params_model(value.name)):
        return value
    if isinstance(value, str):
        value = {"name": value}
    name = _Named.model_validate(value).name
    if user_class.names_class(value):
        if variant.names_algorithm(value):
            raise ParamError(
                variant.ALGORITHM_KEY,
                "give `algorithm` (a built-in algorithm to run) or `class` (your own), not both",
                value[variant.ALGORITHM_KEY],
            ).to_pydantic()
        try:
            user_class.entry_model(name, value[user_class.CLASS_KEY], info.data.get("python_path", []))
        except ParamError as exc:
            raise exc.to_pydantic() from None
    elif variant.names_algorithm(value):
        try:
            model = variant.entry_model(name, value[variant.ALGORITHM_KEY])
        except ParamError as exc:
            raise exc.to_pydantic() from None
        return model.model_validate(variant.plain_entry(value))
    elif name not in names():
        raise ParamError("name", f"unknown algorithm (valid: {', '.join(names())})", name).to_pydantic()
    # A ValidationError raised here reaches the scenario's errors with this entry's path in front.
    return params_model(name).model_validate(value)


def _names_user_code(data: dict[str, Any]) -> bool:
    """Whether raw scenario data names the user's code: an import reference as model, dataset or
    optimizer, or an algorithm entry with a ``class``."""
    workload, optimizer = data.get("workload"), data.get("optimizer")
    values = [workload.get(k) for k in ("model", "dataset")] if isinstance(workload, dict) else []
    values.append(optimizer.get("name") if isinstance(optimizer, dict) else optimizer)
    algorithms = data.get("algorithms")
    entries = algorithms if isinstance(algorithms, list) else []
    return any(is_reference(v) for v in values) or any(user_class.names_class(e) for e in entries)


# SerializeAsAny: dump each entry with its own model's fields, not only AlgorithmParams' `name`.
AlgorithmEntry = Annotated[SerializeAsAny[AlgorithmParams], PlainValidator(_algorithm_entry)]


class Scenario(StrictModel):
    """A whole experiment: ranks, workload, algorithms run in turn, injected imbalance, network,
    injected faults and the watchdog's settings."""

    name: str
    """The scenario's name: letters, digits, ``-`` and ``_``; a run's results go to
    ``results/NAME/`` (under ``--out``)."""
    description: str = ""
    """A line saying what the scenario is for (kept with the results, in scenario.resolved.yaml)."""
    ranks: Annotated[int, Field(ge=1, le=MAX_RANKS)]
    """Number of ranks (processes, each one worker or one node) that train."""
    seed: NonNegativeInt = 0
    """Seed of everything random: initial model, data shards and order, injected imbalance."""
    # harness.user_code searches them; the validator below makes them absolute.
    python_path: list[str] = []  # noqa: RUF012  (a pydantic field: each model copies its default)
    """Directories searched first for the modules of ``"module:callable"`` references, relative to
    the scenario file's directory; default: that directory, when the scenario names code of yours."""
    workload: Workload
    """What each rank trains, for how many iterations, and how it computes."""
    optimizer: OptimizerSpec = SGDOptimizer()
    """The local optimizer of every algorithm (an ``algorithms`` entry may give its own): ``sgd``
    (momentum SGD, the default), ``adam``, ``adamw`` or your own ``"module:callable"``; a bare name
    or a mapping with ``name`` and its parameters. Its ``lr`` is the algorithms' learning rate."""
    algorithms: list[AlgorithmEntry] = []  # noqa: RUF012  (a pydantic field: each model copies its default)
    """The algorithms to run, one after the other, each from the same initial model under the same
    injections: a built-in name, a mapping ``{name: NAME, PARAMETER: VALUE, ...}``, a variant
    ``{name: LABEL, algorithm: BUILT_IN, ...}`` (a built-in under a label of its own), or your own
    class ``{name: NAME, class: "module:Class", ...}``. Names are unique. At least one, except for
    a training script's own workload (no ``workload.model``): a ``torch.distributed`` script that
    ``python -m harness launch --scenario`` runs is the algorithm itself and lists none."""
    imbalance: list[AnyInjectorSpec] = []  # noqa: RUF012  (a pydantic field: each model copies its default)
    """Injected imbalance, one entry per ``kind``: ``random_ranks``, ``fixed``, ``linear``,
    ``jitter``, ``slowdown``. Entries combine: sleeps add up, compute factors multiply."""
    network: Network = Network()
    """Emulated links, nodes and the allreduce algorithm (default: no emulated network)."""
    faults: list[AnyFaultSpec] = []  # noqa: RUF012  (a pydantic field: each model copies its default)
    """Injected faults: ``kill``, ``hang``, ``slow_start`` (real runs only; the simulator ignores them)."""
    watchdog: WatchdogSettings = WatchdogSettings()
    """When ``python -m harness run`` declares the job stuck and stops it."""
    results: ResultsSettings = ResultsSettings()
    """What a run keeps and how its summary judges the algorithms."""
    simulation: SimulationSettings = SimulationSettings()
    """How the simulator runs the scenario: whether its simulated ranks train real models."""
    # The commands record the KEY=VALUE overrides here (harness.scenario.overrides), so
    # scenario.resolved.yaml says how it differs from the file.
    overrides: list[str] = []  # noqa: RUF012  (a pydantic field: each model copies its default)
    """The ``KEY=VALUE`` overrides the scenario was loaded with, in order; the commands fill it in
    (a scenario file leaves it out)."""

    @model_validator(mode="before")
    @classmethod
    def _absolute_python_path(cls, data: Any, info: ValidationInfo) -> Any:
        """Make ``python_path`` absolute against the scenario file's directory (the loader passes it
        as the validation context's ``base_dir``; the working directory without one), and default
        it to that directory when the scenario names the user's code."""
        if not isinstance(data, dict):
            return data
        base = Path((info.context or {}).get("base_dir") or ".").absolute()
        given = data.get("python_path")
        if given is None and _names_user_code(data):
            given = ["."]
        if isinstance(given, list) and all(isinstance(d, str) for d in given):
            data = {**data, "python_path": [os.path.normpath(base / d) for d in given]}
        return data

    @field_validator("name")
    @classmethod
    def _name_chars(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ParamError((), "must be letters, digits, '-' and '_' only", value).to_pydantic()
        return value

    # The validators below see `ranks` in info.data only when it was valid (fields validate in
    # order); otherwise its own error is reported and the rank checks are skipped.

    @field_validator("algorithms")
    @classmethod
    def _algorithms_fit(cls, value: list[Any], info: ValidationInfo) -> list[Any]:
        first: dict[str, int] = {}
        for i, params in enumerate(value):
            if params.name in first:
                reason = f"listed twice (first at algorithms[{first[params.name]}])"
                raise ParamError((i, "name"), reason, params.name).to_pydantic()
            first[params.name] = i
        return _fit_ranks(value, info)

    @field_validator("imbalance", "network", "faults")
    @classmethod
    def _parts_fit(cls, value: Any, info: ValidationInfo) -> Any:
        return _fit_ranks(value, info)

    @model_validator(mode="after")
    def _some_algorithm(self) -> Scenario:
        if not self.algorithms and not self.workload.of_script:
            reason = (
                "at least one is required (only a training script's own workload, without workload.model, "
                "may list none: `python -m harness launch --scenario` runs a torch.distributed script as "
                "the algorithm)"
            )
            raise ParamError(("algorithms",), reason, []).to_pydantic()
        return self

    @model_validator(mode="after")
    def _trains_a_model(self) -> Scenario:
        if self.simulation.train and self.workload.compute != "real":
            what = "a training script's workload" if self.workload.of_script else "emulated compute"
            reason = (
                f"the simulated ranks train the workload's model on its dataset; {what} has none (give "
                "workload.model and workload.dataset with real compute, or leave simulation.train out)"
            )
            raise ParamError(("simulation", "train"), reason, True).to_pydantic()
        return self

    @model_validator(mode="after")
    def _faults_fit(self) -> Scenario:
        names = [a.name for a in self.algorithms]
        slow_start: dict[int, int] = {}
        for i, fault in enumerate(self.faults):
            if isinstance(fault, SlowStartFault):
                if fault.rank in slow_start:
                    reason = f"rank already has a slow_start (faults[{slow_start[fault.rank]}])"
                    raise ParamError(("faults", i, "rank"), reason, fault.rank).to_pydantic()
                slow_start[fault.rank] = i
                continue
            if fault.algorithm is not None and fault.algorithm not in names:
                reason = f"not one of the algorithms run ({', '.join(names)})"
                raise ParamError(("faults", i, "algorithm"), reason, fault.algorithm).to_pydantic()
            if fault.at_iteration is not None and fault.at_iteration >= self.workload.iterations:
                reason = f"must be < workload.iterations ({self.workload.iterations})"
                raise ParamError(("faults", i, "at_iteration"), reason, fault.at_iteration).to_pydantic()
        return self

    def optimizer_of(self, algorithm: AlgorithmParams) -> Any:
        """The local optimizer spec ``algorithm`` trains with: its entry's ``optimizer`` (or its
        model's default), else the scenario's. Its ``lr`` is the algorithm's ``ctx.lr``."""
        return self.optimizer if algorithm.optimizer is None else algorithm.optimizer

    def resolved_dict(self) -> dict[str, Any]:
        """Plain data with every default filled in; ``yaml.safe_dump`` it, load it back, get an equal Scenario."""
        return self.model_dump(mode="json", by_alias=True)
