"""Single-process checks of the native layer (a world of one rank, no mpiexec needed)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from harness import _core, schedules
from harness.comm import CommError, Communicator
from harness.comm.buffers import as_float32_buffer


@pytest.fixture(scope="module")
def comm():
    c = Communicator()
    yield c
    c.close()


def test_torch_tensor_is_zero_copy(comm):
    import torch

    t = torch.arange(6, dtype=torch.float32)
    view = as_float32_buffer(t)
    view[0] = 42.0
    assert t[0].item() == 42.0
    comm.allreduce(t, op="mean")  # one rank: the mean is the value itself
    assert t.tolist() == [42.0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda torch: torch.zeros(3, dtype=torch.float64), "float32"),
        (lambda torch: torch.zeros(4, 4)[:, 0], "contiguous"),
        (lambda torch: torch.zeros(3, device="meta"), "on meta"),
    ],
)
def test_bad_torch_tensors(comm, make, message):
    import torch

    with pytest.raises(CommError, match=message):
        comm.allreduce(make(torch))


def test_nonblocking_handle(comm):
    x = np.ones(10, dtype=np.float32)
    h = comm.iallreduce(x)
    h.wait()
    assert h.done()
    post, start, end = h.times()
    assert post <= start <= end


def test_records_have_times_and_bytes(comm):
    comm.drain_records()
    comm.allreduce(np.ones(5, dtype=np.float32))
    records = comm.drain_records()
    assert [r.op for r in records] == ["allreduce"]
    assert records[0].post_s <= records[0].start_s <= records[0].end_s
    assert records[0].bytes == 0  # one rank sends nothing


def test_native_sync_rule_matches_schedule():
    for sync_every in (0, 1, 3, 11, 33):
        for t in range(200):
            assert _core.is_sync_round(t, sync_every) == schedules.is_sync_round(t, sync_every)


def test_extension_links_the_same_libmpi_as_mpi4py():
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc (Linux)")
    libs = {m.group(0) for m in re.finditer(r"\S*/libmpi\.so[.\d]*", maps.read_text())}
    assert len(libs) == 1, f"more than one libmpi is loaded: {libs}"
