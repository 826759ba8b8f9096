"""Tensors as the native layer takes them: element-type and reduce-op codes, host staging.

The native layer reads and writes contiguous host memory by address (``kernels/group.hpp``).
A CPU tensor that is contiguous is used in place; any other tensor (non-contiguous, or on a
CUDA device: staged through the host, as the native layer's device path does) is copied into a
contiguous host tensor before the operation and copied back after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from harness import _core
from harness.dist.errors import UnsupportedError

# The native layer's element types (harness._core.DType), named as torch names its dtypes.
DTYPE_CODES: dict[torch.dtype, Any] = {getattr(torch, name): code for name, code in _core.DType.__members__.items()}
SUPPORTED_DTYPES = ", ".join(str(d).removeprefix("torch.") for d in DTYPE_CODES)

# The native layer's reduction operators (harness._core.ReduceOp), named as torch names them.
_REDUCE_CODES = {getattr(dist.ReduceOp, name): code for name, code in _core.ReduceOp.__members__.items()}


def dtype_code(tensor: torch.Tensor, op: str) -> Any:
    try:
        return DTYPE_CODES[tensor.dtype]
    except KeyError:
        raise UnsupportedError(
            f"{op}: tensors of dtype {tensor.dtype} are not supported by the harness backend "
            f"(supported: {SUPPORTED_DTYPES})"
        ) from None


def reduce_code(reduce_op: object, op: str) -> Any:
    # opts.reduceOp is a ReduceOp object; ReduceOp.SUM etc. are RedOpType members it compares to.
    for known, code in _REDUCE_CODES.items():
        if reduce_op == known:
            return code
    raise UnsupportedError(
        f"{op}: reduce op {reduce_op} is not supported by the harness backend (SUM, AVG, PRODUCT, MIN, MAX)"
    )


def same_dtype(tensors: Sequence[torch.Tensor], op: str) -> torch.dtype:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise UnsupportedError(f"{op}: the tensors mix dtypes {sorted(map(str, dtypes))}; pass one dtype per call")
    return next(iter(dtypes))


class Staged:
    """Host memory for a list of tensors: ``buf`` is one contiguous CPU tensor holding all of
    them (the tensor itself when there is one contiguous CPU tensor); ``copy_back()`` writes
    ``buf`` into the originals after the operation, ``copy_in`` is done by the constructor when
    ``fill`` is true (an output-only buffer need not be filled)."""

    __slots__ = ("_direct", "_tensors", "buf")

    def __init__(self, tensors: Sequence[torch.Tensor], op: str, fill: bool = True) -> None:
        self._tensors = list(tensors)
        if not self._tensors:
            raise UnsupportedError(f"{op}: no tensor given")
        same_dtype(self._tensors, op)
        dtype_code(self._tensors[0], op)
        if len(self._tensors) == 1 and _in_place_ok(self._tensors[0]):
            self.buf = self._tensors[0]
            self._direct = True
            return
        self._direct = False
        if len(self._tensors) == 1:
            t = self._tensors[0]
            self.buf = torch.empty(t.shape, dtype=t.dtype)  # contiguous, on the host
            if fill:
                self.buf.copy_(t.detach())
        else:
            total = sum(t.numel() for t in self._tensors)
            self.buf = torch.empty(total, dtype=self._tensors[0].dtype)
            if fill:
                offset = 0
                for t in self._tensors:
                    n = t.numel()
                    self.buf[offset : offset + n].copy_(t.detach().reshape(-1))
                    offset += n

    @property
    def direct(self) -> bool:
        return self._direct

    def copy_back(self) -> None:
        if self._direct:
            return
        offset = 0
        flat = self.buf.reshape(-1)
        for t in self._tensors:
            n = t.numel()
            with torch.no_grad():
                t.copy_(flat[offset : offset + n].view(t.shape))
            offset += n
        settle(self._tensors)


def settle(tensors: Sequence[torch.Tensor]) -> None:
    """Waits for the copies just made into ``tensors`` on a GPU. A host-to-device copy is queued
    on the copying thread's current stream (the completion thread's is the default stream), while
    the caller may read the result on another (FSDP2's side streams, a hook's callback): the
    operation counts as done only once its result is on the device."""
    done: set[torch.device] = set()
    for t in tensors:
        if t.device.type == "cuda" and t.device not in done:
            torch.cuda.current_stream(t.device).synchronize()
            done.add(t.device)


def _in_place_ok(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.is_contiguous() and not t.is_sparse


def address(t: torch.Tensor) -> int:
    return t.data_ptr()


def finisher(*staged: Staged) -> Callable[[], None] | None:
    """A function copying every non-direct staging buffer back, or None when all are direct."""
    todo = [s for s in staged if not s.direct]
    if not todo:
        return None

    def finish() -> None:
        for s in todo:
            s.copy_back()

    return finish
