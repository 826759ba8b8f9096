"""How the native layer reports failures: by the kind of each error, never by ending the process.

* Every error kind (``harness._core.ErrorKind``) raises its Python exception, the kind attached.
* A peer that dies while this rank's message to it waits in the link emulator: posting the
  message fails on the progress thread, outside any caller, and must become that operation's
  ``PeerLostError`` (it used to escape the thread and abort the process).
* The codes Python passes across (element types, reduce ops, allreduce algorithms) come from
  the module, not from numbers or names kept by hand on the Python side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import MPI_DIR

from harness import _core
from harness.comm import CommError, Communicator, ErrorKind, PeerLostError
from harness.dist.tensors import _REDUCE_CODES, DTYPE_CODES
from harness.launch import mpiexec_path, stop_job
from harness.scenario.network_fields import AllreduceAlgorithm
from harness.sim.step_programs import ALLREDUCE_ALGORITHMS


@pytest.mark.parametrize("kind", list(_core.ErrorKind.__members__.values()), ids=str)
def test_every_error_kind_raises_its_exception_with_the_kind(kind):
    with pytest.raises(CommError) as raised:
        _core.raise_error(kind, "what went wrong")
    assert raised.value.kind == kind
    assert str(raised.value) == "what went wrong"
    assert isinstance(raised.value, PeerLostError) == (kind == ErrorKind.PEER_LOST)


def test_a_wait_that_gives_up_is_a_timeout_not_a_failure():
    with Communicator() as comm:
        channel = comm.push_channel(3)
        with pytest.raises(CommError, match="arrived within") as raised:
            channel.drain(np.zeros(3, dtype=np.float32), min_messages=1, timeout=0.01)
        assert raised.value.kind == ErrorKind.TIMEOUT
        assert not isinstance(raised.value, PeerLostError)
        channel.close()


def test_an_argument_error_is_a_local_error():
    with Communicator() as comm, pytest.raises(CommError) as raised:
        comm.set_allreduce("no_such_algorithm")
    assert raised.value.kind == ErrorKind.LOCAL


def _run_with_survivors(ranks: int, args: list[str], env: dict) -> str:
    """Run tests/mpi/ARGS[0] on ``ranks`` ranks, where a rank dies and the others must carry on
    (``-disable-auto-cleanup`` keeps the launcher from ending them); what the job printed. The
    120 s is a hang guard: the survivors report within a second or two."""
    cmd = [str(mpiexec_path()), "-disable-auto-cleanup", "-n", str(ranks), sys.executable, "-u",
           str(MPI_DIR / args[0]), *args[1:]]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        stop_job(proc)
        pytest.fail(f"{args[0]}: the survivors never finished (stopped after 120 s)")
    return stdout + stderr


@pytest.mark.mpi
def test_a_peer_dying_while_a_link_holds_a_send_raises_peer_lost_on_the_survivor(tmp_path):
    # Shared memory (MPICH's default between ranks of one host) never notices a dead peer: a
    # send to it just waits. Through the OFI network module's sockets provider a send to a dead
    # peer fails when it is posted, which is the failure under test. -disable-auto-cleanup keeps
    # the launcher from ending the survivor when the other rank dies.
    out = tmp_path / "survivor.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPIR_CVAR_NOLOCAL="1", MPIR_CVAR_CH4_NETMOD="ofi",
               FI_PROVIDER="sockets")
    printed = _run_with_survivors(2, ["native_error_checks.py", str(out)], env)
    assert "terminate called" not in printed and "Aborted" not in printed, printed[-3000:]
    assert out.exists(), f"the survivor wrote no report:\n{printed[-3000:]}"
    report = json.loads(out.read_text())
    assert report["raised"] == "PeerLostError" and report["kind"] == "PEER_LOST", report
    assert "MPI_Isend" in report["message"], report  # the send the link released after the death
    assert report["after_s"] >= 0.9, report  # held by the 1 s link, not refused when posted
    assert report.get("closed"), f"the survivor did not close its communicator:\n{printed[-3000:]}"


@pytest.mark.mpi
@pytest.mark.parametrize("posted", [False, True], ids=["blocking", "posted"])
def test_a_peer_dying_in_a_shared_memory_collective_raises_peer_lost_on_the_survivors(tmp_path, posted):
    # The ranks share this host: their allreduce runs in a shared segment, where no MPI call
    # would notice the death; the waiters check that the process they wait for still exists.
    out = tmp_path / "survivor"
    args = ["shm_peer_lost_checks.py", str(out)] + (["posted"] if posted else [])
    printed = _run_with_survivors(3, args, dict(os.environ, PYTHONUNBUFFERED="1"))
    for rank in (0, 2):
        path = tmp_path / f"survivor.{rank}.json"
        assert path.exists(), f"rank {rank} wrote no report:\n{printed[-3000:]}"
        report = json.loads(path.read_text())
        assert report["raised"] == "PeerLostError" and report["kind"] == "PEER_LOST", report
        assert "rank 1" in report["message"] and "exited" in report["message"], report
        assert report.get("closed"), f"rank {rank} did not close its communicator:\n{printed[-3000:]}"


def test_dtype_and_reduce_op_codes_come_from_the_module():
    assert set(DTYPE_CODES) == {getattr(torch, name) for name in _core.DType.__members__}
    assert all(isinstance(code, _core.DType) for code in DTYPE_CODES.values())
    assert DTYPE_CODES[torch.bfloat16] == _core.DType.bfloat16
    assert all(isinstance(code, _core.ReduceOp) for code in _REDUCE_CODES.values())
    assert _REDUCE_CODES[dist.ReduceOp.AVG] == _core.ReduceOp.AVG
    assert len(_REDUCE_CODES) == len(_core.ReduceOp.__members__)


def test_the_native_layer_refuses_bare_numbers_for_codes():
    with Communicator() as comm:
        group = comm._native.group([0])
        buf = np.ones(4, dtype=np.float32)
        with pytest.raises(TypeError):
            group.allreduce(buf, buf.ctypes.data, buf.size, 0, 0, -1)
        group.allreduce(buf, buf.ctypes.data, buf.size, _core.DType.float32, _core.ReduceOp.SUM, -1).wait()
        np.testing.assert_array_equal(buf, np.ones(4, dtype=np.float32))


def test_the_allreduce_algorithm_names_are_the_native_layers():
    native = tuple(_core.AllreduceAlgorithm.__members__)
    assert native == ALLREDUCE_ALGORITHMS
    assert typing.get_args(AllreduceAlgorithm) == native
