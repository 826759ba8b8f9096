"""Atomic file writes: readers see the old file or the complete new one, never a partial one.

Each writer fills a temporary file in the destination directory (same filesystem, so the
rename is atomic), flushes and fsyncs it, then ``os.replace``s it over the destination and
fsyncs the directory. If anything raises, the temporary file is removed and the previous
destination file, if any, is left untouched. A writer killed outright (SIGKILL) cannot
remove its temporary file; :func:`remove_partial_files` does, and the launcher calls it when
the ranks have ended, so a results directory never holds a half-written file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

# Temporary files are ".<name>.<random>.partial": hidden, and recognisable as unfinished.
PARTIAL_SUFFIX = ".partial"

# How NaN is spelled in CSV files; pandas.read_csv parses it back to NaN.
CSV_NA_REP = "NaN"

# mkstemp creates files with mode 0600; results should get the usual umask-based mode.
# os.umask can only be read by setting it, so do that once, at import.
_UMASK = os.umask(0o022)
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; not every platform can open a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", **open_kwargs: Any) -> Iterator[IO]:
    """Open a temporary file that replaces ``path`` only if the ``with`` block succeeds."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open supports modes 'w' and 'wb', got {mode!r}")
    path = Path(path)
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=PARTIAL_SUFFIX)
    try:
        handle = os.fdopen(fd, mode, **open_kwargs)
    except BaseException:
        os.close(fd)
        os.unlink(tmp_name)
        raise
    try:
        with handle:
            os.chmod(tmp_name, _FILE_MODE)
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_directory(directory)


def remove_partial_files(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporary files writers killed mid-write left under ``directory``; returns
    them. Only call it when no writer is running there."""
    removed = []
    for path in Path(directory).rglob(f".*{PARTIAL_SUFFIX}"):
        if path.is_file():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            removed.append(path)
    return removed


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Atomically write ``data`` to ``path``."""
    with atomic_open(path, "wb") as handle:
        handle.write(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Atomically write ``text`` to ``path`` (newlines written as given)."""
    with atomic_open(path, "w", encoding=encoding, newline="") as handle:
        handle.write(text)
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    """Atomically write ``obj`` as strict JSON (NaN/inf rejected: JSON has none).

    ``indent=None`` writes compact JSON without spaces, for large files such as traces.
    """
    separators = (",", ":") if indent is None else None
    text = json.dumps(obj, indent=indent, separators=separators, allow_nan=False)
    return write_text(path, text + "\n")


def write_csv(path: str | os.PathLike, dataframe) -> Path:
    """Atomically write a DataFrame as CSV: header row, no index, NaN spelled ``NaN``."""
    with atomic_open(path, "w", encoding="utf-8", newline="") as handle:
        dataframe.to_csv(handle, index=False, na_rep=CSV_NA_REP, lineterminator="\n")
    return Path(path)


def save_torch(path: str | os.PathLike, obj: Any) -> Path:
    """Atomically ``torch.save`` ``obj`` to ``path``."""
    import torch  # noqa: PLC0415  (lazy: the results package itself does not need torch)

    with atomic_open(path, "wb") as handle:
        torch.save(obj, handle)
    return Path(path)
