"""Heartbeats over TCP: every rank ships its heartbeat row to the watchdog, wherever both run.

The watchdog's side (:class:`HeartbeatServer`) listens on a TCP socket; the launcher passes its
address to the ranks as ``HARNESS_HEARTBEAT=tcp://ADDRESS:PORT/KEY`` (KEY, a random string,
keeps out connections that are not this job's ranks). In a job the user started, rank 0 runs it
and broadcasts the address (``harness.watchdog.in_job.join_watchdog``). ADDRESS is
``HARNESS_WATCHDOG_ADDRESS`` when set, 127.0.0.1 when every rank runs on the watchdog's host,
else the address this host's name resolves to, which is what the other hosts of a cluster
reach it by (:func:`watchdog_address`).

The rank's side (:class:`Sender`): the rank keeps writing its row in its own memory, as cheaply
as ever (no system call on the hot path; ``harness.watchdog.heartbeat``), and a daemon thread
copies it under the row's seqlock and ships it when it changed, at most every
``SEND_INTERVAL_S``. DONE and FAILED are shipped at once by the thread that writes them, before
the rank goes on, so a rank that exits right after DONE is never taken for dead.

The wire: one hello line (JSON: key, rank, pid, host name), then rows of ``FIELDS``
little-endian float64, in which PROGRESS_AT holds the row's *age*: seconds from the last
progress to the moment of sending, on the rank's clock (negative during an expected delay, NaN
before any progress). Hosts' CLOCK_MONOTONIC have different origins (and a test bed shifts them
with time namespaces), so no rank's clock time is ever compared with the watchdog's: the
receiver turns the age into its own clock on arrival (arrival - age; the transit time makes a
rank look at most that much more recent).

A connection that ends (EOF, which arrives even after SIGKILL: the kernel closes a dead
process's sockets) before its row said DONE means the rank's process ended without finishing.
The receiver keeps, per rank, the host its hello named and when its connection closed.

When they closed is the watchdog's evidence for which rank died first (MPI's clean-up ends the
others within milliseconds, and Hydra's own "BAD TERMINATION" report names whichever process it
happened to reap first, not the first to die). The order in which the server thread happens to
read its sockets is not that evidence: a socket with unread rows is queued for reading before
one whose process died later, and a thread that was not scheduled for a while reads them all at
once. So on Linux every connection is also registered, for its end alone (EPOLLRDHUP, with
errors and hang-ups), in an epoll instance of its own: the kernel queues each connection there
when its end arrives, in that order, and unread rows never queue it. The server takes the ends
from it in that order, each after the rows that preceded it, and stamps them with increasing
times. Elsewhere the ends are taken in the order they are read.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import select
import selectors
import socket
import struct
import sys
import threading
import time
import weakref
from collections.abc import Collection

import numpy as np

from harness.watchdog.heartbeat_row import FIELDS, Field, TableReader

ADDRESS_ENV = "HARNESS_WATCHDOG_ADDRESS"

SEND_INTERVAL_S = 0.2  # a changed row is shipped within this; the watchdog's timeouts are seconds
CONNECT_S = 5.0  # a rank tries this long to reach the watchdog, then runs unwatched
CONNECT_RETRY_S = 0.2  # between attempts
SEND_TIMEOUT_S = 5.0  # a send blocked this long (a watchdog that stopped reading) drops the link
HELLO_MAX = 4096  # bytes; a longer first line is not a rank's hello

_ROW = struct.Struct(f"<{FIELDS}d")
_PROGRESS_AT = int(Field.PROGRESS_AT)

_senders: weakref.WeakSet[Sender] = weakref.WeakSet()  # this process's open links, for flush_all


def watchdog_address(all_here: bool) -> str:
    """The address the watchdog listens on and the ranks connect to: ``HARNESS_WATCHDOG_ADDRESS``
    if set, 127.0.0.1 when every rank runs on this host (``all_here``), else the address this
    host's name resolves to. ValueError when that name does not resolve."""
    explicit = os.environ.get(ADDRESS_ENV, "").strip()
    if explicit:
        return explicit
    if all_here:
        return "127.0.0.1"
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError as exc:
        raise ValueError(
            f"this host's name {name!r} does not resolve ({exc}), so ranks on other hosts cannot reach "
            f"the watchdog: set {ADDRESS_ENV} to an address of this host that they reach"
        ) from None
    if address.startswith("127."):
        # Debian and Ubuntu map the host's own name to 127.0.1.1 in /etc/hosts.
        print(
            f"warning: this host's name {name!r} resolves to {address}, a loopback address other hosts cannot "
            f"reach: their ranks will not reach the watchdog; set {ADDRESS_ENV} to an address of this host that "
            "they reach",
            file=sys.stderr,
        )
    return address


def parse_url(url: str) -> tuple[str, int, str]:
    """(address, port, key) of ``tcp://ADDRESS:PORT/KEY`` (IPv6 addresses in brackets); ValueError
    naming the variable otherwise."""
    rest = url[len("tcp://") :] if url.startswith("tcp://") else None
    where, _, key = (rest or "").partition("/")
    host, _, port = where.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if rest is None or not host or not port.isdigit() or not key:
        raise ValueError(f"HARNESS_HEARTBEAT={url!r}: expected tcp://ADDRESS:PORT/KEY")
    return host, int(port), key


def _url(address: str, port: int, key: str) -> str:
    return f"tcp://{f'[{address}]' if ':' in address else address}:{port}/{key}"


def flush_all() -> None:
    """Ship every open link's row now (from the thread that writes it): a rank about to end
    itself (an injected ``kill``) leaves its last state with the watchdog."""
    for sender in list(_senders):
        sender.ship()


class Sender:
    """A rank's link to the watchdog at ``url``: ships ``row`` (a 1 x FIELDS array that one thread
    of this process writes under its seqlock) from a daemon thread.

    When the watchdog cannot be reached within ``CONNECT_S`` it prints one warning naming the
    address and stays unconnected (``connected`` is False): the rank runs unwatched.
    """

    def __init__(self, url: str, rank: int, row: np.ndarray) -> None:
        self._reader = TableReader(row)
        self._lock = threading.Lock()  # one sender at a time: the thread, or a flush of DONE/FAILED
        self._wake = threading.Event()
        self._closing = False
        self._last: np.ndarray | None = None
        self._sock = _connect(url, rank)
        self.connected = self._sock is not None
        if self._sock is None:
            return
        _senders.add(self)
        self._thread = threading.Thread(target=self._run, name="heartbeat-sender", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closing and self._sock is not None:  # until closed, or the watchdog is gone
            self._wake.wait(SEND_INTERVAL_S)  # a timed sleep: beats on the hot path never wake it
            self.ship()

    def ship(self) -> None:
        """Send the row if it changed since it was last sent."""
        with self._lock:
            if self._sock is None:
                return
            row = self._reader.read()[0]
            if self._last is not None and np.array_equal(row, self._last):
                return
            cells = row.copy()
            cells[_PROGRESS_AT] = time.monotonic() - row[_PROGRESS_AT] if row[_PROGRESS_AT] > 0 else math.nan
            try:
                self._sock.sendall(_ROW.pack(*cells))
            except OSError:
                # The watchdog is gone (its job ended, or rank 0 that ran it finished first):
                # nothing to tell anyone, the rank goes on unwatched.
                self._drop()
                return
            self._last = row

    def close(self) -> None:
        """Ship the last row, stop the thread and close the connection (the watchdog reads EOF)."""
        if self._sock is None:
            return
        self._closing = True
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=SEND_TIMEOUT_S)
        self.ship()
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _connect(url: str, rank: int) -> socket.socket | None:
    """A connection to the watchdog at ``url`` that has said hello, or None after a warning."""
    here = socket.gethostname()
    try:
        address, port, key = parse_url(url)
    except ValueError as exc:
        print(f"warning: rank {rank} on host {here}: {exc}; this rank runs unwatched", file=sys.stderr)
        return None
    deadline = time.monotonic() + CONNECT_S
    while True:
        try:
            sock = socket.create_connection((address, port), timeout=max(0.1, deadline - time.monotonic()))
            break
        except OSError as exc:
            if time.monotonic() + CONNECT_RETRY_S >= deadline:
                print(
                    f"warning: rank {rank} on host {here} cannot reach the watchdog at {address}:{port} ({exc}) "
                    f"within {CONNECT_S:g} s, so this rank runs unwatched (set {ADDRESS_ENV} to an address of the "
                    "watchdog's host that this host reaches)",
                    file=sys.stderr,
                )
                return None
            time.sleep(CONNECT_RETRY_S)
    sock.settimeout(SEND_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small rows; DONE must not wait
    hello = {"key": key, "rank": rank, "pid": os.getpid(), "host": here}
    try:
        sock.sendall((json.dumps(hello) + "\n").encode())
    except OSError as exc:
        print(
            f"warning: rank {rank} on host {here}: the watchdog at {address}:{port} closed the connection ({exc}); "
            "this rank runs unwatched",
            file=sys.stderr,
        )
        sock.close()
        return None
    return sock


class _Connection:
    __slots__ = ("buffer", "ended", "rank", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer, self.ended = sock, bytearray(), False
        self.rank: int | None = None  # known once the hello arrived


class _EndWatch:
    """The connections whose end arrived, in the order the kernel saw them arrive (see the
    module's doc); without epoll (not Linux) it knows nothing and the server reads ends as they
    come."""

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._conns: dict[int, _Connection] = {}

    def fileno(self) -> int | None:
        """Readable when an end is queued (None without epoll)."""
        return None if self._epoll is None else self._epoll.fileno()

    def add(self, conn: _Connection) -> None:
        if self._epoll is not None:
            fd = conn.sock.fileno()
            self._conns[fd] = conn
            self._epoll.register(fd, select.EPOLLRDHUP)  # EPOLLERR and EPOLLHUP come with it

    def remove(self, conn: _Connection) -> None:
        if self._epoll is not None:
            fd = conn.sock.fileno()
            if self._conns.pop(fd, None) is not None:
                self._epoll.unregister(fd)

    def ended(self) -> list[_Connection]:
        """The connections whose end is queued, first to end first."""
        if self._epoll is None:
            return []
        return [self._conns[fd] for fd, _ in self._epoll.poll(0) if fd in self._conns]

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()


class HeartbeatServer:
    """The watchdog's side: the rows of ``ranks`` ranks as they arrive, with their hosts and
    whether their connections closed. A context manager; one thread, sleeping in ``select``.

    The table has the ``Field`` layout, PROGRESS_AT on this process's ``time.monotonic()``;
    a rank that never connected has a zero row (not started)."""

    def __init__(self, ranks: int, address: str) -> None:
        self.ranks = ranks
        self._table = np.zeros((ranks, FIELDS), dtype=np.float64)
        self._hosts: list[str | None] = [None] * ranks
        self._closed: list[float | None] = [None] * ranks  # when the rank's connection ended
        self._last_end = -math.inf  # end times increase strictly, in the order the ends arrived
        self._ends = _EndWatch()
        self._current: list[_Connection | None] = [None] * ranks  # a rank's latest connection
        self._changed = threading.Condition()
        self._key = secrets.token_hex(16)
        self._listener = _listen(address)
        self.url = _url(address, self._listener.getsockname()[1], self._key)
        self._wake_read, self._wake_write = socket.socketpair()  # close() wakes the thread with it
        # Readable once a rank's connection closed: the watchdog sleeps on it beside its pidfds, so
        # a remote rank's death wakes it at once, before the launcher takes the other ranks down
        # (judged later, every rank would have died "at about the same time").
        self._ended_read, self._ended_write = socket.socketpair()
        self._ended_read.setblocking(False)
        self._ended_write.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        ends = self._ends.fileno()
        if ends is not None:
            self._selector.register(ends, selectors.EVENT_READ, self._ends)
        self._thread = threading.Thread(target=self._serve, name="heartbeat-server", daemon=True)
        self._thread.start()

    # -- what the watchdog reads -----------------------------------------------------------------
    def snapshot(self) -> tuple[np.ndarray, list[str | None], dict[int, float]]:
        """(a copy of the table, each rank's host or None, the ranks whose connection closed with
        when it did on this process's clock: the order of these times is the order of the ends)."""
        with contextlib.suppress(OSError):
            while self._ended_read.recv(4096):  # consumed: what closed is in the copy below
                pass
        with self._changed:
            return (
                self._table.copy(),
                list(self._hosts),
                {r: at for r, at in enumerate(self._closed) if at is not None},
            )

    def wait_closed(self, ranks: Collection[int], timeout: float) -> bool:
        """Wait until the connections of ``ranks`` closed (their last rows arrived before); False
        when ``timeout`` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: all(self._closed[r] is not None for r in ranks), timeout)

    def ended_fd(self) -> int:
        """A file descriptor that becomes readable when a rank's connection closes; :meth:`snapshot`
        (which says which) makes it unreadable again."""
        return self._ended_read.fileno()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")
        self._thread.join(timeout=5.0)
        for key in list(self._selector.get_map().values()):
            if isinstance(key.fileobj, socket.socket):  # the listener, the wake-up, the ranks' connections
                key.fileobj.close()
        self._selector.close()
        self._ends.close()
        self._wake_write.close()
        self._ended_read.close()
        self._ended_write.close()

    def __enter__(self) -> HeartbeatServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the thread ------------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            events = self._selector.select()
            self._take_ends()  # first, in the order they arrived: a data event may be read later
            for key, _ in events:
                if key.fileobj is self._wake_read:
                    return
                if key.fileobj is self._listener:
                    self._accept()
                elif key.data is not self._ends and not key.data.ended:
                    self._receive(key.data)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:  # the client gave up meanwhile
            return
        sock.setblocking(False)
        conn = _Connection(sock)
        self._selector.register(sock, selectors.EVENT_READ, conn)
        self._ends.add(conn)

    def _take_ends(self) -> None:
        """End the connections whose end the kernel queued, in its order, each after reading the
        rows it sent before its end."""
        for conn in self._ends.ended():
            self._receive(conn, ending=True)

    def _receive(self, conn: _Connection, ending: bool = False) -> None:
        """Read what ``conn`` sent; at its end, end it: in the end watch's order (``ending``: it
        comes from there), so first every end queued before it."""
        data, eof = bytearray(), False
        while not eof:
            try:
                chunk = conn.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""  # reset: the rank's end is gone, as after EOF
            eof = not chunk
            data += chunk
        if data:
            self._rows(conn, data)
        if eof and not conn.ended:
            if not ending:
                self._take_ends()  # this end is queued there too, behind any that came before it
            if not conn.ended:
                self._end(conn)

    def _rows(self, conn: _Connection, data: bytearray) -> None:
        """The rows in ``data`` (after the hello): the latest one is the rank's state."""
        arrival = time.monotonic()
        conn.buffer += data
        rank = conn.rank if conn.rank is not None else self._hello(conn)
        if rank is None:
            return
        whole = len(conn.buffer) // _ROW.size * _ROW.size
        if not whole:
            return
        row = np.array(_ROW.unpack_from(conn.buffer, whole - _ROW.size))  # the latest row is all that counts
        del conn.buffer[:whole]
        age = row[_PROGRESS_AT]
        row[_PROGRESS_AT] = arrival - age if math.isfinite(age) else 0.0
        with self._changed:
            if self._current[rank] is conn:
                self._table[rank] = row

    def _hello(self, conn: _Connection) -> int | None:
        """Read the hello line if it is all there, and return the rank it names; None while it is
        not, or when the connection is not one of this job's ranks (then it is dropped)."""
        end = conn.buffer.find(b"\n")
        if end < 0:
            if len(conn.buffer) > HELLO_MAX:
                self._end(conn)
            return None
        try:
            hello = json.loads(conn.buffer[:end])
            rank, host = hello["rank"], str(hello["host"])
            valid = hello["key"] == self._key and isinstance(rank, int) and 0 <= rank < self.ranks
        except (ValueError, TypeError, KeyError):
            valid = False
        if not valid:
            self._end(conn)
            return None
        del conn.buffer[: end + 1]
        conn.rank = rank
        with self._changed:
            # A rank's new connection replaces its old one (whose end then means nothing).
            self._current[rank] = conn
            self._hosts[rank] = host
            self._closed[rank] = None
            self._changed.notify_all()
        return rank

    def _end(self, conn: _Connection) -> None:
        conn.ended = True
        self._ends.remove(conn)
        self._selector.unregister(conn.sock)
        conn.sock.close()
        if conn.rank is None:
            return
        self._last_end = max(time.monotonic(), math.nextafter(self._last_end, math.inf))
        with self._changed:
            if self._current[conn.rank] is conn:
                self._closed[conn.rank] = self._last_end
                self._changed.notify_all()
        with contextlib.suppress(OSError):  # full: a wake-up is pending anyway
            self._ended_write.send(b"x")


def _listen(address: str) -> socket.socket:
    """A listening socket on ``address`` (any free port); on every interface of its family when
    ``address`` is not this host's own (a forwarded or NAT address). ValueError when it cannot."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(address, 0, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        raise ValueError(f"watchdog address {address!r} does not resolve ({exc}); check {ADDRESS_ENV}") from None
    sock = socket.socket(family, kind, proto)
    try:
        try:
            sock.bind(where)
        except OSError:
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise ValueError(f"the watchdog cannot listen on {address} ({exc}); check {ADDRESS_ENV}") from None
    return sock
