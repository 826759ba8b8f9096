"""An algorithm class of the user's own, named in a scenario by ``class: "module:Class"``.

examples/own_algorithm (Post-local SGD beside Allreduce-SGD and Local SGD) runs real, simulated
and compared with no other code, and figures draw it, each command in a process of its own that
learns the class from the scenario (the run's ranks, ``compare`` and ``figures`` from the run's
scenario.resolved.yaml). tests/mpi/user_algorithm_checks.py checks what it computes. Every
mistake in such an entry is refused by ``validate`` naming the field; a validated entry
round-trips through the resolved scenario.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO, harness_cli, mpi_check_suite, save_test_calibration

EXAMPLE = REPO / "examples" / "own_algorithm"
NAME = "post_local"  # the example's name for the class
REFERENCE = "post_local_sgd:PostLocalSGD"
ALGORITHMS = ["allreduce_sgd", "local_sgd", NAME]
# The example's switch_at and period: gradient allreduces in iterations 0-7, then model averages
# end iterations 11 and 15 (local_sgd, period 4 too, averages at 3, 7, 11 and 15).
RANKS, ITERATIONS, SWITCH_AT, PERIOD = 3, 16, 8, 4
LOGREG_DIGITS_BYTES = (8 * 8 * 10 + 10) * 4  # logreg on digits: a 64 x 10 weight and 10 biases


def communicates(t: int) -> bool:
    """Whether the example's Post-local SGD allreduces in iteration t (gradient or model)."""
    return t < SWITCH_AT or (t - SWITCH_AT + 1) % PERIOD == 0


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A calibration of 3 ranks with the example's compute time."""
    root = tmp_path_factory.mktemp("user_algorithm")
    save_test_calibration(root / "calibration.json", RANKS, [("logreg", "digits", 16, 0.002)])
    return root


@pytest.fixture(scope="module")
def real_run(workdir) -> Path:
    proc = harness_cli("run", str(EXAMPLE / "scenario.yaml"), "--ranks", str(RANKS), "--iterations", str(ITERATIONS),
                       "--out", str(workdir / "out"), timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (run,) = (workdir / "out" / "own_algorithm").iterdir()
    return run


@pytest.fixture(scope="module")
def compared(real_run, workdir) -> Path:
    proc = harness_cli("compare", str(real_run), "--calibration", str(workdir / "calibration.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return real_run


def rank0(steps: pd.DataFrame, column: str, algorithm: str = NAME) -> list:
    """Rank 0's ``column`` per iteration of ``algorithm``."""
    mine = steps[(steps["algorithm"] == algorithm) & (steps["rank"] == 0)].sort_values("iteration")
    return mine[column].tolist()


def check_bytes(steps: pd.DataFrame) -> None:
    """An allreduce of the model's size exactly where the class communicates: Allreduce-SGD's
    bytes before the switch, Local SGD's after it (same period, and switch_at a multiple of it)."""
    sent = rank0(steps, "bytes_sent")
    assert sent == [LOGREG_DIGITS_BYTES if communicates(t) else 0 for t in range(ITERATIONS)]
    assert sent == (rank0(steps, "bytes_sent", "allreduce_sgd")[:SWITCH_AT]
                    + rank0(steps, "bytes_sent", "local_sgd")[SWITCH_AT:])


@pytest.mark.mpi
def test_the_example_runs_on_real_ranks_under_its_name(real_run):
    meta = json.loads((real_run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["finished_algorithms"] == ALGORITHMS
    summary = pd.read_csv(real_run / "summary.csv")
    assert summary["algorithm"].tolist() == ALGORITHMS and summary["complete"].all()
    trace = json.loads((real_run / "trace.json").read_text())
    processes = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert set(ALGORITHMS) <= processes
    # Its own communication: one allreduce per iteration before the switch (the gradient), then
    # one per period (the model), and nothing else.
    ops = pd.read_csv(real_run / "comm_ops.csv")
    mine = ops[ops["algorithm"] == NAME]
    assert set(mine["op"]) == {"allreduce"}
    assert len(mine) == RANKS * (SWITCH_AT + (ITERATIONS - SWITCH_AT) // PERIOD)
    steps = pd.read_csv(real_run / "steps.csv")
    check_bytes(steps)
    # From the same initial model and data, it trains as Allreduce-SGD up to the switch: the same
    # losses bit for bit through iteration SWITCH_AT (computed from the model of SWITCH_AT steps),
    # other ones after the local steps.
    losses, baseline = rank0(steps, "loss"), rank0(steps, "loss", "allreduce_sgd")
    assert losses[:SWITCH_AT + 1] == baseline[:SWITCH_AT + 1]
    assert losses[SWITCH_AT + 1:] != baseline[SWITCH_AT + 1:]
    resolved = yaml.safe_load((real_run / "scenario.resolved.yaml").read_text())
    assert resolved["algorithms"][2] == {"name": NAME, "class": REFERENCE, "switch_at": SWITCH_AT,
                                         "period": PERIOD}


@pytest.mark.subprocess
def test_simulate_runs_the_class_own_code(workdir):
    out = workdir / "sim"
    proc = harness_cli("simulate", str(EXAMPLE / "scenario.yaml"), "--ranks", str(RANKS), "--iterations",
                       str(ITERATIONS), "--calibration", str(workdir / "calibration.json"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (out / "own_algorithm").iterdir()
    assert pd.read_csv(run / "summary.csv")["algorithm"].tolist() == ALGORITHMS
    trace = json.loads((run / "trace.json").read_text())
    assert NAME in {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    # The simulated communicator carried what the class posts: an allreduce's bytes in the
    # iterations it communicates in, none in its local steps.
    check_bytes(pd.read_csv(run / "steps.csv"))


# `python -m harness figures` draws the manifest's figures; here its manifest names a copy of the
# example scenario at the run's rank count, so it reuses the compared run above (--quick: its
# iterations) and draws figure 5 (real against simulated, every algorithm of compare.csv).
FIGURES_DRIVER = """\
import json, sys
from harness.report import style
from paper_figs import manifest
experiment = manifest.RealRun(sys.argv[1], quick_iterations={iterations}, compare=True)
manifest.EXPERIMENTS = {{key: experiment for key in ("straggler", "slow_link", "balanced")}}
manifest.FIGURES = [manifest.Figure("fig5_real_vs_sim", ("straggler", "slow_link", "balanced"))]
from harness.cli import main
code = main(["figures", "--quick", "--results", sys.argv[2], "--out", sys.argv[3]])
print(json.dumps({{"label": style.label({name!r}), "colour": style.color({name!r})}}))
sys.exit(code)
"""


@pytest.mark.mpi
def test_compare_and_figures_draw_it_in_fresh_processes(compared, workdir):
    from harness.algorithms.registry import BUILT_IN
    from harness.report.style import UNKNOWN_COLOUR

    table = pd.read_csv(compared / "compare.csv")
    assert sorted(table[table["algorithm"] == NAME]["mode"]) == ["predictive", "trace"]
    assert (compared / "compare.png").is_file() and (compared / "sim-trace").is_dir()

    scenario = yaml.safe_load((EXAMPLE / "scenario.yaml").read_text())
    copy = workdir / "own_algorithm_3.yaml"
    copy.write_text(yaml.safe_dump({**scenario, "ranks": RANKS, "python_path": [str(EXAMPLE)]}))
    driver = FIGURES_DRIVER.format(iterations=ITERATIONS, name=NAME)
    proc = subprocess.run([sys.executable, "-c", driver, str(copy), str(workdir / "out"), str(workdir / "figures")],
                          capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reusing" in proc.stderr and "$ python -m harness run" not in proc.stderr  # the run above, as it is
    drawn = pd.read_csv(workdir / "figures" / "fig5_real_vs_sim.csv")
    assert NAME in set(drawn["algorithm"])
    look = json.loads(proc.stdout.strip().splitlines()[-1])
    assert look["label"] == "Post-local SGD"  # the class's label, learned from the scenario
    assert look["colour"] not in {entry.colour for entry in BUILT_IN} | {UNKNOWN_COLOUR}


CHECKS = "user_algorithm_checks.py"


TestUserAlgorithmChecks = mpi_check_suite(CHECKS, (RANKS,), checks=3, doc="""What Post-local SGD computes:
    switch_at past the last iteration: Allreduce-SGD (the built-in's models bit for bit);
    switch_at 0: Local SGD with the same period (likewise); in between, gradient averaging up to
    the switch, then a model average after every period-th local step counted from it.""")


# -- validation ----------------------------------------------------------------------------------

USER_MODULE = '''\
from pydantic import Field

from harness.algorithms import Algorithm, AlgorithmParams, ParamError, PositiveInt


class Good(Algorithm):
    class Params(AlgorithmParams):
        period: PositiveInt = 2


class Other(Good):
    pass


class NoParams(Algorithm):
    pass


class DictParams(Algorithm):
    Params = dict


class EvenRanks(Good):
    class Params(AlgorithmParams):
        pairs: PositiveInt = 1

        def check(self, ranks):
            if ranks % 2:
                raise ParamError("pairs", f"needs an even number of ranks (ranks is {ranks})", self.pairs)


class ClassParam(Algorithm):
    class Params(AlgorithmParams):
        klass: str = Field("x", alias="class")


class BadLabel(Good):
    label = ""


class NotAlgorithm:
    pass


def function():
    pass
'''

WORKLOAD = {"model": "logreg", "dataset": "digits", "batch_size": 8, "iterations": 4}


def entry(**fields) -> dict:
    return {"name": "mine", "class": "user_algos:Good", **fields}


BAD_ENTRIES = {  # id: (entry, field, what the error says)
    "no module": (entry(**{"class": "no_such_module_here:Good"}), "class",
                  ("module 'no_such_module_here' does not import: ModuleNotFoundError: No module named "
                   "'no_such_module_here' (got 'no_such_module_here:Good')")),
    "module raises": (entry(**{"class": "broken_algos:Good"}), "class",
                      ("module 'broken_algos' does not import: RuntimeError: broken on purpose "
                       "(got 'broken_algos:Good')")),
    "no attribute": (entry(**{"class": "user_algos:Missing"}), "class", "has no attribute 'Missing'"),
    "not a subclass": (entry(**{"class": "user_algos:NotAlgorithm"}), "class",
                       "is class NotAlgorithm, not a subclass of harness.algorithms.Algorithm"),
    "a function": (entry(**{"class": "user_algos:function"}), "class",
                   "is a function, not a subclass of harness.algorithms.Algorithm"),
    "no Params": (entry(**{"class": "user_algos:NoParams"}), "class",
                  "NoParams has no parameter model: give it a class attribute Params"),
    "Params not a model": (entry(**{"class": "user_algos:DictParams"}), "class",
                           ("DictParams.Params is <class 'dict'>, not a subclass of "
                            "harness.algorithms.AlgorithmParams")),
    "Params takes class": (entry(**{"class": "user_algos:ClassParam"}), "class",
                           "ClassParam.Params declares a parameter 'class'"),
    "bad label": (entry(**{"class": "user_algos:BadLabel"}), "class",
                  "BadLabel.label must be a non-empty string or None, not ''"),
    "bad form": (entry(**{"class": "user_algos.Good"}), "class",
                 "not an import reference of the form 'module:attribute'"),
    "not a string": (entry(**{"class": 3}), "class", "must be a string 'module:Class' (got 3)"),
    "bad value": (entry(period=0), "period", "must be >= 1 (got 0)"),
    "bad type": (entry(period="2"), "period", "must be an integer (got '2')"),
    # (the list may go on with keys every algorithm has, e.g. optimizer)
    "unknown key": (entry(perod=2), "perod", "unknown key (valid: name, class, period"),
    "built-in name": (entry(name="dpsgd"), "name",
                      "is a built-in algorithm's name; give your class a name of its own (got 'dpsgd')"),
    "bad name": (entry(name="my-algo"), "name", "must be a letter, then letters, digits and '_' (got 'my-algo')"),
}


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("user_algos")
    (root / "user_algos.py").write_text(USER_MODULE)
    (root / "broken_algos.py").write_text('raise RuntimeError("broken on purpose\\nsecond line")\n')
    return root


def validate(directory: Path, algorithms: list, **fields) -> subprocess.CompletedProcess:
    path = directory / "scenario.yaml"
    path.write_text(yaml.safe_dump({"name": "mine", "ranks": 3, "workload": WORKLOAD, "algorithms": algorithms,
                                    **fields}))
    return harness_cli("validate", str(path), cwd=directory)


def written(directory: Path) -> set[str]:
    """The files under ``directory``, but Python's bytecode cache of the user's modules."""
    return {str(p.relative_to(directory)) for p in directory.rglob("*") if "__pycache__" not in p.parts}


@pytest.mark.parametrize("case", list(BAD_ENTRIES))
@pytest.mark.subprocess
def test_validate_names_the_field_of_a_bad_entry(user_dir, tmp_path, case):
    bad, field, message = BAD_ENTRIES[case]
    for module in ("user_algos.py", "broken_algos.py"):
        shutil.copy(user_dir / module, tmp_path / module)
    before = written(tmp_path) | {"scenario.yaml"}
    proc = validate(tmp_path, ["allreduce_sgd", bad])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f": algorithms[1].{field}: " in lines[0] and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert written(tmp_path) == before


@pytest.mark.subprocess
def test_validate_refuses_one_name_for_two_classes_and_a_rank_count_the_class_refuses(user_dir):
    proc = validate(user_dir, [entry(), entry(**{"class": "user_algos:Other"})])
    assert proc.returncode == 2
    assert "algorithms[1].name: already names another algorithm class (user_algos:Good)" in proc.stderr
    proc = validate(user_dir, [entry(**{"class": "user_algos:EvenRanks"})])
    assert proc.returncode == 2
    assert "algorithms[0].pairs: needs an even number of ranks (ranks is 3) (got 1)" in proc.stderr
    proc = validate(user_dir, [{"name": "post", "class": REFERENCE, "switch_at": -1}], python_path=[str(EXAMPLE)])
    assert proc.returncode == 2
    assert "algorithms[0].switch_at: must be >= 0 (got -1)" in proc.stderr


@pytest.mark.subprocess
def test_one_class_under_two_names_with_their_own_parameters(user_dir):
    proc = validate(user_dir, [entry(), entry(name="mine_slow", period=8), "allreduce_sgd"])
    assert proc.returncode == 0, proc.stderr
    assert "mine class=user_algos:Good period=2" in proc.stdout
    assert "mine_slow class=user_algos:Good period=8" in proc.stdout


@pytest.fixture
def registrations():
    """Forget the algorithms a test registered in this process (other tests list the registry)."""
    from harness.algorithms.registry import names, unregister

    before = names()
    yield
    for name in names():
        if name not in before:
            unregister(name)


def test_a_validated_entry_round_trips_through_the_resolved_scenario(registrations, tmp_path):
    from harness.algorithms import algorithm_class, registration
    from harness.scenario import load_scenario, scenario_from_dict

    scenario = load_scenario(EXAMPLE / "scenario.yaml")
    resolved = scenario.resolved_dict()
    assert resolved["python_path"] == [str(EXAMPLE)]
    assert resolved["algorithms"][2] == {"name": NAME, "class": REFERENCE, "switch_at": SWITCH_AT, "period": PERIOD}
    elsewhere = tmp_path / "run"  # the run directory: python_path is absolute, so it still finds the class
    elsewhere.mkdir()
    again = scenario_from_dict(yaml.safe_load(yaml.safe_dump(resolved)), base_dir=elsewhere)
    assert again == scenario and again.resolved_dict() == resolved
    cls = algorithm_class(NAME)
    assert cls.__name__ == "PostLocalSGD" and cls.__module__ == "post_local_sgd"
    assert (registration(NAME).label, registration(NAME).family) == ("Post-local SGD", None)
