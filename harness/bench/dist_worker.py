"""The MPI worker of ``bench dist``, which every rank of its job runs.

``python -m harness bench dist`` launches it; it can also be started directly under the venv's
mpiexec::

    mpiexec -n 4 python -m harness.bench.dist_worker --sizes 50k,1M --wrappers ddp,fsdp2 --steps 20 --repeats 3

Rank 0 prints the table, a row per model and wrapper. torch, mpi4py and the native layer are
imported inside the worker's functions only.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
import warnings
from typing import Any

import numpy as np

from harness.bench.arguments import say, worker_main
from harness.bench.dist import MODELS, SEED, WRAPPERS, add_arguments, parameter_count, to_argv
from harness.bench.mpi_worker import on_world, worker_command
from harness.comm.asleep import quiet_barrier
from harness.mpi_library import import_mpi


def worker_argv(args: argparse.Namespace, ranks: int) -> list[str]:
    """The whole command each rank runs: ``run_ranks(ranks, worker_argv(args, ranks))``."""
    return worker_command("harness.bench.dist_worker", to_argv(args, ranks))


def _wrapped(wrapper: str, module: Any, group: Any) -> Any:
    """``module`` under ``wrapper`` over ``group``: DDP, or FSDP2 (``fully_shard`` on each
    ``Linear``, then on the whole model, over a mesh of ``group``; the module itself, sharded)."""
    import torch  # noqa: PLC0415  (seconds to load: on the ranks only)

    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415  (torch: on the ranks only)

        return DistributedDataParallel(module, process_group=group)
    from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415  (torch: on the ranks only)
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415  (torch: on the ranks only)

    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in module:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(module, mesh=mesh)


def _full_parameters(wrapper: str, model: Any) -> Any:
    """The model's parameters, whole and flat (FSDP2's shards gathered: a collective on every rank)."""
    import torch  # noqa: PLC0415  (seconds to load: on the ranks only)

    if wrapper == "ddp":
        return torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    return torch.cat([p.detach().full_tensor().reshape(-1) for p in model.parameters()])


def _run_backend(
    wrapper: str, group: Any, widths: tuple[int, ...], batch: int, steps: int, warmup: int, world: Any
) -> tuple[list[float], Any]:
    """Steps of ``wrapper`` (ddp, fsdp2) over ``group``: the slowest rank's time of each timed
    step (s), and the final parameters (whole, flat)."""
    import torch  # noqa: PLC0415  (seconds to load: on the ranks only)

    MPI = import_mpi()  # initializes MPI: on the ranks only

    torch.manual_seed(SEED)
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = _wrapped(wrapper, torch.nn.Sequential(*layers[:-1]), group)
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
    params = _full_parameters(wrapper, model)
    del model, opt
    return times.tolist(), params


@on_world
def run_worker(args: argparse.Namespace, world: Any) -> int:
    """Run the benchmark on this rank; rank 0 prints the table. 0."""
    import torch  # noqa: PLC0415  (seconds to load: on the ranks only)
    import torch.distributed as dist  # noqa: PLC0415  (torch: on the ranks only)

    import harness.dist  # noqa: F401, PLC0415  registers "harness", sets env:// from MPI: on the ranks only

    warnings.filterwarnings("ignore", category=FutureWarning)
    n, rank = world.Get_size(), world.Get_rank()
    torch.set_num_threads(1)
    dist.init_process_group("harness")
    try:
        groups = {"gloo": dist.new_group(backend="gloo"), "harness": dist.group.WORLD}
        if rank == 0:
            wrappers = " and ".join(WRAPPERS[w] for w in args.wrappers)
            say(
                f"# dist: {wrappers} on harness vs gloo, {n} ranks, torch {torch.__version__}, 1 thread per rank; "
                f"{args.steps} timed steps after {args.warmup} warm-up, x {args.repeats} repetitions alternating"
            )
            say(
                "# time per step = median over steps and repetitions of the slowest rank; ratio = gloo / harness "
                "(> 1: harness faster)"
            )
            say(
                f"{'model':>6} {'params':>11} {'batch':>6} {'wrapper':>7} {'gloo ms':>9} {'harness ms':>11} "
                f"{'ratio':>6} {'max |diff|':>11}"
            )
        for name, wrapper in itertools.product(args.sizes, args.wrappers):
            widths, batch = MODELS[name]
            times: dict[str, list[float]] = {"gloo": [], "harness": []}
            diff = 0.0
            for rep in range(args.repeats):
                order = ["gloo", "harness"] if rep % 2 == 0 else ["harness", "gloo"]
                params = {}
                for backend in order:
                    t, params[backend] = _run_backend(
                        wrapper, groups[backend], widths, batch, args.steps, args.warmup, world
                    )
                    times[backend] += t
                diff = max(diff, float((params["gloo"] - params["harness"]).abs().max()))
            if rank == 0:
                g, h = (statistics.median(times[b]) * 1e3 for b in ("gloo", "harness"))
                say(
                    f"{name:>6} {parameter_count(widths):>11,d} {batch:>6d} {WRAPPERS[wrapper]:>7} {g:>9.2f} "
                    f"{h:>11.2f} {g / h:>6.2f} {diff:>11.2g}"
                )
    finally:
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    return worker_main("python -m harness.bench.dist_worker", __doc__, add_arguments, run_worker, argv)


if __name__ == "__main__":
    sys.exit(main())
