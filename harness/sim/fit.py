"""Fit the simulated network to this machine under training load.

Quiet measurements (a ping-pong, an allreduce right after a barrier) see progress threads that
are awake and cores that are free. A training run does not: ranks reach a collective at
different times, the early ones' progress threads have gone to sleep, and with more ranks than
cores every message hop waits for a time slice. On 8 ranks sharing 2 cores a 473 KB ring
allreduce took 0.9 ms after a barrier and about 10 ms inside Allreduce-SGD.

So ``calibrate`` also runs four short reference trainings on all ranks, one per communication
pattern (``harness.calibrate.training_measures.reference_algorithms``: Allreduce-SGD's collective every
iteration, D-PSGD's whole-model exchanges, SGP's pushes, WAGMA-SGD's group rounds), and
:func:`fit_loaded_network` picks the alpha-beta model (with ``progress_s = alpha``: waking up
for a held message costs one hop; shared cores as given) under which the trace-driven
simulation of those runs reproduces their measured wall times best (squared log error). The
reference runs are not the runs ``compare`` reports on: the fit is calibration, the comparison
is validation (though a reference training is close to the ``balanced`` scenario).

When the calibration's ranks spanned several hosts, the references are simulated with the
hosts as nodes (``hosts``, ``harness.sim.hosts``), whose NICs add the measured inter-host
excess to the messages between hosts, so the fitted model is what a message costs inside a
host, as ``simulate`` and ``compare`` use it. Without reference trainings,
:func:`fit_allreduce_on_hosts` fits the quiet allreduce times the same way.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from harness.scenario.network import NodeTopology
from harness.scenario.schema import Scenario
from harness.sim.calibration import NetworkModel
from harness.sim.collective_timing import predict_allreduce_s
from harness.sim.simulate import simulate_algorithm
from harness.sim.timing import TraceTiming

ALPHAS = np.geomspace(5e-6, 3e-3, 12)  # seconds per message hop
BANDWIDTHS = np.geomspace(2e7, 2e10, 10)  # bytes per second


def _wall(frame: pd.DataFrame) -> float:
    return float(frame["end_s"].max() - frame["start_s"].min())


def fit_loaded_network(
    references: list[tuple[Scenario, pd.DataFrame]], shared_cores: int | None, hosts: NodeTopology | None = None
) -> tuple[NetworkModel, float]:
    """The grid point minimising the squared log error of the simulated wall times.

    ``references``: (one-algorithm scenario, its measured steps) pairs; ``hosts``: the hosts
    they ran on as nodes, or None (one host). Returns the model and the root-mean-square
    relative error it leaves on the references.
    """
    if not references:
        raise ValueError("no reference runs to fit the network to")
    measured = [_wall(steps) for _, steps in references]
    timings = [TraceTiming(steps, sc.ranks, sc.workload.iterations) for sc, steps in references]
    best, best_error = None, math.inf
    for alpha in ALPHAS:
        for bandwidth in BANDWIDTHS:
            model = NetworkModel(
                latency_s=float(alpha),
                bandwidth_bytes_per_s=float(bandwidth),
                progress_s=float(alpha),
                shared_cores=shared_cores,
            )
            error = 0.0
            for (sc, _), timing, wall in zip(references, timings, measured):
                frame, _ = simulate_algorithm(sc, sc.algorithms[0], timing, model, hosts=hosts)
                error += math.log(_wall(frame) / wall) ** 2
            if error < best_error:
                best, best_error = model, error
    assert best is not None  # the grid is not empty, and an error is finite
    return best, math.sqrt(best_error / len(references))


def fit_allreduce_on_hosts(points: list[tuple[int, int, float]], hosts: NodeTopology) -> tuple[NetworkModel, float]:
    """The grid point under which allreduces on ``hosts`` take the measured times (squared log
    error), and the rms relative error left. ``points``: (ranks, bytes per rank, seconds) of
    allreduces all ranks joined at once. ``harness.sim.collective_timing.fit_to_allreduce`` solves this in
    closed form on one host; the NICs' queues make the time nonlinear in alpha and beta."""
    points = [p for p in points if p[0] == len(hosts.node_of) and p[2] > 0]
    if len(points) < 2:
        raise ValueError(f"need allreduce times of {len(hosts.node_of)} ranks at 2 or more sizes (got {len(points)})")
    best, best_error = None, math.inf
    for alpha in ALPHAS:
        for bandwidth in BANDWIDTHS:
            model = NetworkModel(latency_s=float(alpha), bandwidth_bytes_per_s=float(bandwidth))
            error = sum(
                math.log(predict_allreduce_s(ranks, nbytes, model, hosts=hosts) / seconds) ** 2
                for ranks, nbytes, seconds in points
            )
            if error < best_error:
                best, best_error = model, error
    assert best is not None  # the grid is not empty, and an error is finite
    return best, math.sqrt(best_error / len(points))
