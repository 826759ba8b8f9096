"""Pure helpers of ``python -m harness calibrate``: what to measure, how often, and the table.

Nothing here imports mpi4py or torch: the launching parent uses this module to turn scenario
files into a ``Plan`` (the JSON spec each calibration job reads), and rank 0 of the job uses
the statistics helpers to turn raw timings into a ``CalibrationEntry``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from tabulate import tabulate

from harness.arguments import split_list
from harness.workload.names import workload_labels

KIB = 1024
MIB = 1024 * KIB

#: Point-to-point message sizes (bytes, float32 buffers): 2 floats, 1 KiB, 64 KiB, 1 MiB, 4 MiB.
P2P_SIZES = (8, KIB, 64 * KIB, MIB, 4 * MIB)
#: Allreduce sizes always measured; each workload's model size (4 bytes per parameter) is added.
ALLREDUCE_SIZES = (4, 64 * KIB, MIB)
#: Larger model sizes are not measured (memory and time on an oversubscribed machine); the
#: simulator's alpha-beta decomposition covers them.
MAX_OP_BYTES = 64 * MIB
#: Compute times are averaged over windows of consecutive iterations at least this long: with
#: more ranks than cores the scheduler runs a rank for a few ms slices at a time, so single
#: iterations are either uncontended or hold a whole wait for the core (median ~ uncontended,
#: far below the real rate); windows of several slices see the shared core.
WINDOW_S = 0.025
#: Nominal sleep per iteration of the emulated-compute loop that measures ``loop_overhead_s``.
OVERHEAD_SLEEP_S = 0.001
MIN_RANKS = 2  # the point-to-point measurement needs two ranks


@dataclass(frozen=True)
class Effort:
    """Repetitions of each measurement (``FULL`` by default, ``QUICK`` with ``--quick``)."""

    p2p_reps: int  # timed exchanges per size, up to 64 KiB (fewer above, see ``reps_for``)
    rounds: int  # point-to-point sizes and ops are measured in this many interleaved rounds
    op_reps: int  # timed back-to-back ops per size
    warmup: int  # untimed repetitions before each size
    byte_budget: int  # sizes above 64 KiB run about this many bytes of repetitions...
    min_reps: int  # ...but at least this many
    reference_min_iters: int  # iterations of each reference training the network is fitted to:
    reference_budget_s: float  # as many as take about this long at the measured compute time
    compute_warmup: int  # untimed training iterations per workload
    compute_min_iters: int  # timed iterations per workload: as many as fit in compute_budget_s,
    compute_max_iters: int  # clamped to [min, max]
    compute_budget_s: float
    eval_reps: int  # timed evaluation points per (model, dataset)
    overhead_iters: int  # iterations of the emulated-compute loop

    def reps_for(self, size: int, reps: int) -> tuple[int, int]:
        """(timed, warm-up) repetitions for a message of ``size`` bytes."""
        if size <= 64 * KIB:
            return reps, self.warmup
        return min(reps, max(self.min_reps, self.byte_budget // size)), min(self.warmup, 3)


FULL = Effort(
    p2p_reps=400,
    rounds=8,
    op_reps=64,
    warmup=10,
    byte_budget=256 * MIB,
    min_reps=5,
    reference_min_iters=40,
    reference_budget_s=1.0,
    compute_warmup=10,
    compute_min_iters=30,
    compute_max_iters=300,
    compute_budget_s=8.0,
    eval_reps=10,
    overhead_iters=300,
)
QUICK = Effort(
    p2p_reps=20,
    rounds=2,
    op_reps=10,
    warmup=3,
    byte_budget=16 * MIB,
    min_reps=3,
    reference_min_iters=12,
    reference_budget_s=0.2,
    compute_warmup=2,
    compute_min_iters=5,
    compute_max_iters=20,
    compute_budget_s=1.0,
    eval_reps=2,
    overhead_iters=40,
)


@dataclass(frozen=True)
class TimedWorkload:
    """One real-compute workload to time: what a rank trains, with the scenario's seed, optimizer
    and python_path (where the modules of a model or dataset given as ``"module:callable"`` are)."""

    model: str
    dataset: str
    batch_size: int
    seed: int = 0
    optimizer: dict[str, Any] = field(default_factory=dict)  # Optimizer fields; {} = defaults
    model_args: dict[str, Any] = field(default_factory=dict)
    dataset_args: dict[str, Any] = field(default_factory=dict)
    num_classes: int | None = None
    python_path: tuple[str, ...] = ()

    @classmethod
    def of_scenario(cls, scenario: Any) -> TimedWorkload:
        """The workload of a ``harness.scenario.Scenario``."""
        w = scenario.workload
        return cls(
            w.model,
            w.dataset,
            w.batch_size,
            scenario.seed,
            scenario.optimizer.model_dump(),
            dict(w.model_args),
            dict(w.dataset_args),
            w.num_classes,
            tuple(scenario.python_path),
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TimedWorkload:
        return cls(**{**data, "python_path": tuple(data.get("python_path", ()))})

    @property
    def labels(self) -> tuple[str, str]:
        """(model, dataset) as the calibration file names them: the scenario's values, with their
        arguments in call form when there are any (``harness.workload.names.workload_labels``)."""
        return workload_labels(self)

    @property
    def key(self) -> tuple[str, str, int]:
        return (*self.labels, self.batch_size)

    def scenario_fields(self) -> dict[str, Any]:
        """The scenario's ``workload`` keys that say what is trained (no iterations or compute)."""
        fields: dict[str, Any] = {"model": self.model, "dataset": self.dataset, "batch_size": self.batch_size}
        extra = {"model_args": self.model_args, "dataset_args": self.dataset_args, "num_classes": self.num_classes}
        return {**fields, **{k: v for k, v in extra.items() if v}}


@dataclass(frozen=True)
class Plan:
    """Everything one calibration job measures; serialized as the worker's JSON spec.

    ``op_models`` are workloads whose model's parameter count (times 4 bytes) is added to the
    allreduce sizes by the worker, which can build models; ``op_bytes`` are sizes known without
    building one (emulated compute with an explicit ``params``).
    """

    ranks: int
    quick: bool = False
    workloads: tuple[TimedWorkload, ...] = ()
    op_models: tuple[TimedWorkload, ...] = ()
    op_bytes: tuple[int, ...] = ()

    @property
    def effort(self) -> Effort:
        return QUICK if self.quick else FULL

    def with_ranks(self, ranks: int) -> Plan:
        return Plan(ranks, self.quick, self.workloads, self.op_models, self.op_bytes)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(
            ranks=int(data["ranks"]),
            quick=bool(data["quick"]),
            workloads=tuple(TimedWorkload.from_json(w) for w in data["workloads"]),
            op_models=tuple(TimedWorkload.from_json(w) for w in data["op_models"]),
            op_bytes=tuple(int(b) for b in data["op_bytes"]),
        )


def plan_from_scenarios(scenarios: Iterable[Any], quick: bool = False) -> Plan:
    """The workloads and allreduce sizes of ``scenarios`` (``harness.scenario.Scenario``s).

    Every distinct real-compute (model, dataset, batch size) is one workload (the first
    scenario naming it gives the seed and optimizer); emulated-compute scenarios add no
    workload, only their communicated size to the allreduce sizes. ``ranks`` is left 0.
    """
    workloads: dict[tuple[str, str, int], TimedWorkload] = {}
    op_models: dict[tuple[str, str], TimedWorkload] = {}
    op_bytes: set[int] = set()
    for s in scenarios:
        w = s.workload
        wl = TimedWorkload.of_scenario(s)
        if w.compute == "real":
            workloads.setdefault(wl.key, wl)
        if w.compute == "real" or w.params is None:
            op_models.setdefault(wl.labels, wl)
        else:
            op_bytes.add(4 * w.params)
    return Plan(0, quick, tuple(workloads.values()), tuple(op_models.values()), tuple(sorted(op_bytes)))


@dataclass(frozen=True)
class P2PPairs:
    """The rank pairs the point-to-point measurement times (``p2p_pairs``): ``same_host``, two
    ranks on one host (None: no host has two), and ``cross_host``, two ranks on different hosts
    (None: one host)."""

    same_host: tuple[int, int] | None
    cross_host: tuple[int, int] | None


def p2p_pairs(rank_hosts: Sequence[str]) -> P2PPairs:
    """Which ranks time point-to-point messages, from the host name of every rank.

    On one host: ranks 0 and 1, as always. Across hosts: rank 0 with the lowest other rank on
    its host and rank 0 with the lowest rank on another host, so both links are measured from
    the same rank; when rank 0 is alone on its host, the lowest two ranks that share a host.
    """
    if len(rank_hosts) < MIN_RANKS:
        raise ValueError(f"point-to-point needs {MIN_RANKS} ranks (got {len(rank_hosts)})")
    home = rank_hosts[0]
    if all(host == home for host in rank_hosts):
        return P2PPairs((0, 1), None)
    cross = (0, next(r for r, host in enumerate(rank_hosts) if host != home))
    if home in rank_hosts[1:]:
        return P2PPairs((0, list(rank_hosts).index(home, 1)), cross)
    first: dict[str, int] = {}  # the lowest rank seen so far on each host
    for r, host in enumerate(rank_hosts):
        if host in first:  # the first rank whose host already had one: the lowest such pair
            return P2PPairs((first[host], r), cross)
        first[host] = r
    return P2PPairs(None, cross)


def allreduce_sizes(model_bytes: Iterable[int]) -> list[int]:
    """``ALLREDUCE_SIZES`` plus the given model sizes up to ``MAX_OP_BYTES``, ascending, distinct."""
    return sorted({*ALLREDUCE_SIZES, *(b for b in model_bytes if 0 < b <= MAX_OP_BYTES)})


def parse_ranks(text: str) -> list[int]:
    """Comma-separated rank counts, each >= 2: ``"2,8"`` -> ``[2, 8]`` (ascending, distinct)."""
    counts = []
    for p in split_list(text, "rank", "2,8"):
        try:
            n = int(p)
        except ValueError:
            raise ValueError(f"bad rank count {p!r}: expected a whole number") from None
        if n < MIN_RANKS:
            raise ValueError(
                f"rank counts must be >= {MIN_RANKS}: the point-to-point measurement needs two ranks (got {n})"
            )
        counts.append(n)
    return sorted(set(counts))


# -- statistics ---------------------------------------------------------------------------------
def median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float)))


def p95(values: Sequence[float]) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), 95))


def per_rep_mean_median(times_by_rank: Sequence[Sequence[float]]) -> float:
    """Median over repetitions of the mean over ranks of each repetition's time.

    In back-to-back blocking operations the ranks' entry times alternate around each other;
    the mean over ranks of one repetition cancels that skew, the median drops outliers.
    """
    arr = np.asarray(times_by_rank, dtype=float)
    return float(np.median(arr.mean(axis=0)))


def iteration_times(starts: Sequence[float]) -> list[float]:
    """Per-iteration times of one rank from its iterations' start times (consecutive differences)."""
    s = np.asarray(starts, dtype=float)
    return np.diff(s).tolist()


def window_means(times_by_rank: Sequence[Sequence[float]], window_s: float = WINDOW_S) -> list[float]:
    """Mean iteration time of each window of ``k`` consecutive iterations of each rank.

    ``k`` is the smallest count whose mean total (over all ranks' iterations) reaches
    ``window_s`` (1 for iterations longer than that); a rank's last incomplete window is
    dropped unless it has no complete one.
    """
    lists = [np.asarray(t, dtype=float) for t in times_by_rank if len(t)]
    if not lists:
        raise ValueError("no iteration times")
    mean = float(np.mean(np.concatenate(lists)))
    k = max(1, math.ceil(window_s / mean)) if mean > 0 else 1
    out: list[float] = []
    for t in lists:
        full = len(t) // k * k
        out += t[:full].reshape(-1, k).mean(axis=1).tolist() if full else [float(t.mean())]
    return out


def timed_iterations(per_iter_s: float, effort: Effort) -> int:
    """How many timed iterations of a workload fit ``effort.compute_budget_s`` (clamped)."""
    if not math.isfinite(per_iter_s) or per_iter_s <= 0:
        return effort.compute_max_iters
    n = int(effort.compute_budget_s / per_iter_s)
    return max(effort.compute_min_iters, min(effort.compute_max_iters, n))


# -- the table ----------------------------------------------------------------------------------
def _bytes_label(n: int) -> str:
    for suffix, unit in (("MiB", MIB), ("KiB", KIB)):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {suffix}"
    return f"{n} B"


def format_table(calibration: Any, measured: Iterable[int] = ()) -> str:
    """The calibration's entries side by side: one column per rank count, one row per quantity.

    Columns of entries not in ``measured`` (kept from an earlier calibration) say ``(kept)``.
    """
    measured = set(measured)
    entries = list(calibration.entries)
    rows: dict[str, list[str]] = {}

    def put(label: str, col: int, text: str) -> None:
        rows.setdefault(label, [""] * len(entries))[col] = text

    for col, e in enumerate(entries):
        put("simulated network from", col, e.network_source)
        put("  alpha (us)", col, f"{e.network.latency_s * 1e6:.1f}")
        put("  bandwidth (GB/s)", col, f"{e.network.bandwidth_bytes_per_s / 1e9:.3f}")
        put("  shared cores", col, str(e.network.shared_cores or "-"))
        if e.network_fit_error is not None:
            put("  rms error of the fit (%)", col, f"{e.network_fit_error * 100:.1f}")
        if len(e.hosts) > 1:  # single-host tables stay as they were
            put("hosts (ranks)", col, ", ".join(f"{h} ({n})" for h, n in zip(e.hosts, e.ranks_per_host)))
            put(
                "point-to-point pair",
                col,
                f"{e.p2p_pair[0]}-{e.p2p_pair[1]}"
                + (" (one host)" if e.rank_hosts[e.p2p_pair[0]] == e.rank_hosts[e.p2p_pair[1]] else " (two hosts)"),
            )
        if e.p2p_network is not None:
            put("quiet point-to-point alpha (us)", col, f"{e.p2p_network.latency_s * 1e6:.1f}")
            put("quiet point-to-point bandwidth (GB/s)", col, f"{e.p2p_network.bandwidth_bytes_per_s / 1e9:.2f}")
        for p in e.p2p:
            put(f"one-way {_bytes_label(p.bytes)} (us)", col, f"{p.one_way_s * 1e6:.1f}")
        if e.inter_host_network is not None:
            pair = e.inter_host_pair
            put("inter-host pair", col, f"{pair[0]}-{pair[1]}" if pair else "-")
            put("inter-host alpha (us)", col, f"{e.inter_host_network.latency_s * 1e6:.1f}")
            put("inter-host bandwidth (GB/s)", col, f"{e.inter_host_network.bandwidth_bytes_per_s / 1e9:.2f}")
            for p in e.inter_host_p2p:
                put(f"inter-host one-way {_bytes_label(p.bytes)} (us)", col, f"{p.one_way_s * 1e6:.1f}")
        for op in e.ops:
            label = op.op if op.op == "barrier" else f"{op.op} {_bytes_label(op.bytes)}"
            put(f"{label} (us)", col, f"{op.median_s * 1e6:.1f}")
        for c in e.compute:
            put(f"compute {c.model}/{c.dataset}/b{c.batch_size} median (ms)", col, f"{c.median_s * 1e3:.2f}")
            put(f"compute {c.model}/{c.dataset}/b{c.batch_size} p95 (ms)", col, f"{c.p95_s * 1e3:.2f}")
        for ev in e.evaluation:
            put(f"eval {ev.model}/{ev.dataset} (ms)", col, f"{ev.median_s * 1e3:.2f}")
        put("loop overhead (us)", col, f"{e.loop_overhead_s * 1e6:.1f}")
    headers = ["", *(f"{e.ranks} ranks" + ("" if e.ranks in measured or not measured else " (kept)") for e in entries)]
    body = [[label, *values] for label, values in rows.items()]
    return tabulate(body, headers=headers, tablefmt="simple", stralign="right", disable_numparse=True)
