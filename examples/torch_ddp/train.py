"""A stock DistributedDataParallel training loop: nothing in it knows about the harness.

A small MLP on a synthetic 10-class problem, DDP with PowerSGD's communication hook (or, with
``--post-local-sgd``, the post-local SGD hook and ``PostLocalSGDOptimizer``). Run it under a
scenario (stragglers, slow links, faults; results directory and report)::

    python -m harness launch --scenario examples/torch_ddp/scenario.yaml examples/torch_ddp/train.py
    python -m harness launch --scenario examples/torch_ddp/scenario.yaml --label post_local_sgd \\
        examples/torch_ddp/train.py --post-local-sgd

``launch`` sets torchrun's variables and registers the ``harness`` backend before the script
runs. Under a bare ``mpiexec -n 3 python train.py`` the ``import harness.dist`` below does that.

The one line that knows about the harness: ``record`` hands each step's training loss and
accuracy, and every ``--eval-every`` steps the loss and accuracy on held-out samples, to the
results of ``launch`` (steps.csv, evals.csv: the summary's time to the scenario's target loss,
the report's accuracy and loss against time); anywhere else it does nothing.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.optim import PostLocalSGDOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:
    from harness.dist import record  # the script's loss and accuracy into launch's results; a no-op elsewhere
except ImportError:  # without the harness installed (e.g. --backend gloo under torchrun) the script runs as it is
    def record(loss=None, accuracy=None, *, evaluation=False) -> None:
        pass

HELD_OUT = 512  # the last samples of the synthetic data: the test set, never trained on


def dataset(samples: int = 4096, features: int = 32, classes: int = 10) -> TensorDataset:
    """A synthetic classification problem, the same on every rank."""
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(classes, features, generator=g) * 2
    y = torch.randint(0, classes, (samples,), generator=g)
    x = centers[y] + torch.randn(samples, features, generator=g)
    return TensorDataset(x, y)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy and accuracy of ``model`` (the plain module: no DDP collectives) on (x, y)."""
    logits = model(x)
    return nn.functional.cross_entropy(logits, y), (logits.argmax(1) == y).float().mean()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--backend", default="harness")
    p.add_argument("--post-local-sgd", action="store_true", help="post-local SGD instead of PowerSGD")
    p.add_argument("--eval-every", type=int, default=5,
                   help="evaluate on the held-out samples every N steps (and after the last)")
    args = p.parse_args()
    if args.backend == "harness":
        import harness.dist  # noqa: F401  (launch has imported it already; needed under a bare mpiexec)

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if args.post_local_sgd:
        alone, _ = dist.new_subgroups(group_size=1)  # after 5 steps each rank steps alone (no node has 2 GPUs here)
        model.register_comm_hook(PostLocalSGDState(process_group=None, subgroup=alone, start_localSGD_iter=5),
                                 post_localSGD_hook)
        optimizer = PostLocalSGDOptimizer(sgd, PeriodicModelAverager(period=4, warmup_steps=5))
    else:
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=5,
                                       min_compression_rate=0.5)
        model.register_comm_hook(state, powersgd.powerSGD_hook)
        optimizer = sgd
    x_all, y_all = dataset().tensors
    data = TensorDataset(x_all[:-HELD_OUT], y_all[:-HELD_OUT])
    # Each rank tests its share of the held-out samples; the harness averages the ranks' values.
    x_test, y_test = x_all[-HELD_OUT:][rank::world], y_all[-HELD_OUT:][rank::world]
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    loss_fn = nn.CrossEntropyLoss()
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            logits = model(x)
            loss = loss_fn(logits, y)
            loss.backward()
            optimizer.step()
            step += 1
            record(loss=loss, accuracy=(logits.argmax(1) == y).float().mean())  # this step's, on this rank's batch
            if step % args.eval_every == 0 or step == args.steps:
                test_loss, test_accuracy = evaluate(model.module, x_test, y_test)
                record(loss=test_loss, accuracy=test_accuracy, evaluation=True)
                if rank == 0:
                    print(f"step {step}: loss {loss.item():.3f}, held-out loss {test_loss.item():.3f} "
                          f"(rank 0's share)", flush=True)
            if step == args.steps:
                break
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
