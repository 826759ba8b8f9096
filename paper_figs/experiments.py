"""Simulated parameter sweeps behind the paper figures (``manifest.Sweep``).

Each public function ``<name>(quick: bool, **overrides) -> pandas.DataFrame`` runs the SimPy
simulator (no MPI; in-process and without torch except :func:`time_to_accuracy`) over a grid of
scenarios and returns a tidy table, which ``python -m harness figures`` saves as
``<results>/figures/<name>.csv``. The keyword overrides (rank counts, iterations, delays) exist
so that tests can run a sweep at a tiny size.

Common choices:

- Compute is emulated (a sleep, ``harness.compute_time``), never real: the sweeps model GPU
  clusters this machine does not have. The communicated buffer is ResNet-50 sized (``params:
  25_557_032`` floats, 102 MB); ``workload.model`` is only a valid placeholder.
- All series see the same injected delays and compute jitter. The series of one grid point are
  one scenario, an entry each (:func:`_simulate_series`: the simulator runs each algorithm on
  the scenario's one injection plan, so this gives what a scenario per series gave), except in
  the SGP figure, whose series also differ in network, placement and staging: a
  single-algorithm scenario each, all with the same seed. An entry's name is its series key; a
  series that runs the algorithm of another with other parameters is a variant entry
  (``{name: eager_sgd_solo, algorithm: eager_sgd, mode: solo}``, ``harness.algorithms.variant``).
- The time-to-accuracy sweep (:func:`time_to_accuracy`) is the exception: it simulates WITH
  VALUES (``simulation.train``: every simulated rank trains a real MLP replica on its shard), so
  its compute is real, timed by a hand-made calibration entry (:data:`AT_SCALE_COMPUTE_S`, the
  default cluster network), and its points run in parallel processes (:data:`SWEEP_WORKERS`).
- Throughput and time per iteration come from ``harness.results.summary.summarize``:
  ``iter_time_s`` is ``wall_s / iterations`` (makespan over all ranks, per iteration).
- The WAGMA and SGP figures reproduce the papers' systems as they ran, every constant sourced
  at its definition (``WAGMA_REPO_*``, ``ARIES``, ``SGP_PAPER_*``, ``PCIE3_X16_GBPS``); the SGP
  figure's second setup (``per_worker``), the imbalance sweep and the low-communication sweep
  keep this harness's own cluster choices: 250 or 200 ms of compute with 10% lognormal jitter,
  the default cluster network (``harness.sim.runs.DEFAULT_NETWORK``) or nodes of 8 sharing a NIC
  (``network.topology``).
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from harness.results.columns import EVAL_COLUMNS, to_frame
from harness.results.summary import evaluation_ready_s as ready_s
from harness.results.summary import summarize
from harness.scenario.loader import scenario_from_dict
from harness.sim.calibration import CalibrationEntry, ComputePoint, EvalPoint
from harness.sim.runs import DEFAULT_NETWORK, TrainedRun, predict
from harness.sim.training import training_problem
from harness.validation import sgp_stack
from harness.validation.simulated import FREE_NETWORK, simulate_one, simulate_series
from harness.validation.systems import (
    ARIES,
    SGP_NETWORKS,
    SGP_PAPER_SERIES,
    WAGMA_REPO_BATCH,
    WAGMA_REPO_COMPUTE_MS,
    WAGMA_REPO_RANKS,
    WAGMA_REPO_STRAGGLERS,
    WAGMA_SERIES,
)
from harness.workload.names import workload_labels

# The SGP figure's workers: ResNet-50 at batch 32 per GPU, 200 ms of compute, 8 GPUs per node.
SGP_COMPUTE_MS = 200.0
SGP_BATCH_SIZE = 32
SGP_WORKERS_PER_NODE = 8

# Series key -> algorithm entry of a scenario. Keys are the names harness.report.style knows.
SGP_SERIES: dict[str, Any] = {
    "allreduce_sgd": "allreduce_sgd",
    "dpsgd": "dpsgd",
    "sgp": "sgp",
    "osgp": {"name": "osgp", "synch_freq": 0},  # 1-OSGP
}
# Series of the SGP figure that differ in the network, not the algorithm: (algorithm entry,
# changes to network.topology, other network fields). WAGMA-SGD's phase-0 groups are 8
# consecutive ranks: one node with ranks placed node by node, 8 different nodes with ranks dealt
# round-robin.
SGP_TOPOLOGY_SERIES: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]] = {
    "allreduce_sgd_hierarchical": ("allreduce_sgd", {}, {"allreduce": "hierarchical"}),
    "wagma_groups_in_nodes": ({"name": "wagma", "group_size": 8, "period": 11}, {}, {}),
    "wagma_groups_across_nodes": ({"name": "wagma", "group_size": 8, "period": 11}, {"placement": "round_robin"}, {}),
}
# One scenario per delay; the two eager-SGD modes are variants labelled by their series keys.
IMBALANCE_SERIES: dict[str, Any] = {
    "allreduce_sgd": "allreduce_sgd",
    "eager_sgd_solo": {"name": "eager_sgd_solo", "algorithm": "eager_sgd", "mode": "solo"},
    "eager_sgd_majority": {"name": "eager_sgd_majority", "algorithm": "eager_sgd", "mode": "majority"},
    "wagma": {"name": "wagma", "group_size": 8, "period": 11},
}


# The low-communication figure's methods and stragglers are those of this scenario (one definition).
LOW_COMMUNICATION_SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "low_communication.yaml"
LOW_COMMUNICATION_NETWORK = "10 GbE"  # a key of SGP_NETWORKS

# -- time to accuracy at scale (figure 8): scenarios/at_scale.yaml simulated with values -------------
# Its methods, stragglers (two random ranks sleep 150 ms per iteration), workload (the built-in
# mlp on `teacher`, 256 training samples per rank, the same 2,000 test samples at every rank
# count) and target accuracy (80%) are read from the file (one definition).
AT_SCALE_SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "at_scale.yaml"
# One rank-iteration of that workload (forward, backward and momentum-SGD step of the mlp's 26k
# parameters on 32 samples of 1x8x8): `python -m harness calibrate --scenario
# scenarios/at_scale.yaml --ranks 2` on this repository's 2-core development machine measured one
# rank computing alone (`ComputePoint.alone_s`, what `simulate --reading cluster` uses: a rank with
# a core of its own) at 0.52 and 0.60 ms in two runs (with both ranks computing at once: 0.84 and
# 0.47 ms); 0.55 ms is used, no jitter (real compute is timed by its median). The stragglers'
# 150 ms, 270 times this, set the time scale.
AT_SCALE_COMPUTE_S = 0.55e-3
# Rank 0 testing the averaged and its own model on the 2,000 test samples at an evaluation point
# (`EvalPoint`): 3.45 and 3.41 ms in the same two calibrations.
AT_SCALE_EVAL_S = 3.4e-3
# Iterations per rank count: the scenario's 400 where the sweep can afford them; fewer at 256 and
# 1,024 ranks (every rank computes for real: 1 to 2 ms of this machine per simulated rank-step),
# where each iteration sees more data (ranks x 32 samples) and 80% comes sooner in iterations.
TIME_TO_ACCURACY_ITERATIONS: dict[int, int] = {16: 400, 64: 400, 256: 200, 1024: 150}
TIME_TO_ACCURACY_QUICK_ITERATIONS: dict[int, int] = {16: 100, 64: 100}
# Evaluations every 25 iterations (the scenario: 50), so that the time to the target is resolved
# at 150 iterations too. Every evaluation point waits for the last rank (the model average).
TIME_TO_ACCURACY_EVAL_EVERY = 25
# Processes that simulate the sweep's points side by side (one (ranks, method) point each, the
# largest first): the machine's cores, at most 2 (this machine's). They are spawned: a script
# that calls the sweep needs the `if __name__ == "__main__":` guard.
SWEEP_WORKERS = max(1, min(2, os.cpu_count() or 1))


def wagma_scaling(
    quick: bool,
    ranks: Sequence[int] | None = None,
    iterations: int | None = None,
    compute_ms: float = WAGMA_REPO_COMPUTE_MS,
    batch_size: int = WAGMA_REPO_BATCH,
) -> pd.DataFrame:
    """WAGMA-SGD paper: throughput vs number of workers under injected stragglers, from the
    repository's ResNet-50 configuration (:data:`WAGMA_REPO_RANKS` workers of one P100, batch
    128, :data:`WAGMA_REPO_COMPUTE_MS` of compute, :data:`WAGMA_REPO_STRAGGLERS`, Piz Daint's
    :data:`ARIES` network) swept from 16 to 1,024 workers; the series of :data:`WAGMA_SERIES`.
    Iterations: 100 (quick: 22, two WAGMA sync cycles).

    Columns: algorithm, ranks, iterations, samples_per_s, iter_time_s, relative_to_allreduce
    (samples_per_s over Allreduce-SGD's at the same rank count).
    """
    ranks = tuple(ranks or ((16, WAGMA_REPO_RANKS, 256) if quick else (16, 32, 64, 128, 256, 512, 1024)))
    iterations = iterations or (22 if quick else 100)
    rows = []
    for p in ranks:
        simulated = simulate_series(
            "wagma_scaling",
            p,
            WAGMA_SERIES,
            iterations,
            batch_size,
            compute_ms,
            WAGMA_REPO_STRAGGLERS,
            ARIES,
            jitter=0.0,
        )
        for key, row in simulated.items():
            rows.append(
                {
                    "algorithm": key,
                    "ranks": p,
                    "iterations": iterations,
                    "samples_per_s": row["samples_per_s"],
                    "iter_time_s": row["wall_s"] / iterations,
                }
            )
    table = pd.DataFrame(rows)
    base = table[table["algorithm"] == "allreduce_sgd"].set_index("ranks")["samples_per_s"]
    table["relative_to_allreduce"] = table["samples_per_s"] / table["ranks"].map(base)
    return table


def sgp_scaling(
    quick: bool,
    nodes: Sequence[int] | None = None,
    iterations: int | None = None,
    workers_per_node: int = SGP_WORKERS_PER_NODE,
    compute_ms: float = SGP_COMPUTE_MS,
    batch_size: int = SGP_BATCH_SIZE,
) -> pd.DataFrame:
    """SGP paper: time per iteration vs nodes on 10 GbE and 100 Gb InfiniBand, in two setups.

    ``setup == "paper"`` (:func:`sgp_paper_rows`): the cluster as the paper ran it, one rank per
    node. ``setup == "per_worker"``: a modern cluster, one rank per GPU: every rank is a worker,
    the 8 workers of a node share its NIC and talk to each other over NVLink-class links
    (``network.topology`` with the presets of :data:`SGP_NETWORKS`), compute 200 ms +- 10% at
    batch 32 per worker. Its series: Allreduce-SGD (auto: a flat ring, and hierarchical), D-PSGD,
    SGP and 1-OSGP per worker, and WAGMA-SGD (groups of 8, a synchronous round every 11) with its
    phase-0 groups inside nodes or across nodes (:data:`SGP_TOPOLOGY_SERIES`). No injection;
    ResNet-50 buffer. Iterations: 60 (quick: 12).

    Columns: setup, algorithm, network, nodes, ranks, iterations, iter_time_s, samples_per_s.
    """
    nodes = tuple(nodes or ((4, 32) if quick else (4, 8, 16, 32)))
    iterations = iterations or (12 if quick else 60)
    series = {key: (algorithm, {}, {}) for key, algorithm in SGP_SERIES.items()} | SGP_TOPOLOGY_SERIES
    rows = sgp_paper_rows(nodes, iterations)
    for network_name, preset in SGP_NETWORKS.items():
        for n in nodes:
            p = workers_per_node * n
            for key, (algorithm, changes, network_fields) in series.items():
                topology = {"preset": preset, "ranks_per_node": workers_per_node, **changes}
                if topology.get("placement") == "round_robin":
                    topology = {**topology, "placement": [r % n for r in range(p)]}
                    del topology["ranks_per_node"]
                row = simulate_one(
                    "sgp_scaling",
                    p,
                    algorithm,
                    iterations,
                    batch_size,
                    compute_ms,
                    [],
                    FREE_NETWORK,
                    topology,
                    network_fields=network_fields,
                )
                rows.append(
                    {
                        "setup": "per_worker",
                        "algorithm": key,
                        "network": network_name,
                        "nodes": n,
                        "ranks": p,
                        "iterations": iterations,
                        "iter_time_s": row["wall_s"] / iterations,
                        "samples_per_s": row["samples_per_s"],
                    }
                )
    return pd.DataFrame(rows)


def sgp_paper_rows(nodes: Sequence[int], iterations: int) -> list[dict]:
    """The SGP paper's runs as they ran (``setup: paper``, ``harness.validation.sgp_stack``):
    every rank a node agent of 8 V100s, one NIC per node, per series (:data:`SGP_PAPER_SERIES`)
    the allreduce algorithm of its stack and the staging of the model through PCIe when it
    communicated from the host; the local work per iteration is the stack's, fitted on SGP's
    published times (``sgp_stack.stack_fit``: forward and backward, DataParallel, the data
    loader), +- 10%. Every constant's source is at its definition."""
    local_ms = 1e3 * sgp_stack.stack_fit().local_s
    rows = []
    for network_name, runs in SGP_PAPER_SERIES.items():
        for n in nodes:
            for run in runs:
                row = sgp_stack.simulate_run(network_name, run, n, iterations, local_ms, jitter=0.1)
                rows.append(
                    {
                        "setup": "paper",
                        "algorithm": run[0],
                        "network": network_name,
                        "nodes": n,
                        "ranks": n,
                        "iterations": iterations,
                        "iter_time_s": row["wall_s"] / iterations,
                        "samples_per_s": row["samples_per_s"],
                    }
                )
    return rows


def imbalance_sweep(
    quick: bool,
    delays_ms: Sequence[float] | None = None,
    ranks: int = 64,
    iterations: int | None = None,
    compute_ms: float = 250.0,
    batch_size: int = 64,
) -> pd.DataFrame:
    """Time per iteration vs injected delay: 2 random ranks of 64 sleep ``delay_ms`` per iteration.

    Allreduce-SGD, eager-SGD solo and majority (sync every 33 rounds), WAGMA-SGD (groups of 8,
    sync every 11 rounds), :data:`IMBALANCE_SERIES`, simulated as one scenario per delay; compute
    and network as in :func:`wagma_scaling`. Iterations: 100 (quick: 33).

    Columns: algorithm (series key: ``eager_sgd_solo`` / ``eager_sgd_majority`` for the two
    eager modes), delay_ms, ranks, iterations, iter_time_s, samples_per_s.
    """
    delays = tuple(delays_ms if delays_ms is not None else ((0, 160, 640) if quick else (0, 40, 80, 160, 320, 640)))
    iterations = iterations or (33 if quick else 100)
    rows = []
    for delay in delays:
        imbalance = [{"kind": "random_ranks", "count": 2, "delay_ms": float(delay)}] if delay > 0 else []
        simulated = simulate_series(
            "imbalance_sweep", ranks, IMBALANCE_SERIES, iterations, batch_size, compute_ms, imbalance, DEFAULT_NETWORK
        )
        for key, row in simulated.items():
            rows.append(
                {
                    "algorithm": key,
                    "delay_ms": float(delay),
                    "ranks": ranks,
                    "iterations": iterations,
                    "iter_time_s": row["wall_s"] / iterations,
                    "samples_per_s": row["samples_per_s"],
                }
            )
    return pd.DataFrame(rows)


def low_communication_series() -> tuple[dict[str, Any], list[dict]]:
    """(series key -> algorithm entry, imbalance) of ``scenarios/low_communication.yaml``, as the
    file writes them: the key is the entry's name (its label, unique in the scenario)."""
    data = yaml.safe_load(LOW_COMMUNICATION_SCENARIO.read_text())
    series = {entry if isinstance(entry, str) else entry["name"]: entry for entry in data["algorithms"]}
    return series, list(data.get("imbalance", []))


def low_communication_scaling(
    quick: bool,
    ranks: Sequence[int] | None = None,
    iterations: int | None = None,
    workers_per_node: int = SGP_WORKERS_PER_NODE,
    compute_ms: float = SGP_COMPUTE_MS,
    batch_size: int = SGP_BATCH_SIZE,
) -> pd.DataFrame:
    """Low-communication methods at scale: time per iteration vs ranks on 10 Gb Ethernet.

    The methods, their parameters (H = 20 inner steps for Local SGD and the DiLoCo family, ...)
    and the stragglers (two random ranks sleep 40 ms per iteration, at every scale) are those of
    ``scenarios/low_communication.yaml`` (:func:`low_communication_series`). The cluster is the
    SGP figure's on 10 GbE: nodes of 8 ranks sharing the node's NIC (preset ``ethernet_10g``:
    20 us, 10 Gb/s; NVLink-class inside the node; not the scenario's 1 Gb/s, which would leave
    Allreduce-SGD nothing but communication), a ResNet-50-sized buffer, 200 ms +- 10% of
    compute at batch 32 per rank. Allreduces are the native hierarchical ones (reduce inside
    each node, a ring over the nodes' leaders, broadcast inside): each NIC carries twice the
    model either way, as in the flat ring over ranks placed node by node (at 256 ranks the two
    give every method's time per iteration within 6%), but the simulator walks the flat ring's
    2(p-1) steps message by message through the shared NICs: Allreduce-SGD's 40 iterations at
    1,024 ranks did not finish in 9 minutes. Ranks: 16, 64, 256, 1,024 (quick: 16, 64).
    Iterations: 40, two outer rounds (quick: 20, one). The full sweep takes about 9 minutes
    (WAGMA-SGD at 1,024 ranks most of it), the quick one a few seconds.

    Columns: algorithm, network, ranks, nodes, iterations, iter_time_s, samples_per_s.
    """
    ranks = tuple(ranks or ((16, 64) if quick else (16, 64, 256, 1024)))
    iterations = iterations or (20 if quick else 40)
    series, imbalance = low_communication_series()
    topology = {"preset": SGP_NETWORKS[LOW_COMMUNICATION_NETWORK], "ranks_per_node": workers_per_node}
    rows = []
    for p in ranks:
        simulated = simulate_series(
            "low_communication_scaling",
            p,
            series,
            iterations,
            batch_size,
            compute_ms,
            imbalance,
            FREE_NETWORK,
            topology,
            network_fields={"allreduce": "hierarchical"},
        )
        for key, row in simulated.items():
            rows.append(
                {
                    "algorithm": key,
                    "network": LOW_COMMUNICATION_NETWORK,
                    "ranks": p,
                    "nodes": p // workers_per_node,
                    "iterations": iterations,
                    "iter_time_s": row["wall_s"] / iterations,
                    "samples_per_s": row["samples_per_s"],
                }
            )
    return pd.DataFrame(rows)


def at_scale_series() -> tuple[dict[str, Any], float]:
    """(series key -> algorithm entry, target accuracy) of ``scenarios/at_scale.yaml``, as the
    file writes them: the key is the entry's name (its label, unique in the scenario)."""
    data = yaml.safe_load(AT_SCALE_SCENARIO.read_text())
    series = {entry if isinstance(entry, str) else entry["name"]: entry for entry in data["algorithms"]}
    return series, float(data["results"]["target_accuracy"])


def at_scale_entry(scenario) -> CalibrationEntry:
    """The timing of the time-to-accuracy sweep: the default cluster network
    (:data:`~harness.sim.runs.DEFAULT_NETWORK`) and the scenario's workload computing for
    :data:`AT_SCALE_COMPUTE_S` per iteration (:data:`AT_SCALE_EVAL_S` per evaluation)."""
    model, dataset = workload_labels(scenario.workload)
    compute = ComputePoint(
        model=model,
        dataset=dataset,
        batch_size=scenario.workload.batch_size,
        median_s=AT_SCALE_COMPUTE_S,
        p95_s=AT_SCALE_COMPUTE_S,
        samples=1,
        alone_s=AT_SCALE_COMPUTE_S,
    )
    return CalibrationEntry(
        ranks=scenario.ranks,
        network=DEFAULT_NETWORK,
        network_source="default cluster network",
        compute=[compute],
        evaluation=[EvalPoint(model=model, dataset=dataset, median_s=AT_SCALE_EVAL_S)],
    )


def evaluation_ready_s(steps: pd.DataFrame, evals: pd.DataFrame) -> pd.Series:
    """Per evaluation iteration k of ``evals``: the simulated time at which its averaged model
    exists, less earlier evaluations' time, as summary.csv's ``time_to_target_s`` counts it
    (``harness.results.summary.evaluation_ready_s``, indexed by iteration here).

    Not the evaluation's ``time_s`` (evals.csv), which is rank 0's arrival: a method whose ranks
    drift apart (AD-PSGD, WAGMA-SGD, SGP, D-PSGD) evaluates an average of models that the slower
    ranks finish later, up to a straggler's sleeps later."""
    average = evals[evals["model"] == "average"]
    return pd.Series(
        ready_s(steps, average).to_numpy(), index=average["iteration"].astype(int).to_numpy(), name="ready_s"
    )


def time_to_accuracy_point(
    ranks: int, key: str, algorithm: Any, iterations: int, eval_every: int, target_accuracy: float | None = None
) -> list[dict]:
    """One method of ``scenarios/at_scale.yaml`` on ``ranks`` ranks for ``iterations`` iterations,
    simulated with values (``harness.sim.runs.predict`` with a ``TrainedRun``) on
    :func:`at_scale_entry`'s timing: one row per evaluation of the averaged model (columns of
    :func:`time_to_accuracy`). ``target_accuracy``: None, the scenario's."""
    data = yaml.safe_load(AT_SCALE_SCENARIO.read_text())
    data.update(ranks=ranks, algorithms=[algorithm])
    data["workload"] = {**data["workload"], "iterations": iterations, "eval_every": eval_every}
    data["simulation"] = {**(data.get("simulation") or {}), "train": True}
    data["results"] = {**(data.get("results") or {}), "provenance": "none"}  # only the evaluations are read
    if target_accuracy is not None:
        data["results"]["target_accuracy"] = target_accuracy
    scenario = scenario_from_dict(data)
    problem = training_problem(scenario)
    if problem is not None:
        raise RuntimeError(f"time_to_accuracy: {ranks} ranks of {key}: {problem}")
    target = scenario.results.target_accuracy
    started = time.monotonic()
    trained = TrainedRun(scenario, Path(tempfile.mkdtemp(prefix="time_to_accuracy-")))
    try:
        frames, _ = predict(scenario, at_scale_entry(scenario), trained=trained)
        records = trained.evals[key]
    finally:
        trained.discard()
    host_s = time.monotonic() - started
    steps, evals = frames[key], to_frame(records, EVAL_COLUMNS)
    w = scenario.workload
    summary = summarize(steps, evals, w.batch_size, iterations, ranks=ranks, target_accuracy=target).iloc[0]
    if not summary["complete"]:
        raise RuntimeError(f"time_to_accuracy: simulation of {key!r} on {ranks} ranks is incomplete")
    ready = evaluation_ready_s(steps, evals)
    t0 = float(steps["start_s"].min())
    average = evals[evals["model"] == "average"].sort_values(["iteration", "time_s"], kind="stable")
    rank0 = evals[evals["model"] == "rank0"].set_index("iteration")["test_accuracy"]
    reached = average[average["test_accuracy"] >= target]
    hit = int(reached["iteration"].iloc[0]) if len(reached) else -1
    rows = [
        {
            "ranks": ranks,
            "algorithm": key,
            "iterations": iterations,
            "eval_every": eval_every,
            "iteration": int(rec.iteration),
            "time_s": float(rec.time_s) - t0,
            "ready_s": float(ready[rec.iteration]),
            "test_accuracy": float(rec.test_accuracy),
            "test_loss": float(rec.test_loss),
            "rank0_accuracy": float(rank0.get(rec.iteration, float("nan"))),
            "consensus_distance": float(rec.consensus_distance),
        }
        for rec in average.itertuples(index=False)
    ]
    for row in rows:
        row.update(
            {
                "target_accuracy": float(target),
                "iteration_to_target": hit,
                "time_to_target_s": float(ready[hit]) if hit >= 0 else float("nan"),
                "summary_time_to_target_s": float(summary["time_to_target_s"]),
                "final_accuracy": float(summary["final_accuracy"]),
                "wall_s": float(summary["wall_s"]),
                "host_s": host_s,
            }
        )
    return rows


def time_to_accuracy(
    quick: bool,
    ranks: Sequence[int] | None = None,
    iterations: int | Mapping[int, int] | None = None,
    eval_every: int = TIME_TO_ACCURACY_EVAL_EVERY,
    algorithms: Sequence[str] | None = None,
    workers: int | None = None,
    target_accuracy: float | None = None,
) -> pd.DataFrame:
    """Time to accuracy at scale: ``scenarios/at_scale.yaml`` simulated with values at 16, 64,
    256 and 1,024 ranks (quick: 16 and 64), every method of the scenario (``algorithms``: a
    subset of their names).

    Weak scaling: every rank trains on its own 256 samples of ``teacher`` (the training set grows
    with the ranks), the test set is the same 2,000 samples at every rank count. Stragglers: the
    scenario's two random ranks sleeping 150 ms per iteration. Timing (:func:`at_scale_entry`):
    the default cluster network and :data:`AT_SCALE_COMPUTE_S` of compute per iteration.
    Iterations: :data:`TIME_TO_ACCURACY_ITERATIONS` (400 at 16 and 64 ranks, 200 at 256, 150 at
    1,024; quick: 100), or ``iterations`` (one count, or ranks -> count); evaluations every
    ``eval_every`` (25). Points run in ``workers`` processes (:data:`SWEEP_WORKERS`; 1: in this
    one). ``target_accuracy``: the scenario's (80%) unless given. The full sweep took 16 to 18
    minutes on this 2-core machine (1,950 to 2,160 s of simulation in two processes, 1,550 s of
    it at 1,024 ranks, while other jobs shared the cores), the quick one 44 s.

    Columns, one row per evaluation of the averaged model: ranks, algorithm, iterations,
    eval_every, iteration, time_s (rank 0's arrival at the evaluation, since the first step, as
    evals.csv), ready_s (when the averaged model exists: :func:`evaluation_ready_s`),
    test_accuracy, test_loss, rank0_accuracy, consensus_distance; and per (ranks, algorithm),
    repeated on its rows: target_accuracy, iteration_to_target (-1: never), time_to_target_s
    (ready_s of the first evaluation at or above the target; NaN: never), summary_time_to_target_s
    (what summary.csv's ``time_to_target_s`` says for the same run: the same count, a
    cross-check), final_accuracy, wall_s (the run's makespan), host_s (this machine's seconds for
    the point).
    """
    plan = TIME_TO_ACCURACY_QUICK_ITERATIONS if quick else TIME_TO_ACCURACY_ITERATIONS
    ranks = tuple(ranks or plan)
    series, _ = at_scale_series()
    if algorithms is not None:
        unknown = set(algorithms) - set(series)
        if unknown:
            raise ValueError(f"time_to_accuracy: not methods of {AT_SCALE_SCENARIO.name}: {sorted(unknown)}")
        series = {key: entry for key, entry in series.items() if key in algorithms}

    def count(p: int) -> int:
        if isinstance(iterations, int):
            return iterations
        return int((iterations or plan).get(p, min(plan.values())))

    points = [(p, key, entry, count(p), eval_every, target_accuracy) for p in ranks for key, entry in series.items()]
    workers = SWEEP_WORKERS if workers is None else workers
    if workers <= 1 or len(points) == 1:
        results = [time_to_accuracy_point(*point) for point in points]
    else:
        # Spawned, not forked: torch's thread pools do not survive a fork. The largest points first.
        by_cost = sorted(range(len(points)), key=lambda i: -points[i][0] * points[i][3])
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {i: pool.submit(time_to_accuracy_point, *points[i]) for i in by_cost}
            results = [futures[i].result() for i in range(len(points))]
    return pd.DataFrame([row for rows in results for row in rows])
