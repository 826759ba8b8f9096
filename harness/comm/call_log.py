"""A call log: every call an algorithm makes to its communicator, per iteration.

:class:`CallLog` wraps a communicator (the native layer's ``Communicator`` or the simulator's
``SimCommunicator``: they have the same interface) and is used in its place. Each call is
passed on unchanged and appended to :attr:`CallLog.calls` as a :class:`Call`: the iteration,
its position in the iteration, the operation, the peers, the buffer's length in floats, the
caller's other arguments and what the call returned that a caller can act on (a count, a
round's info, whether a handle is done). The persistent operations and handles it returns are
wrapped too, so their calls are logged as well. Operation names are :data:`CALL_NAMES`.

The training loop (``harness.runner.loop``) calls :meth:`CallLog.begin_iteration` with t at
the start of every iteration and with None before ``finish()``. Calls made before the first
iteration (an algorithm's constructor creates its persistent operations there) are logged
under iteration -1, those of ``finish()`` under one past the last iteration.

A scenario's ``results: {comm_calls: true}`` makes real and simulated runs write the log as
``comm_calls.csv`` (``results/README.md``); ``tests/test_conformance.py`` compares the two.

Example::

    log = CallLog(comm)
    ctx = AlgorithmContext(log, params, grads, lr, seed)   # the algorithm talks to the log
    ...
    for call in log.calls:
        print(call.iteration, call.seq, call.op, call.peers, call.floats, call.detail, call.result)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

CALL_NAMES = (
    # the communicator
    "allreduce",
    "iallreduce",
    "broadcast",
    "ibroadcast",
    "barrier",
    "ibarrier",
    "exchange",
    "iexchange",
    "push_channel",
    "wait_avoiding",
    "pairwise_averager",
    # a handle a non-blocking call returned
    "wait",
    "done",
    "info",
    # a push channel
    "push.send",
    "push.drain",
    "push.pending",
    "push.flush",
    "push.close",
    # the wait-avoiding group allreduce
    "wa.iround",
    "wa.round",
    "wa.close",
    # pairwise averaging
    "pair.publish",
    "pair.irequest",
    "pair.drain",
    "pair.close",
)
"""Every value :attr:`Call.op` can take (comm_calls.csv's ``op``; ``results/README.md`` lists them)."""

# The keys of a wait-avoiding round's info that describe the round; t_join and t_done are times.
ROUND_INFO_KEYS = ("round", "sync", "group_size", "staleness", "joined_early")


class Call(NamedTuple):
    """One call to the communicator or to an object it returned."""

    iteration: int  # -1: before the first iteration; one past the last: finish()
    seq: int  # position of the call in its iteration on this rank, from 0
    op: str  # one of CALL_NAMES
    peers: str  # ranks the caller named, ';'-separated; '' if none
    floats: int  # length of the buffer passed (of the channel for push_channel); 0 if none
    detail: str  # the caller's other arguments, 'key=value' separated by spaces
    result: str  # what the call returned that the caller can act on; '' if nothing


def _floats(buf: Any) -> int:
    numel = getattr(buf, "numel", None)  # torch tensors and stand-ins
    if callable(numel):
        return int(numel())
    return int(buf.size) if hasattr(buf, "size") else len(buf)  # numpy arrays; memoryviews


def _peers(peers: Sequence[int]) -> str:
    return ";".join(str(int(p)) for p in peers)


def _flag(value: Any) -> str:
    return "1" if value else "0"


def round_info(info: dict) -> str:
    """A wait-avoiding round's info as logged: ``round=K sync=0 group_size=S staleness=D joined_early=0``."""
    return " ".join(f"{k}={int(info[k])}" for k in ROUND_INFO_KEYS)


class CallLog:
    """A communicator that logs every call made to it (see the module docstring)."""

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self.calls: list[Call] = []
        self._iteration = -1
        self._seq = 0

    def begin_iteration(self, t: int | None) -> None:
        """Calls from now on belong to iteration ``t``; None: to ``finish()``, one past the last."""
        self._iteration = self._iteration + 1 if t is None else int(t)
        self._seq = 0
        forward = getattr(self._comm, "begin_iteration", None)  # the simulator stamps its records
        if forward is not None:
            forward(t)

    def log(self, op: str, peers: str = "", floats: int = 0, detail: str = "", result: str = "") -> str:
        """Append one call; returns its ``I.S`` (iteration, seq), which names it in a handle's calls."""
        seq = self._seq
        self._seq += 1
        self.calls.append(Call(self._iteration, seq, op, peers, floats, detail, result))
        return f"{self._iteration}.{seq}"

    def _handle(self, handle: Any, name: str) -> LoggedHandle:
        return LoggedHandle(handle, self, name)

    # -- what the runner uses, passed on unlogged -------------------------------------------
    @property
    def rank(self) -> int:
        return self._comm.rank

    @property
    def size(self) -> int:
        return self._comm.size

    def __getattr__(self, name: str) -> Any:
        # drain_records, set_links, close, closed, ...: the loop's and the runner's, not the algorithm's
        return getattr(self._comm, name)

    def __enter__(self) -> CallLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self._comm.close()

    # -- collectives ------------------------------------------------------------------------
    def iallreduce(self, buf: Any, op: str = "sum") -> LoggedHandle:
        handle = self._comm.iallreduce(buf, op)
        return self._handle(handle, self.log("iallreduce", floats=_floats(buf), detail=f"op={op}"))

    def allreduce(self, buf: Any, op: str = "sum") -> None:
        self._comm.allreduce(buf, op)
        self.log("allreduce", floats=_floats(buf), detail=f"op={op}")

    def ibroadcast(self, buf: Any, root: int = 0) -> LoggedHandle:
        handle = self._comm.ibroadcast(buf, root)
        return self._handle(handle, self.log("ibroadcast", floats=_floats(buf), detail=f"root={int(root)}"))

    def broadcast(self, buf: Any, root: int = 0) -> None:
        self._comm.broadcast(buf, root)
        self.log("broadcast", floats=_floats(buf), detail=f"root={int(root)}")

    def ibarrier(self) -> LoggedHandle:
        return self._handle(self._comm.ibarrier(), self.log("ibarrier"))

    def barrier(self) -> None:
        self._comm.barrier()
        self.log("barrier")

    # -- point to point ---------------------------------------------------------------------
    def iexchange(self, send: Any, recv: Any, peer: int) -> LoggedHandle:
        handle = self._comm.iexchange(send, recv, peer)
        return self._handle(handle, self.log("iexchange", _peers([peer]), _floats(send)))

    def exchange(self, send: Any, recv: Any, peer: int) -> None:
        self._comm.exchange(send, recv, peer)
        self.log("exchange", _peers([peer]), _floats(send))

    # -- persistent operations ----------------------------------------------------------------
    def push_channel(self, count: int) -> LoggedPushChannel:
        channel = self._comm.push_channel(count)
        self.log("push_channel", floats=int(count))
        return LoggedPushChannel(channel, self)

    def wait_avoiding(
        self,
        initial: Any,
        *,
        phases: Sequence[Sequence[int]],
        sync_every: int,
        accumulate: bool = False,
        quorum: int = 1,
    ) -> LoggedWaitAvoiding:
        op = self._comm.wait_avoiding(
            initial, phases=phases, sync_every=sync_every, accumulate=accumulate, quorum=quorum
        )
        groups = "|".join(_peers(g) for g in phases)
        # quorum= only when it is not the default 1, so logs of ops without a quorum read as before.
        extra = "" if quorum == 1 else f" quorum={int(quorum)}"
        self.log(
            "wait_avoiding",
            floats=_floats(initial),
            detail=f"sync_every={int(sync_every)} accumulate={_flag(accumulate)} phases={groups}{extra}",
        )
        return LoggedWaitAvoiding(op, self)

    def pairwise_averager(self, initial: Any) -> LoggedPairwiseAverager:
        averager = self._comm.pairwise_averager(initial)
        self.log("pairwise_averager", floats=_floats(initial))
        return LoggedPairwiseAverager(averager, self)


class LoggedHandle:
    """A handle whose ``wait``, ``done`` and ``info`` are logged with ``of=I.S``, the call that
    returned it."""

    __slots__ = ("_handle", "_log", "_of")

    def __init__(self, handle: Any, log: CallLog, of: str) -> None:
        self._handle, self._log, self._of = handle, log, of

    def wait(self, timeout: float | None = None) -> None:
        self._handle.wait(timeout)
        self._log.log("wait", detail=f"of={self._of}" + ("" if timeout is None else f" timeout={timeout:g}"))

    def done(self) -> bool:
        done = self._handle.done()
        self._log.log("done", detail=f"of={self._of}", result=_flag(done))
        return done

    def info(self) -> dict:
        info = self._handle.info()
        self._log.log("info", detail=f"of={self._of}", result=round_info(info))
        return info

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


class LoggedPushChannel:
    """``Communicator.push_channel``'s channel, logged."""

    def __init__(self, channel: Any, log: CallLog) -> None:
        self._channel, self._log = channel, log

    @property
    def count(self) -> int:
        return self._channel.count

    def send(self, buf: Any, peers: Sequence[int], round: int = 0) -> LoggedHandle:
        handle = self._channel.send(buf, peers, round)
        return self._log._handle(handle, self._log.log("push.send", _peers(peers), _floats(buf), f"round={int(round)}"))

    def drain(self, out: Any, min_messages: int = 0, timeout: float | None = None, round: int | None = None) -> int:
        got = self._channel.drain(out, min_messages, timeout, round)
        detail = (
            f"min_messages={int(min_messages)}"
            + ("" if round is None else f" round={int(round)}")
            + ("" if timeout is None else f" timeout={timeout:g}")
        )
        self._log.log("push.drain", floats=_floats(out), detail=detail, result=str(int(got)))
        return got

    def pending(self, round: int | None = None) -> int:
        count = self._channel.pending(round)
        self._log.log("push.pending", detail="" if round is None else f"round={int(round)}", result=str(int(count)))
        return count

    def flush(self) -> None:
        self._channel.flush()
        self._log.log("push.flush")

    def close(self) -> None:
        self._channel.close()
        self._log.log("push.close")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


class LoggedWaitAvoiding:
    """``Communicator.wait_avoiding``'s operation, logged. The round's group is the op's
    business; the log has what the caller passes (``may_activate``) and gets back (the info)."""

    def __init__(self, op: Any, log: CallLog) -> None:
        self._op, self._log = op, log

    def iround(self, buf: Any, out: Any, may_activate: bool = True) -> LoggedHandle:
        handle = self._op.iround(buf, out, may_activate)
        of = self._log.log("wa.iround", floats=_floats(buf), detail=f"may_activate={_flag(may_activate)}")
        return self._log._handle(handle, of)

    def round(self, buf: Any, out: Any, may_activate: bool = True) -> dict:
        info = self._op.round(buf, out, may_activate)
        self._log.log(
            "wa.round", floats=_floats(buf), detail=f"may_activate={_flag(may_activate)}", result=round_info(info)
        )
        return info

    def close(self) -> None:
        self._op.close()
        self._log.log("wa.close")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._op, name)


class LoggedPairwiseAverager:
    """``Communicator.pairwise_averager``'s averager, logged."""

    def __init__(self, averager: Any, log: CallLog) -> None:
        self._averager, self._log = averager, log

    def publish(self, buf: Any) -> None:
        self._averager.publish(buf)
        self._log.log("pair.publish", floats=_floats(buf))

    def irequest(self, buf: Any, out: Any, peer: int) -> LoggedHandle:
        handle = self._averager.irequest(buf, out, peer)
        return self._log._handle(handle, self._log.log("pair.irequest", _peers([peer]), _floats(buf)))

    def drain(self, out: Any) -> int:
        got = self._averager.drain(out)
        self._log.log("pair.drain", floats=_floats(out), result=str(int(got)))
        return got

    def close(self) -> None:
        self._averager.close()
        self._log.log("pair.close")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._averager, name)
