"""A stock torch.distributed training script with four data-parallel modes: DDP, FSDP2, HSDP, ZeRO.

A small MLP (five linear layers of distinct widths, about 80k parameters; output sizes 211, 173,
131, 67 and 10, none a multiple of 3 or 8, so FSDP pads each layer's dim 0 to a multiple of its
shard group size) on a synthetic 10-class problem, trained with ``--parallel``:

- ``ddp``: ``DistributedDataParallel`` with small gradient buckets (``--bucket-cap-mb``, default
  0.1: several allreduces per step), ``--find-unused-parameters``, ``--static-graph`` (not with
  ``--accumulate``: torch's DDP fails an internal assert for a static graph under ``no_sync()``,
  pytorch/pytorch#143580, on gloo too);
- ``fsdp``: FSDP2, ``fully_shard`` on each hidden layer and on the root (which keeps the output
  layer), over all ranks;
- ``hsdp``: FSDP2 over a 2-D device mesh (``replicate`` x ``shard``, ``--shard`` ranks per shard
  group): parameters sharded within a shard group, gradients all-reduced across the groups;
- ``zero``: DDP with ``ZeroRedundancyOptimizer`` (Adam inside): each rank steps its share of the
  parameters and broadcasts them (``--bucket-view``: one flat buffer per rank).

``--accumulate K`` takes K micro-batches per optimizer step, the first K - 1 without gradient
synchronization (DDP's ``no_sync()``; FSDP2's ``set_requires_gradient_sync(False)``).

Under a scenario (stragglers, slow links, faults; results directory and report)::

    python -m harness launch --scenario examples/torch_parallel/scenario.yaml --label fsdp \\
        examples/torch_parallel/train.py --parallel fsdp

and as a plain torch program on gloo::

    torchrun --nproc-per-node 4 examples/torch_parallel/train.py --backend gloo --parallel hsdp

``launch`` sets torchrun's variables and registers the ``harness`` backend before the script runs;
under a bare ``mpiexec -n 4 python train.py`` the ``import harness.dist`` below does that. The one
other line that knows about the harness hands each step's loss to launch's results (steps.csv);
it does nothing elsewhere, and nothing where ``harness.dist.record`` does not exist.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

MODES = ("ddp", "fsdp", "hsdp", "zero")
FEATURES, CLASSES = 48, 10
WIDTHS = (211, 173, 131, 67)  # hidden layers' output sizes (dim 0 of their weights and biases)


def record(loss: torch.Tensor) -> None:
    """This step's loss into ``launch``'s results through ``harness.dist.record``, where the harness
    is loaded (under ``launch``, or ``--backend harness``) and has it; a no-op anywhere else."""
    fn = getattr(sys.modules.get("harness.dist"), "record", None)
    if fn is not None:
        fn(loss=loss)


def make_model() -> nn.Sequential:
    layers: list[nn.Module] = []
    width = FEATURES
    for out in WIDTHS:
        layers += [nn.Linear(width, out), nn.ReLU()]
        width = out
    layers.append(nn.Linear(width, CLASSES))
    return nn.Sequential(*layers)


def batches(rank: int, batch_size: int, seed: int):
    """This rank's endless stream of (x, y): the classes' centres are the same on every rank, the
    samples are drawn from a generator seeded with ``seed`` and the rank."""
    centers = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(seed)) * 2
    g = torch.Generator().manual_seed(seed * 1000 + 1 + rank)
    while True:
        y = torch.randint(0, CLASSES, (batch_size,), generator=g)
        yield centers[y] + torch.randn(batch_size, FEATURES, generator=g), y


def wrap(model: nn.Sequential, args: argparse.Namespace, world: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model under ``args.parallel`` and its optimizer."""
    if args.parallel in ("ddp", "zero"):
        ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb, find_unused_parameters=args.find_unused_parameters,
                  static_graph=args.static_graph)
        if args.parallel == "ddp":
            return ddp, torch.optim.Adam(ddp.parameters(), lr=args.lr)
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ddp, ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam,
                                            parameters_as_bucket_view=args.bucket_view, lr=args.lr)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    if args.parallel == "fsdp":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    else:
        if world % args.shard:
            raise SystemExit(f"hsdp: {world} ranks are not a multiple of --shard {args.shard}")
        mesh = init_device_mesh("cpu", (world // args.shard, args.shard), mesh_dim_names=("replicate", "shard"))
    for layer in model:
        if isinstance(layer, nn.Linear) and layer is not model[-1]:
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)  # the root: the output layer's parameters
    return model, torch.optim.Adam(model.parameters(), lr=args.lr)


def no_sync(model: nn.Module, parallel: str):
    """A context in which backward passes accumulate gradients without synchronizing them."""
    if parallel in ("ddp", "zero"):
        return model.no_sync()

    @contextlib.contextmanager
    def fsdp_no_sync():
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    return fsdp_no_sync()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parallel", choices=MODES, default="ddp")
    p.add_argument("--backend", default="harness", help="torch.distributed backend (harness, gloo)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank and micro-batch")
    p.add_argument("--accumulate", type=int, default=1, metavar="K",
                   help="micro-batches per optimizer step; the first K - 1 without gradient synchronization")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-cap-mb", type=float, default=0.1, help="ddp, zero: DDP's bucket size")
    p.add_argument("--find-unused-parameters", action="store_true", help="ddp, zero")
    p.add_argument("--static-graph", action="store_true", help="ddp, zero")
    p.add_argument("--shard", type=int, default=2, help="hsdp: ranks per shard group")
    p.add_argument("--bucket-view", action="store_true", help="zero: parameters_as_bucket_view")
    args = p.parse_args()
    if args.accumulate < 1:
        p.error("--accumulate must be at least 1")
    if args.static_graph and args.accumulate > 1:
        # torch 2.13's DDP: static_graph with no_sync() fails an internal assert at the first backward
        # (reducer.cpp, expect_autograd_hooks_), on gloo too: pytorch/pytorch#143580
        p.error("--static-graph with --accumulate > 1: DDP's static graph does not support no_sync() "
                "(pytorch/pytorch#143580)")
    if args.backend == "harness":
        import harness.dist  # noqa: F401  (launch has imported it already; needed under a bare mpiexec)

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # the same initial parameters on every rank
    model, optimizer = wrap(make_model(), args, world)
    data = batches(rank, args.batch_size, args.seed)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        total = 0.0
        for k in range(args.accumulate):
            x, y = next(data)
            with no_sync(model, args.parallel) if k < args.accumulate - 1 else contextlib.nullcontext():
                loss = loss_fn(model(x), y) / args.accumulate
                loss.backward()
            total += loss.detach()
        optimizer.step()
        record(total)
        times.append(time.perf_counter() - start)
    if rank == 0:
        steady = times[1:] or times
        print(f"{args.parallel} on {args.backend}, {world} ranks: {args.steps} steps, last loss {float(total):.4f}, "
              f"median step {statistics.median(steady) * 1e3:.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
