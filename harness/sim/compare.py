"""Real versus simulated: simulate a finished real run's scenario and measure the error.

Two modes:

- ``trace``: trace-driven. Every rank's local work per iteration (and the loop's bookkeeping
  between iterations, and the time after each evaluation point) is replayed from the run's
  steps.csv; the simulator predicts only the communication and the waiting.
- ``predictive``: the calibrated compute model only; nothing is taken from the run.

Both use the calibrated network of the run's rank count (or of the entry
:meth:`~harness.sim.calibration.Calibration.choose` falls back to, recorded as
``calibration_ranks``), the topology :func:`harness.sim.hosts.simulated_topology` chose (the
scenario's, or the hosts of a multi-host run; recorded in the simulated runs' run.json as
``network_topology``) and the scenario's injection plan. Per algorithm and mode,
``compare.csv`` (columns :data:`COMPARE_COLUMNS`) holds measured and predicted time per
iteration (``wall_s / iterations``) and throughput, and the relative throughput error
``predicted / measured - 1``. ``compare.png`` plots predicted against measured
throughput. The simulated runs themselves are written next to them (``sim-trace/``,
``sim-predictive/``) so their traces can be opened beside the real one.

With ``train`` (``compare --train``) the simulations carry values (``harness.sim.training``):
their ranks train from the run's initial model on the run's shards and batches, and
compare.csv adds the final test accuracy of the averaged model, measured and predicted, and the
largest difference over the evaluation points (``accuracy_error_max``, in accuracy points).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from harness.results import atomic
from harness.results.columns import EVAL_COLUMNS, to_frame
from harness.results.records import RunDirectory
from harness.results.summary import summarize
from harness.scenario.schema import Scenario
from harness.sim.calibration import CalibrationEntry
from harness.sim.hosts import SimTopology
from harness.sim.runs import TrainedRun, predict, replay, write_simulated_run
from harness.sim.script_replay import ScriptTrace, replay_script
from harness.sim.script_scaling import ScriptStructure

MODES = ("trace", "predictive")
COMPARE_FILE = "compare.csv"
COMPARE_PLOT = "compare.png"
COMPARE_COLUMNS = (
    "algorithm",
    "mode",
    "measured_iter_s",
    "predicted_iter_s",
    "measured_samples_per_s",
    "predicted_samples_per_s",
    "throughput_error",
    "measured_wait_fraction",
    "predicted_wait_fraction",
    "calibration_ranks",
    "measured_final_accuracy",
    "predicted_final_accuracy",
    "accuracy_error_max",
)


def compared_scenario(run: RunDirectory, scenario: Scenario) -> Scenario:
    """``scenario`` with only the algorithms ``run`` finished; ValueError if there are none."""
    finished = [a for a in run.algorithms if a in {p.name for p in scenario.algorithms}]
    if not finished:
        raise ValueError(f"{run.path}: the run has no finished algorithm to compare")
    return scenario.model_copy(update={"algorithms": [p for p in scenario.algorithms if p.name in finished]})


def compare_run(
    run: RunDirectory,
    scenario: Scenario,
    entry: CalibrationEntry,
    calibration_name: str,
    modes: tuple[str, ...] = MODES,
    topology: SimTopology | None = None,
    script: str | None = None,
    train: bool = False,
) -> pd.DataFrame:
    """Simulate ``run``'s finished algorithms (``scenario`` from :func:`compared_scenario`) in
    each mode with calibration ``entry`` and ``topology`` (``harness.sim.hosts.simulated_topology``;
    None: the scenario's own, if any); write and return the comparison.

    ``script``: the label of a torch.distributed script run (``launch --scenario``, no
    algorithms), whose recorded collectives are replayed (``harness.sim.script_replay``) on its
    recorded local work (trace) or its compute model (predictive). ``train``: the simulations carry
    values (see the module docstring)."""
    if train:
        scenario = scenario.model_copy(update={"simulation": scenario.simulation.model_copy(update={"train": True})})
    w = scenario.workload
    measured = summarize(run.steps, run.evals, w.batch_size, w.iterations, ranks=scenario.ranks)
    hosts = topology.hosts if topology is not None else None
    rows = []
    for mode in modes:
        if script is not None:  # its recorded collectives, on its recorded local work or its compute model
            trace = ScriptTrace.read(run.path, scenario.ranks, w.iterations)
            frame, stat = replay_script(
                scenario,
                script,
                run.steps,
                trace,
                scenario,
                entry.network,
                hosts,
                mode=mode,
                structure=ScriptStructure.read(run.path),
            )
            frames, stats = {script: frame}, [stat]
        elif mode == "trace":
            frames, stats = replay(
                scenario, run.steps, entry.network, hosts=hosts, trained=_trained(scenario, run, recorded=run.steps)
            )
        elif mode == "predictive":
            frames, stats = predict(scenario, entry, hosts=hosts, trained=_trained(scenario, run))
        else:
            raise ValueError(f"unknown mode {mode!r} (valid: {', '.join(MODES)})")
        _replace_dir(
            run.path / f"sim-{mode}",
            lambda path, frames=frames, stats=stats, mode=mode: write_simulated_run(
                path,
                scenario,
                frames,
                stats,
                mode,
                calibration_name,
                run_id=f"sim-{mode}",
                calibration_ranks=entry.ranks,
                topology=topology,
            ),
        )
        simulated_evals = _evals_frame(frames)
        predicted = summarize(
            pd.concat(frames.values()), simulated_evals, w.batch_size, w.iterations, ranks=scenario.ranks
        )
        both = measured.merge(predicted, on="algorithm", suffixes=("_measured", "_predicted"))
        for row in both.itertuples(index=False):
            rows.append(
                {
                    "algorithm": row.algorithm,
                    "mode": mode,
                    "measured_iter_s": row.wall_s_measured / w.iterations,
                    "predicted_iter_s": row.wall_s_predicted / w.iterations,
                    "measured_samples_per_s": row.samples_per_s_measured,
                    "predicted_samples_per_s": row.samples_per_s_predicted,
                    "throughput_error": row.samples_per_s_predicted / row.samples_per_s_measured - 1.0,
                    "measured_wait_fraction": row.wait_fraction_measured,
                    "predicted_wait_fraction": row.wait_fraction_predicted,
                    "calibration_ranks": entry.ranks,
                    "measured_final_accuracy": row.final_accuracy_measured if train else np.nan,
                    "predicted_final_accuracy": row.final_accuracy_predicted if train else np.nan,
                    "accuracy_error_max": accuracy_error(run.evals, simulated_evals, row.algorithm)
                    if train
                    else np.nan,
                }
            )
    table = pd.DataFrame(rows, columns=list(COMPARE_COLUMNS))
    atomic.write_csv(run.path / COMPARE_FILE, table)
    plot_comparison(table, run.path / COMPARE_PLOT, title=f"{scenario.name} ({scenario.ranks} ranks)")
    return table


def _trained(scenario: Scenario, run: RunDirectory, recorded: pd.DataFrame | None = None):
    """A ``TrainedRun`` staged inside ``run``'s directory, or None without values;
    ``recorded``: the steps a trace-driven replay follows (``TrainedRun``)."""
    if not scenario.simulation.train:
        return None
    return TrainedRun(scenario, Path(tempfile.mkdtemp(prefix=".sim-values-", dir=run.path)), recorded)


def _evals_frame(frames) -> pd.DataFrame | None:
    """The evaluations of a simulation with values (None without)."""
    trained = getattr(frames, "trained", None)
    if trained is None:
        return None
    return to_frame([r for records in trained.evals.values() for r in records], EVAL_COLUMNS)


def accuracy_error(real: pd.DataFrame, simulated: pd.DataFrame, algorithm: str) -> float:
    """The largest |simulated - real| test accuracy of the averaged model over the evaluation
    points both have, in accuracy points (percent); NaN when they share none."""

    def averaged(frame: pd.DataFrame) -> pd.Series:
        rows = frame[(frame["algorithm"] == algorithm) & (frame["model"] == "average")]
        return rows.set_index("iteration")["test_accuracy"]

    both = pd.concat([averaged(real), averaged(simulated)], axis=1, join="inner").dropna()
    if both.empty:
        return float("nan")
    return float((both.iloc[:, 1] - both.iloc[:, 0]).abs().max() * 100)


def error_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per mode: median and worst |throughput error| over the algorithms."""
    grouped = table.assign(abs_error=table["throughput_error"].abs()).groupby("mode", sort=False)["abs_error"]
    return pd.DataFrame({"median_abs_error": grouped.median(), "worst_abs_error": grouped.max()})


def plot_comparison(table: pd.DataFrame, path: Path, title: str) -> None:
    """Write :func:`comparison_figure` of ``table`` to ``path`` (PNG)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  (pyplot: only where the plot is drawn)

    fig = comparison_figure(table, title)
    with atomic.atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=120)
    plt.close(fig)


def comparison_figure(table: pd.DataFrame, title: str):
    """Predicted versus measured throughput with +-10% bands: one colour and marker per
    algorithm (``harness.report.style``, as in every figure), filled for ``trace``, hollow for
    ``predictive``, the two joined by a thin line. Names go in a legend beside the axes, not
    next to the points: the points of a run cluster on the diagonal and their labels overprint."""
    import matplotlib  # noqa: PLC0415  (pyplot: only where the plot is drawn, after the backend is chosen)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  (as above)
    from matplotlib.lines import Line2D  # noqa: PLC0415  (as above)

    from harness.report import style  # noqa: PLC0415  (pyplot: only where the plot is drawn)

    fig, ax = plt.subplots(figsize=(8.5, 6))
    values = table[["measured_samples_per_s", "predicted_samples_per_s"]].to_numpy()
    low, high = float(np.nanmin(values)) * 0.8, float(np.nanmax(values)) * 1.2
    line = np.array([low, high])
    ax.plot(line, line, color="black", linewidth=1)
    ax.fill_between(line, line * 0.9, line * 1.1, color="grey", alpha=0.2)
    handles = [
        Line2D([], [], color="black", linewidth=1, label="exact"),
        plt.Rectangle((0, 0), 1, 1, color="grey", alpha=0.2, label="±10%"),
    ]
    fills: dict = dict(zip(MODES, ("full", "none")))  # matplotlib's keywords: typed loosely
    for mode in MODES:
        handles.append(Line2D([], [], linestyle="", marker="o", color="dimgrey", fillstyle=fills[mode], label=mode))
    for algorithm in style.ordered(table["algorithm"]):
        rows = table[table["algorithm"] == algorithm].set_index("mode")
        look: dict = {"color": style.color(algorithm), "marker": style.marker(algorithm)}
        ax.plot(
            rows["measured_samples_per_s"],
            rows["predicted_samples_per_s"],
            linewidth=0.8,
            alpha=0.5,
            color=look["color"],
        )
        for mode in rows.index:
            ax.plot(
                rows.loc[mode, "measured_samples_per_s"],
                rows.loc[mode, "predicted_samples_per_s"],
                linestyle="",
                markersize=8,
                fillstyle=fills[mode],
                markeredgewidth=1.5,
                **look,
            )
        handles.append(Line2D([], [], linestyle="", markersize=8, label=style.label(algorithm), **look))
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured throughput (samples/s)")
    ax.set_ylabel("simulated throughput (samples/s)")
    ax.set_title(title)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


def _replace_dir(path: Path, write) -> None:
    """Write a directory through ``write(tmp_path)`` next to ``path``, then swap it in."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    write(tmp)
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
