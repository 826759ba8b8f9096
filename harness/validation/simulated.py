"""Published systems simulated as they ran: a scenario built from a few numbers, simulated on
the SimPy model, summarized (one definition for ``bench validation`` and the paper figures'
sweeps in ``paper_figs/experiments.py``).

Compute is emulated (``workload.compute.emulate_ms``: the system's per-iteration local time,
taken from a source), the communicated buffer is ``workload.params`` floats, and the network
is a ``NetworkModel`` (the base point-to-point cost) plus the scenario's ``network`` section
(topology, allreduce algorithm). ``workload.model`` is only a valid placeholder.
"""

from __future__ import annotations

from typing import Any

from harness.results.summary import summarize
from harness.scenario.loader import scenario_from_dict
from harness.sim.calibration import CalibrationEntry, NetworkModel
from harness.sim.runs import predict

SEED = 1234
RESNET50_PARAMS = 25_557_032  # ResNet-50's parameter count (torchvision): the buffer most cases communicate
#: The base point-to-point network where the topology is the whole network.
FREE_NETWORK = NetworkModel(latency_s=0.0, bandwidth_bytes_per_s=1e15)


def scenario_doc(
    name: str,
    ranks: int,
    algorithms: list[Any],
    iterations: int,
    batch_size: int,
    compute_ms: float,
    imbalance: list[dict],
    topology: dict[str, Any] | None = None,
    workload: dict[str, Any] | None = None,
    network_fields: dict[str, Any] | None = None,
    jitter: float = 0.1,
    params: int = RESNET50_PARAMS,
) -> dict:
    """A scenario of these algorithm entries; ``workload`` and ``network_fields`` add fields to
    those sections; ``jitter``: the emulated compute's lognormal sigma."""
    return {
        "name": name,
        "ranks": ranks,
        "seed": SEED,
        "workload": {
            "model": "resnet20",  # placeholder: the communicated size is `params`
            "dataset": "synthetic",
            "batch_size": batch_size,
            "iterations": iterations,
            "eval_every": iterations,
            "compute": {"emulate_ms": compute_ms, "jitter": jitter},
            "params": params,
            **(workload or {}),
        },
        "algorithms": algorithms,
        "imbalance": imbalance,
        "network": ({"topology": topology} if topology else {}) | (network_fields or {}),
    }


def simulate_series(
    name: str,
    ranks: int,
    series: dict[str, Any],
    iterations: int,
    batch_size: int,
    compute_ms: float,
    imbalance: list[dict],
    network: NetworkModel,
    topology: dict[str, Any] | None = None,
    **sections: Any,
) -> dict[str, dict]:
    """One scenario listing every entry of ``series`` (series key -> algorithm entry, whose name
    is the key), simulated: each series' summary row (samples_per_s, wall_s, ...)."""
    scenario = scenario_from_dict(
        scenario_doc(
            name, ranks, list(series.values()), iterations, batch_size, compute_ms, imbalance, topology, **sections
        )
    )
    frames, _ = predict(scenario, CalibrationEntry(ranks=ranks, network=network))
    rows = {}
    for key, algorithm in series.items():
        row = summarize(frames[key], None, batch_size, iterations, ranks=ranks).iloc[0].to_dict()
        if not row["complete"]:
            raise RuntimeError(f"{name}: simulation of {algorithm!r} on {ranks} ranks is incomplete")
        rows[key] = row
    return rows


def simulate_one(
    name: str,
    ranks: int,
    algorithm: Any,
    iterations: int,
    batch_size: int,
    compute_ms: float,
    imbalance: list[dict],
    network: NetworkModel,
    topology: dict[str, Any] | None = None,
    **sections: Any,
) -> dict:
    """One single-algorithm scenario, simulated: its summary row (samples_per_s, wall_s, ...)."""
    key = algorithm if isinstance(algorithm, str) else algorithm["name"]
    return simulate_series(
        name, ranks, {key: algorithm}, iterations, batch_size, compute_ms, imbalance, network, topology, **sections
    )[key]


def iteration_s(row: dict) -> float:
    """Time per iteration of a summary row: the makespan over all ranks, per iteration."""
    return float(row["wall_s"]) / float(row["iterations"])
