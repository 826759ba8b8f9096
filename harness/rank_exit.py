"""How a rank ends when it must: promptly on an interrupt, and by aborting the MPI job after an error.

A rank runs inside an MPI job, where ending one process the wrong way leaves the others waiting
in a collective forever, or makes the launcher report a "BAD TERMINATION" that "typically refers
to a problem with your application" for a stop that was asked for. So a rank that is interrupted
(Ctrl+C, SIGTERM, the watchdog's stop) ends by itself with an exit status within
``INTERRUPT_GRACE_S`` (:func:`exit_promptly_when_interrupted`), and a rank that raised aborts the
whole job once the launcher has read why (:func:`abort_job_after_error`, :func:`abort_mpi_job`).
Every kind of rank uses it: the runner's worker, a ``harness.api`` script, a torch.distributed
script, the calibration and benchmark workers, and rank 0's watchdog on a verdict.
"""

from __future__ import annotations

import contextlib
import faulthandler
import fcntl
import os
import signal
import stat
import struct
import sys
import termios
import threading
import time
import traceback
from collections.abc import Sequence

INTERRUPT_GRACE_S = 5.0  # an interrupted rank ends within this, whatever it was doing
IMPORT_RETRY_S = 0.05  # an interrupt arriving during an import is delivered again after this
OUTPUT_DRAIN_S = 2.0  # before MPI_Abort: at most this long for the launcher to read what the rank printed
OUTPUT_DRAIN_POLL_S = 0.005


_interrupt_guard: tuple | None = None  # what exit_promptly_when_interrupted keeps alive
_interrupted = False  # whether this rank got SIGINT or SIGTERM (with the guard on)
_raised = False  # whether that interrupt has been raised as KeyboardInterrupt


def exit_promptly_when_interrupted(grace_s: float = INTERRUPT_GRACE_S) -> None:
    """In a rank, from its main thread: SIGINT and SIGTERM raise KeyboardInterrupt (whatever
    disposition the process inherited; after the import under way, if any), and the process
    ends with an exit status within ``grace_s`` even if its main thread cannot run Python by
    then.

    Python runs signal handlers only between bytecodes of the main thread, so a rank blocked
    in a native wait (a collective whose peers have already left) would never see its
    KeyboardInterrupt; ended by SIGTERM or SIGKILL instead, it makes mpiexec report a "BAD
    TERMINATION" that "typically refers to a problem with your application", which an
    interrupt is not. So the signal is also written to a wake-up pipe, and a thread blocked on
    it arms faulthandler's timer, a C thread that needs no interpreter lock, to ``_exit(1)``
    after ``grace_s`` unless the rank has ended by then (normally with 130, by itself).
    """
    global _interrupt_guard
    if _interrupt_guard is not None:
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # the C signal handler must never block on it
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_interrupt)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    # Where the timer writes the traceback nobody asked for; open for the process's life (the timer
    # may fire at any moment), so no context manager.
    sink = open(os.devnull, "w")  # noqa: SIM115

    def arm_on_interrupt() -> None:
        while True:
            got = os.read(read_end, 64)  # the numbers of the signals caught, one byte each
            if any(sig in got for sig in (signal.SIGINT, signal.SIGTERM)):
                faulthandler.dump_traceback_later(grace_s, exit=True, file=sink)
                return

    threading.Thread(target=arm_on_interrupt, name="exit-when-interrupted", daemon=True).start()
    _interrupt_guard = (read_end, write_end, sink)


def _raise_interrupt(signum: int, frame) -> None:
    """SIGINT, SIGTERM: KeyboardInterrupt, once, but never in the middle of an import. Raised
    there, it can be swallowed, turned into an ImportError, or make the interpreter end by
    SIGINT at exit (seen importing torch); so the signal comes again a little later instead.

    Later interrupts are ignored: a stop sends one straight to a rank and one through mpiexec
    (ranks on other hosts get only that), and a second KeyboardInterrupt raised while the
    first unwinds (in an ``except`` on the way to ``sys.exit(130)``) would end the rank with a
    traceback. The timer armed by the first ends the rank within its grace anyway."""
    global _interrupted, _raised
    _interrupted = True
    if _raised:
        return
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            again = threading.Timer(IMPORT_RETRY_S, os.kill, (os.getpid(), signum))
            again.daemon = True  # never keeps an exiting rank waiting
            again.start()
            return
        frame = frame.f_back
    _raised = True
    raise KeyboardInterrupt


def abort_job_after_error() -> int:
    """In a rank's worker, after an exception: print it and abort the whole MPI job, so no other
    rank waits in a collective forever; returns the exit status 1. After an interrupt (see
    :func:`exit_promptly_when_interrupted`) the error is its doing, e.g. an import it cut short
    and that reported it as an ImportError: nothing is printed and the status is 130."""
    if _interrupted:
        return 130
    traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    # MPI as far as this rank got: none loaded (it failed before) or not started, nothing to abort.
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        abort_mpi_job(MPI.COMM_WORLD)
    return 1


def abort_mpi_job(comm) -> None:
    """``comm.Abort(1)`` once the launcher has read what this rank printed (see
    :func:`wait_until_output_is_read`): otherwise the message saying why may never arrive."""
    wait_until_output_is_read()
    comm.Abort(1)


def wait_until_output_is_read(fds: Sequence[int] = (1, 2), limit_s: float = OUTPUT_DRAIN_S) -> bool:
    """Wait (sleeping, at most ``limit_s``) until whoever reads this process's stdout and stderr
    pipes has taken all that was written to them; False if it has not by then.

    Under mpiexec a rank's output goes through a pipe to Hydra's proxy, which forwards it. On
    MPI_Abort the proxy kills the job at once, and what it has not read from the pipe by then
    is lost: under load about one abort in ten lost the traceback that says why, and none did
    once the rank waited for the pipe to empty (measured, not a guarantee Hydra documents).
    Outputs that are not pipes (a terminal, a file) have nothing in flight and are not waited for."""
    pipes = []
    for fd in fds:
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                pipes.append(fd)
        except OSError:
            pass
    deadline = time.monotonic() + limit_s
    while True:
        unread = 0
        for fd in pipes:
            with contextlib.suppress(OSError):
                unread += struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        if unread == 0:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(OUTPUT_DRAIN_POLL_S)
