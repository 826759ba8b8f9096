"""Which experiment produces each figure's data (read by ``python -m harness figures``).

Experiments:

- :class:`RealRun`: ``python -m harness run SCENARIO`` (``--quick``: fewer iterations). A figure
  receives the newest complete real run directory of that scenario under the results root.
- :class:`Sweep`: a simulated parameter sweep, ``paper_figs.experiments.<function>(quick)``
  returning a table; saved as ``<results>/figures/<name>.csv`` and given to the figure as that path.

A figure module ``paper_figs.<module>`` has ``NAME`` and ``draw(inputs) -> (figure, table)``,
where ``inputs`` maps each of its experiment keys to the path above and ``table`` is exactly
what the figure plots (columns ``panel``, ``series``, ``x``, ``y`` plus context columns).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RealRun:
    scenario: str  # scenario file, relative to the repository root
    quick_iterations: int  # --iterations with --quick
    compare: bool = False  # also run `compare` on it (figures of real against simulated)


@dataclass(frozen=True)
class Sweep:
    function: str  # name in paper_figs.experiments


@dataclass(frozen=True)
class Figure:
    module: str  # paper_figs.<module>
    inputs: tuple[str, ...]  # keys of EXPERIMENTS


EXPERIMENTS: dict[str, RealRun | Sweep] = {
    "straggler": RealRun("scenarios/straggler.yaml", quick_iterations=20, compare=True),
    "slow_link": RealRun("scenarios/slow_link.yaml", quick_iterations=20, compare=True),
    "balanced": RealRun("scenarios/balanced.yaml", quick_iterations=20, compare=True),
    "low_communication": RealRun("scenarios/low_communication.yaml", quick_iterations=40),
    "wagma_scaling": Sweep("wagma_scaling"),
    "sgp_scaling": Sweep("sgp_scaling"),
    "imbalance_sweep": Sweep("imbalance_sweep"),
    "low_communication_scaling": Sweep("low_communication_scaling"),
    "time_to_accuracy": Sweep("time_to_accuracy"),
}

FIGURES: list[Figure] = [
    Figure("fig1_wagma_throughput", ("wagma_scaling", "straggler")),
    Figure("fig2_sgp_scaling", ("sgp_scaling", "slow_link")),
    Figure("fig3_overlap_local_sgd", ("slow_link",)),
    Figure("fig4_imbalance_sweep", ("imbalance_sweep",)),
    Figure("fig5_real_vs_sim", ("straggler", "slow_link", "balanced")),
    Figure("fig6_timeline", ("straggler",)),
    Figure("fig7_low_communication", ("low_communication", "low_communication_scaling")),
    Figure("fig8_time_to_accuracy", ("time_to_accuracy",)),
]
