"""The harness backend's process group: torch.distributed's operations on the native layer.

A Python subclass of ``torch.distributed.ProcessGroup`` (as torchft's process groups and torch's
own test process groups are): torch's Python functions (``dist.all_reduce``, ...) call its
methods directly, and torch's C++ callers (DDP's reducer, its communication hooks) reach the
same methods through the ``ProcessGroup`` trampoline. Every byte goes through the native group
(``kernels/group.hpp``), under the scenario's emulated links.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from harness.dist import mismatch
from harness.dist.errors import UnsupportedError
from harness.dist.lineage import next_lineage, tag_of
from harness.dist.tensors import Staged, dtype_code, finisher, reduce_code, settle
from harness.dist.work import HarnessWork

if TYPE_CHECKING:
    # The options torch passes each operation (AllgatherOptions is not re-exported by torch.distributed).
    from torch._C._distributed_c10d import (
        AllgatherOptions,
        AllreduceOptions,
        AllToAllOptions,
        BarrierOptions,
        BroadcastOptions,
        GatherOptions,
        ReduceOptions,
        ReduceScatterOptions,
        ScatterOptions,
    )

BACKEND = "harness"

# Called with (group, work) for every work a group makes (harness.dist.session records each
# collective's group this way); None: nothing watches.
Observer = Callable[["HarnessProcessGroup", HarnessWork], None]
_observer: Observer | None = None


def observe(fn: Observer | None) -> None:
    """Have ``fn(group, work)`` called for every work any harness process group makes (None: stop;
    ``launch``'s session stops once the script returned, which the mismatch watch notes: the
    script posts nothing more)."""
    global _observer
    _observer = fn
    watch = mismatch.current()
    if fn is None and watch is not None:
        watch.finished("returned")


def _opt(opts: object | None, name: str, default: Any) -> Any:
    return default if opts is None else getattr(opts, name, default)


def _split_into(tensors: Sequence[torch.Tensor], flat: torch.Tensor) -> Callable[[], None]:
    """A function copying consecutive pieces of ``flat`` into ``tensors``."""

    def finish() -> None:
        offset = 0
        with torch.no_grad():
            for t in tensors:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view(t.shape))
                offset += n
        settle(tensors)

    return finish


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _one_numel(tensors: Sequence[torch.Tensor], n: int, op: str, what: str) -> None:
    for t in tensors:
        if t.numel() != n:
            raise UnsupportedError(f"{op}: every {what} tensor must hold {n} elements (got {t.numel()})")


class HarnessProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group whose traffic crosses the harness's native layer.

    Args:
        native: the native group (``harness._core.Group``) of the members.
        rank, size: this rank in the group and the group's size (torch's).
        world_ranks: the world rank of every group rank.
    """

    def __init__(self, native: Any, rank: int, size: int, world_ranks: list[int]) -> None:
        # torch's stub lists only the (store, rank, size) constructor; the binding also takes (rank, size),
        # the one torch's own Python process groups call.
        super().__init__(rank, size)  # type: ignore[call-arg]
        self._coalesced: list[HarnessWork] | None = None
        self._seq = itertools.count()
        self._tag_ub = native.tag_ub
        self._posting = threading.local()  # the lineage of the collective this thread posts
        self._native = native
        self._rank = rank
        self._size = size
        self.world_ranks = list(world_ranks)

    # -- identity ---------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND

    # torch sets a group's name and description on its backends; a Python process group has
    # none, so it keeps them itself (DeviceMesh.from_group, FSDP2 look the group up by name).
    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return getattr(self, "_group_name", "")

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return getattr(self, "_group_desc", "")

    def shutdown(self) -> None:
        """torch's ``destroy_process_group``: the mismatch watch notes that this rank posts on the
        group no more."""
        watch = mismatch.current()
        if watch is not None:
            watch.destroyed(self)
        super().shutdown()

    @property
    def native(self) -> Any:
        return self._native

    def __repr__(self) -> str:
        return f"HarnessProcessGroup(rank={self._rank}, size={self._size}, world_ranks={self.world_ranks})"

    # -- helpers ----------------------------------------------------------------------------
    def _tag(self) -> int:
        """The tag of the collective about to be posted (see harness.dist.lineage); the work made
        next carries its lineage."""
        lineage = next_lineage(lambda: next(self._seq))
        self._posting.lineage = lineage
        return tag_of(lineage, self._tag_ub)

    def _shape(self, handle: Any, kind: str, nbytes: int, peer: int = -1, tag: int = 0) -> Any:
        """Notes what ``handle``'s operation is, for the simulator (:mod:`harness.dist.sequence`) and
        the mismatch audit (:mod:`harness.dist.mismatch`): the native operation, its payload bytes
        (what ``payload_bytes`` of collectives.csv means for each operation), the group rank of
        its root or peer (-1: none) and, for point-to-point, its tag; the work made next carries
        the notes of its handles, in order."""
        shapes = getattr(self._posting, "shapes", None)
        if shapes is None:
            shapes = self._posting.shapes = []
        shapes.append((kind, int(nbytes), int(peer), int(tag)))
        return handle

    def description(self) -> str:
        """The group as results and errors name it: its description (else its name) and world
        ranks, e.g. ``default_pg [0 1 2]`` (torch names a group after making it: read at first use)."""
        where = getattr(self, "_where", None)
        if where is None:
            desc = self.getGroupDesc()
            name = desc if desc and desc != "undefined" else self.getGroupName()
            where = f"{name} [{' '.join(str(r) for r in self.world_ranks)}]"
            if name:
                self._where = where
        return where

    def _made(self, work: HarnessWork) -> HarnessWork:
        work.lineage = getattr(self._posting, "lineage", ())
        work.shapes, self._posting.shapes = getattr(self._posting, "shapes", None) or [], []
        watch = mismatch.current()
        if watch is not None:
            watch.posted(self, self.description(), work)
        if _observer is not None:
            _observer(self, work)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _root(self, root: int, op: str) -> int:
        if not 0 <= root < self._size:
            raise UnsupportedError(f"{op}: root {root} is not a rank of this group of {self._size}")
        return root

    # The operations torch's Python functions and its C++ callers (through the trampoline) call: the
    # virtual (tensors, opts) form of each. torch's stub also lists the binding's convenience overloads
    # (one tensor, op=, root=, timeout=), which C++ turns into the virtual form: a Python override never
    # receives them, so those overrides are marked `type: ignore[override]`.

    # -- reductions -------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor],  # type: ignore[override]  # virtual form only
                  opts: AllreduceOptions | None = None) -> HarnessWork:
        op = "all_reduce"
        code = reduce_code(_opt(opts, "reduceOp", dist.ReduceOp.SUM), op)
        st = Staged(tensors, op)
        h = self._native.allreduce(st.buf, st.buf.data_ptr(), st.buf.numel(), dtype_code(st.buf, op), code, self._tag())
        self._shape(h, "allreduce", _nbytes(st.buf))
        return self._made(HarnessWork([h], tensors, finisher(st), op))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: AllreduceOptions | None = None) -> HarnessWork:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor],  # type: ignore[override]  # virtual form only
               opts: ReduceOptions | None = None) -> HarnessWork:
        op = "reduce"
        code = reduce_code(_opt(opts, "reduceOp", dist.ReduceOp.SUM), op)
        root = self._root(_opt(opts, "rootRank", 0), op)
        st = Staged(tensors, op)
        h = self._native.reduce(st.buf, st.buf.data_ptr(), st.buf.numel(), dtype_code(st.buf, op), code, root,
                                self._tag())
        self._shape(h, "reduce", _nbytes(st.buf), root)
        return self._made(HarnessWork([h], tensors, finisher(st) if self._rank == root else None, op))

    def _reduce_scatter_flat(self, out: torch.Tensor, inp: torch.Tensor, code: Any, op: str) -> tuple[Any, Staged]:
        so, si = Staged([out], op, fill=False), Staged([inp], op)
        if si.buf.dtype != so.buf.dtype:
            raise UnsupportedError(f"{op}: input {si.buf.dtype} and output {so.buf.dtype} differ in dtype")
        h = self._native.reduce_scatter((si.buf, so.buf), si.buf.data_ptr(), si.buf.numel(), so.buf.data_ptr(),
                                        so.buf.numel(), dtype_code(so.buf, op), code, self._tag())
        return self._shape(h, "reduce_scatter", _nbytes(si.buf)), so

    # (parameters named as torch names them, here and below, so the aliases at the end fit torch's too)
    def _reduce_scatter_base(self, outputTensor: torch.Tensor, inputTensor: torch.Tensor,
                             opts: ReduceScatterOptions | None = None) -> HarnessWork:
        op = "reduce_scatter_tensor"
        code = reduce_code(_opt(opts, "reduceOp", dist.ReduceOp.SUM), op)
        h, so = self._reduce_scatter_flat(outputTensor, inputTensor, code, op)
        return self._made(HarnessWork([h], [outputTensor], finisher(so), op))

    def reduce_scatter_tensor_coalesced(self, outputTensors: list[torch.Tensor], inputTensors: list[torch.Tensor],
                                        opts: ReduceScatterOptions | None = None) -> HarnessWork:
        op = "reduce_scatter_tensor_coalesced"
        code = reduce_code(_opt(opts, "reduceOp", dist.ReduceOp.SUM), op)
        handles, staged = [], []
        for out, inp in zip(outputTensors, inputTensors, strict=True):
            h, so = self._reduce_scatter_flat(out, inp, code, op)
            handles.append(h)
            staged.append(so)
        return self._made(HarnessWork(handles, outputTensors, finisher(*staged), op))

    def reduce_scatter(self, output_tensors: list[torch.Tensor],  # type: ignore[override]  # virtual form only
                       input_tensors: list[list[torch.Tensor]],
                       opts: ReduceScatterOptions | None = None) -> HarnessWork:
        op = "reduce_scatter"
        code = reduce_code(_opt(opts, "reduceOp", dist.ReduceOp.SUM), op)
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            raise UnsupportedError(f"{op}: one output tensor and one input list per call")
        out, inputs = output_tensors[0], input_tensors[0]
        if len(inputs) != self._size:
            raise UnsupportedError(f"{op}: the input list holds {len(inputs)} tensors for a group of {self._size}")
        _one_numel(inputs, out.numel(), op, "input")
        flat = Staged(inputs, op)
        h, so = self._reduce_scatter_flat(out, flat.buf, code, op)
        return self._made(HarnessWork([h], output_tensors, finisher(so), op))

    # -- data movement ----------------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor],  # type: ignore[override]  # virtual form only
                  opts: BroadcastOptions | None = None) -> HarnessWork:
        op = "broadcast"
        root = self._root(_opt(opts, "rootRank", 0), op)
        st = Staged(tensors, op, fill=self._rank == root)
        h = self._native.broadcast(st.buf, st.buf.data_ptr(), st.buf.numel(), dtype_code(st.buf, op), root, self._tag())
        self._shape(h, "broadcast", _nbytes(st.buf), root)
        return self._made(HarnessWork([h], tensors, finisher(st) if self._rank != root else None, op))

    def _allgather_flat(self, out: torch.Tensor, inp: torch.Tensor, op: str) -> tuple[Any, Staged]:
        so, si = Staged([out], op, fill=False), Staged([inp], op)
        if si.buf.dtype != so.buf.dtype:
            raise UnsupportedError(f"{op}: input {si.buf.dtype} and output {so.buf.dtype} differ in dtype")
        h = self._native.allgather((si.buf, so.buf), si.buf.data_ptr(), si.buf.numel(), so.buf.data_ptr(),
                                   so.buf.numel(), dtype_code(so.buf, op), self._tag())
        return self._shape(h, "allgather", _nbytes(si.buf)), so

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,
                        opts: AllgatherOptions | None = None) -> HarnessWork:
        op = "all_gather_into_tensor"
        h, so = self._allgather_flat(output, input, op)
        return self._made(HarnessWork([h], [output], finisher(so), op))

    def allgather_into_tensor_coalesced(self, output_lists: list[torch.Tensor], input_list: list[torch.Tensor],
                                        opts: AllgatherOptions | None = None) -> HarnessWork:
        op = "all_gather_into_tensor_coalesced"
        handles, staged = [], []
        for out, inp in zip(output_lists, input_list, strict=True):
            h, so = self._allgather_flat(out, inp, op)
            handles.append(h)
            staged.append(so)
        return self._made(HarnessWork(handles, output_lists, finisher(*staged), op))

    def allgather(self, output_tensors: list[list[torch.Tensor]],  # type: ignore[override]  # virtual form only
                  input_tensors: list[torch.Tensor], opts: AllgatherOptions | None = None) -> HarnessWork:
        op = "all_gather"
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            raise UnsupportedError(f"{op}: one output list and one input tensor per call")
        outs, inp = output_tensors[0], input_tensors[0]
        if len(outs) != self._size:
            raise UnsupportedError(f"{op}: the output list holds {len(outs)} tensors for a group of {self._size}")
        _one_numel(outs, inp.numel(), op, "output")
        flat = torch.empty(inp.numel() * self._size, dtype=inp.dtype)
        h, _ = self._allgather_flat(flat, inp, op)
        return self._made(HarnessWork([h], output_tensors, _split_into(outs, flat), op))

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
                            opts: AllgatherOptions | None = None) -> HarnessWork:
        raise UnsupportedError("all_gather_coalesced is not supported by the harness backend "
                               "(use all_gather_into_tensor)")

    def gather(self, output_tensors: list[list[torch.Tensor]],  # type: ignore[override]  # virtual form only
               input_tensors: list[torch.Tensor], opts: GatherOptions | None = None) -> HarnessWork:
        op = "gather"
        root = self._root(_opt(opts, "rootRank", 0), op)
        if len(input_tensors) != 1:
            raise UnsupportedError(f"{op}: one input tensor per call")
        inp = input_tensors[0]
        si = Staged([inp], op)
        n = si.buf.numel()
        if self._rank == root:
            if len(output_tensors) != 1 or len(output_tensors[0]) != self._size:
                raise UnsupportedError(f"{op}: the root needs one output list of {self._size} tensors")
            outs = output_tensors[0]
            _one_numel(outs, n, op, "output")
            flat = torch.empty(n * self._size, dtype=inp.dtype)
            finish = _split_into(outs, flat)
        else:
            flat = torch.empty(0, dtype=inp.dtype)
            finish = None
        h = self._native.gather((si.buf, flat), si.buf.data_ptr(), n, flat.data_ptr(), flat.numel(),
                                dtype_code(si.buf, op), root, self._tag())
        self._shape(h, "gather", _nbytes(si.buf), root)
        return self._made(HarnessWork([h], output_tensors, finish, op))

    def scatter(self, output_tensors: list[torch.Tensor],  # type: ignore[override]  # virtual form only
                input_tensors: list[list[torch.Tensor]], opts: ScatterOptions | None = None) -> HarnessWork:
        op = "scatter"
        root = self._root(_opt(opts, "rootRank", 0), op)
        if len(output_tensors) != 1:
            raise UnsupportedError(f"{op}: one output tensor per call")
        so = Staged(output_tensors, op, fill=False)
        n = so.buf.numel()
        if self._rank == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self._size:
                raise UnsupportedError(f"{op}: the root needs one input list of {self._size} tensors")
            _one_numel(input_tensors[0], n, op, "input")
            flat = Staged(input_tensors[0], op).buf
        else:
            flat = torch.empty(0, dtype=so.buf.dtype)
        h = self._native.scatter((so.buf, flat), flat.data_ptr(), flat.numel(), so.buf.data_ptr(), n,
                                 dtype_code(so.buf, op), root, self._tag())
        self._shape(h, "scatter", _nbytes(so.buf), root)
        return self._made(HarnessWork([h], output_tensors, finisher(so), op))

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,  # type: ignore[override]  # virtual form only
                      output_split_sizes: list[int], input_split_sizes: list[int],
                      opts: AllToAllOptions | None = None) -> HarnessWork:
        op = "all_to_all_single"
        si, so = Staged([input], op), Staged([output], op, fill=False)
        if si.buf.dtype != so.buf.dtype:
            raise UnsupportedError(f"{op}: input {si.buf.dtype} and output {so.buf.dtype} differ in dtype")

        def counts(t: torch.Tensor, splits: list[int]) -> list[int]:
            rows = t.shape[0] if t.dim() > 0 else 1
            per_row = t.numel() // rows if rows else 0
            if not splits:
                if rows % self._size:
                    raise UnsupportedError(f"{op}: {rows} rows do not split evenly over {self._size} ranks")
                return [rows // self._size * per_row] * self._size
            if len(splits) != self._size or sum(splits) != rows:
                raise UnsupportedError(f"{op}: split sizes {list(splits)} do not divide {rows} rows over "
                                       f"{self._size} ranks")
            return [s * per_row for s in splits]

        h = self._native.alltoall((si.buf, so.buf), si.buf.data_ptr(), si.buf.numel(), so.buf.data_ptr(),
                                  so.buf.numel(), dtype_code(so.buf, op), counts(input, input_split_sizes),
                                  counts(output, output_split_sizes), self._tag())
        self._shape(h, "alltoall", _nbytes(si.buf))
        return self._made(HarnessWork([h], [output], finisher(so), op))

    def alltoall(self, output_tensors: list[torch.Tensor],  # type: ignore[override]  # virtual form only
                 input_tensors: list[torch.Tensor], opts: AllToAllOptions | None = None) -> HarnessWork:
        op = "all_to_all"
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise UnsupportedError(f"{op}: one input and one output tensor per rank ({self._size})")
        si = Staged(input_tensors, op)
        flat = torch.empty(sum(t.numel() for t in output_tensors), dtype=si.buf.dtype)
        h = self._native.alltoall((si.buf, flat), si.buf.data_ptr(), si.buf.numel(), flat.data_ptr(),
                                  flat.numel(), dtype_code(flat, op), [t.numel() for t in input_tensors],
                                  [t.numel() for t in output_tensors], self._tag())
        self._shape(h, "alltoall", _nbytes(si.buf))
        return self._made(HarnessWork([h], output_tensors, _split_into(output_tensors, flat), op))

    def barrier(self, opts: BarrierOptions | None = None) -> HarnessWork:  # type: ignore[override]  # virtual form only
        h = self._shape(self._native.barrier(self._tag()), "barrier", 0)
        return self._made(HarnessWork([h], [], None, "barrier"))

    # -- point to point ---------------------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> HarnessWork:
        op = "send"
        st = Staged(tensors, op)
        h = self._native.send(st.buf, st.buf.data_ptr(), st.buf.numel(), dtype_code(st.buf, op), int(dst), int(tag))
        self._shape(h, "send", _nbytes(st.buf), int(dst), int(tag))
        return self._made(HarnessWork([h], tensors, None, op))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> HarnessWork:
        op = "recv"
        st = Staged(tensors, op, fill=False)
        h = self._native.recv(st.buf, st.buf.data_ptr(), st.buf.numel(), dtype_code(st.buf, op), int(src), int(tag))
        self._shape(h, "recv", _nbytes(st.buf), int(src), int(tag))
        return self._made(HarnessWork([h], tensors, finisher(st), op))

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> HarnessWork:
        raise UnsupportedError("recv from any source (src=None) is not supported by the harness backend; "
                               "name the source rank")

    # -- coalescing (dist._coalescing_manager, batch_isend_irecv) ---------------------------
    def _start_coalescing(self, device: torch.device | None = None) -> None:
        self._coalesced = []

    def _end_coalescing(self, device: torch.device | None = None) -> HarnessWork:
        works, self._coalesced = self._coalesced or [], None
        return _Combined(works)

    # torch 2.13's names (the older ones above stay for torch's C++ callers and older torch)
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base  # type: ignore[assignment]  # virtual form only, as alltoall_base


class _Combined(HarnessWork):
    """The works of one coalesced block, waited together."""

    def __init__(self, works: list[HarnessWork]) -> None:
        super().__init__([h for w in works for h in w._handles], [w._result for w in works], None, "coalesced")
        self._works = works

    def _complete(self, timeout_s: float | None = None) -> None:
        for w in self._works:
            w._complete(timeout_s)
        self._completed = True
