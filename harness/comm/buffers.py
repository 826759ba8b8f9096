"""Turn caller buffers into what the native layer takes: C-contiguous float32 memory, zero copy.

numpy arrays pass through; CPU torch tensors become numpy views of the same memory (torch
does not export the buffer protocol). Device tensors are refused here, in one place: a CUDA
run stages through host memory in the caller before it communicates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness._core import CommError


def _is_torch_tensor(obj: Any) -> bool:
    # Checked by module name so that pure-communication callers never import torch.
    return type(obj).__module__.startswith("torch") and hasattr(obj, "is_contiguous") and hasattr(obj, "device")


def as_float32_buffer(obj: Any, what: str = "buffer") -> Any:
    """Return ``obj`` (numpy) or a zero-copy numpy view of it (CPU torch tensor).

    Raises CommError for a torch tensor that is not on the CPU, not float32 or not contiguous;
    the native layer checks numpy arrays (dtype, contiguity, writability) itself.
    """
    if type(obj) is np.ndarray:  # the common case first: every blocking call passes here
        return obj
    if _is_torch_tensor(obj):
        if obj.device.type != "cpu":
            raise CommError(
                f"{what} is a torch tensor on {obj.device}; the native layer takes CPU memory "
                "(copy it to a pinned host buffer first)"
            )
        if str(obj.dtype) != "torch.float32":
            raise CommError(f"{what} must have dtype float32 (got {obj.dtype})")
        if not obj.is_contiguous():
            raise CommError(f"{what} must be contiguous (call .contiguous() on it)")
        return obj.detach().numpy()
    if isinstance(obj, (np.ndarray, memoryview)):
        return obj
    raise CommError(f"{what} must be a numpy array or a CPU torch tensor (got {type(obj).__name__})")
