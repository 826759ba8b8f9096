"""The torch.distributed backend ``harness`` (harness.dist) against gloo, on every rank of one launch.

Usage (tests/test_dist.py): mpiexec -n P python tests/mpi/dist_checks.py REPORT.json [-v]
The default group is ``harness`` (its env:// variables come from MPI on import); a gloo group of
the same ranks is the reference. Inputs are small integers wherever the reduction order could
matter, so gloo's and the native layer's results must be bitwise equal; training runs compare
parameters bitwise where the order is the same (2 ranks) and to 1e-6 relative otherwise.
"""

from __future__ import annotations

import sys
import warnings

import torch
import torch.distributed as dist
from checklib import Checks, Skip, run_checks
from mpi4py import MPI

import harness.dist  # noqa: F401  registers the backend, sets env:// from MPI
from harness.dist import UnsupportedError

warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 renames all_gather_into_tensor & co.
WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
CHECKS = check = Checks()

dist.init_process_group("harness")
GLOO = dist.new_group(backend="gloo")
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.float64, torch.int32, torch.uint8]
OPS = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
       "MAX": dist.ReduceOp.MAX}


def ints(n: int, dtype: torch.dtype, seed: int, low: int = 0, high: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (n,), generator=g).to(dtype)


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    assert torch.equal(a, b), f"{what}: differs from gloo at {int((a != b).sum())} of {a.numel()} elements"


def both(fn, *args):
    """``fn(group, *args)`` on harness and on gloo (the latter on clones of the tensor args)."""
    clone = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    return fn(dist.group.WORLD, *args), fn(GLOO, *clone)


@check
def backend_is_harness():
    assert dist.get_backend() == "harness", dist.get_backend()
    assert dist.get_rank() == RANK and dist.get_world_size() == SIZE


@check
def all_reduce_matches_gloo_for_every_dtype_and_op():
    for dtype in DTYPES:
        for name, op in OPS.items():
            if dtype == torch.uint8 and name == "SUM":
                continue  # wraps around identically; covered by int types
            high = 3 if name == "PRODUCT" else 9
            for n in (0, 1, 7, 1000, 70000):  # below and above the ring threshold
                x = ints(n, dtype, seed=RANK * 1000 + n, high=high) + (1 if name == "PRODUCT" else 0)
                ours, ref = x.clone(), x.clone()
                dist.all_reduce(ours, op=op)
                dist.all_reduce(ref, op=op, group=GLOO)
                same(ours, ref, f"all_reduce {name} {dtype} n={n}")


@check
def all_reduce_avg_is_the_mean():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        x = ints(100, dtype, seed=RANK) * SIZE
        ours, ref = x.clone(), x.clone()
        dist.all_reduce(ours, op=dist.ReduceOp.AVG)
        dist.all_reduce(ref, group=GLOO)
        same(ours, ref / SIZE, f"all_reduce AVG {dtype}")
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.int64), op=dist.ReduceOp.AVG)
    except Exception as exc:  # noqa: BLE001
        assert "allreduce" in str(exc) and "AVG" in str(exc), str(exc)
    else:
        raise AssertionError("AVG of int64 raised nothing")


@check
def broadcast_from_every_root():
    for dtype in DTYPES + [torch.bool]:
        for root in range(SIZE):
            x = ints(33, dtype, seed=RANK) if dtype != torch.bool else ints(33, torch.int64, RANK, high=2).bool()
            ours, ref = both(lambda g, t, r=root: (dist.broadcast(t, src=r, group=g), t)[1], x)
            same(ours, ref, f"broadcast {dtype} root={root}")


@check
def gathers_and_scatters_match_gloo():
    x = ints(13, torch.float32, seed=RANK, high=100)
    # all_gather (list) and all_gather_into_tensor
    outs = [torch.empty(13) for _ in range(SIZE)]
    dist.all_gather(outs, x)
    ref = [torch.empty(13) for _ in range(SIZE)]
    dist.all_gather(ref, x, group=GLOO)
    for a, b in zip(outs, ref):
        same(a, b, "all_gather")
    flat = torch.empty(13 * SIZE)
    dist.all_gather_into_tensor(flat, x)
    same(flat, torch.cat(ref), "all_gather_into_tensor")
    inplace = torch.zeros(13 * SIZE, dtype=torch.bfloat16)  # input a view of its own slot (FSDP does this)
    inplace[RANK * 13:(RANK + 1) * 13] = x.to(torch.bfloat16)
    dist.all_gather_into_tensor(inplace, inplace[RANK * 13:(RANK + 1) * 13])
    same(inplace, torch.cat(ref).to(torch.bfloat16), "all_gather_into_tensor in place")
    # reduce_scatter_tensor and reduce_scatter (list)
    big = ints(13 * SIZE, torch.float32, seed=10 + RANK, high=100)
    for name, op in {"SUM": dist.ReduceOp.SUM, "MAX": dist.ReduceOp.MAX}.items():
        ours, ref1 = torch.empty(13), torch.empty(13)
        dist.reduce_scatter_tensor(ours, big, op=op)
        dist.reduce_scatter_tensor(ref1, big.clone(), op=op, group=GLOO)
        same(ours, ref1, f"reduce_scatter_tensor {name}")
    avg = torch.empty(13)
    dist.reduce_scatter_tensor(avg, big * SIZE, op=dist.ReduceOp.AVG)
    summed = torch.empty(13)
    dist.reduce_scatter_tensor(summed, big * SIZE, group=GLOO)
    same(avg, summed / SIZE, "reduce_scatter_tensor AVG")
    ours = torch.empty(13)
    dist.reduce_scatter(ours, list(big.chunk(SIZE)))
    same(ours, _rs_ref(big), "reduce_scatter list")
    # reduce, gather, scatter to and from every root
    for root in range(SIZE):
        r = ints(9, torch.int64, seed=RANK + 50, high=100)
        mine = r.clone()
        dist.reduce(mine, dst=root)
        expect = r.clone()
        dist.all_reduce(expect, group=GLOO)
        if RANK == root:
            same(mine, expect, f"reduce to {root}")
        else:
            same(mine, r, f"reduce to {root} leaves a non-root's tensor as it was")
        got = [torch.empty(9, dtype=torch.int64) for _ in range(SIZE)] if RANK == root else None
        dist.gather(r, got, dst=root)
        everyone = [torch.empty(9, dtype=torch.int64) for _ in range(SIZE)]
        dist.all_gather(everyone, r, group=GLOO)
        if RANK == root:
            for a, b in zip(got, everyone):
                same(a, b, f"gather to {root}")
        out = torch.empty(9, dtype=torch.int64)
        dist.scatter(out, [t + 1000 * i for i, t in enumerate(everyone)] if RANK == root else None, src=root)
        same(out, everyone[RANK] + 1000 * RANK, f"scatter from {root}")


def _rs_ref(big: torch.Tensor) -> torch.Tensor:
    out = torch.empty(big.numel() // SIZE)
    dist.reduce_scatter_tensor(out, big.clone(), group=GLOO)
    return out


@check
def all_to_all_single_with_uneven_splits():
    # rank r sends (r + j + 1) rows of 3 to rank j
    send_splits = [RANK + j + 1 for j in range(SIZE)]
    recv_splits = [j + RANK + 1 for j in range(SIZE)]
    inp = torch.arange(sum(send_splits) * 3, dtype=torch.float32).reshape(-1, 3) + 1000 * RANK
    ours = torch.empty(sum(recv_splits), 3)
    ref = torch.empty(sum(recv_splits), 3)
    dist.all_to_all_single(ours, inp, recv_splits, send_splits)
    dist.all_to_all_single(ref, inp.clone(), recv_splits, send_splits, group=GLOO)
    same(ours, ref, "all_to_all_single uneven")
    even_in = torch.arange(SIZE * 4, dtype=torch.int64) + 100 * RANK
    a, b = torch.empty_like(even_in), torch.empty_like(even_in)
    dist.all_to_all_single(a, even_in)
    dist.all_to_all_single(b, even_in.clone(), group=GLOO)
    same(a, b, "all_to_all_single even")
    outs = [torch.empty(2) for _ in range(SIZE)]
    dist.all_to_all(outs, [torch.full((2,), float(RANK * 10 + j)) for j in range(SIZE)])
    for j, t in enumerate(outs):
        same(t, torch.full((2,), float(j * 10 + RANK)), "all_to_all list")


@check
def point_to_point_ring_and_barrier():
    if SIZE < 2:
        raise Skip("needs two ranks")
    right, left = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        got = torch.empty(5, dtype=dtype)
        reqs = [dist.irecv(got, src=left, tag=3), dist.isend(torch.full((5,), RANK, dtype=dtype), dst=right, tag=3)]
        for r in reqs:
            r.wait()
        same(got, torch.full((5,), left, dtype=dtype), f"isend/irecv {dtype}")
    # blocking send/recv in order, two tags
    if RANK == 0:
        dist.send(torch.tensor([1.0]), dst=1, tag=1)
        dist.send(torch.tensor([2.0]), dst=1, tag=2)
    elif RANK == 1:
        b, a = torch.empty(1), torch.empty(1)
        dist.recv(b, src=0, tag=2)
        dist.recv(a, src=0, tag=1)
        assert (a.item(), b.item()) == (1.0, 2.0), (a, b)
    dist.barrier()


@check
def async_ops_wait_and_futures_chain():
    x = torch.full((1000,), float(RANK + 1))
    work = dist.all_reduce(x, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    total = SIZE * (SIZE + 1) / 2
    assert torch.equal(fut.wait(), torch.full((1000,), 2 * total)), fut.wait()[:3]
    assert work.is_completed()
    # several in flight at once, waited in reverse order
    xs = [torch.full((10,), float(i + RANK)) for i in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in xs]
    for w in reversed(works):
        w.wait()
    for i, t in enumerate(xs):
        assert torch.equal(t, torch.full((10,), float(SIZE * i + SIZE * (SIZE - 1) / 2))), (i, t)
    # a future callback that starts and waits another collective (as PowerSGD's hook does)
    y = torch.ones(4)

    def then(f):
        z = f.value()[0].clone()
        return dist.all_reduce(z, async_op=True).get_future().wait()[0]

    out = dist.all_reduce(y, async_op=True).get_future().then(then).wait()
    assert torch.equal(out, torch.full((4,), float(SIZE * SIZE))), out


@check
def subgroups_from_new_group():
    evens = [r for r in range(SIZE) if r % 2 == 0]
    odds = [r for r in range(SIZE) if r % 2 == 1]
    g_even = dist.new_group(evens)
    g_odd = dist.new_group(odds) if odds else None
    mine = g_even if RANK % 2 == 0 else g_odd
    x = torch.tensor([float(RANK)])
    dist.all_reduce(x, group=mine)
    expect = sum(evens) if RANK % 2 == 0 else sum(odds)
    assert x.item() == expect, (x, expect)
    b = torch.tensor([float(RANK)])
    dist.broadcast(b, src=(evens if RANK % 2 == 0 else odds)[-1], group=mine)  # src is a global rank
    assert b.item() == (evens if RANK % 2 == 0 else odds)[-1], b
    pairs = dist.new_subgroups(group_size=1)[0]  # every rank alone
    y = torch.tensor([3.0])
    dist.all_reduce(y, group=pairs)
    assert y.item() == 3.0


@check
def object_collectives_and_noncontiguous_tensors():
    got = [None] * SIZE
    dist.all_gather_object(got, {"rank": RANK})
    assert got == [{"rank": r} for r in range(SIZE)], got
    lst = [{"from": RANK}]
    dist.broadcast_object_list(lst, src=SIZE - 1)
    assert lst == [{"from": SIZE - 1}], lst
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4) + RANK
    t = m.t()  # not contiguous
    dist.all_reduce(t)
    expect = (torch.arange(12, dtype=torch.float32).reshape(3, 4) * SIZE + SIZE * (SIZE - 1) / 2).t()
    same(t, expect, "all_reduce of a transposed view")


@check
def unsupported_names_the_operation():
    for fn, words in [
        (lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)), ("all_reduce", "int16")),
        (lambda: dist.broadcast(torch.ones(2, dtype=torch.int16), src=0), ("broadcast", "int16")),
        (lambda: dist.recv(torch.ones(1)), ("any source",)),
    ]:
        try:
            fn()
        except UnsupportedError as exc:
            missing = [w for w in words if w not in str(exc)]
            assert not missing, f"{exc} lacks {missing}"
        else:
            raise AssertionError(f"no error for {words}")


# -- training: the same loop on gloo and on harness --------------------------------------------


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 48), torch.nn.ReLU(),
                               torch.nn.Linear(48, 4))


def batch(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * RANK + t)
    return torch.randn(16, 20, generator=g), torch.randn(16, 4, generator=g)


def params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def loop(model: torch.nn.Module, opt, steps: int = 8) -> None:
    for t in range(steps):
        x, y = batch(t)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def equivalent(ours: torch.Tensor, ref: torch.Tensor, what: str, bitwise: bool) -> str:
    """Bitwise equal when ``bitwise`` (the reduction order is the same), else within 1e-6 relative."""
    diff = float((ours - ref).abs().max()) if ours.numel() else 0.0
    scale = float(ref.abs().max()) or 1.0
    if bitwise:
        assert torch.equal(ours, ref), f"{what}: not bitwise equal to gloo (max difference {diff:.3g})"
    else:
        assert diff <= 1e-6 * scale, f"{what}: max difference {diff:.3g} > 1e-6 x {scale:.3g}"
    return f"max difference {diff:.3g} (scale {scale:.3g})"


def on_both(train) -> tuple[torch.Tensor, torch.Tensor]:
    """``train(group, backend)`` on the harness default group and on the gloo group."""
    return train(dist.group.WORLD, "harness"), train(GLOO, "gloo")


def ddp(model: torch.nn.Module, group) -> torch.nn.Module:
    # small buckets: several allreduces per step, as a larger model would have
    return torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.005)


@check
def ddp_matches_gloo():
    def train(group, _):
        model = ddp(net(), group)
        loop(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
        return params(model)

    return equivalent(*on_both(train), "DDP", bitwise=SIZE <= 2)


@check
def ddp_powersgd_hook_trains_in_step():
    """DDP + PowerSGD's hook on harness. gloo cannot be the reference here: in torch 2.13 its
    worker thread runs the hook's callbacks, which wait for a nested all_reduce that the same
    thread would have to run, and the job hangs at the first compressed step (any thread count).
    So: every rank ends with the same parameters, the hook compressed (they differ from plain
    DDP's), and the same run repeated gives bitwise the same parameters."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    def train(hook: bool) -> torch.Tensor:
        model = ddp(net(), dist.group.WORLD)
        if hook:
            state = powersgd.PowerSGDState(process_group=dist.group.WORLD, matrix_approximation_rank=2,
                                           start_powerSGD_iter=3, min_compression_rate=0.5, use_error_feedback=True,
                                           warm_start=True, random_seed=0)
            model.register_comm_hook(state, powersgd.powerSGD_hook)
        loop(model, torch.optim.SGD(model.parameters(), lr=0.05))
        return params(model)

    first, again, plain = train(True), train(True), train(False)
    assert torch.equal(first, again), "PowerSGD on harness is not reproducible"
    everyone = WORLD.allgather(first.numpy())
    assert all((e == everyone[0]).all() for e in everyone), "ranks end with different parameters"
    diff = float((first - plain).abs().max())
    assert diff > 1e-4, f"PowerSGD's parameters equal plain DDP's (max difference {diff:.3g}): no compression"
    return f"differs from plain DDP by up to {diff:.3g}"


@check
def zero_redundancy_optimizer_matches_gloo():
    from torch.distributed.optim import ZeroRedundancyOptimizer

    def train(group, _):
        model = ddp(net(), group)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, process_group=group,
                                      lr=0.01)
        loop(model, opt)
        return params(model)

    return equivalent(*on_both(train), "ZeroRedundancyOptimizer", bitwise=SIZE <= 2)


@check
def post_local_sgd_optimizer_matches_gloo():
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
        PostLocalSGDState,
        post_localSGD_hook,
    )
    from torch.distributed.algorithms.model_averaging.averagers import (
        PeriodicModelAverager,
    )
    from torch.distributed.optim import PostLocalSGDOptimizer

    halves = [[r for r in range(SIZE) if r % 2 == 0], [r for r in range(SIZE) if r % 2 == 1]]

    def train(group, backend):
        subgroup, _ = dist.new_subgroups_by_enumeration([h for h in halves if h], backend=backend)
        model = ddp(net(), group)
        model.register_comm_hook(PostLocalSGDState(process_group=group, subgroup=subgroup, start_localSGD_iter=3),
                                 post_localSGD_hook)
        opt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                    PeriodicModelAverager(period=2, warmup_steps=3, process_group=group))
        loop(model, opt, steps=9)
        return params(model)

    return equivalent(*on_both(train), "PostLocalSGDOptimizer", bitwise=SIZE <= 2)


@check
def fsdp2_matches_gloo():
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    def train(group, _):
        model = net()
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        loop(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
        return torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])

    return equivalent(*on_both(train), "FSDP2", bitwise=False)


if __name__ == "__main__":
    code = run_checks(CHECKS, sys.argv[1], WORLD, only=sys.argv[3:] or None)
    dist.destroy_process_group()
    sys.exit(code)
