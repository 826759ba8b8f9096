"""The calibration file: what ``python -m harness calibrate`` measured and ``simulate`` uses.

One JSON file (default ``results/calibration.json``) holds one entry per rank count that was
calibrated, because on a machine with fewer cores than ranks every cost depends on how many
ranks share the cores. An entry has:

- ``network``: the alpha-beta point-to-point model fitted to one-way message times measured
  through the native layer (``latency_s`` = alpha, ``bandwidth_bytes_per_s`` = 1 / beta), and
  the measured points it was fitted to (``p2p``);
- ``ops``: measured median time of native collectives at several sizes (for checking the
  simulator's decomposition of collectives into point-to-point steps against reality);
- ``compute``: the median local work per iteration (batch, forward, backward, optimizer step,
  loop bookkeeping) of each (model, dataset, batch size) while all ranks compute at once;
- ``evaluation``: the median time of one evaluation point on rank 0 (test metrics of the
  averaged model and of rank 0's model) per (model, dataset);
- ``loop_overhead_s``: per-iteration overhead of the loop beyond an emulated-compute sleep;
- where the ranks ran (added later; older files without it still load, as one host of unknown
  name): ``rank_hosts`` (the host name of every rank), ``hosts`` (in order of first appearance)
  and ``ranks_per_host``. ``p2p`` is the pair ``p2p_pair`` on one host. When the ranks spanned
  several hosts, ``inter_host_p2p`` are the same one-way times for ``inter_host_pair``, a pair on
  different hosts, and ``inter_host_network`` their alpha-beta fit: the inter-host link beside
  the intra-host one (``p2p_network``). ``harness.sim.hosts`` turns the two into the simulated
  network of a multi-host run.

The models validate the file on load, so a hand-edited or truncated file fails with one
message naming the bad field.

A simulation of P ranks uses the entry measured at P ranks, or another one
(:meth:`Calibration.choose`, which also says which and why, for the commands to print and
record as ``calibration_ranks``).

Example::

    cal = load_calibration(Path("results/calibration.json"))
    entry, note = cal.choose(8)
    entry.network.latency_s, entry.compute_s("mlp", "mnist5k", 32)
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.calibrate.measure import MIN_RANKS
from harness.errors import HarnessError
from harness.results import atomic
from harness.strict_model import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

FORMAT_VERSION = 1
DEFAULT_PATH = Path("results") / "calibration.json"


class CalibrationError(HarnessError):
    """A calibration file that is missing, malformed, or lacks what a simulation needs."""


class _Strict(BaseModel):
    # Not harness.strict_model.StrictModel: the file is written by the harness itself (JSON numbers,
    # where an integral float reads back as an int), so lax number types are right here.
    model_config = ConfigDict(extra="forbid", frozen=True)


class NetworkModel(_Strict):
    """Alpha-beta point-to-point cost: a message of b bytes takes ``latency_s + b / bandwidth``.

    ``progress_s`` is the extra delay before a message held on an emulated slow link is handed
    over once it is due: the sending rank's progress thread has to wake up for it, which on a
    machine with more ranks than cores takes a scheduler time slice or more (0: no such delay).

    ``shared_cores``: when the ranks share this many cores (more ranks than cores on one
    machine), message costs grow with the number of ranks computing at the time, k, by
    ``max(1, k / shared_cores)``: progress threads wait for a core. None: every rank has its own.
    """

    latency_s: NonNegativeFloat
    bandwidth_bytes_per_s: PositiveFloat
    progress_s: NonNegativeFloat = 0.0
    shared_cores: PositiveInt | None = None

    def message_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


class P2PPoint(_Strict):
    bytes: NonNegativeInt
    one_way_s: NonNegativeFloat  # median over repetitions: half a ping-pong round trip


class OpPoint(_Strict):
    op: str  # e.g. "allreduce", "barrier"
    bytes: NonNegativeInt  # payload per rank
    median_s: NonNegativeFloat


class ComputePoint(_Strict):
    model: str
    dataset: str
    batch_size: PositiveInt
    median_s: NonNegativeFloat  # every rank computing at once (this machine's cores shared)
    p95_s: NonNegativeFloat
    samples: PositiveInt
    # One rank computing while the others wait: a rank with cores of its own, what the cluster
    # reading of a simulation uses. None in files written before it was measured.
    alone_s: NonNegativeFloat | None = None


class EvalPoint(_Strict):
    model: str
    dataset: str
    median_s: NonNegativeFloat


class CalibrationEntry(_Strict):
    ranks: PositiveInt
    network: NetworkModel  # what simulate uses
    network_source: str = "given"  # how ``network`` was obtained (docs/guides/simulation.md, "Calibration")
    network_fit_error: NonNegativeFloat | None = None  # rms relative error left on what it was fitted to
    p2p_network: NetworkModel | None = None  # alpha-beta fit of the quiet point-to-point times
    p2p: list[P2PPoint] = []
    ops: list[OpPoint] = []
    compute: list[ComputePoint] = []
    evaluation: list[EvalPoint] = []
    loop_overhead_s: NonNegativeFloat = 0.0
    # Where the ranks ran (docs/guides/simulation.md, "Calibration"); empty in older files.
    rank_hosts: list[str] = []  # host name of every rank, in rank order
    hosts: list[str] = []  # the distinct host names, in order of first appearance
    ranks_per_host: list[PositiveInt] = []  # in the order of ``hosts``
    p2p_pair: tuple[NonNegativeInt, NonNegativeInt] = (0, 1)  # the ranks ``p2p`` measured (one host, if any)
    inter_host_pair: tuple[NonNegativeInt, NonNegativeInt] | None = None  # the ranks ``inter_host_p2p`` measured
    inter_host_p2p: list[P2PPoint] = []  # as ``p2p``, between two hosts
    inter_host_network: NetworkModel | None = None  # alpha-beta fit of ``inter_host_p2p``

    @model_validator(mode="after")
    def _hosts_agree(self) -> CalibrationEntry:
        """``hosts`` and ``ranks_per_host`` are what ``rank_hosts`` says, for ``ranks`` ranks."""
        if not self.rank_hosts:
            if self.hosts or self.ranks_per_host:
                raise ValueError("hosts and ranks_per_host need rank_hosts (the host of every rank)")
            return self
        if len(self.rank_hosts) != self.ranks:
            raise ValueError(f"rank_hosts names {len(self.rank_hosts)} hosts for {self.ranks} ranks")
        hosts = list(dict.fromkeys(self.rank_hosts))
        counts = [self.rank_hosts.count(h) for h in hosts]
        if (self.hosts, self.ranks_per_host) != (hosts, counts):
            raise ValueError(
                f"hosts {self.hosts} and ranks_per_host {self.ranks_per_host} disagree with rank_hosts "
                f"(hosts {hosts}, ranks per host {counts})"
            )
        return self

    def compute_s(self, model: str, dataset: str, batch_size: int, alone: bool = False) -> float | None:
        """Median local work per iteration of this workload with all ranks computing at once, or
        (``alone``) with one rank computing alone; None if that was not calibrated."""
        for point in self.compute:
            if (point.model, point.dataset, point.batch_size) == (model, dataset, batch_size):
                return point.alone_s if alone else point.median_s
        return None

    def with_compute_scaled(self, factor: float) -> CalibrationEntry:
        """A copy whose CPU work takes ``factor`` times as long: the local work (compute, loop
        overhead) and the copying of message bytes (the network's bandwidth is divided by it);
        the per-message latency (a wake-up) and rank 0's evaluation (alone, the others waiting)
        are kept."""
        network = self.network.model_copy(update={"bandwidth_bytes_per_s": self.network.bandwidth_bytes_per_s / factor})
        return self.model_copy(
            update={
                "compute": [
                    p.model_copy(update={"median_s": p.median_s * factor, "p95_s": p.p95_s * factor})
                    for p in self.compute
                ],
                "loop_overhead_s": self.loop_overhead_s * factor,
                "network": network,
            }
        )

    def evaluation_s(self, model: str, dataset: str) -> float | None:
        for point in self.evaluation:
            if (point.model, point.dataset) == (model, dataset):
                return point.median_s
        return None


def core_share_factor(measured_ranks: int, ranks: int, cpus: int) -> float:
    """How much longer CPU-bound local work takes at ``ranks`` ranks than at ``measured_ranks``
    on ``cpus`` cores: every rank computes with one thread, so while P > C ranks compute on C
    cores each gets C / P of a core; 1 while the ranks do not outnumber the cores."""
    return max(1.0, ranks / cpus) / max(1.0, measured_ranks / cpus)


class Calibration(_Strict):
    format: Annotated[int, Field(ge=1, le=FORMAT_VERSION)] = FORMAT_VERSION
    created_at: str
    harness_version: str
    cpus: PositiveInt  # logical CPUs of the machine that was measured
    entries: list[CalibrationEntry]

    def choose(
        self, ranks: int, has: Callable[[CalibrationEntry], bool] | None = None, scale_shared_cores: bool = True
    ) -> EntryChoice:
        """The entry to simulate ``ranks`` ranks with, among those that ``has`` what the simulation
        needs (all when None or when none has it; the caller then says what is missing): the one
        measured at ``ranks``; otherwise the one measured with the most ranks that did not
        oversubscribe the cores (the cluster-like per-rank cost), else the smallest; with a note
        saying so in those two cases. ``scale_shared_cores`` (this machine's reading): an entry
        measured with shared cores has its CPU work scaled to ``ranks`` ranks on the same cores."""
        if not self.entries:
            raise CalibrationError("the calibration file has no entries: run `python -m harness calibrate`")
        candidates = [e for e in self.entries if has is None or has(e)] or list(self.entries)
        for entry in candidates:
            if entry.ranks == ranks:
                return EntryChoice(entry, None)
        measured = ", ".join(str(e.ranks) for e in self.entries)
        uncontended = [e for e in candidates if e.ranks <= self.cpus]
        if uncontended:
            entry = max(uncontended, key=lambda e: e.ranks)
            why = f"the most ranks that did not share the {self.cpus} CPUs"
        else:
            entry = min(candidates, key=lambda e: e.ranks)
            why = f"the fewest ranks; every entry shared the {self.cpus} CPUs"
        if len(candidates) < len(self.entries):
            why += ", of those that measured this workload"
        note = (
            f"no calibration for {ranks} ranks (measured: {measured}): using the one measured at {entry.ranks} "
            f"ranks ({why})"
        )
        # An entry measured with shared cores models this machine, where more ranks share the same
        # cores; an uncontended one stands for a cluster, where every rank brings its own.
        factor = self.core_share_factor(entry.ranks, ranks) if entry.ranks > self.cpus and scale_shared_cores else 1.0
        if factor != 1.0:
            entry = entry.with_compute_scaled(factor)
            note += (
                f", its CPU work (local work, copying message bytes) x{factor:g} for {ranks} ranks sharing "
                f"{self.cpus} CPUs"
            )
        return EntryChoice(entry, note)

    def core_share_factor(self, measured_ranks: int, ranks: int) -> float:
        """:func:`core_share_factor` on this machine's cores."""
        return core_share_factor(measured_ranks, ranks, self.cpus)

    def with_entry(self, entry: CalibrationEntry) -> Calibration:
        """A copy with ``entry`` replacing any entry of the same rank count (sorted by ranks).

        The replaced entry's compute and evaluation times of workloads ``entry`` did not
        measure are kept, so calibrating one scenario's workload loses no other's.
        """
        old = next((e for e in self.entries if e.ranks == entry.ranks), None)
        if old is not None:
            new = {(p.model, p.dataset, p.batch_size) for p in entry.compute}
            new_eval = {(p.model, p.dataset) for p in entry.evaluation}
            entry = entry.model_copy(
                update={
                    "compute": [
                        *entry.compute,
                        *(p for p in old.compute if (p.model, p.dataset, p.batch_size) not in new),
                    ],
                    "evaluation": [
                        *entry.evaluation,
                        *(p for p in old.evaluation if (p.model, p.dataset) not in new_eval),
                    ],
                }
            )
        kept = [e for e in self.entries if e.ranks != entry.ranks]
        return self.model_copy(update={"entries": sorted([*kept, entry], key=lambda e: e.ranks)})


class EntryChoice(NamedTuple):
    """The entry a simulation uses, and a note when it was measured at another rank count."""

    entry: CalibrationEntry
    note: str | None


def calibrate_command(scenario_file: str | Path, ranks: int, output: Path = DEFAULT_PATH) -> str:
    """The command line that measures ``scenario_file``'s workloads at ``ranks`` ranks into ``output``."""
    words = [
        "python",
        "-m",
        "harness",
        "calibrate",
        "--scenario",
        str(scenario_file),
        "--ranks",
        str(max(ranks, MIN_RANKS)),
    ]
    if Path(output) != DEFAULT_PATH:
        words += ["--output", str(output)]
    return shlex.join(words)


def fit_alpha_beta(points: list[P2PPoint]) -> NetworkModel:
    """Least-squares fit of ``one_way_s = alpha + bytes * beta`` (alpha, beta clipped at >= 0).

    Relative errors are minimised (each point weighted by 1 / its time), so the small-message
    latency is not drowned by the large messages' absolute times.
    """
    if len(points) < 2:
        raise CalibrationError(f"need at least 2 point-to-point sizes to fit alpha-beta (got {len(points)})")
    b = np.array([p.bytes for p in points], dtype=float)
    t = np.array([p.one_way_s for p in points], dtype=float)
    w = 1.0 / np.maximum(t, 1e-9)
    design = np.stack([np.ones_like(b), b], axis=1) * w[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    alpha = max(float(alpha), 0.0)
    beta = max(float(beta), 1e-15)  # no negative or zero per-byte time: bandwidth stays finite
    return NetworkModel(latency_s=alpha, bandwidth_bytes_per_s=1.0 / beta)


def load_calibration(path: Path) -> Calibration:
    """Read and validate a calibration file; CalibrationError names what is wrong."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CalibrationError(
            f"{path}: no calibration file; run `python -m harness calibrate` first (or pass --calibration FILE)"
        ) from None
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    try:
        return Calibration.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise CalibrationError(f"{path}: {where}: {first['msg']}") from None


def save_calibration(calibration: Calibration, path: Path) -> None:
    """Write atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, calibration.model_dump_json(indent=2) + "\n")


#: The network of :func:`save_fixed_calibration`'s entry (measured on no machine).
FIXED_NETWORK = NetworkModel(latency_s=3e-4, bandwidth_bytes_per_s=1e9)


def save_fixed_calibration(path: Path, ranks: int, compute: Sequence[tuple[str, str, int, float]] = ()) -> Path:
    """A calibration file with one entry for ``ranks`` ranks, measured on no machine: 0.3 ms and
    1 GB/s links, and a compute median per ``(model, dataset, batch_size, seconds)`` (p95 a
    quarter above it; alone the same: no machine, no shared cores). What ``simulate`` and
    ``compare`` need where what is compared is the communication model, not this machine's
    calibration (the tests, ``bench agreement``)."""
    points = [
        ComputePoint(model=m, dataset=d, batch_size=b, median_s=s, p95_s=s * 1.25, samples=10, alone_s=s)
        for m, d, b, s in compute
    ]
    save_calibration(
        Calibration(
            created_at="2026-01-01T00:00:00+00:00",
            harness_version="test",
            cpus=2,
            entries=[CalibrationEntry(ranks=ranks, network=FIXED_NETWORK, compute=points)],
        ),
        path,
    )
    return path
