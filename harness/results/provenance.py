"""What a run keeps in ``provenance/``, how much disk that takes, and the worker's writer of it.

The level is the scenario's ``results.provenance`` (``python -m harness run --provenance``
overrides it). Each level keeps everything the next one does:

- ``full``: ``final``'s files, plus ``final_models_<algorithm>.pt``, every rank's final model;
- ``final``: ``initial_model.pt``, ``shards.npz`` and ``final_average_<algorithm>.pt``, the
  average of the ranks' final models, the very model whose test accuracy is ``final_accuracy``;
- ``none``: nothing (no ``provenance/`` folder).

``auto`` is ``full`` with real compute and ``none`` with emulated compute, whose "model" is
only the communicated buffer of ``workload.params`` floats, nothing worth keeping. ``resolve``
replaces ``auto`` before the run directory is written, so ``scenario.resolved.yaml`` says what
the run keeps. Before launching, ``run`` refuses a run
whose provenance (``expected_bytes``, an upper bound) does not fit the free disk space.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, get_args

import numpy as np

from harness.results import atomic
from harness.scenario.schema import ProvenanceSetting, Scenario
from harness.workload.names import BUILTIN_DATASET_FACTS

SETTINGS: tuple[str, ...] = get_args(ProvenanceSetting)
AUTO, FULL, FINAL, NONE = SETTINGS
# Samples (train + test) of each built-in dataset without dataset_args, as
# harness.workload.load_dataset returns them; pinned by tests/test_provenance.py. The shards hold
# one int64 per training sample, at most this many. Other datasets: harness.workload.dataset_facts.
DATASET_SAMPLES = {name: facts.samples for name, facts in BUILTIN_DATASET_FACTS.items()}
# Bytes a saved file takes beyond its raw data (torch's zip container, npz member headers);
# generous, since the estimate must be an upper bound.
FILE_OVERHEAD = 4096
FLOAT32, INT64 = 4, 8


def resolve(scenario: Scenario, setting: str | None = None) -> Scenario:
    """``scenario`` with ``results.provenance`` set to the level the run keeps: ``setting``
    (the ``--provenance`` option) if given, else the scenario's own, ``auto`` resolved."""
    setting = setting or scenario.results.provenance
    if setting not in SETTINGS:
        raise ValueError(f"provenance must be one of {', '.join(SETTINGS)}, got {setting!r}")
    if setting == AUTO:
        setting = FULL if scenario.workload.compute == "real" else NONE
    results = scenario.results.model_copy(update={"provenance": setting})
    return scenario.model_copy(update={"results": results})


def level(scenario: Scenario) -> str:
    """The level the run keeps (``full``, ``final`` or ``none``), whether or not it was resolved."""
    return resolve(scenario).results.provenance


def expected_bytes(scenario: Scenario, algorithms: int) -> int:
    """An upper bound of what a run training ``algorithms`` algorithms writes into ``provenance/``."""
    keep = level(scenario)
    if keep == NONE:  # before the import: `harness run`'s own process need not load torch then
        return 0
    from harness.workload import communicated_floats, dataset_facts  # noqa: PLC0415  (imports torch)

    model = FLOAT32 * communicated_floats(scenario)
    initial = model + FILE_OVERHEAD
    shards = INT64 * dataset_facts(scenario).samples + FILE_OVERHEAD * (1 + scenario.ranks)
    per_algorithm = model + FILE_OVERHEAD  # final_average_<algorithm>.pt
    if keep == FULL:
        per_algorithm += scenario.ranks * model + FILE_OVERHEAD  # final_models_<algorithm>.pt
    return initial + shards + algorithms * per_algorithm


def free_bytes(path: Path) -> int:
    """Free bytes (for this user) on the file system that holds ``path`` or would hold it."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def disk_problem(scenario: Scenario, algorithms: int, out: Path) -> str | None:
    """Why ``provenance/`` of this run cannot fit under ``out``, or None when it fits."""
    need = expected_bytes(scenario, algorithms)
    if need == 0:
        return None
    free = free_bytes(out)
    if need <= free:
        return None
    keep = level(scenario)
    what = (f"{scenario.ranks} ranks x {algorithms} algorithm{'s' * (algorithms != 1)}" if keep == FULL
            else f"{algorithms} algorithm{'s' * (algorithms != 1)}")
    smaller = ", ".join(f"'{s}'" for s in (FINAL, NONE) if s != keep)
    return (f"results.provenance '{keep}' would write up to {human_bytes(need)} into provenance/ ({what}), "
            f"but only {human_bytes(free)} are free on the file system of {out}; "
            f"set results.provenance (or --provenance) to {smaller}, or choose another --out")


def directory_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (0 if it does not exist)."""
    path = Path(path)
    if not path.is_dir():
        return 0
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file() and not entry.is_symlink())


def human_bytes(count: int) -> str:
    """``count`` in decimal units, 3 significant digits: ``879 MB``, ``1.23 GB``, ``512 B``."""
    if count < 1000:
        return f"{count} B"
    value = count / 1000.0
    for unit in ("kB", "MB", "GB"):
        if value < 999.5:
            return f"{value:.3g} {unit}"
        value /= 1000.0
    return f"{value:.3g} TB" if value < 999.5 else f"{value:,.0f} TB"


class ProvenanceWriter:
    """Writes ``provenance/`` at the run's level; every write is atomic, the folder is made on the first.

    Every rank holds one: the worker asks ``keeps_anything`` / ``keeps_rank_models`` before it
    gathers or averages anything (collectives all ranks must agree on), so a level that keeps
    nothing costs no communication; only rank 0 calls the writers.
    """

    def __init__(self, directory: Path, keep: str) -> None:
        if keep not in (FULL, FINAL, NONE):
            raise ValueError(f"provenance level must be resolved (full, final or none), got {keep!r}")
        self.directory = Path(directory)
        self.keep = keep

    @property
    def keeps_anything(self) -> bool:
        return self.keep != NONE

    @property
    def keeps_rank_models(self) -> bool:
        return self.keep == FULL

    def write_start(self, shards: list[np.ndarray], initial_model: Any) -> None:
        """``shards.npz`` (``rank<r>``: rank r's training indices) and ``initial_model.pt``."""
        if not self.keeps_anything:
            return
        self.directory.mkdir(exist_ok=True)
        # Any: mypy would match the unpacked arrays against savez_compressed's allow_pickle too.
        arrays: dict[str, Any] = {f"rank{r}": s for r, s in enumerate(shards)}
        with atomic.atomic_open(self.directory / "shards.npz", "wb") as handle:
            np.savez_compressed(handle, **arrays)
        atomic.save_torch(self.directory / "initial_model.pt", initial_model)

    def write_final(self, algorithm: str, average: Any, rank_models: Any = None) -> None:
        """``final_average_<algorithm>.pt`` and, at ``full``, ``final_models_<algorithm>.pt`` ([ranks, n])."""
        if not self.keeps_anything:
            return
        if self.keeps_rank_models and rank_models is None:
            raise ValueError(f"provenance 'full' needs every rank's final model of {algorithm}")
        self.directory.mkdir(exist_ok=True)
        atomic.save_torch(self.directory / f"final_average_{algorithm}.pt", average)
        if self.keeps_rank_models:
            atomic.save_torch(self.directory / f"final_models_{algorithm}.pt", rank_models)

    def report(self) -> str:
        """One line for the end of the run: the level and the size of ``provenance/`` on disk."""
        if not self.keeps_anything:
            return "provenance: none (nothing saved)"
        return f"provenance: {self.keep}, {human_bytes(directory_bytes(self.directory))} in {self.directory}"
