"""``python -m harness figures`` and the real-vs-simulated figure, on quick real runs."""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import pytest
import yaml

import paper_figs
from conftest import harness_cli
from harness.cli import main as harness_main
from harness.report import style
from paper_figs import command as figures_command
from paper_figs import fig5_real_vs_sim, manifest


def assert_draws_its_table(fig, table: pd.DataFrame) -> None:
    drawn = style.plotted(fig).sort_values(["panel", "series", "x", "y"]).reset_index(drop=True)
    expected = table[["panel", "series", "x", "y"]].sort_values(["panel", "series", "x", "y"]).reset_index(drop=True)
    assert len(drawn) == len(expected) > 0
    assert (drawn["panel"].to_numpy() == expected["panel"].to_numpy()).all()
    assert (drawn["series"].to_numpy() == expected["series"].to_numpy()).all()
    np.testing.assert_allclose(drawn[["x", "y"]].to_numpy(float), expected[["x", "y"]].to_numpy(float), rtol=1e-9)


@pytest.mark.mpi
def test_real_vs_sim_figure_plots_every_compared_algorithm(figure_results, tmp_path) -> None:
    fig, table = fig5_real_vs_sim.draw(figure_results)
    assert_draws_its_table(fig, table)
    compared = sum(len(pd.read_csv(run / "compare.csv")) for run in figure_results.values())
    assert len(table) == compared  # one point per (mode, algorithm) of every run
    png, csv = style.save(fig, table, tmp_path, fig5_real_vs_sim.NAME)
    assert png.stat().st_size > 10_000
    pd.testing.assert_frame_equal(pd.read_csv(csv), table, check_dtype=False)


@pytest.mark.mpi
def test_real_vs_sim_figure_names_a_run_without_compare(figure_results, tmp_path) -> None:
    with pytest.raises(ValueError, match="no compare.csv"):
        fig5_real_vs_sim.draw({"empty": tmp_path})


def test_every_manifest_figure_has_a_module_and_known_inputs() -> None:
    import importlib

    for figure in manifest.FIGURES:
        module = importlib.import_module(f"paper_figs.{figure.module}")
        assert module.NAME == figure.module and callable(module.draw)
        assert set(figure.inputs) <= set(manifest.EXPERIMENTS)


@pytest.mark.subprocess
def test_figures_command_refuses_unknown_names() -> None:
    proc = harness_cli("figures", "--only", "fig99_nothing")
    assert proc.returncode == 2 and "fig99_nothing" in proc.stderr


@pytest.mark.mpi
def test_figures_command_runs_what_is_missing_then_reuses_it(figure_results, tmp_path, monkeypatch) -> None:
    # A tiny scenario stands in for the manifest's: the command must run it (real ranks), compare
    # it (with the calibration file it finds), draw, and reuse everything the second time.
    data = {"name": "tiny_fig", "ranks": 2, "seed": 1,
            "workload": {"model": "mlp", "dataset": "mnist5k", "batch_size": 32, "iterations": 6, "eval_every": 3},
            "algorithms": ["allreduce_sgd", "sgp"]}
    scenario = tmp_path / "tiny_fig.yaml"
    scenario.write_text(yaml.safe_dump(data))
    results = tmp_path / "results"
    results.mkdir()
    (results / "calibration.json").write_bytes((figure_results["straggler"].parent.parent.parent.parent
                                                / "calibration.json").read_bytes())
    monkeypatch.chdir(tmp_path)  # results/calibration.json is looked up here
    monkeypatch.setattr(manifest, "EXPERIMENTS", {"tiny": manifest.RealRun(str(scenario), quick_iterations=4,
                                                                           compare=True)})
    monkeypatch.setattr(manifest, "FIGURES", [manifest.Figure("fig5_real_vs_sim", ("tiny",))])
    args = argparse.Namespace(quick=True, only=None, results=results, out=tmp_path / "out", gallery=False,
                              rerun=False)
    assert figures_command.run(args) == 0
    (run,) = (results / "tiny_fig").iterdir()
    assert (run / "compare.csv").is_file()
    assert (tmp_path / "out" / "fig5_real_vs_sim.png").stat().st_size > 0
    assert yaml.safe_load((run / "scenario.resolved.yaml").read_text())["workload"]["iterations"] == 4
    assert figures_command.run(args) == 0  # everything reused: still one run
    assert len(list((results / "tiny_fig").iterdir())) == 1


def test_figures_command_draws_fig7_from_its_run_and_sweep(tmp_path, capsys) -> None:
    # fig7's manifest entries, wired up without a real run: a synthetic complete run with the
    # quick iterations and a tiny sweep saved where the command looks are both reused.
    from test_figures_sweeps import write_low_communication_run

    from paper_figs import experiments

    results = tmp_path / "results"
    real = manifest.EXPERIMENTS["low_communication"]
    run = write_low_communication_run(results / "low_communication" / "20260101-000000", real.quick_iterations)
    sweep = results / "figures" / "low_communication_scaling-quick.csv"
    sweep.parent.mkdir(parents=True)
    names = list(experiments.low_communication_series()[0])
    pd.DataFrame({"algorithm": names, "network": "10 GbE", "ranks": 16, "iter_time_s": 0.25}).to_csv(sweep, index=False)
    assert harness_main(["figures", "--quick", "--results", str(results), "--only", "fig7_low_communication"]) == 0
    err = capsys.readouterr().err
    assert f"reusing {run}" in err and f"reusing {sweep}" in err
    drawn = pd.read_csv(results / "figures" / "quick" / "fig7_low_communication.csv")
    assert set(drawn["panel"]) == {0, 1} and (drawn.loc[drawn["panel"] == 1, "x"] == 16).all()


def _listing(directory) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir()}


@pytest.mark.subprocess
def test_figures_stay_out_of_the_checkout_unless_the_gallery_is_asked_for(tmp_path, monkeypatch, capsys) -> None:
    # fig4 needs only a simulated sweep: quick, and no ranks to launch.
    results, only = tmp_path / "results", ["--only", "fig4_imbalance_sweep"]
    committed = _listing(paper_figs.GALLERY_DIR)
    assert harness_main(["figures", "--quick", "--results", str(results), *only]) == 0
    quick = results / "figures" / "quick"
    assert sorted(p.name for p in quick.iterdir()) == ["fig4_imbalance_sweep.csv", "fig4_imbalance_sweep.png"]
    assert f"figures written to {quick}" in capsys.readouterr().out
    assert _listing(paper_figs.GALLERY_DIR) == committed  # the tracked images are untouched
    # Full figures go next to the sweeps, apart from the quick ones (the quick sweep stands in).
    sweep = results / "figures" / "imbalance_sweep-quick.csv"
    (results / "figures" / "imbalance_sweep.csv").write_bytes(sweep.read_bytes())
    assert harness_main(["figures", "--results", str(results), *only]) == 0
    assert (results / "figures" / "fig4_imbalance_sweep.png").is_file()
    # --gallery writes where the README's images are (here a stand-in folder), never quick figures.
    gallery = (tmp_path / "gallery").resolve()
    monkeypatch.setattr(paper_figs, "GALLERY_DIR", gallery)
    capsys.readouterr()
    assert harness_main(["figures", "--gallery", "--quick", "--results", str(results), *only]) == 2
    assert "--gallery with --quick" in capsys.readouterr().err and not gallery.exists()
    assert harness_main(["figures", "--gallery", "--results", str(results), *only]) == 0
    assert (gallery / "fig4_imbalance_sweep.png").is_file()
    assert f"figures written to {gallery} (the README's gallery)" in capsys.readouterr().out
