"""The configuration floor: one user error, one strict base model, and how the CLI reports the error."""

from __future__ import annotations

import pytest

from harness.algorithms.params import AlgorithmParams, LocalSGDParams
from harness.bench.sizes import SizeError
from harness.cli import error_text, main
from harness.errors import HarnessError, ParamError
from harness.strict_model import StrictModel
from harness.launch import LaunchError
from harness.scenario import Scenario, ScenarioError, scenario_from_dict
from harness.scenario.schema import Workload
from harness.sim.calibration import CalibrationError
from harness.sim.timing import TimingError
from paper_figs.command import FiguresError
from conftest import harness_cli, write_scenario_file

USER_ERRORS = (LaunchError, CalibrationError, TimingError, ScenarioError, ParamError, FiguresError, SizeError)

# Two problems in one file: the loader reports each on a line of its own.
TWO_PROBLEMS = {
    "name": "two_problems",
    "ranks": 4,
    "workload": {"model": "mlp", "dataset": "digits", "batch_size": 0, "iterations": 4,
                 "compute": {"emulate_ms": 1}, "params": 100},
    "algorithms": [{"name": "local_sgd", "period": 0}],
}
TWO_PROBLEM_LINES = [
    "algorithms[0].period: must be >= 1 (got 0)",
    "workload.batch_size: must be >= 1 (got 0)",
]


@pytest.mark.parametrize("cls", USER_ERRORS, ids=lambda cls: cls.__name__)
def test_every_user_error_is_a_harness_error(cls: type[Exception]) -> None:
    assert issubclass(cls, HarnessError)


def test_errors_that_argparse_and_pydantic_catch_stay_value_errors() -> None:
    # argtype turns a ValueError into the option's usage error; pydantic a validator's into its own.
    assert issubclass(SizeError, ValueError) and issubclass(ParamError, ValueError)


def test_scenario_and_algorithm_models_share_the_strict_base() -> None:
    assert issubclass(Scenario, StrictModel) and issubclass(Workload, StrictModel)
    assert issubclass(AlgorithmParams, StrictModel)
    with pytest.raises(ValueError, match=r"unknown key \(valid: name, period, optimizer\)"):
        LocalSGDParams.model_validate({"perod": 2})
    with pytest.raises(ScenarioError, match=r"algorithms\[0\]\.perod: unknown key \(valid: name, period, optimizer\)"):
        scenario_from_dict({**TWO_PROBLEMS, "workload": {**TWO_PROBLEMS["workload"], "batch_size": 8},
                            "algorithms": [{"name": "local_sgd", "perod": 2}]})


def test_error_text_prefixes_each_problem_and_keeps_indented_lines() -> None:
    exc = CalibrationError("cal.json: no entry for mlp\nscenario.yaml: bad\n  python -m harness calibrate --ranks 4")
    assert error_text(exc).splitlines() == [
        "error: cal.json: no entry for mlp",
        "error: scenario.yaml: bad",
        "  python -m harness calibrate --ranks 4",
    ]


@pytest.mark.parametrize("command", ["validate", "sbatch", "simulate"])
def test_every_command_reports_a_bad_scenario_alike(command, tmp_path, capsys) -> None:
    path = write_scenario_file(tmp_path, TWO_PROBLEMS)
    extra = [] if command == "validate" else ["--out", str(tmp_path / "out")]
    assert main([command, str(path), *extra]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert sorted(err.splitlines()) == [f"error: {path}: {line}" for line in TWO_PROBLEM_LINES]
    assert not (tmp_path / "out").exists()


def test_run_reports_a_launch_error_before_writing_anything(tmp_path, capsys) -> None:
    path = write_scenario_file(tmp_path, {**TWO_PROBLEMS, "workload": {**TWO_PROBLEMS["workload"], "batch_size": 8},
                                          "algorithms": ["local_sgd"]})
    hosts = tmp_path / "no_such_hostfile"
    status = main(["run", str(path), "--out", str(tmp_path / "out"), "--launcher", "mpiexec", "--hosts", str(hosts)])
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --hosts {hosts}: cannot read it") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.subprocess
def test_python_m_harness_exits_2_without_a_traceback(tmp_path) -> None:
    path = write_scenario_file(tmp_path, TWO_PROBLEMS)
    proc = harness_cli("validate", str(path))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert sorted(proc.stderr.splitlines()) == [f"error: {path}: {line}" for line in TWO_PROBLEM_LINES]
