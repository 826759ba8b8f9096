"""DDP and FSDP2 on the ``harness`` torch.distributed backend vs on ``gloo``: time per step, side by side.

``python -m harness bench dist`` launches its worker (:mod:`harness.bench.dist_worker`) on
``--ranks`` ranks; this module is what the command and the worker share: the models, the
wrappers and the options.

Every rank runs one process group of each backend: the default group is ``harness``
(``import harness.dist`` sets env:// from MPI) and a gloo group of the same ranks
(``dist.new_group(backend="gloo")``). Per model size, wrapper and repetition, the same script
runs on both, in alternating order (gloo first in even repetitions, harness first in odd ones,
so neither always runs on a warmer machine): an MLP built from the same seed on each backend,
wrapped by ``--wrappers`` (``ddp``: ``DistributedDataParallel`` over the backend's group;
``fsdp2``: ``fully_shard`` on each ``Linear`` and then on the whole model, over a
``DeviceMesh`` of the backend's group), ``--warmup`` untimed steps, then ``--steps`` timed
steps of zero_grad / forward / MSE loss / backward / SGD step on a fixed random batch. DDP's
collectives are its bucketed allreduces, overlapped with the backward; FSDP2's are an
all-gather of each layer's parameters before its forward and again before its backward, and a
reduce-scatter of its gradients after it (each rank keeps and steps its shard). A step's time is
the slowest rank's; the table shows, per model and wrapper, the median over all timed steps of
all repetitions per backend and the ratio gloo / harness (> 1: harness is faster). torch runs
one intra-op thread per rank (ranks usually outnumber cores).

Models (``--sizes``, by name): ``50k`` (49,472 parameters), ``1M`` (1,050,112), ``25M``
(25,176,064): plain ``Linear``/``ReLU`` stacks, so the step is mostly matrix products and the
wrapper's collectives.

The last column is the largest difference between the two backends' parameters after a
repetition's steps (both start from the same weights and see the same batches; FSDP2's are
gathered whole, ``DTensor.full_tensor()``, after the timed steps): 0 at 2 ranks, float rounding
(~1e-8) at more, where the two sum in different orders.

Neither this module nor the worker imports torch, mpi4py or the native layer before the worker
runs, so the parent command can import them without initializing MPI.
"""

from __future__ import annotations

import argparse
import itertools

from harness.arguments import choice_list, int_at_least

# name -> (layer widths, batch): parameter counts are sum(w_i * w_(i+1) + w_(i+1))
MODELS: dict[str, tuple[tuple[int, ...], int]] = {
    "50k": ((128, 256, 64), 32),
    "1M": ((512, 1024, 512), 32),
    "25M": ((2048, 4096, 2048, 2048, 2048), 8),
}
DEFAULT_SIZES = "50k,1M,25M"
WRAPPERS: dict[str, str] = {"ddp": "DDP", "fsdp2": "FSDP2"}
"""``--wrappers`` name -> how the table names it."""
DEFAULT_WRAPPERS = "ddp,fsdp2"
DEFAULT_STEPS = 20
DEFAULT_REPEATS = 3
DEFAULT_WARMUP = 3
SEED = 1234


def parameter_count(widths: tuple[int, ...]) -> int:
    """Parameters of the MLP with these layer widths.

    >>> parameter_count(MODELS["50k"][0])
    49472
    """
    return sum(a * b + b for a, b in itertools.pairwise(widths))


_models_list = choice_list("model size", tuple(MODELS), DEFAULT_SIZES, ignore_case=True)
_wrappers_list = choice_list("wrapper", tuple(WRAPPERS), DEFAULT_WRAPPERS, ignore_case=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options (the parent command and the worker take the same ones)."""
    parser.add_argument(
        "--ranks",
        type=int_at_least(1),
        default=None,
        help="number of ranks (default 4, or the size of the MPI job already running)",
    )
    parser.add_argument(
        "--sizes",
        type=_models_list,
        default=_models_list(DEFAULT_SIZES),
        help=f"comma-separated model sizes out of {', '.join(MODELS)} (default {DEFAULT_SIZES})",
    )
    parser.add_argument(
        "--wrappers",
        type=_wrappers_list,
        default=_wrappers_list(DEFAULT_WRAPPERS),
        help=f"comma-separated data-parallel wrappers out of {', '.join(WRAPPERS)} (fsdp2: fully_shard), "
        f"each model under each (default {DEFAULT_WRAPPERS})",
    )
    parser.add_argument(
        "--steps",
        type=int_at_least(1),
        default=DEFAULT_STEPS,
        help=f"timed steps per backend, model, wrapper and repetition (default {DEFAULT_STEPS})",
    )
    parser.add_argument(
        "--repeats",
        type=int_at_least(1),
        default=DEFAULT_REPEATS,
        help=f"repetitions per model and wrapper, the backends alternating (default {DEFAULT_REPEATS})",
    )
    parser.add_argument(
        "--warmup",
        type=int_at_least(0),
        default=DEFAULT_WARMUP,
        help=f"untimed steps before each timed run (default {DEFAULT_WARMUP})",
    )


def to_argv(args: argparse.Namespace, ranks: int) -> list[str]:
    """The worker's command-line arguments for parsed ``args``."""
    return [
        "--ranks",
        str(ranks),
        "--sizes",
        ",".join(args.sizes),
        "--wrappers",
        ",".join(args.wrappers),
        "--steps",
        str(args.steps),
        "--repeats",
        str(args.repeats),
        "--warmup",
        str(args.warmup),
    ]
