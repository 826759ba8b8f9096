"""Buffer sizes of the benchmarks, in bytes: parsed from ``4096``, ``4K``, ``1M``, ``1G`` (binary
suffixes) and written back in the shortest exact spelling. A size must be a whole number of
float32 elements: the benchmarks' buffers are float32.
"""

from __future__ import annotations

import re

from harness.arguments import split_list
from harness.errors import HarnessError

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
MAX_SIZE = GIB  # each rank holds several buffers of the size (input, result, MPI result, tolerance)

_SUFFIX = {"": 1, "K": KIB, "M": MIB, "G": GIB}
_SIZE_RE = re.compile(r"(\d+)\s*(?:([KMG])I?)?B?", re.IGNORECASE)


class SizeError(HarnessError, ValueError):
    """A size argument that is not a positive whole number of float32 elements (a ValueError,
    which ``harness.arguments.argtype`` turns into the option's usage error)."""


def parse_bytes(text: str) -> int:
    """A byte count with an optional binary suffix: ``4096``, ``4K``, ``1M``, ``1G`` (``KB``, ``KiB`` too)."""
    match = _SIZE_RE.fullmatch(text.strip())
    if match is None:
        raise SizeError(f"bad size {text!r}: expected a byte count like 4096, 4K, 1M or 1G")
    return int(match.group(1)) * _SUFFIX[(match.group(2) or "").upper()]


def parse_size(text: str) -> int:
    """A benchmark buffer size in bytes: positive, a multiple of 4 (float32), at most 1G.

    >>> parse_size("64K")
    65536
    """
    size = parse_bytes(text)
    if size <= 0:
        raise SizeError(f"bad size {text!r}: must be positive")
    if size % 4:
        raise SizeError(f"bad size {text!r}: {size} bytes is not a whole number of float32 elements (4 bytes each)")
    if size > MAX_SIZE:
        raise SizeError(f"bad size {text!r}: at most 1G per buffer")
    return size


def parse_sizes(text: str) -> list[int]:
    """Comma-separated sizes (see ``parse_size``), ascending, duplicates dropped."""
    try:
        parts = split_list(text, "size", "4K,64K,1M")
    except ValueError as exc:
        raise SizeError(str(exc)) from None
    return sorted({parse_size(p) for p in parts})


def format_size(size: int) -> str:
    """The shortest exact spelling: 4K, 1M, 1536K, 100."""
    for suffix, unit in (("G", GIB), ("M", MIB), ("K", KIB)):
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)
