"""Work objects of the harness backend: ``wait()`` on the native handle, ``get_future()`` as a
``torch.futures.Future`` completed when the native operation completes.

Nothing polls. ``wait()`` blocks in the native handle (GIL released, on a condition variable).
A future is completed by one completion thread per process, which sleeps in a native
completion queue (``harness._core.CompletionQueue``) that the progress thread pushes an
operation's id into when it finishes; the thread then copies staged results back and sets the
future's result, which runs the future's ``then`` callbacks (DDP's communication hooks) on it.

A callback that starts another operation and waits for its future (PowerSGD's hook does) runs on
the completion thread itself; ``get_future()`` called there completes the future before
returning it (waiting on the native handle), so the thread never waits for itself.
"""

from __future__ import annotations

import atexit
import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from harness import _core
from harness.dist.lineage import LineageFuture, inside

_JOIN_AT_EXIT_S = 5.0
# Seconds the main thread has spent in wait() on the backend's works (FSDP2 waits for its
# all-gathers there, inside the forward pass): the session takes it apart from the local work.
main_thread_wait_s = 0.0


class _Completer:
    """The completion thread: maps ids the native queue hands back to their callbacks."""

    def __init__(self) -> None:
        self._queue = _core.CompletionQueue()
        self._lock = threading.Lock()
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next_id = 0
        self._thread: threading.Thread | None = None

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def watch(self, handle: Any, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the completion thread once ``handle``'s operation is done."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="harness.dist completion", daemon=True)
                self._thread.start()
            ident = self._next_id
            self._next_id += 1
            self._callbacks[ident] = callback
        handle.notify(self._queue, ident)

    def _run(self) -> None:
        while True:
            ident = self._queue.pop()  # sleeps with the GIL released
            if ident < 0:
                return
            with self._lock:
                callback = self._callbacks.pop(ident)
            callback()

    def close(self) -> None:
        """Ends the thread (at exit, before the interpreter finalizes: a daemon thread still inside
        the native queue then would be killed mid-call and abort the process)."""
        self._queue.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=_JOIN_AT_EXIT_S)


_completer = _Completer()
atexit.register(_completer.close)


def _timeout_s(timeout: Any) -> float | None:
    """torch passes a timedelta (zero: no limit, kNoTimeout) or nothing."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return None if seconds <= 0 else seconds


class HarnessWork(dist.Work):
    """One operation of the harness backend (several native handles for a coalesced call).

    Args:
        handles: the native handles of the operation.
        result: what the future holds (the output tensors, as torch's backends return them).
        finish: run once after the handles are done, before the result is visible (copies staged
            buffers back into the caller's tensors), or None.
        op: the operation's name, for errors.
    """

    def __init__(self, handles: list[Any], result: Any, finish: Callable[[], None] | None, op: str) -> None:
        super().__init__()
        self._handles = handles
        self._result = result
        self._finish = finish
        self._op = op
        self._lock = threading.Lock()
        self._completed = False
        self._error: BaseException | None = None
        self._future: torch.futures.Future | None = None
        self.lineage: tuple[int, ...] = ()  # set by the process group (harness.dist.lineage)
        # per handle: op, bytes, peer, tag (HarnessProcessGroup._shape)
        self.shapes: list[tuple[str, int, int, int]] = []

    def _complete(self, timeout_s: float | None = None) -> None:
        with self._lock:
            if not self._completed:
                try:
                    for h in self._handles:
                        h.wait(timeout_s)
                    if self._finish is not None:
                        self._finish()
                except _core.CommError as exc:
                    if exc.kind == _core.ErrorKind.TIMEOUT:  # the op may still end
                        raise
                    self._error = exc
                except BaseException as exc:  # noqa: BLE001  recorded and raised to every waiter
                    self._error = exc
                self._completed = True
        if self._error is not None:
            raise self._error

    def wait(self, timeout: Any = None) -> bool:
        global main_thread_wait_s
        if threading.current_thread() is not threading.main_thread() or self._completed:
            self._complete(_timeout_s(timeout))
            return True
        began = time.monotonic()
        try:
            self._complete(_timeout_s(timeout))
        finally:
            main_thread_wait_s += time.monotonic() - began
        return True

    def is_completed(self) -> bool:
        return self._completed or all(h.done() for h in self._handles)

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> Any:
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def _set_future(self) -> None:
        fut = self._future
        assert fut is not None
        try:
            self._complete()
        except BaseException as exc:  # noqa: BLE001
            fut.set_exception(exc)
            return
        with inside(self.lineage):  # callbacks torch's C++ side chained run in it too
            fut.set_result(self._result)

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            self._future = LineageFuture(self.lineage)
            pending = [h for h in self._handles if not h.done()]
            if not pending or threading.current_thread() is _completer.thread:
                self._set_future()
            else:
                # The last handle of a coalesced call: handles of one caller finish in order on
                # the progress thread only per group, so wait for each in turn.
                remaining = list(pending)

                def next_or_done() -> None:
                    while remaining and remaining[0].done():
                        remaining.pop(0)
                    if remaining:
                        _completer.watch(remaining[0], next_or_done)
                    else:
                        self._set_future()

                next_or_done()
        return self._future


def completed_work(result: Any) -> HarnessWork:
    """A work with nothing to wait for (an operation that moves no bytes)."""
    return HarnessWork([], result, None, "noop")
