"""The rules that scale a torch.distributed script's recorded sequence to another rank count
(harness.sim.script_scaling), against torch's own sizes: FSDP2's padded shards computed with
torch's helper, ZeroRedundancyOptimizer's partition computed by torch itself."""

from __future__ import annotations

import math

import pytest
import torch

from harness.sim.script_replay import ReplayOp
from harness.sim.script_scaling import ScalingError, ScriptStructure, ZeroSpec, group_at, peer_at, scale_step


def op(kind: str, members: tuple[int, ...], nbytes: int, peer: int = -1) -> ReplayOp:
    return ReplayOp(kind, members, nbytes, peer, "overlap", 0.5, True)


@pytest.mark.parametrize(("members", "rank", "n", "expected"), [
    ((0, 1, 2, 3), 5, 8, tuple(range(8))),  # the world
    ((2,), 6, 8, (6,)),  # alone
    ((2, 3), 5, 8, (4, 5)),  # a block of 2 (a mesh's inner dimension) stays a block of 2
    ((1, 3), 6, 8, (0, 2, 4, 6)),  # a stride-2 slice (the outer dimension) grows
    ((1, 3), 6, 7, None),  # 7 ranks are no mesh of rows of 2
    ((0, 3), 1, 8, None),  # no pattern
])
def test_groups_keep_their_shape(members, rank, n, expected):
    assert group_at(members, 4, rank, n) == expected


def test_peers_keep_their_relation():
    assert peer_at("send", 2, 1, 4, 6, 8) == 7  # the next rank
    assert peer_at("recv", 0, 1, 4, 0, 8) == 7  # the previous one
    assert peer_at("send", 3, 1, 4, 4, 8) == 6  # the XOR-2 partner
    # recorded at 2 ranks next and previous coincide: a send goes forward, a receive comes from behind
    assert (peer_at("send", 1, 0, 2, 3, 6), peer_at("recv", 1, 0, 2, 3, 6)) == (4, 2)


def fsdp_piece(shapes: list[tuple[int, ...]], k: int) -> int:
    """Elements per rank of FSDP2 parameters of ``shapes`` sharded over k, with torch's padding rule."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import _get_dim0_padded_size

    return sum(_get_dim0_padded_size(torch.Size(s), k).numel() // k for s in shapes)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 64, 1024])
def test_fsdp_sizes_follow_the_shard_group(n):
    shapes = [(61, 32), (61,), (10, 61), (10,)]
    structure = ScriptStructure(fsdp=(tuple((s[0], math.prod(s[1:])) for s in shapes),))
    k = 4
    gather = op("allgather", (0, 1, 2, 3), fsdp_piece(shapes, k) * 4)
    scatter = op("reduce_scatter", (0, 1, 2, 3), fsdp_piece(shapes, k) * 4 * k)
    out = scale_step([gather, scatter], 1, 0, 4, n - 1, n, structure)
    assert [o.nbytes for o in out] == [fsdp_piece(shapes, n) * 4, fsdp_piece(shapes, n) * 4 * n]
    assert all(o.members == tuple(range(n)) for o in out)
    with pytest.raises(ScalingError, match="allgather of 12 bytes .*none of this size"):
        scale_step([op("allgather", (0, 1, 2, 3), 12)], 1, 0, 4, 0, n if n != 4 else 8, structure)


def torch_zero_broadcasts(numels: list[int], k: int) -> list[tuple[int, int]]:
    """What torch's ZeroRedundancyOptimizer broadcasts after a step at k ranks, from its own partition."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    params = [torch.nn.Parameter(torch.zeros(n)) for n in numels]
    zero = ZeroRedundancyOptimizer.__new__(ZeroRedundancyOptimizer)
    zero.param_groups = [{"params": params}]
    zero.world_size = k
    zero._partition_parameters_cache = []
    zero._partition_param_group = lambda group, per_rank: zero._partition_parameters_cache.__setitem__(
        slice(None), [[{"params": p}] for p in per_rank])
    partition = ZeroRedundancyOptimizer._partition_parameters(zero)
    return [(r, p.numel() * 4) for r, groups in enumerate(partition) for g in groups for p in g["params"]]


@pytest.mark.parametrize("n", [2, 3, 8, 64])
def test_zero_broadcasts_are_torch_partition(n):
    numels = [2048, 64, 4096, 64, 640, 10, 640, 10, 7]
    spec = ZeroSpec((tuple(numels),), 4, False, (0, 1, 2, 3))
    assert spec.broadcasts(n) == torch_zero_broadcasts(numels, n)
    recorded = [ReplayOp("broadcast", (0, 1, 2, 3), size, root, "after", 0.0, False)
                for root, size in spec.broadcasts(4)]
    before = op("allreduce", (0, 1, 2, 3), 4000)
    out = scale_step([before, *recorded], 2, 0, 4, 2, n, ScriptStructure(zero=(spec,)))
    assert out[0].nbytes == 4000
    assert [(o.peer, o.nbytes) for o in out[1:]] == spec.broadcasts(n)
