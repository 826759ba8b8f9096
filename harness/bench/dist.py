"""DDP on the ``harness`` torch.distributed backend against DDP on ``gloo``: time per step, side by side.

Launched by ``python -m harness bench dist``; this module is the worker every rank runs. It can
also be started directly under the venv's mpiexec::

    mpiexec -n 4 python -m harness.bench.dist --sizes 50k,1M --steps 20 --repeats 3

Every rank runs one process group of each backend: the default group is ``harness``
(``import harness.dist`` sets env:// from MPI) and a gloo group of the same ranks
(``dist.new_group(backend="gloo")``). Per model size and repetition, the same script runs on
both, in alternating order (gloo first in even repetitions, harness first in odd ones, so
neither always runs on a warmer machine): a ``DistributedDataParallel`` MLP built from the same
seed on each backend, ``--warmup`` untimed steps, then ``--steps`` timed steps of
zero_grad / forward / MSE loss / backward (DDP's bucketed allreduces, overlapped with the
backward) / SGD step on a fixed random batch. A step's time is the slowest rank's; the table
shows the median over all timed steps of all repetitions per backend and the ratio
gloo / harness (> 1: harness is faster). torch runs one intra-op thread per rank (ranks
usually outnumber cores).

Models (``--sizes``, by name): ``50k`` (49,472 parameters), ``1M`` (1,050,112), ``25M``
(25,176,064): plain ``Linear``/``ReLU`` stacks, so the step is mostly matrix products and
DDP's allreduces.

The last column is the largest difference between the two backends' parameters after a
repetition's steps (both start from the same weights and see the same batches): 0 at 2 ranks,
float rounding (~1e-8) at more, where the two sum in different orders.

torch, mpi4py and the native layer are imported inside ``run_worker`` only, so the parent command
can import this module for its arguments without initializing MPI.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from harness.arguments import argtype, int_at_least, split_list
from harness.bench.arguments import job_size_matches, say, worker_main

# name -> (layer widths, batch): parameter counts are sum(w_i * w_(i+1) + w_(i+1))
MODELS: dict[str, tuple[tuple[int, ...], int]] = {
    "50k": ((128, 256, 64), 32),
    "1M": ((512, 1024, 512), 32),
    "25M": ((2048, 4096, 2048, 2048, 2048), 8),
}
DEFAULT_SIZES = "50k,1M,25M"
DEFAULT_STEPS = 20
DEFAULT_REPEATS = 3
DEFAULT_WARMUP = 3
SEED = 1234


def parameter_count(widths: tuple[int, ...]) -> int:
    """Parameters of the MLP with these layer widths.

    >>> parameter_count(MODELS["50k"][0])
    49472
    """
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


def parse_models(text: str) -> list[str]:
    """Comma-separated model names out of ``MODELS`` (case-insensitive), duplicates dropped."""
    names = split_list(text, "size", DEFAULT_SIZES)
    by_lower = {k.lower(): k for k in MODELS}
    bad = [n for n in names if n.lower() not in by_lower]
    if bad:
        raise ValueError(f"unknown model size {bad[0]!r}: choose from {', '.join(MODELS)}")
    return list(dict.fromkeys(by_lower[n.lower()] for n in names))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options (the parent command and the worker take the same ones)."""
    parser.add_argument("--ranks", type=int_at_least(1), default=None,
                        help="number of ranks (default 4, or the size of the MPI job already running)")
    parser.add_argument("--sizes", type=argtype(parse_models), default=parse_models(DEFAULT_SIZES),
                        help=f"comma-separated model sizes out of {', '.join(MODELS)} (default {DEFAULT_SIZES})")
    parser.add_argument("--steps", type=int_at_least(1), default=DEFAULT_STEPS,
                        help=f"timed steps per backend, model and repetition (default {DEFAULT_STEPS})")
    parser.add_argument("--repeats", type=int_at_least(1), default=DEFAULT_REPEATS,
                        help=f"repetitions per model, the backends alternating (default {DEFAULT_REPEATS})")
    parser.add_argument("--warmup", type=int_at_least(0), default=DEFAULT_WARMUP,
                        help=f"untimed steps before each timed run (default {DEFAULT_WARMUP})")


def to_argv(args: argparse.Namespace, ranks: int) -> list[str]:
    """The worker's command-line arguments for parsed ``args``."""
    return ["--ranks", str(ranks), "--sizes", ",".join(args.sizes), "--steps", str(args.steps),
            "--repeats", str(args.repeats), "--warmup", str(args.warmup)]


# -- the worker ---------------------------------------------------------------------------------
def _run_backend(group: Any, widths: tuple[int, ...], batch: int, steps: int, warmup: int, world: Any) -> tuple[list[float], Any]:
    """Steps of DDP over ``group``: the slowest rank's time of each timed step (s), and the final
    parameters (flat)."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415
    from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415

    from harness.comm.asleep import quiet_barrier  # noqa: PLC0415

    torch.manual_seed(SEED)
    layers: list[torch.nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = DistributedDataParallel(torch.nn.Sequential(*layers[:-1]), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(SEED + world.Get_rank())
    x = torch.randn(batch, widths[0], generator=gen)
    y = torch.randn(batch, widths[-1], generator=gen)
    times = np.zeros(steps)
    quiet_barrier(world)
    for i in range(-warmup, steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        if i >= 0:
            times[i] = t1 - t0
    world.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    params = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    del model, opt
    return times.tolist(), params


def run_worker(args: argparse.Namespace) -> int:
    """Run the benchmark on this rank; rank 0 prints the table. 0."""
    import warnings  # noqa: PLC0415

    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415

    import harness.dist  # noqa: F401, PLC0415  registers "harness", sets env:// from MPI

    warnings.filterwarnings("ignore", category=FutureWarning)
    world = MPI.COMM_WORLD
    n, rank = world.Get_size(), world.Get_rank()
    if not job_size_matches(args, world):
        return 2
    torch.set_num_threads(1)
    dist.init_process_group("harness")
    try:
        groups = {"gloo": dist.new_group(backend="gloo"), "harness": dist.group.WORLD}
        if rank == 0:
            say(f"# dist: DDP on harness vs gloo, {n} ranks, torch {torch.__version__}, 1 thread per rank; "
                f"{args.steps} timed steps after {args.warmup} warm-up, x {args.repeats} repetitions alternating")
            say("# time per step = median over steps and repetitions of the slowest rank; ratio = gloo / harness "
                "(> 1: harness faster)")
            say(f"{'model':>6} {'params':>11} {'batch':>6} {'gloo ms':>9} {'harness ms':>11} {'ratio':>6} "
                f"{'max |diff|':>11}")
        for name in args.sizes:
            widths, batch = MODELS[name]
            times: dict[str, list[float]] = {"gloo": [], "harness": []}
            diff = 0.0
            for rep in range(args.repeats):
                order = ["gloo", "harness"] if rep % 2 == 0 else ["harness", "gloo"]
                params = {}
                for backend in order:
                    t, params[backend] = _run_backend(groups[backend], widths, batch, args.steps, args.warmup, world)
                    times[backend] += t
                diff = max(diff, float((params["gloo"] - params["harness"]).abs().max()))
            if rank == 0:
                g, h = (statistics.median(times[b]) * 1e3 for b in ("gloo", "harness"))
                say(f"{name:>6} {parameter_count(widths):>11,d} {batch:>6d} {g:>9.2f} {h:>11.2f} {g / h:>6.2f} "
                    f"{diff:>11.2g}")
    finally:
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    return worker_main("python -m harness.bench.dist", __doc__, add_arguments, run_worker, argv)


if __name__ == "__main__":
    sys.exit(main())
