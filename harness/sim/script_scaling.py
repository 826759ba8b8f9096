"""A torch.distributed script's recorded collective sequence at another rank count: the rules.

A script recorded at R ranks is simulated at N by having simulated rank r replay recorded rank
``r mod R`` (its place in every group, its phase and timing of each operation), with each
operation rewritten by the rule that made it, using what the run noted about the script
(``script_structure.json``, :mod:`harness.dist.structure`):

- **Groups** keep their shape: the world stays the world; a block of k consecutive ranks (a
  ``new_subgroups(group_size=k)`` group, the inner dimension of a device mesh: HSDP's shard
  group) stays a block of k; a strided slice ``{i, i+s, i+2s, ...}`` (a mesh's outer dimension:
  HSDP's replicate group) keeps its stride and grows to N/s members; a group of one stays one.
  So a device mesh grows along its outermost dimension, its inner ones keep their sizes: more
  nodes of the same size. Any other subgroup is refused.
- **Sizes**: an allreduce, broadcast, reduce or barrier moves what it moved (DDP's buckets, a
  model average, HSDP's allreduce of the shard). An all-gather or reduce-scatter over a group
  whose size changes is one of the script's FSDP2 parameter groups, recognised by its size:
  FSDP2 gives each of k ranks ``ceil(d0 / k) * (numel / d0)`` elements of every parameter, so
  the all-gather's piece and the reduce-scatter's input (k pieces) are recomputed at the new
  size; one that no parameter group explains is refused. Gathers, scatters and all-to-alls over
  a group that changes size are refused.
- **ZeroRedundancyOptimizer**: its broadcasts after the step (every rank's partition, rank by
  rank) are regenerated from its parameters with torch's own partition rule (largest parameter
  first, to the rank with the fewest elements so far).
- **Point to point**: the peer keeps its relation to the rank: the next or the previous rank in
  the ring, or the partner ``rank XOR m`` (recorded at 2 ranks, where they coincide, a send goes
  to the next rank and a receive comes from the previous).
- **Roots** keep their index in their group.

Every refusal names the operation (rank, step, kind, group, size) and what would be needed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness.results.columns import STRUCTURE_FILE

ELEMENT_BYTES = (1, 2, 4, 8)
GROUP_SIZED = frozenset({"allgather", "reduce_scatter"})  # sizes follow the group's size
FIXED = frozenset({"allreduce", "broadcast", "reduce", "barrier"})


class ScalingError(ValueError):
    """A recorded operation no rule scales to the asked rank count (the message says which)."""


@dataclass(frozen=True)
class ZeroSpec:
    """A ZeroRedundancyOptimizer as the run noted it."""

    param_groups: tuple[tuple[int, ...], ...]  # element counts per parameter, per parameter group
    element_bytes: int
    bucket_view: bool
    group_ranks: tuple[int, ...]

    def broadcasts(self, k: int) -> list[tuple[int, int]]:
        """(root's group index, bytes) of the broadcasts after each step at k ranks, in the order
        torch posts them: rank by rank, its partition (bucket or parameter by parameter)."""
        per_rank: list[list[int]] = [[] for _ in range(k)]
        sizes = [0] * k  # carried across parameter groups, as torch does
        for group in self.param_groups:
            for numel in sorted(group, reverse=True):  # stable: torch's sorted(..., reverse=True)
                r = sizes.index(min(sizes))
                per_rank[r].append(numel)
                sizes[r] += numel
        # torch lists a rank's parameters group by group; within a group in the order assigned,
        # which the loop above keeps (a rank's list is appended to in assignment order).
        if self.bucket_view:
            return [(r, (sum(p) or 1) * (self.element_bytes if sum(p) else 4)) for r, p in enumerate(per_rank)]
        return [(r, numel * self.element_bytes) for r, p in enumerate(per_rank) for numel in p]


@dataclass(frozen=True)
class ScriptStructure:
    """``script_structure.json``: FSDP2 parameter groups (each a tuple of (dim 0, elements per
    row) per parameter), ZeRO optimizers, per recorded rank the medians of the optimizer-step
    window and of the local work without the main thread's waits (``harness.dist.structure``)."""

    fsdp: tuple[tuple[tuple[int, int], ...], ...] = ()
    zero: tuple[ZeroSpec, ...] = ()
    after_step_s: tuple[float, ...] = ()
    local_s: tuple[float, ...] = ()  # per recorded rank: local work without the main thread's waits (empty: not noted)

    @property
    def waits_apart(self) -> bool:
        """Whether the notes give every rank's local work without its waits (which the
        simulation then makes itself)."""
        return bool(self.local_s)

    @classmethod
    def read(cls, run_dir: Path) -> ScriptStructure:
        """The run's notes; empty where the run has none (a run from before they were noted)."""
        path = Path(run_dir) / STRUCTURE_FILE
        if not path.is_file():
            return cls()
        try:
            ranks = json.loads(path.read_text())["ranks"]
            first = ranks[0]
            return cls(
                fsdp=tuple(tuple((int(d0), int(rest)) for d0, rest in g["shapes"]) for g in first["fsdp"]),
                zero=tuple(
                    ZeroSpec(
                        tuple(tuple(int(n) for n in pg) for pg in z["param_groups"]),
                        int(z["element_bytes"]),
                        bool(z["bucket_view"]),
                        tuple(int(r) for r in z["group_ranks"]),
                    )
                    for z in first["zero"]
                ),
                after_step_s=tuple(float(r.get("after_step_s", 0.0)) for r in ranks),
                local_s=tuple(float(r["local_s"]) for r in ranks) if all("local_s" in r for r in ranks) else (),
            )
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ScalingError(f"{path}: not the notes of a script run ({exc})") from exc

    def fsdp_elements(self, group: int, k: int) -> int:
        """Elements one of k ranks holds of FSDP2 parameter group ``group``."""
        return sum(-(-d0 // k) * rest for d0, rest in self.fsdp[group])

    def shard_ratio(self, k: int, n: int) -> float:
        """How much more (or less) of the parameters a rank holds with k' = n than with k ranks
        sharding every FSDP2 group; 1 without FSDP2."""
        if not self.fsdp or k == n:
            return 1.0
        now = sum(self.fsdp_elements(g, k) for g in range(len(self.fsdp)))
        return sum(self.fsdp_elements(g, n) for g in range(len(self.fsdp))) / now if now else 1.0


# -- groups and peers ------------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def _ranks(start: int, stop: int, step: int = 1) -> tuple[int, ...]:
    """One tuple per group, shared by every operation over it (1,024 ranks x their operations
    would otherwise each hold a copy of the world)."""
    return tuple(range(start, stop, step))


def group_at(members: tuple[int, ...], ranks: int, rank: int, n: int) -> tuple[int, ...] | None:
    """The group ``rank`` (of n) is in where recorded rank ``rank mod ranks`` was in ``members``
    (module doc); None where the group has no rule."""
    k = len(members)
    if members == _ranks(0, ranks):
        return _ranks(0, n)
    if k == 1:
        return (rank,)
    first = members[0]
    if ranks % k == 0 and first % k == 0 and members == tuple(range(first, first + k)):
        if n % k:
            return None
        start = rank // k * k
        return _ranks(start, start + k)
    stride = members[1] - members[0]
    if ranks % stride == 0 and first < stride and members == tuple(range(first, ranks, stride)):
        if n % stride:
            return None
        return _ranks(rank % stride, n, stride)
    return None


def peer_at(op: str, peer: int, base: int, ranks: int, rank: int, n: int) -> int | None:
    """The peer ``rank`` (of n) sends to or receives from where recorded rank ``base`` used ``peer``."""
    d = (peer - base) % ranks
    forward = d == 1 and (d != ranks - 1 or op != "recv")
    if forward:
        return (rank + 1) % n
    if d == ranks - 1:
        return (rank - 1) % n
    m = peer ^ base
    if m and m & (m - 1) == 0 and n % (2 * m) == 0:
        return rank ^ m
    return None


# -- the rewrite -----------------------------------------------------------------------------------
def _where(op: Any, base: int, t: int) -> str:
    group = " ".join(map(str, op.members))
    return f"rank {base}'s {op.op} of {op.nbytes} bytes over [{group}] in step {t}"


def _fsdp_size(op: Any, k: int, k2: int, structure: ScriptStructure, where: str) -> int:
    """The bytes at group size k2 of an all-gather / reduce-scatter of FSDP2 at k (module doc)."""
    sizes = set()
    for g in range(len(structure.fsdp)):
        for e in ELEMENT_BYTES:
            piece = structure.fsdp_elements(g, k) * e
            whole = op.op == "reduce_scatter"
            if (piece * k if whole else piece) == op.nbytes:
                new = structure.fsdp_elements(g, k2) * e
                sizes.add(new * k2 if whole else new)
    if len(sizes) == 1:
        return sizes.pop()
    if not sizes:
        noted = (
            f"the run noted {len(structure.fsdp)} FSDP2 parameter groups, none of this size"
            if structure.fsdp
            else "the run noted no FSDP2 parameter groups (script_structure.json)"
        )
        raise ScalingError(
            f"{where}: its size at {k2} ranks cannot be inferred: {noted}; an {op.op} whose pieces "
            "follow the group's size must come from fully_shard's parameters"
        )
    raise ScalingError(f"{where}: several FSDP2 parameter groups have this size at {k} ranks and differ at {k2}")


def _zero_rewrite(ops: list, base: int, t: int, ranks: int, n: int, structure: ScriptStructure) -> list:
    """``ops`` (one step of recorded rank ``base``) with each ZeRO optimizer's broadcast block
    regenerated for n ranks (the rest is left for the per-operation rules)."""
    for spec in structure.zero:
        members = spec.group_ranks
        if len(members) == n or members != tuple(range(ranks)):
            continue  # not resized, or a ZeRO over a subgroup: the per-operation rules refuse its broadcasts
        recorded = [(members.index(root), size) for root, size in spec.broadcasts(ranks)]
        wanted = len(recorded)
        for i in range(len(ops) - wanted + 1):
            block = ops[i : i + wanted]
            if (
                all(o.op == "broadcast" and o.members == members for o in block)
                and [(o.root_index, o.nbytes) for o in block] == recorded
            ):
                template = block[-1]
                new = [
                    replace(template, members=_ranks(0, n), peer=root, nbytes=size, waited=False)
                    for root, size in spec.broadcasts(n)
                ]
                if new:
                    new[-1] = replace(new[-1], waited=template.waited)
                ops = ops[:i] + [_Final(o) for o in new] + ops[i + wanted :]
                break
    return ops


@dataclass(frozen=True)
class _Final:
    """An operation already written for the new rank count."""

    op: Any


def scale_step(ops: list, base: int, t: int, ranks: int, rank: int, n: int, structure: ScriptStructure) -> list:
    """Recorded rank ``base``'s operations of step t (``ReplayOp``), for rank ``rank`` of n."""
    out = []
    for item in _zero_rewrite(list(ops), base, t, ranks, n, structure):
        if isinstance(item, _Final):
            out.append(item.op)
            continue
        op = item
        where = _where(op, base, t)
        if op.op in ("send", "recv"):
            peer = peer_at(op.op, op.peer, base, ranks, rank, n)
            if peer is None:
                raise ScalingError(
                    f"{where} (peer {op.peer}): the peer is neither the next nor the previous rank "
                    f"nor a fixed XOR partner, so it has no counterpart at {n} ranks"
                )
            out.append(replace(op, members=_ranks(0, n), peer=peer))
            continue
        members = group_at(op.members, ranks, rank, n)
        if members is None:
            raise ScalingError(
                f"{where}: the group is neither the world, a block of consecutive ranks nor a "
                f"strided slice of them (a device mesh's dimension) that fits {n} ranks"
            )
        k, k2 = len(op.members), len(members)
        nbytes = op.nbytes
        if k != k2 and op.op in GROUP_SIZED:
            nbytes = _fsdp_size(op, k, k2, structure, where)
        elif k != k2 and op.op not in FIXED:
            raise ScalingError(
                f"{where}: a {op.op}'s pieces follow the group's size, and no rule says how "
                "(only FSDP2's all-gathers and reduce-scatters are recognised)"
            )
        peer = members[op.root_index] if op.peer >= 0 else -1
        out.append(replace(op, members=members, peer=peer, nbytes=nbytes))
    return out
