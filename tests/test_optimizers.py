"""The scenario's ``optimizer:``: sgd (default), adam, adamw and the user's ``"module:callable"``.

Schema defaults and errors per form; Adam/AdamW built over flat-view models give torch's own
numbers (also through the runner's staging and with the foreach and fused implementations); a
user's optimizer found beside its scenario file, and each way it can be wrong; one short run under
mpiexec with AdamW.
"""

from __future__ import annotations

import inspect
import json
import sys
import uuid

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml

from conftest import harness_cli, run_scenario
from harness.algorithms.base import AlgorithmContext
from harness.algorithms.registry import algorithm_class, params_model
from harness.errors import ParamError
from harness.injection import InjectionPlan
from harness.runner.flat_sgd import FlatSGD
from harness.runner.local_work import LocalWork
from harness.runner.optimizers import build_optimizer, check_optimizer, small_model
from harness.runner.workload_state import build_state
from harness.scenario import ScenarioError, load_scenario, scenario_from_dict
from harness.scenario.schema import (
    AdamOptimizer,
    AdamWOptimizer,
    ReferenceOptimizer,
    SGDOptimizer,
)
from harness.workload import build_model, flat_grads, flat_params, load_dataset

BASE = {
    "name": "opt",
    "ranks": 3,
    "seed": 7,
    "workload": {"model": "logreg", "dataset": "digits", "batch_size": 16, "iterations": 6, "eval_every": 3},
    "algorithms": ["allreduce_sgd"],
}


def scenario(optimizer=None, **changes):
    data = {**BASE, **changes}
    if optimizer is not None:
        data["optimizer"] = optimizer
    return scenario_from_dict(data)


def error_of(optimizer) -> str:
    with pytest.raises(ScenarioError) as info:
        scenario(optimizer)
    return str(info.value).removeprefix("<dict>: ")


# ---------------------------------------------------------------------------------------------
# schema


def test_old_scenarios_keep_momentum_sgd_with_the_same_fields():
    assert scenario().optimizer == SGDOptimizer()
    s = scenario({"lr": 0.1, "momentum": 0.5, "nesterov": True, "weight_decay": 0.0})
    assert isinstance(s.optimizer, SGDOptimizer)
    assert s.optimizer.model_dump() == {"name": "sgd", "lr": 0.1, "momentum": 0.5, "nesterov": True,
                                        "weight_decay": 0.0}
    assert scenario("sgd").optimizer == scenario({"name": "sgd"}).optimizer == SGDOptimizer()


@pytest.mark.parametrize("name, cls, torch_cls", [("adam", AdamOptimizer, torch.optim.Adam),
                                                  ("adamw", AdamWOptimizer, torch.optim.AdamW)])
def test_adam_defaults_are_torchs(name, cls, torch_cls):
    spec = scenario(name).optimizer
    assert type(spec) is cls and spec == scenario({"name": name}).optimizer
    signature = inspect.signature(torch_cls).parameters
    for field in ("lr", "eps", "weight_decay", "amsgrad"):
        assert getattr(spec, field) == signature[field].default, field
    assert tuple(spec.betas) == signature["betas"].default
    assert spec.weight_decay == (0.01 if name == "adamw" else 0.0)


def test_reference_form():
    spec = scenario({"name": "my_opts:make", "lr": 0.02, "args": {"momentum": 0.5}}).optimizer
    assert isinstance(spec, ReferenceOptimizer)
    assert (spec.name, spec.lr, spec.args) == ("my_opts:make", 0.02, {"momentum": 0.5})
    assert scenario({"name": "torch.optim:RMSprop", "lr": 0.01}).optimizer.args == {}


def test_every_form_exposes_the_lr_the_algorithms_get():
    assert scenario().optimizer.lr == 0.05
    assert scenario("adamw").optimizer.lr == 1e-3
    assert scenario({"name": "adam", "lr": 3e-4}).optimizer.lr == 3e-4
    assert scenario({"name": "m:f", "lr": 0.2}).optimizer.lr == 0.2


@pytest.mark.parametrize("optimizer, message", [
    ("adamx", "optimizer.name: unknown optimizer (valid: sgd, adam, adamw, or 'module:callable') (got 'adamx')"),
    ({"name": "Adam"}, "optimizer.name: unknown optimizer (valid: sgd, adam, adamw, or 'module:callable') (got 'Adam')"),
    ({"name": 3}, "optimizer.name: unknown optimizer (valid: sgd, adam, adamw, or 'module:callable') (got 3)"),
    (5, ("optimizer: must be an optimizer name (sgd, adam, adamw or 'module:callable') or a mapping with `name:` "
         "and its parameters (got 5)")),
    ({"name": "adam", "momentum": 0.9},
     "optimizer.momentum: unknown key (valid: name, lr, betas, eps, weight_decay, amsgrad) (got 'momentum')"),
    ({"betas": [0.9, 0.99]},
     "optimizer.betas: unknown key (valid: name, lr, momentum, nesterov, weight_decay) (got 'betas')"),
    ({"name": "m:f", "lr": 0.1, "momentum": 0.9}, "optimizer.momentum: unknown key (valid: name, lr, args) (got 'momentum')"),
    ({"name": "adamw", "betas": [0.9, 1.0]}, "optimizer.betas[1]: must be < 1 (got 1.0)"),
    ({"name": "adam", "betas": [-0.1, 0.9]}, "optimizer.betas[0]: must be >= 0 (got -0.1)"),
    ({"name": "adam", "betas": [0.9]}, "optimizer.betas: must have at least 2 item(s) (got [0.9])"),
    ({"name": "adam", "betas": 0.9}, "optimizer.betas: must be a list (got 0.9)"),
    ({"name": "adamw", "lr": 0}, "optimizer.lr: must be > 0 (got 0)"),
    ({"name": "adam", "eps": -1e-8}, "optimizer.eps: must be >= 0 (got -1e-08)"),
    ({"name": "adamw", "weight_decay": -0.1}, "optimizer.weight_decay: must be >= 0 (got -0.1)"),
    ({"name": "adam", "amsgrad": "yes"}, "optimizer.amsgrad: must be true or false (got 'yes')"),
    ({"name": "sgd", "momentum": 1.0}, "optimizer.momentum: must be < 1 (got 1.0)"),
    ({"momentum": 0.0, "nesterov": True}, "optimizer.nesterov: needs momentum > 0 (got True)"),
    ({"name": "m:f"}, "optimizer.lr: required field missing"),
    ({"name": "my opts:make", "lr": 0.1},
     ("optimizer.name: not an import reference of the form 'module:attribute' (e.g. 'mynet:build') "
      "(got 'my opts:make')")),
    ({"name": "m:f", "lr": 0.1, "args": {"lr": 0.5}}, "optimizer.args.lr: give it as optimizer.lr (got 0.5)"),
    ({"name": "m:f", "lr": 0.1, "args": {"params": []}},
     "optimizer.args.params: the model's parameters are passed by the harness (got [])"),
    ({"name": "m:f", "lr": 0.1, "args": [1]}, "optimizer.args: must be a mapping (got [1])"),
])
def test_errors_name_the_field(optimizer, message):
    assert error_of(optimizer) == message


ROUND_TRIPS = [
    None, "sgd", {"lr": 0.1, "nesterov": True}, "adam", "adamw",
    {"name": "adamw", "betas": [0.8, 0.9], "amsgrad": True, "eps": 0},
    # "1e-4" stays a string: the loader reads YAML 1.2 floats, so the dump must quote it.
    {"name": "m:f", "lr": 0.1, "args": {"betas": [0.5, 0.6], "fused": False, "tag": "1e-4"}},
]


@pytest.mark.parametrize("optimizer", ROUND_TRIPS)
def test_resolved_scenario_round_trips(optimizer, tmp_path):
    path = tmp_path / "opt.yaml"
    path.write_text(yaml.safe_dump({**BASE, **({} if optimizer is None else {"optimizer": optimizer})}))
    s = load_scenario(path)
    resolved = tmp_path / "scenario.resolved.yaml"
    resolved.write_text(yaml.safe_dump(s.resolved_dict()))
    again = load_scenario(resolved)
    assert again == s and again.optimizer == s.optimizer
    assert yaml.safe_load(resolved.read_text())["optimizer"]["name"] == s.optimizer.name


def test_a_reference_puts_the_scenario_directory_on_the_search_path(tmp_path):
    path = tmp_path / "opt.yaml"
    path.write_text(yaml.safe_dump({**BASE, "optimizer": {"name": "m:f", "lr": 0.1}}))
    assert load_scenario(path).python_path == [str(tmp_path)]
    path.write_text(yaml.safe_dump({**BASE, "optimizer": "adamw"}))
    assert load_scenario(path).python_path == []


# ---------------------------------------------------------------------------------------------
# built-in optimizers on the flat buffers


def flat_model(seed=0):
    model = build_model("tiny_cnn", (1, 8, 8), 10, seed=seed)
    return model, flat_params(model), flat_grads(model)


def batches(n=4):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 1, 8, 8, generator=generator), torch.randint(0, 10, (8,), generator=generator))
            for _ in range(n)]


def train(model, optimizer, data):
    for x, y in data:
        optimizer.zero_grad(set_to_none=False)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def assert_views(model, flat, grads):
    offset = 0
    for p in model.parameters():
        assert p.data_ptr() == flat[offset:].data_ptr() and p.grad.data_ptr() == grads[offset:].data_ptr()
        offset += p.numel()
    assert torch.equal(flat, torch.cat([p.detach().reshape(-1) for p in model.parameters()]))


def test_sgd_is_flat_sgd_with_the_scenarios_numbers():
    model, flat, grads = flat_model()
    opt = build_optimizer(scenario({"lr": 0.1, "momentum": 0.5, "nesterov": True, "weight_decay": 0.0}).optimizer,
                          model)
    assert isinstance(opt, FlatSGD) and opt.params is flat and opt.grads is grads
    assert (opt.lr, opt.momentum, opt.nesterov, opt.weight_decay) == (0.1, 0.5, True, 0.0)


@pytest.mark.parametrize("optimizer, torch_cls", [
    ({"name": "adam", "lr": 0.01, "weight_decay": 1e-3}, torch.optim.Adam),
    ({"name": "adamw", "lr": 0.01, "betas": [0.8, 0.95], "amsgrad": True}, torch.optim.AdamW),
])
def test_adam_on_flat_views_gives_torchs_numbers(optimizer, torch_cls):
    spec = scenario(optimizer).optimizer
    model, flat, grads = flat_model()
    opt = build_optimizer(spec, model)
    assert type(opt) is torch_cls
    plain = build_model("tiny_cnn", (1, 8, 8), 10, seed=0)
    reference = torch_cls(plain.parameters(), lr=spec.lr, betas=tuple(spec.betas), eps=spec.eps,
                          weight_decay=spec.weight_decay, amsgrad=spec.amsgrad)
    before = flat.clone()
    data = batches()
    train(model, opt, data)
    train(plain, reference, data)
    assert not torch.equal(flat, before)
    assert torch.equal(flat, torch.cat([p.detach().reshape(-1) for p in plain.parameters()]))
    assert_views(model, flat, grads)
    # What an algorithm writes into the flat buffer (a model average) is what the next step starts from.
    flat.mul_(0.5)
    assert all(torch.equal(p, q) for p, q in zip(opt.param_groups[0]["params"], model.parameters()))


@pytest.mark.parametrize("implementation", [{"foreach": True}, {"foreach": False}, {"fused": True}])
@pytest.mark.parametrize("torch_cls", [torch.optim.Adam, torch.optim.AdamW])
def test_every_torch_implementation_keeps_the_views(torch_cls, implementation):
    model, flat, grads = flat_model()
    plain = build_model("tiny_cnn", (1, 8, 8), 10, seed=0)
    data = batches()
    train(model, torch_cls(model.parameters(), lr=0.01, **implementation), data)
    train(plain, torch_cls(plain.parameters(), lr=0.01), data)
    assert_views(model, flat, grads)
    torch.testing.assert_close(flat, torch.cat([p.detach().reshape(-1) for p in plain.parameters()]))


def test_runner_state_with_staging_steps_like_torch(monkeypatch):
    """build_state and LocalWork with staged buffers (as on a GPU): the host model follows AdamW."""
    monkeypatch.setenv("HARNESS_STAGE_ON_CPU", "1")
    s = scenario({"name": "adamw", "lr": 0.01}, workload={**BASE["workload"], "model": "mlp"})
    dataset = load_dataset("digits", s.seed)
    state = build_state(s, 1, dataset)
    assert state.staging.staged and isinstance(state.optimizer, torch.optim.AdamW)
    work = LocalWork(s, state, 1, InjectionPlan.from_scenario(s), None, "allreduce_sgd")
    plain = build_model("mlp", tuple(dataset.input_shape), dataset.num_classes, s.seed)
    reference = torch.optim.AdamW(plain.parameters(), lr=0.01)
    for t in range(3):
        gradient_s, _ = work.gradient(t, 1.0)
        work.step(t, 1.0, gradient_s)
        x, y = state.batch(t, s.workload.batch_size, s.seed, 1)
        reference.zero_grad()
        F.cross_entropy(plain(x), y).backward()
        reference.step()
    assert torch.equal(state.params, torch.cat([p.detach().reshape(-1) for p in plain.parameters()]))


class OneRank:
    """A world of one rank: the mean over ranks is the value itself (no MPI in the test process)."""

    rank, size = 0, 1

    def allreduce(self, buffer, op):
        pass

    def iallreduce(self, buffer, op):
        return self

    def wait(self):
        pass


@pytest.mark.parametrize("name", ["bmuf", "overlap_local_sgd"])
def test_algorithms_that_use_lr_give_the_same_models_for_any_lr(name):
    """What docs/algorithms.md says for a non-SGD optimizer: ``ctx.lr`` (the configured lr) only sets
    the unit of BMUF's and Overlap Local SGD's momentum buffers; their models do not depend on it."""
    finals = []
    for lr in (0.05, 1e-3):
        params = torch.zeros(5)
        algorithm = algorithm_class(name)(params_model(name)(period=2), AlgorithmContext(OneRank(), params,
                                                                                         torch.zeros(5), lr, 0))
        generator = torch.Generator().manual_seed(3)
        for t in range(8):
            params.add_(torch.randn(5, generator=generator))  # any local step, Adam's included
            algorithm.after_step(t)
        algorithm.finish()
        finals.append(params)
    assert not torch.equal(finals[0], torch.zeros(5))
    torch.testing.assert_close(finals[0], finals[1])


# ---------------------------------------------------------------------------------------------
# the user's optimizer

USER_MODULE = '''
import torch

def make(params, lr, momentum=0.0):
    return torch.optim.SGD(params, lr=lr, momentum=momentum)

def raises(params, lr):
    raise RuntimeError("no optimizer today\\nsecond line")

def number(params, lr):
    return 42

def copies(params, lr):
    return torch.optim.SGD([p.detach().clone().requires_grad_() for p in params], lr=lr)

class Reseating(torch.optim.SGD):
    def step(self, closure=None):
        for p in self.param_groups[0]["params"]:
            p.data = p.data - 0.1 * p.grad

class SetsToNone(torch.optim.SGD):
    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none=True)

class StepRaises(torch.optim.SGD):
    def step(self, closure=None):
        raise ValueError("bad step")

NOT_CALLABLE = 3
'''


@pytest.fixture
def user_scenario(tmp_path, monkeypatch):
    """``(attribute, args, module_name) -> Scenario`` loaded from a file beside the user's modules:
    a fresh one per test (its own name, so no test sees another's import) and one that does not
    import. sys.path and sys.modules are restored afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    module = f"user_opts_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(USER_MODULE)
    (tmp_path / "broken_opts.py").write_text("import torch\nraise ImportError('cannot build this today')\n")

    def load(attribute, args=None, module_name=module):
        optimizer = {"name": f"{module_name}:{attribute}", "lr": 0.1, **({"args": args} if args else {})}
        path = tmp_path / "user.yaml"
        path.write_text(yaml.safe_dump({**BASE, "optimizer": optimizer}))
        return load_scenario(path)

    yield load
    for name in (module, "broken_opts"):
        sys.modules.pop(name, None)


def test_user_optimizer_is_built_with_its_args(user_scenario):
    s = user_scenario("make", {"momentum": 0.5})
    check_optimizer(s)
    model, flat, grads = flat_model()
    opt = build_optimizer(s.optimizer, model, s.python_path)
    assert type(opt) is torch.optim.SGD
    assert (opt.param_groups[0]["lr"], opt.param_groups[0]["momentum"]) == (0.1, 0.5)
    plain = build_model("tiny_cnn", (1, 8, 8), 10, seed=0)
    data = batches()
    train(model, opt, data)
    train(plain, torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.5), data)
    assert torch.equal(flat, torch.cat([p.detach().reshape(-1) for p in plain.parameters()]))
    assert_views(model, flat, grads)


def test_a_torch_optimizer_class_can_be_named_directly():
    s = scenario({"name": "torch.optim:RMSprop", "lr": 0.01, "args": {"alpha": 0.9}})
    check_optimizer(s)
    opt = build_optimizer(s.optimizer, small_model(), s.python_path)
    assert type(opt) is torch.optim.RMSprop and opt.param_groups[0]["alpha"] == 0.9


def test_user_optimizer_in_build_state(user_scenario):
    s = user_scenario("make")
    state = build_state(s, 0, load_dataset("digits", s.seed))
    assert type(state.optimizer) is torch.optim.SGD
    assert [p.data_ptr() for p in state.optimizer.param_groups[0]["params"]] == \
        [p.data_ptr() for p in state.model.parameters()]


REPLACED = ("the optimizer's step or zero_grad(set_to_none=False) replaced parameter or gradient tensors instead "
            "of updating them in place")


@pytest.mark.parametrize("attribute, args, module, reason", [
    ("make", None, "no_such_module_here",
     "module 'no_such_module_here' does not import: ModuleNotFoundError: No module named 'no_such_module_here'"),
    ("make", None, "broken_opts", "module 'broken_opts' does not import: ImportError: cannot build this today"),
    ("missing", None, None, "has no attribute 'missing'"),
    ("NOT_CALLABLE", None, None, "is a builtins.int (3), not a callable"),
    ("raises", None, None, "(params, lr=0.1, **args) raised RuntimeError: no optimizer today"),
    ("make", {"nesterov_typo": True}, None,
     "(params, lr=0.1, **args) raised TypeError: make() got an unexpected keyword argument 'nesterov_typo'"),
    ("number", None, None, "returned a builtins.int (42), not a torch.optim.Optimizer"),
    ("copies", None, None, "returned an optimizer over 4 tensor(s) that are not the model parameters it was given"),
    ("StepRaises", None, None, "the optimizer's step or zero_grad raised ValueError: bad step"),
    ("Reseating", None, None, REPLACED),
    ("SetsToNone", None, None, REPLACED),
])
def test_user_optimizer_errors_name_the_field(user_scenario, attribute, args, module, reason):
    s = user_scenario(attribute, args) if module is None else user_scenario(attribute, args, module_name=module)
    with pytest.raises(ParamError) as info:
        check_optimizer(s)
    error = info.value
    assert error.path == ("optimizer", "name") and error.value == s.optimizer.name
    assert reason in error.reason, error.reason
    assert str(error).startswith("optimizer.name: ") and "\n" not in str(error)


@pytest.mark.subprocess
def test_validate_refuses_a_broken_optimizer_before_anything_runs(user_scenario, tmp_path):
    """``python -m harness validate`` (and ``run``, through the same checks) calls the user's optimizer."""
    user_scenario("make")
    proc = harness_cli("validate", str(tmp_path / "user.yaml"))
    assert proc.returncode == 0, proc.stderr
    reference = user_scenario("number").optimizer.name
    proc = harness_cli("validate", str(tmp_path / "user.yaml"))
    assert proc.returncode == 2
    reason = "returned a builtins.int (42), not a torch.optim.Optimizer"
    assert f"user.yaml: optimizer.name: {reason} (got {reference!r})" in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------
# a real run


@pytest.mark.mpi
def test_adamw_run_under_mpiexec(tmp_path):
    data = {**BASE, "name": "adamw_run", "optimizer": {"name": "adamw", "lr": 0.01},
            "algorithms": ["allreduce_sgd"]}
    run = run_scenario(tmp_path, data)
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["finished_algorithms"] == ["allreduce_sgd"]
    steps = pd.read_csv(run / "steps.csv")
    assert len(steps) == 3 * 6 and steps.loss.notna().all() and (steps.loss.abs() < 1e3).all()
    resolved = yaml.safe_load((run / "scenario.resolved.yaml").read_text())["optimizer"]
    assert resolved == {"name": "adamw", "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
                        "amsgrad": False}
    # Same averaged gradient, same moments: Allreduce-SGD with AdamW keeps every rank's model identical,
    # and it is AdamW on the mean of the ranks' gradients, computed here in one process.
    finals = torch.load(run / "provenance" / "final_models_allreduce_sgd.pt")
    assert all(torch.equal(finals[0], finals[r]) for r in range(1, 3))
    s = load_scenario(run / "scenario.resolved.yaml")
    dataset = load_dataset("digits", s.seed)
    states = [build_state(s, r, dataset) for r in range(3)]  # each rank's model and batches
    model = build_model("logreg", tuple(dataset.input_shape), dataset.num_classes, s.seed)
    flat, grads = flat_params(model), flat_grads(model)
    reference = torch.optim.AdamW(model.parameters(), lr=0.01)
    for t in range(s.workload.iterations):
        rank_grads = []
        for r, state in enumerate(states):
            state.params.copy_(flat)
            state.grads.zero_()
            x, y = state.batch(t, s.workload.batch_size, s.seed, r)
            F.cross_entropy(state.model(x), y).backward()
            rank_grads.append(state.grads.clone())
        grads.copy_(torch.stack(rank_grads).mean(0))
        reference.step()
    torch.testing.assert_close(finals[0], flat)
