"""The torch.distributed backend ``harness`` with CUDA tensors (staged through the host).

Usage (tests/test_dist.py, on a machine with a GPU): mpiexec -n P python tests/mpi/dist_cuda_checks.py REPORT.json
Every rank uses the GPU of its local rank (all of them the same GPU on a one-GPU machine). The
reference of each operation is the same operation on the harness with CPU tensors: the native
layer reduces on the host either way, so the results must be bitwise equal. Training compares a
CUDA run with the same loop on the CPU (1e-4 relative: GPU and CPU kernels round differently)
and, for DDP, the replicas of all ranks with each other (bitwise).
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
import torch.distributed as dist
from checklib import Checks, run_checks
from mpi4py import MPI

import harness.dist  # noqa: F401  registers the backend, sets env:// from MPI

warnings.filterwarnings("ignore", category=FutureWarning)
WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
CHECKS = check = Checks()
GPU = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
torch.cuda.set_device(GPU)
dist.init_process_group("harness")


def data(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 97 + RANK)
    return torch.randn(n, generator=g).to(dtype)


def same(cuda: torch.Tensor, cpu: torch.Tensor, what: str) -> None:
    assert cuda.device.type == "cuda", f"{what}: the result left the GPU ({cuda.device})"
    assert torch.equal(cuda.cpu(), cpu), f"{what}: the CUDA result differs from the CPU one"


@check
def collectives_on_cuda_equal_those_on_the_host():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
        x = data(1000, dtype, 1)
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            a, b = x.to(GPU), x.clone()
            dist.all_reduce(a, op=op)
            dist.all_reduce(b, op=op)
            same(a, b, f"all_reduce {op} {dtype}")
        a, b = x.to(GPU), x.clone()
        dist.broadcast(a, src=SIZE - 1)
        dist.broadcast(b, src=SIZE - 1)
        same(a, b, f"broadcast {dtype}")
        out_a, out_b = torch.empty(1000 * SIZE, dtype=dtype, device=GPU), torch.empty(1000 * SIZE, dtype=dtype)
        dist.all_gather_into_tensor(out_a, x.to(GPU))
        dist.all_gather_into_tensor(out_b, x)
        same(out_a, out_b, f"all_gather_into_tensor {dtype}")
        big = data(1000 * SIZE, dtype, 2)
        out_a, out_b = torch.empty(1000, dtype=dtype, device=GPU), torch.empty(1000, dtype=dtype)
        dist.reduce_scatter_tensor(out_a, big.to(GPU))
        dist.reduce_scatter_tensor(out_b, big)
        same(out_a, out_b, f"reduce_scatter_tensor {dtype}")
    x = data(6 * SIZE, torch.float32, 3)
    a, b = torch.empty_like(x, device=GPU), torch.empty_like(x)
    dist.all_to_all_single(a, x.to(GPU))
    dist.all_to_all_single(b, x)
    same(a, b, "all_to_all_single")
    gathered = [torch.empty(10, device=GPU) for _ in range(SIZE)]
    dist.all_gather(gathered, data(10, torch.float32, 4).to(GPU))
    for r, t in enumerate(gathered):
        g = torch.Generator().manual_seed(4 * 97 + r)
        same(t, torch.randn(10, generator=g), f"all_gather from rank {r}")


@check
def point_to_point_and_noncontiguous_cuda_tensors():
    right, left = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    out, inbox = data(50, torch.float32, 5).to(GPU), torch.empty(50, device=GPU)
    reqs = [dist.isend(out, right), dist.irecv(inbox, left)]
    for r in reqs:
        r.wait()
    g = torch.Generator().manual_seed(5 * 97 + left)
    same(inbox, torch.randn(50, generator=g), "isend/irecv around the ring")
    m = data(64, torch.float32, 6).reshape(8, 8)
    a, b = m.to(GPU).t(), m.clone().t()  # transposed views: not contiguous
    dist.all_reduce(a)
    dist.all_reduce(b)
    same(a.contiguous(), b.contiguous(), "all_reduce of a non-contiguous CUDA view")


@check
def results_are_visible_to_a_side_stream_and_to_futures():
    """FSDP2 runs its collectives on side streams and DDP's hooks read results in ``then``
    callbacks: the copy back to the GPU must be complete when ``wait()`` returns or the future
    completes, whatever stream reads it next."""
    side = torch.cuda.Stream(GPU)
    big = data(1 << 20, torch.float32, 7)
    ref = big.clone()
    dist.all_reduce(ref)
    with torch.cuda.stream(side):
        a = big.to(GPU, non_blocking=False)
        work = dist.all_reduce(a, async_op=True)
        work.wait()
        doubled = a * 2  # on the side stream, right after wait()
    side.synchronize()
    same(doubled, ref * 2, "all_reduce read on a side stream after wait()")
    b = big.to(GPU)
    fut = dist.all_reduce(b, async_op=True).get_future().then(lambda f: f.value()[0] * 3)
    same(fut.wait(), ref * 3, "a future's then() callback on a CUDA result")


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 48), torch.nn.ReLU(),
                               torch.nn.Linear(48, 4))


def loop(model: torch.nn.Module, opt, device: torch.device, steps: int = 8) -> None:
    for t in range(steps):
        g = torch.Generator().manual_seed(1000 * RANK + t)
        x, y = torch.randn(16, 20, generator=g).to(device), torch.randn(16, 4, generator=g).to(device)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def close(cuda: torch.Tensor, cpu: torch.Tensor, what: str) -> str:
    diff = float((cuda.cpu() - cpu).abs().max())
    scale = float(cpu.abs().max()) or 1.0
    assert diff <= 1e-4 * scale, f"{what}: CUDA and CPU runs differ by {diff:.3g} > 1e-4 x {scale:.3g}"
    return f"max difference to the CPU run {diff:.3g} (scale {scale:.3g})"


@check
def ddp_on_cuda_trains_as_on_the_cpu():
    def train(device: torch.device) -> torch.Tensor:
        model = net().to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=0.005)
        loop(ddp, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9), device)
        return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])

    cuda, cpu = train(GPU), train(torch.device("cpu"))
    everyone = WORLD.allgather(cuda.cpu().numpy())
    assert all((e == everyone[0]).all() for e in everyone), "DDP replicas on CUDA differ between ranks"
    return close(cuda, cpu, "DDP")


@check
def fsdp2_on_cuda_trains_as_on_the_cpu():
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    def train(device: torch.device) -> torch.Tensor:
        model = net().to(device)
        mesh = DeviceMesh.from_group(dist.group.WORLD, device.type)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        loop(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), device)
        return torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])

    return close(train(GPU), train(torch.device("cpu")), "FSDP2")


if __name__ == "__main__":
    code = run_checks(CHECKS, sys.argv[1], WORLD, only=sys.argv[3:] or None)
    dist.destroy_process_group()
    sys.exit(code)
