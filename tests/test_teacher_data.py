"""The ``teacher`` dataset (sized by the ranks, one test set at every rank count) and how a
dataset callable is given the scenario's ranks."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from harness.results import provenance
from harness.scenario import scenario_from_dict
from harness.scenario.checks import check_user_code
from harness.scenario.loader import ScenarioError
from harness.workload import batch_indices, build_model, dataset_facts, load_dataset, scenario_dataset, shard_indices
from harness.workload.teacher import TEACHER_BLOCK, TEACHER_SAMPLES_PER_RANK, teacher, teacher_facts
from harness.workload.names import BUILTIN_DATASET_FACTS, DATASETS, WorkloadCodeError


def _scenario(ranks: int, **workload) -> object:
    return scenario_from_dict({
        "name": "teacher", "ranks": ranks, "seed": 3,
        "workload": {"model": "mlp", "dataset": "teacher", "batch_size": 8, "iterations": 2, **workload},
        "algorithms": ["allreduce_sgd"]})


def test_registered_as_a_builtin():
    assert DATASETS["teacher"] == "harness.workload.teacher:teacher"
    data = load_dataset("teacher", seed=0)  # no ranks: one rank's share
    facts = BUILTIN_DATASET_FACTS["teacher"]
    assert (data.input_shape, data.num_classes, data.num_train + data.num_test) == (
        facts.input_shape, facts.num_classes, facts.samples)
    assert data.num_train == TEACHER_SAMPLES_PER_RANK and data.num_test == 2000
    assert data.train_x.dtype == torch.float32 and data.train_y.dtype == torch.int64


def test_deterministic_per_seed():
    a, b, c = (teacher(s, ranks=2) for s in (5, 5, 6))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0]) and not torch.equal(a[3], c[3])


def test_test_set_is_the_same_at_every_rank_count_and_size():
    small, large = teacher(1, ranks=4), teacher(1, ranks=64)
    by_total = teacher(1, num_samples=100)
    noisy = teacher(1, ranks=4, label_noise=0.3)
    for other in (large, by_total, noisy):
        assert torch.equal(small[2], other[2]) and torch.equal(small[3], other[3])


def test_a_larger_training_set_begins_with_a_smaller_one():
    # Across block boundaries too: 3 * TEACHER_BLOCK + 17 samples extend TEACHER_BLOCK + 5.
    short = teacher(2, num_samples=TEACHER_BLOCK + 5)
    long = teacher(2, num_samples=3 * TEACHER_BLOCK + 17)
    per_rank = teacher(2, samples_per_rank=TEACHER_BLOCK + 5, ranks=1)
    n = TEACHER_BLOCK + 5
    assert torch.equal(long[0][:n], short[0]) and torch.equal(long[1][:n], short[1])
    assert all(torch.equal(x, y) for x, y in zip(short, per_rank))


def test_sizes():
    assert teacher(0, ranks=8)[0].shape == (8 * TEACHER_SAMPLES_PER_RANK, 1, 8, 8)
    assert teacher(0, samples_per_rank=10, ranks=7)[1].shape == (70,)
    assert teacher(0, num_samples=123, ranks=64)[1].shape == (123,)  # fixed in total: ranks do not matter
    x, y, tx, ty = teacher(0, input_shape=(3, 4, 5), num_classes=4, num_samples=50, test_samples=30)
    assert x.shape == (50, 3, 4, 5) and tx.shape == (30, 3, 4, 5)
    assert int(max(y.max(), ty.max())) < 4
    assert teacher_facts(input_shape=(3, 4, 5), num_classes=4, num_samples=50, test_samples=30).samples == 80
    assert teacher_facts(ranks=1024).samples == 1024 * TEACHER_SAMPLES_PER_RANK + 2000


@pytest.mark.parametrize("args,wanted", [
    ({"num_samples": 100, "samples_per_rank": 10}, "give both num_samples"),
    ({"num_samples": 3, "ranks": 4}, "fewer than the 4 ranks"),
    ({"samples_per_rank": 0}, "samples_per_rank to be an integer >= 1"),
    ({"label_noise": 1.5}, "label_noise to be a fraction"),
    ({"label_noise": "0.1"}, "label_noise to be a fraction"),
    ({"input_shape": (8, 8)}, "input_shape"),
    ({"num_classes": 1}, "num_classes >= 2"),
])
def test_bad_arguments_name_dataset_args(args, wanted):
    with pytest.raises(WorkloadCodeError, match=wanted) as info:
        load_dataset("teacher", seed=0, **args)
    assert info.value.field == "dataset_args"
    assert str(info.value).startswith("teacher's dataset_args ")


def test_bad_arguments_are_a_scenario_error_at_dataset_args():
    scenario = _scenario(4, dataset_args={"num_samples": 100, "samples_per_rank": 10})
    with pytest.raises(ScenarioError, match=r"^x\.yaml: workload\.dataset_args: teacher's dataset_args give both "):
        check_user_code(scenario, "x.yaml")


@pytest.mark.parametrize("seed", range(4))
def test_classes_are_balanced(seed):
    _, y, _, ty = teacher(seed, num_samples=20000)
    for labels in (y, ty):
        share = np.bincount(labels.numpy(), minlength=10) / len(labels)
        assert share.min() > 0.07 and share.max() < 0.13, share


def test_label_noise_relabels_about_that_fraction_of_the_training_set_only():
    clean, noisy = teacher(4, num_samples=10000), teacher(4, num_samples=10000, label_noise=0.5)
    assert torch.equal(clean[0], noisy[0])  # the inputs do not depend on the noise
    changed = float((clean[1] != noisy[1]).float().mean())
    assert changed == pytest.approx(0.5 * 0.9, abs=0.03)  # a random label is the right one 1 time in 10


def test_scenario_dataset_passes_the_ranks():
    four, sixty_four = scenario_dataset(_scenario(4)), scenario_dataset(_scenario(64))
    assert (four.num_train, sixty_four.num_train) == (4 * 256, 64 * 256)  # two cache entries, not one
    assert torch.equal(four.test_x, sixty_four.test_x)
    fixed = _scenario(64, dataset_args={"ranks": 2})  # dataset_args win
    assert scenario_dataset(fixed).num_train == 2 * 256
    weak = _scenario(16, dataset_args={"samples_per_rank": 32})
    assert scenario_dataset(weak).num_train == 16 * 32
    shards = [shard_indices(weak.ranks * 32, weak.ranks, r, weak.seed) for r in range(weak.ranks)]
    assert {len(s) for s in shards} == {32}  # each rank's shard is samples_per_rank


def test_facts_follow_the_ranks_without_loading(monkeypatch):
    import harness.workload.data as data

    monkeypatch.setattr(data, "load_dataset", lambda *a, **k: pytest.fail("loaded the dataset"))
    monkeypatch.setattr(data, "_LOADED", {})
    assert dataset_facts(_scenario(1024)).samples == 1024 * 256 + 2000
    assert dataset_facts(_scenario(8, dataset_args={"num_samples": 500, "test_samples": 100})).samples == 600
    # The provenance estimate (one int64 per sample for the shards) works at any rank count.
    assert provenance.expected_bytes(provenance.resolve(_scenario(1024)), 1) > 8 * 1024 * 256


def test_a_users_dataset_gets_ranks_only_when_it_asks(tmp_path):
    (tmp_path / "ranked.py").write_text(textwrap.dedent("""
        import torch

        def _splits(n):
            x = torch.randn(n, 1, 1, 2)
            return x, torch.arange(n) % 2, x[:2], torch.tensor([0, 1])

        def asks(seed, ranks=None):
            return _splits(3 * (ranks or 1))

        def catch_all(seed, **args):
            assert "ranks" not in args, args
            return _splits(6)
    """))

    def scenario(dataset: str, ranks: int) -> object:
        return scenario_from_dict({
            "name": "r", "ranks": ranks, "python_path": [str(tmp_path)],
            "workload": {"model": "logreg", "dataset": dataset, "batch_size": 1, "iterations": 1},
            "algorithms": ["allreduce_sgd"]})

    assert scenario_dataset(scenario("ranked:asks", 5)).num_train == 15
    assert scenario_dataset(scenario("ranked:asks", 2)).num_train == 6
    assert scenario_dataset(scenario("ranked:catch_all", 5)).num_train == 6
    assert load_dataset("ranked:asks", 0, search_path=[str(tmp_path)]).num_train == 3  # no ranks given


@pytest.mark.slow
def test_one_rank_learns_it_well_above_chance():
    """mlp, momentum SGD at the scenario defaults, batch 32, the harness's batch order: 300
    iterations on 16 ranks' worth of data reach about 70% (chance: 10%); see teacher's docstring."""
    seed = 0
    data = load_dataset("teacher", seed, ranks=16)
    torch.manual_seed(seed)
    model = build_model("mlp", data.input_shape, data.num_classes, seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    shard = shard_indices(data.num_train, 1, 0, seed)
    for iteration in range(300):
        batch = torch.from_numpy(batch_indices(shard, 32, iteration, seed, 0))
        loss = F.cross_entropy(model(data.train_x[batch]), data.train_y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        accuracy = float((model(data.test_x).argmax(dim=1) == data.test_y).float().mean())
    assert accuracy > 0.6, accuracy
