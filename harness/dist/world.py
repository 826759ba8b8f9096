"""The native world communicator the backend's groups are built on, and ``env://`` from MPI.

One ``harness.comm.Communicator`` over ``MPI.COMM_WORLD`` per process carries every group's
traffic (one progress thread, one link emulator: the scenario's links apply to every group).
``python -m harness launch`` hands the backend the communicator of its session
(:func:`use_communicator`), so the scenario's emulated network is the one already set up;
otherwise the first process group makes its own.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
from typing import Any

from harness.mpi_library import import_mpi
from harness.dist.errors import BackendInitError
from harness.launch import inside_mpi_job

_lock = threading.Lock()
_comm: Any = None


def use_communicator(comm: Any) -> None:
    """Carry the backend's traffic on ``comm`` (a ``harness.comm.Communicator`` over the world)."""
    global _comm
    with _lock:
        _comm = comm


def communicator() -> Any:
    """The world communicator, made on first use."""
    global _comm
    with _lock:
        if _comm is None or _comm.closed:
            from harness.comm import Communicator  # noqa: PLC0415  (loads mpi4py.MPI, which initializes MPI)

            _comm = Communicator()
        return _comm


def launched_by_mpi() -> bool:
    return inside_mpi_job() is not None


def fill_env_from_mpi() -> None:
    """Set the ``env://`` variables torchrun sets from MPI, where they are unset.

    RANK, WORLD_SIZE: MPI's; LOCAL_RANK, LOCAL_WORLD_SIZE: among the ranks on this host;
    MASTER_ADDR: 127.0.0.1 when every rank is on one host, else rank 0's address; MASTER_PORT: a
    port free on rank 0 at the time. Collective over ``MPI.COMM_WORLD`` (every rank imports
    ``harness.dist``, so every rank calls it).
    """
    MPI = import_mpi()  # initializes MPI: only under an MPI launcher

    world = MPI.COMM_WORLD
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        one_host = local.size == world.size
        if world.rank == 0:
            addr = "127.0.0.1" if one_host else socket.gethostbyname(socket.gethostname())
            with socket.socket() as s:
                s.bind(("" if not one_host else "127.0.0.1", 0))
                port = s.getsockname()[1]
            master = (addr, port)
        else:
            master = None
        addr, port = world.bcast(master, root=0)
        values = {
            "RANK": world.rank,
            "WORLD_SIZE": world.size,
            "LOCAL_RANK": local.rank,
            "LOCAL_WORLD_SIZE": local.size,
            "MASTER_ADDR": addr,
            "MASTER_PORT": port,
        }
    finally:
        local.Free()
    for key, value in values.items():
        os.environ.setdefault(key, str(value))


def check_against_mpi(rank: int, size: int) -> None:
    """torch's rank and world size for the default group must be MPI's."""
    comm = communicator()
    if (rank, size) != (comm.rank, comm.size):
        hint = (
            "the ranks were not started by an MPI launcher: start them with `python -m harness launch SCRIPT` "
            "or `mpiexec -n N python SCRIPT`, not torchrun"
            if comm.size == 1
            else "RANK and WORLD_SIZE must be MPI's (unset them: importing harness.dist sets them from MPI)"
        )
        raise BackendInitError(
            f"init_process_group('harness'): torch says rank {rank} of {size}, MPI says rank {comm.rank} of "
            f"{comm.size}; {hint}"
        )


def abort_job_on_uncaught_exception() -> None:
    """Under a bare ``mpiexec``/``srun`` (no ``launch``, whose watchdog ends a job whose rank
    fails): a rank that ends in an uncaught exception exits with status 1 right after printing
    it, without ``MPI_Finalize``, so the launcher ends the job (as ``python -m mpi4py`` makes it
    with ``MPI_Abort``). Otherwise its exit would wait in ``MPI_Finalize`` for peers that wait
    for it in a collective, and the job would hang instead of failing.

    The exit is registered to run first at interpreter exit (before mpi4py's finalizer), not
    taken inside the hook: torch's own hook wraps this one and writes the traceback only after
    it returns."""
    previous = sys.excepthook

    def exit_failed() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    def abort(kind: type, value: BaseException, tb: Any) -> None:
        previous(kind, value, tb)
        if not issubclass(kind, (KeyboardInterrupt, SystemExit)):
            atexit.register(exit_failed)

    sys.excepthook = abort
