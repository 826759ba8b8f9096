"""A scenario's own model and dataset (``"module:callable"``): loading, checks, errors, example 1."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, harness_cli, save_test_calibration

from harness.cli import main
from harness.scenario import load_scenario, scenario_from_dict
from harness.scenario.checks import check_user_code
from harness.workload import (
    build_model,
    communicated_floats,
    flat_params,
    load_dataset,
    parameter_count,
    scenario_dataset,
    scenario_model,
)
from harness.workload.names import WorkloadCodeError

EXAMPLE = REPO / "examples" / "own_model_data" / "scenario.yaml"

# A module with a model and a dataset callable that satisfy the contract; each error case
# below replaces one of them.
GOOD = """
import torch
from torch import nn

def net(input_shape, num_classes, hidden=0):
    c, h, w = input_shape
    layers = [nn.Flatten(), nn.Linear(c * h * w, hidden or num_classes)]
    if hidden:
        layers += [nn.ReLU(), nn.Linear(hidden, num_classes)]
    return nn.Sequential(*layers)

def data(seed, n=40, classes=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 2, 2, generator=g)
    y = torch.arange(n) % classes
    return x[:30], y[:30], x[30:], y[30:]
"""


@pytest.fixture(autouse=True)
def isolated_imports(monkeypatch):
    """sys.path and sys.modules as they were after each test: loading a reference puts the
    scenario's directory in front of sys.path and its module (the example's are named `model`
    and `data`) into sys.modules, where later tests would find them first."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        file = getattr(sys.modules[name], "__file__", None) or ""
        if file and not file.startswith((sys.prefix, sys.base_prefix, str(REPO / "harness"))):
            del sys.modules[name]


def _scenario_file(directory: Path, module: str, source: str, **workload) -> Path:
    """A scenario beside ``module``.py (``source``) that names its ``net`` and ``data``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{module}.py").write_text(textwrap.dedent(source))
    doc = {
        "name": module,
        "ranks": 2,
        "workload": {"model": f"{module}:net", "dataset": f"{module}:data", "batch_size": 4, "iterations": 2,
                     **workload},
        "algorithms": ["allreduce_sgd"],
    }
    path = directory / f"{module}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


# (case id, module source, workload overrides, field named, fragment of the reason)
ERRORS = [
    ("no_import", "import uw_no_such_package_xyz\n" + GOOD, {}, "workload.model",
     "does not import: ModuleNotFoundError: No module named 'uw_no_such_package_xyz'"),
    ("no_attribute", GOOD, {"model": "MOD:nothing_here"}, "workload.model", "has no attribute 'nothing_here'"),
    ("not_callable", GOOD + "\nNUMBER = 3\n", {"model": "MOD:NUMBER"}, "workload.model", "not a callable"),
    ("model_raises", GOOD + "\ndef net(input_shape, num_classes):\n    raise ValueError('no such layer\\nmore')\n",
     {}, "workload.model", "raised ValueError: no such layer ("),
    ("model_not_module", GOOD + "\ndef net(input_shape, num_classes):\n    return 3\n", {}, "workload.model",
     "returned a int, not a torch.nn.Module"),
    ("model_wrong_output", GOOD + "\ndef net(input_shape, num_classes):\n    return nn.Sequential(nn.Flatten(), "
     "nn.Linear(4, num_classes + 2))\n", {}, "workload.model",
     "output for 2 samples is shape (2, 5); it must be float logits of shape (batch, num_classes) = (2, 3)"),
    ("model_forward_fails", GOOD + "\ndef net(input_shape, num_classes):\n    return nn.Linear(7, num_classes)\n",
     {}, "workload.model", "forward pass on 2 training samples of shape (1, 2, 2) raised RuntimeError"),
    ("model_float64", GOOD + "\ndef net(input_shape, num_classes):\n    return nn.Sequential(nn.Flatten(), "
     "nn.Linear(4, num_classes)).double()\n", {}, "workload.model", "is torch.float64; parameters must be float32"),
    ("model_no_parameters", GOOD + "\ndef net(input_shape, num_classes):\n    return nn.Flatten()\n", {},
     "workload.model", "without parameters"),
    ("model_args_unknown", GOOD, {"model_args": {"depth": 3}}, "workload.model_args",
     "got an unexpected keyword argument 'depth'"),
    ("model_args_reserved", GOOD, {"model_args": {"num_classes": 3}}, "workload.model_args",
     "num_classes is set by the harness"),
    ("dataset_without_seed", GOOD + "\ndef data(n=4):\n    return None\n", {}, "workload.dataset",
     "must take the keyword arguments seed=..."),
    ("dataset_args_unknown", GOOD, {"dataset_args": {"size": 3}}, "workload.dataset_args",
     "got an unexpected keyword argument 'size'"),
    ("dataset_raises", GOOD + "\ndef data(seed):\n    raise OSError('no file data.npz')\n", {}, "workload.dataset",
     "raised OSError: no file data.npz"),
    ("dataset_wrong_type", GOOD + "\ndef data(seed):\n    return {'x': 1}\n", {}, "workload.dataset",
     "returned a dict; a dataset callable returns (train_x, train_y, test_x, test_y) tensors"),
    ("dataset_three_tensors", GOOD + "\ndef data(seed):\n    return torch.zeros(4, 1, 2, 2), torch.zeros(4), "
     "torch.zeros(2)\n", {}, "workload.dataset", "returned a tuple of 3 (Tensor, Tensor, Tensor)"),
    ("inputs_not_float", GOOD + "\ndef data(seed):\n    x = torch.zeros(4, 1, 2, 2, dtype=torch.uint8)\n"
     "    y = torch.zeros(4, dtype=torch.int64)\n    return x, y, x, y\n", {}, "workload.dataset",
     "train_x has dtype torch.uint8; inputs must be floating point"),
    ("labels_not_int64", GOOD + "\ndef data(seed):\n    x = torch.zeros(4, 1, 2, 2)\n"
     "    y = torch.zeros(4, dtype=torch.int32)\n    return x, y, x, y\n", {}, "workload.dataset",
     "train_y has dtype torch.int32; labels must be int64"),
    ("inputs_wrong_dims", GOOD + "\ndef data(seed):\n    x = torch.zeros(4, 4)\n"
     "    y = torch.zeros(4, dtype=torch.int64)\n    return x, y, x, y\n", {}, "workload.dataset",
     "train_x has shape (4, 4); inputs must be N x C x H x W"),
    ("labels_wrong_dims", GOOD + "\ndef data(seed):\n    x = torch.zeros(4, 1, 2, 2)\n"
     "    y = torch.zeros(4, 1, dtype=torch.int64)\n    return x, y, x, y\n", {}, "workload.dataset",
     "train_y has shape (4, 1); labels must be 1-D"),
    ("lengths_differ", GOOD + "\ndef data(seed):\n    x = torch.zeros(4, 1, 2, 2)\n"
     "    y = torch.zeros(3, dtype=torch.int64)\n    return x, y, x[:3], y\n", {}, "workload.dataset",
     "train_x has 4 samples but train_y 3"),
    ("test_split_empty", GOOD + "\ndef data(seed):\n    x = torch.zeros(4, 1, 2, 2)\n"
     "    y = torch.zeros(4, dtype=torch.int64)\n    return x, y, x[:0], y[:0]\n", {}, "workload.dataset",
     "the test split is empty"),
    ("shapes_differ", GOOD + "\ndef data(seed):\n    x = torch.zeros(4, 1, 2, 2)\n"
     "    y = torch.zeros(4, dtype=torch.int64)\n    return x, y, torch.zeros(4, 1, 3, 3), y\n", {},
     "workload.dataset", "train inputs are (1, 2, 2) but test inputs (1, 3, 3)"),
    ("negative_label", GOOD + "\ndef data(seed):\n    x = torch.zeros(4, 1, 2, 2)\n"
     "    y = torch.tensor([0, 1, -1, 0])\n    return x, y, x, y\n", {}, "workload.dataset",
     "train_y has label -1; labels must be >= 0"),
    ("label_not_below_num_classes", GOOD, {"num_classes": 2}, "workload.num_classes",
     "has label 2, but num_classes is 2"),
    ("fewer_samples_than_ranks", GOOD + "\ndef data(seed):\n    x = torch.zeros(1, 1, 2, 2)\n"
     "    y = torch.zeros(1, dtype=torch.int64)\n    return x, y, x, y\n", {}, "workload.dataset",
     "has 1 training samples, fewer than the 2 ranks"),
    ("dataset_items_not_pairs", GOOD + "\ndef data(seed):\n    return [torch.zeros(1, 2, 2)] * 3, "
     "[torch.zeros(1, 2, 2)] * 2\n", {}, "workload.dataset", "train[0] is a tensor of shape (1, 2, 2) and dtype "
     "torch.float32; items must be (input, label) pairs"),
    ("dataset_float_labels", GOOD + "\ndef data(seed):\n    return [(torch.zeros(1, 2, 2), 0.5)] * 3, "
     "[(torch.zeros(1, 2, 2), 1)] * 2\n", {}, "workload.dataset", "train[0]'s label is a float; labels are integers"),
]


@pytest.mark.parametrize(("case", "source", "workload", "field", "reason"), ERRORS, ids=[e[0] for e in ERRORS])
def test_user_code_errors_name_the_field_and_write_nothing(tmp_path, capsys, case, source, workload, field, reason):
    module = f"uw_{case}"
    workload = {k: v.replace("MOD", module) if isinstance(v, str) else v for k, v in workload.items()}
    path = _scenario_file(tmp_path / "scenario", module, source, **workload)
    # validate: exit 2, one error line `FILE: FIELD: reason (got VALUE)`
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}: {field}: "), err
    assert reason in err, err
    assert "\n" not in err and "Traceback" not in err
    # run: exit 2 before anything is written or launched
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out)]) == 2
    assert f"{path}: {field}: " in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.subprocess
def test_validate_error_through_the_command_line(tmp_path):
    path = _scenario_file(tmp_path, "uw_cli", GOOD, model_args={"depth": 3})
    proc = harness_cli("validate", str(path), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {path}: workload.model_args: uw_cli:net cannot be called"), proc.stderr
    proc = harness_cli("run", str(path), "--out", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 2 and "workload.model_args" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_good_user_code_passes_and_is_what_the_ranks_build(tmp_path):
    path = _scenario_file(tmp_path, "uw_good", GOOD, model_args={"hidden": 5}, dataset_args={"n": 50, "classes": 4})
    scenario = load_scenario(path)
    assert scenario.python_path == [str(tmp_path)]
    check_user_code(scenario, str(path))
    data = scenario_dataset(scenario)
    # dataset_args reach the callable (n=50: 30 train, 20 test; 4 classes), num_classes from the labels
    assert (data.num_train, data.num_test, data.num_classes, data.input_shape) == (30, 20, 4, (1, 2, 2))
    model = scenario_model(scenario, data)
    # model_args reach the callable: a hidden layer of 5 units
    assert [p.shape for p in model.parameters()] == [(5, 4), (5,), (4, 5), (4,)]
    real = flat_params(model).numel()
    assert communicated_floats(scenario) == parameter_count("uw_good:net", (1, 2, 2), 4, {"hidden": 5}) == real
    # the same seed, the same initial model (torch is seeded around the call)
    assert torch.equal(flat_params(scenario_model(scenario, data)), flat_params(model))


def test_num_classes_widens_the_head(tmp_path):
    path = _scenario_file(tmp_path, "uw_classes", GOOD, num_classes=7)
    scenario = load_scenario(path)
    check_user_code(scenario)
    data = scenario_dataset(scenario)
    assert data.num_classes == 7 and int(data.train_y.max()) == 2
    assert scenario_model(scenario, data)(data.test_x).shape == (10, 7)


def test_dataset_pair_is_read_into_tensors(tmp_path):
    source = GOOD + textwrap.dedent("""
        import numpy as np

        class Squares(torch.utils.data.Dataset):
            def __init__(self, n):
                self.n = n
            def __len__(self):
                return self.n
            def __getitem__(self, i):
                return np.full((1, 2, 2), i, dtype=np.float32), np.int64(i % 3)

        def data(seed):
            train = torch.utils.data.TensorDataset(torch.arange(24.0).reshape(6, 1, 2, 2), torch.arange(6) % 2)
            return train, Squares(4)
    """)
    path = _scenario_file(tmp_path, "uw_pair", source)
    scenario = load_scenario(path)
    check_user_code(scenario)
    data = scenario_dataset(scenario)
    assert torch.equal(data.train_x, torch.arange(24.0).reshape(6, 1, 2, 2))
    assert data.train_y.tolist() == [0, 1, 0, 1, 0, 1] and data.train_y.dtype == torch.int64
    assert data.test_x[:, 0, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0] and data.test_y.tolist() == [0, 1, 2, 0]
    assert data.num_classes == 3


def test_tuple_dataset_keeps_values_and_converts_to_float32():
    x = torch.arange(16, dtype=torch.float64).reshape(4, 1, 2, 2)
    y = torch.tensor([0, 2, 1, 0])
    from harness.workload.data import dataset_from_return

    data = dataset_from_return("mine", (x, y, x[:2], y[:2]))
    assert data.train_x.dtype == torch.float32 and torch.equal(data.train_x, x.float())
    assert (data.num_classes, data.name) == (3, "mine")
    with pytest.raises(WorkloadCodeError, match="has label 2, but num_classes is 2") as info:
        dataset_from_return("mine", (x, y, x, y), classes=2)
    assert info.value.field == "num_classes"


def test_module_beside_the_scenario_comes_before_sys_path(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "uw_shadow.py").write_text("raise ImportError('the sys.path copy was imported')\n")
    sys.path.insert(0, str(elsewhere))
    path = _scenario_file(tmp_path / "scenario", "uw_shadow", GOOD)
    scenario = load_scenario(path)
    check_user_code(scenario)
    assert Path(sys.modules["uw_shadow"].__file__).parent == tmp_path / "scenario"
    # A python_path given in the file is searched first, relative to the file.
    (tmp_path / "scenario" / "lib").mkdir()
    (tmp_path / "scenario" / "lib" / "uw_lib.py").write_text(textwrap.dedent(GOOD))
    doc = yaml.safe_load(path.read_text())
    doc.update(name="lib", python_path=["lib"])
    doc["workload"].update(model="uw_lib:net", dataset="uw_lib:data")
    (tmp_path / "scenario" / "lib.yaml").write_text(yaml.safe_dump(doc))
    scenario = load_scenario(tmp_path / "scenario" / "lib.yaml")
    assert scenario.python_path == [str(tmp_path / "scenario" / "lib")]
    check_user_code(scenario)


def test_parameter_count_of_a_model_that_cannot_be_built_on_meta(tmp_path):
    source = GOOD + textwrap.dedent("""
        def net(input_shape, num_classes):
            model = nn.Sequential(nn.Flatten(), nn.Linear(4, num_classes))
            assert model[1].weight.abs().sum().item() >= 0  # reads values: impossible on the meta device
            return model
    """)
    (tmp_path / "uw_meta.py").write_text(source)
    count = parameter_count("uw_meta:net", (1, 2, 2), 3, search_path=[str(tmp_path)])
    assert count == flat_params(build_model("uw_meta:net", (1, 2, 2), 3, 0, search_path=[str(tmp_path)])).numel()
    assert "uw_meta" in sys.modules  # imported from tmp_path, the search path given
    assert count == 4 * 3 + 3


def test_built_ins_take_dataset_args_through_the_same_path():
    doc = {"name": "s", "ranks": 2, "algorithms": ["allreduce_sgd"],
           "workload": {"model": "tiny_cnn", "dataset": "synthetic", "batch_size": 4, "iterations": 2,
                        "dataset_args": {"input_shape": [3, 12, 10], "num_classes": 4, "num_samples": 100}}}
    scenario = scenario_from_dict(doc)
    check_user_code(scenario)  # built-ins with arguments are checked too
    data = scenario_dataset(scenario)
    assert (data.input_shape, data.num_classes, data.num_train + data.num_test) == ((3, 12, 10), 4, 100)
    assert communicated_floats(scenario) == flat_params(scenario_model(scenario, data)).numel()
    doc["workload"]["dataset_args"] = {"num_samples": -1}
    with pytest.raises(Exception, match=r"workload\.dataset: synthetic raised ValueError"):
        check_user_code(scenario_from_dict(doc))
    with pytest.raises(WorkloadCodeError, match="unknown dataset"):
        load_dataset("cifar10", seed=0)


def test_calibration_plan_labels_user_workloads(tmp_path):
    from harness.calibrate.measure import Plan, plan_from_scenarios

    path = _scenario_file(tmp_path, "uw_plan", GOOD, model_args={"hidden": 5}, num_classes=4)
    plan = plan_from_scenarios([load_scenario(path)])
    (workload,) = plan.workloads
    assert workload.key == ("uw_plan:net(hidden=5, num_classes=4)", "uw_plan:data", 4)
    assert workload.python_path == (str(tmp_path),)
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_example_model_keeps_batchnorm_buffers_out_of_the_flat_view_and_moves_to_a_device():
    from harness.device import dataset_on

    scenario = load_scenario(EXAMPLE)
    data = scenario_dataset(scenario)
    model = scenario_model(scenario, data)
    buffers = [name for name, _ in model.named_buffers() if "running" in name]
    assert buffers  # the example's ResNet has BatchNorm
    assert flat_params(model).numel() == sum(p.numel() for p in model.parameters()) == communicated_floats(scenario)
    # the device path moves a user's dataset like a built-in one (meta: a device other than the CPU anywhere)
    moved = dataset_on(data, torch.device("meta"))
    assert {t.device.type for t in (moved.train_x, moved.train_y, moved.test_x, moved.test_y)} == {"meta"}
    assert (moved.input_shape, moved.num_classes, moved.name) == ((3, 32, 32), 6, "data:textures")


# -- example 1 ------------------------------------------------------------------------------------
@pytest.mark.mpi
def test_example_runs_and_simulates(tmp_path):
    """examples/own_model_data: a small ResNet with BatchNorm on CIFAR-shaped images of the
    example's own, under random stragglers: trained for real, then simulated."""
    out = tmp_path / "out"
    proc = harness_cli("run", str(EXAMPLE), "--ranks", "3", "--iterations", "6", "--out", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (out / "own_model_data").iterdir()
    steps = pd.read_csv(run / "steps.csv")
    summary = pd.read_csv(run / "summary.csv").set_index("algorithm")
    assert list(summary.index) == ["allreduce_sgd", "sgp", "wagma"]
    assert len(steps) == 3 * 3 * 6 and (steps["injected_delay_s"] > 0).any()
    assert summary["complete"].all() and summary["final_accuracy"].between(0, 1).all()
    assert (run / "provenance" / "initial_model.pt").exists() and (run / "provenance" / "shards.npz").exists()

    scenario = load_scenario(EXAMPLE, overrides={"ranks": 3, "iterations": 6})
    model, dataset = ("model:small_resnet(width=8)", "data:textures(noise=2.0, num_classes=6, num_samples=1200)")
    calibration = save_test_calibration(tmp_path / "calibration.json", 3, [(model, dataset, 16, 0.01)])
    proc = harness_cli("simulate", str(EXAMPLE), "--ranks", "3", "--iterations", "6", "--calibration",
                       str(calibration), "--out", str(tmp_path / "sim"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sim,) = (tmp_path / "sim" / "own_model_data").iterdir()
    simulated = pd.read_csv(sim / "steps.csv")
    # The simulator communicates the example model's own size, as the real ranks did.
    for name in ("allreduce_sgd", "sgp"):
        assert (simulated[simulated.algorithm == name]["bytes_sent"].max()
                == steps[steps.algorithm == name]["bytes_sent"].max()), name
    assert communicated_floats(scenario) == flat_params(scenario_model(scenario, scenario_dataset(scenario))).numel()
