"""What a torch.distributed script is made of, noted at run time: what makes its collectives scale.

A recorded collective sequence (:mod:`harness.dist.sequence`) says what each rank sent at the
rank count it ran at. To say what the same script sends at another count, the simulator
(:mod:`harness.sim.script_scaling`) needs what decided the sizes and the groups, which the
sizes alone do not tell. :class:`StructureNotes` looks at the objects torch hands the session's
hooks and notes:

- **FSDP2 parameter groups** (``fully_shard``): every parameter's original shape, and the mesh
  the group shards over (its shape and dimension names; HSDP's 2-D mesh). FSDP2 pads each
  parameter's dim 0 to a multiple of the shard group's size k and gives each rank
  ``ceil(d0 / k) * (numel / d0)`` elements of it: an all-gather moves the sum of those pieces,
  a reduce-scatter k times that.
- **ZeroRedundancyOptimizer**: the element counts of every parameter in every parameter group,
  whether it syncs bucket views, and its group: from these torch's own greedy partition (largest
  parameter first, to the rank with the fewest elements so far) gives every rank's partition,
  hence the broadcasts after each step, at any rank count.
- **Process groups** the script posted on (world ranks of each).
- **Step windows**: per step, the time from the optimizer step's pre-hook to the step's end (the
  optimizer's own work, which FSDP2 does on the shard), and the CPU time the script's thread
  used (``time.thread_time``) in the step and in that window: the local work without the time
  the thread waited, which the wall-clock split cannot tell apart where torch waits inside the
  forward pass (FSDP2's all-gathers); and the step's local work on the wall clock without the
  time the main thread spent in the backend's ``wait()`` (those waits, beyond what
  ``comm_blocked_s`` already counts). The notes keep each one's median over the steps after the
  first.

The session gathers every rank's notes and rank 0 writes them as ``script_structure.json``.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch.distributed as dist


def _element_bytes(t: Any) -> int:
    return int(t.element_size())


class StructureNotes:
    """One rank's notes (module doc); ``as_dict()`` is what the results file holds for it."""

    def __init__(self) -> None:
        self.fsdp: list[dict] = []
        self.zero: list[dict] = []
        self.groups: set[tuple[int, ...]] = set()
        self.after_s: list[float] = []
        self.local_s: list[float] = []  # per step: the local work without the main thread's waits
        self.cpu_s: list[float] = []  # per step: the CPU time of the script's thread (time.thread_time)
        self.after_cpu_s: list[float] = []  # of it, from the optimizer step's pre-hook on
        self._seen_modules = False
        self._seen_optimizers: set[int] = set()

    def group_used(self, world_ranks: tuple[int, ...]) -> None:
        self.groups.add(world_ranks)

    def modules(self, root: Any) -> None:
        """At the first training forward pass: FSDP2's parameter groups under ``root``."""
        if self._seen_modules:
            return
        self._seen_modules = True
        try:
            from torch.distributed.fsdp import FSDPModule  # noqa: PLC0415  (optional; only scripts that use it)
        except ImportError:  # a torch without FSDP2
            return
        seen: set[int] = set()
        for module in root.modules():
            if not isinstance(module, FSDPModule):
                continue
            group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
            if group is None or id(group) in seen or not group.fsdp_params:
                continue
            seen.add(id(group))
            mesh = group.mesh_info.mesh
            shard = group.fsdp_params[0].mesh_info
            self.fsdp.append({
                "shapes": [[int(p._orig_size[0]) if len(p._orig_size) else 1,
                            int(p._orig_size.numel()) // max(1, int(p._orig_size[0]) if len(p._orig_size) else 1)]
                           for p in group.fsdp_params],
                "mesh_shape": [int(s) for s in mesh.shape],
                "mesh_dim_names": list(mesh.mesh_dim_names or ()),
                "shard_size": int(shard.shard_mesh_size),
            })

    def optimizer(self, optimizer: Any) -> None:
        """At an outermost optimizer step: a ZeroRedundancyOptimizer's partition inputs."""
        if id(optimizer) in self._seen_optimizers:
            return
        self._seen_optimizers.add(id(optimizer))
        try:
            from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: PLC0415  (2 s of imports; optional)
        except ImportError:
            return
        if not isinstance(optimizer, ZeroRedundancyOptimizer):
            return
        params = [p for g in optimizer.param_groups for p in g["params"]]
        self.zero.append({
            "param_groups": [[int(p.numel()) for p in g["params"]] for g in optimizer.param_groups],
            "element_bytes": _element_bytes(params[0]) if params else 4,
            "bucket_view": bool(optimizer.parameters_as_bucket_view),
            "group_ranks": [int(r) for r in dist.get_process_group_ranks(optimizer.process_group)],
        })

    def step_window(self, pre_s: float, end_s: float, cpu_s: float, after_cpu_s: float, local_s: float) -> None:
        """A step ended: its optimizer window (``pre_s`` to ``end_s``), the CPU time the script's
        thread used in the step and in that window, and its local work: ``compute_s`` less the
        time the main thread waited in the backend's ``wait()`` beyond ``comm_blocked_s``."""
        self.local_s.append(max(0.0, local_s))
        self.after_s.append(max(0.0, end_s - pre_s))
        self.cpu_s.append(max(0.0, cpu_s))
        self.after_cpu_s.append(max(0.0, after_cpu_s))

    def as_dict(self) -> dict:
        def steady(values: list[float]) -> float:  # step 0 holds the lazy set-ups
            values = values[1:] or values
            return statistics.median(values) if values else 0.0

        return {"fsdp": self.fsdp, "zero": self.zero, "groups": sorted(list(g) for g in self.groups),
                "after_step_s": steady(self.after_s), "cpu_s": steady(self.cpu_s),
                "after_step_cpu_s": steady(self.after_cpu_s), "local_s": steady(self.local_s)}
