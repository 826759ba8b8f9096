"""Stress test of the wait-avoiding group allreduce and the push-sum channel under random delays.

Launched by ``python -m harness bench stress``; this module is the worker every rank runs. It can
also be started directly under the venv's mpiexec (the full run is the default)::

    mpiexec -n 8 python -m harness.bench.stress --rounds 10000 --json stress.json

Three parts run one after the other on the world communicator (``--parts``), each for
``--rounds`` rounds; before every round each rank sleeps a random time (``--delay-fraction`` of
the rounds, uniform in [0, ``--max-delay-ms``], from a per-rank seeded RNG):

``wagma``
    ``Communicator.wait_avoiding`` in WAGMA mode (publishing overwrites) over the WAGMA groups
    of ``--group-size`` (``harness.schedules.wagma_phases``), synchronous every
    ``--sync-every`` rounds.
``eager``
    The same op in eager-SGD mode (``accumulate=True``: publishing adds, a contribution takes
    the buffer and zeroes it) over one group of all ranks; even rounds are "solo" (any rank may
    activate), odd ones "majority" (only the round's initiator ``(7 k + 3) % ranks`` may). The
    round count is rounded up to end on a synchronous round, so everything published must
    have been summed out by the end.
``push``
    A push-sum channel: each round a rank pushes, to 1..``--max-peers`` random out-peers,
    integer amounts it removes from its own mass, and drains now and then; every
    ``--flush-every`` rounds (and at the end) ``flush()``, drain, and an exact check.

The rule checked, exactly (every value is an integer below 2^24, so float32 sums are exact):

* Rank j's buffer published at round r (``publish_buffer``) is a header of 2*ranks slots,
  ``A[j] = 1`` and ``B[j] = g(r) = (r + 1) % 4093 + 1``, zero elsewhere, then a payload
  ``U[j] + V[j] * g(r)`` (``payload_weights``). WAGMA's initial buffer is that of round -1;
  eager-SGD's is zero. So a round's sum says, per rank, how many publishes it holds (A) and
  which (B), and its payload must be the matching linear function of the header.
* Per round and rank (``check_info``, ``check_result``): the info's round, sync flag and group
  size; ``staleness >= 0``, ``joined_early == (staleness > 0)``, staleness 0 in synchronous
  rounds and never reaching back past the previous synchronous round; the sum is integral,
  nonzero exactly at the round's group (all ranks in synchronous rounds), WAGMA members hold
  exactly one publish, and the payload matches the header.
* Across ranks (rank 0, ``check_group_rounds``): with ``R[j, k] = k - staleness`` reported by
  rank j for round k, the header every member of the group got equals the rule: WAGMA, each
  member j contributes its publish of round ``R[j, k]``; eager-SGD, the publishes of rounds
  ``R[j, k-1] + 1 .. R[j, k]`` (``R[j, -1] = -1``). ``R`` never decreases and the members of a
  group agree on the group and got bitwise-equal sums.
* eager-SGD totals (``check_totals``): the sum over rounds of everything summed out equals
  everything published by all ranks, header and payload: no contribution lost or counted twice.
* push-sum (``check_drained``, ``check_push_totals``): a drained buffer's counter slot equals
  the message count ``drain`` returns; after each flush the held mass summed over ranks equals
  the initial total exactly, and rank i received from j exactly as many messages as j sent to i.

Rank 0 prints one report line per part and writes ``--json``; the exit status is 1 when any
check failed (the first failures are printed: part, check, rank, round), 2 on bad arguments.
mpi4py and the native layer are imported inside ``run_worker`` only.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.arguments import argtype, int_at_least, split_list
from harness.bench.arguments import job_size_matches, say, worker_main

DEFAULT_RANKS = 8  # for the parent command (harness.commands.bench) when it launches the job
DEFAULT_ROUNDS = 10_000
DEFAULT_SEED = 1234
DEFAULT_MAX_DELAY_MS = 2.0
DEFAULT_DELAY_FRACTION = 0.5
DEFAULT_GROUP_SIZE = 2
DEFAULT_SYNC_EVERY = 5
DEFAULT_PAYLOAD = 256
DEFAULT_MAX_PEERS = 3
DEFAULT_FLUSH_EVERY = 500
PARTS = ("wagma", "eager", "push")
ROUND_MOD = 4093  # g(r) = (r + 1) % ROUND_MOD + 1 keeps values small whatever the round count
EXACT = 1 << 24  # float32 represents every integer of magnitude <= 2^24
U_MOD, V_MOD = 11, 3  # payload weights: U in 1..11, V in 0..2
MASS_SLOTS = 2
MAX_REPORTED = 20  # failures printed / kept in the JSON


# -- the rule: pure functions, no MPI -----------------------------------------------------------
def g(r: Any) -> Any:
    """The B-slot value of a publish of round ``r`` (>= -1, int or array): in [1, ROUND_MOD]."""
    return (r + 1) % ROUND_MOD + 1


def payload_weights(ranks: int, payload: int) -> tuple[np.ndarray, np.ndarray]:
    """(U, V), int64 arrays (ranks, payload): rank j's round-r payload is ``U[j] + V[j] * g(r)``."""
    j = np.arange(ranks, dtype=np.int64)[:, None]
    i = np.arange(payload, dtype=np.int64)[None, :]
    return (7 * j + 3 * i) % U_MOD + 1, (j + i) % V_MOD


def buffer_length(ranks: int, payload: int) -> int:
    return 2 * ranks + payload


def publish_buffer(rank: int, r: int, ranks: int, weights: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """What ``rank`` publishes at round ``r`` (r = -1: WAGMA's initial buffer)."""
    u, v = weights
    buf = np.zeros(buffer_length(ranks, u.shape[1]), dtype=np.float32)
    buf[rank] = 1
    buf[ranks + rank] = g(r)
    buf[2 * ranks:] = u[rank] + v[rank] * g(r)
    return buf


def max_publishes_per_contribution(sync_every: int) -> int:
    """Bound on the publishes one eager-SGD contribution can hold: the rounds since the one
    before the previous synchronous round (a rank joins every round, in order)."""
    return 2 * sync_every + 1


def magnitude_problem(ranks: int, sync_every: int, payload: int) -> str | None:
    """Why a run with these settings could leave the exactly representable float32 range, or None."""
    if sync_every < 1:
        return "--sync-every must be >= 1 (without synchronous rounds staleness is unbounded)"
    largest_slot = max(U_MOD + (V_MOD - 1) * ROUND_MOD if payload else 0, ROUND_MOD)
    worst = ranks * max_publishes_per_contribution(sync_every) * largest_slot
    if worst >= EXACT:
        return (f"{ranks} ranks with --sync-every {sync_every} could sum to {worst} >= 2^24 in one slot: "
                "use fewer ranks or a smaller --sync-every")
    if initial_mass(ranks - 1, ranks).max() * ranks >= EXACT:
        return f"{ranks} ranks: the push-sum mass would reach 2^24"
    return None


def is_sync(k: Any, sync_every: int) -> Any:
    """Whether round(s) ``k`` (int or array) are synchronous (``harness.schedules.is_sync_round``)."""
    if sync_every <= 0:
        return np.zeros(np.shape(k), dtype=bool) if np.ndim(k) else False
    return k % sync_every == sync_every - 1


def prev_sync_round(k: Any, sync_every: int) -> Any:
    """The last synchronous round before round ``k`` (-1 if none): no buffer a rank contributes
    at round ``k`` can be older, since a synchronous round is joined only by its caller."""
    k = np.asarray(k, dtype=np.int64)
    if sync_every <= 0:
        return np.full_like(k, -1)
    below = k - 1 - (sync_every - 1)
    return np.where(below >= 0, k - 1 - np.mod(below, sync_every), -1)


def group_members(phases: Sequence[Sequence[int]], k: int, ranks: int, sync_every: int) -> list[int]:
    """Sorted members of round ``k`` for a rank with ``phases``: all ranks in synchronous rounds."""
    if is_sync(k, sync_every):
        return list(range(ranks))
    return sorted(int(r) for r in phases[k % len(phases)])


def check_info(info: dict, k: int, members: Sequence[int], sync_every: int) -> list[str]:
    """What is wrong with the info one rank got for round ``k`` (empty: nothing)."""
    bad = []
    sync = bool(is_sync(k, sync_every))
    s = int(info["staleness"])
    if info["round"] != k:
        bad.append(f"info says round {info['round']}")
    if bool(info["sync"]) != sync:
        bad.append(f"info says sync={bool(info['sync'])}, rule says {sync}")
    if info["group_size"] != len(members):
        bad.append(f"group_size {info['group_size']}, the round's group has {len(members)}")
    if s < 0:
        bad.append(f"negative staleness {s}")
    if bool(info["joined_early"]) != (s > 0):
        bad.append(f"joined_early={bool(info['joined_early'])} with staleness {s}")
    if sync and s != 0:
        bad.append(f"staleness {s} in a synchronous round")
    oldest = int(prev_sync_round(k, sync_every))
    if k - s < oldest:
        bad.append(f"contributed the buffer of round {k - s}, older than synchronous round {oldest}")
    return bad


def check_result(out: np.ndarray, members: Sequence[int], ranks: int, weights: tuple[np.ndarray, np.ndarray],
                 accumulate: bool) -> list[str]:
    """What is wrong with one rank's round sum ``out`` on its own (empty: nothing)."""
    if not np.all(np.isfinite(out)):
        return [f"{int(np.count_nonzero(~np.isfinite(out)))} non-finite values (a slot never written?)"]
    if not np.all(out == np.rint(out)) or np.any(np.abs(out) >= EXACT):
        return ["a value that is not an integer below 2^24 (only such values were published)"]
    vals = out.astype(np.int64)
    a, b, pay = vals[:ranks], vals[ranks:2 * ranks], vals[2 * ranks:]
    bad = []
    member = np.zeros(ranks, dtype=bool)
    member[list(members)] = True
    if np.any(a[~member]) or np.any(b[~member]):
        outside = np.flatnonzero(((a != 0) | (b != 0)) & ~member)
        bad.append(f"contributions of ranks outside the group: {outside.tolist()}")
    if accumulate:
        if np.any(a < 0) or np.any(b < a) or np.any(b > ROUND_MOD * a):
            bad.append(f"impossible publish counts/tags: A={a.tolist()} B={b.tolist()}")
    else:
        missing = np.flatnonzero(member & ((a != 1) | (b < 1) | (b > ROUND_MOD)))
        if missing.size:
            bad.append(f"members {missing.tolist()} did not contribute exactly one buffer: "
                       f"A={a[missing].tolist()} B={b[missing].tolist()}")
    u, v = weights
    want = a @ u + b @ v
    wrong = np.flatnonzero(pay != want)
    if wrong.size:
        i = int(wrong[0])
        bad.append(f"payload differs from its header at {wrong.size} elements (first [{i}]: {pay[i]}, want {want[i]})")
    return bad


def contributions(staleness: np.ndarray, accumulate: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per rank j and round k (arrays shaped like ``staleness``, ranks x rounds), the (A, B) header
    slots of what the rule says j contributed, from the staleness j reported."""
    ranks, rounds = staleness.shape
    k = np.arange(rounds, dtype=np.int64)
    r = k[None, :] - staleness.astype(np.int64)  # the publish round each contribution is from
    if not accumulate:
        return np.ones_like(r), g(r)
    # eager-SGD: rounds prev+1 .. r, with prev the round contributed one round earlier (-1 first)
    prev = np.concatenate([np.full((ranks, 1), -1, dtype=np.int64), r[:, :-1]], axis=1)
    top = int(max(rounds, 1))
    prefix = np.concatenate([[0], np.cumsum(g(np.arange(top, dtype=np.int64)))])  # prefix[x+1] = sum g(0..x)
    lo, hi = np.clip(prev + 1, 0, top), np.clip(r + 1, 0, top)
    return r - prev, prefix[hi] - prefix[np.minimum(lo, hi)]


def membership(phases_by_rank: Sequence[Sequence[Sequence[int]]], rounds: int, sync_every: int) -> np.ndarray:
    """mask[i, k, j]: whether j is in rank i's group of round k."""
    ranks = len(phases_by_rank)
    mask = np.zeros((ranks, rounds, ranks), dtype=bool)
    k = np.arange(rounds)
    for i, phases in enumerate(phases_by_rank):
        for p, group in enumerate(phases):
            rows = k[k % len(phases) == p]
            mask[i][np.ix_(rows, [int(m) for m in group])] = True
    mask[:, is_sync(k, sync_every), :] = True
    return mask


def check_group_rounds(phases_by_rank: Sequence[Sequence[Sequence[int]]], staleness: np.ndarray,
                       headers: np.ndarray, digests: np.ndarray, sync_every: int, accumulate: bool,
                       limit: int = MAX_REPORTED) -> tuple[int, list[str]]:
    """The rule across ranks (see the module docstring). ``staleness[j, k]`` as rank j reported,
    ``headers[i, k]`` the first 2*ranks slots of rank i's sum, ``digests[i, k]`` a hash of the
    whole sum. Returns (violation count, the first ``limit`` described)."""
    ranks, rounds = staleness.shape
    staleness = staleness.astype(np.int64)
    found: list[str] = []
    count = 0

    def report(kind: str, where: np.ndarray, describe: Callable[[tuple], str]) -> None:
        nonlocal count
        count += len(where)
        for idx in where[: max(0, limit - len(found))]:
            found.append(f"{kind}: {describe(tuple(int(x) for x in idx))}")

    k = np.arange(rounds, dtype=np.int64)
    r = k[None, :] - staleness
    prev = np.concatenate([np.full((ranks, 1), -1, dtype=np.int64), r[:, :-1]], axis=1)
    report("contributed buffer went back in time", np.argwhere(r < prev),
           lambda jk: f"rank {jk[0]} round {jk[1]}: buffer of round {r[jk]} after round {prev[jk]}")
    report("contributed a buffer from the future", np.argwhere(r > k[None, :]),
           lambda jk: f"rank {jk[0]} round {jk[1]}: staleness {staleness[jk]}")
    oldest = prev_sync_round(k, sync_every)
    report("contributed a buffer older than the previous synchronous round", np.argwhere(r < oldest[None, :]),
           lambda jk: f"rank {jk[0]} round {jk[1]}: buffer of round {r[jk]}, synchronous round {oldest[jk[1]]}")

    mask = membership(phases_by_rank, rounds, sync_every)
    a, b = contributions(staleness, accumulate)  # (ranks j, rounds k)
    want = np.concatenate([mask * a.T[None, :, :], mask * b.T[None, :, :]], axis=2)  # (i, k, 2*ranks)
    diff = np.argwhere(np.any(headers != want, axis=2))
    report("sum differs from the rule", diff,
           lambda ik: f"rank {ik[0]} round {ik[1]}: got A={headers[ik][:ranks].tolist()} "
                      f"B={headers[ik][ranks:].tolist()}, rule gives A={want[ik][:ranks].tolist()} "
                      f"B={want[ik][ranks:].tolist()} (staleness {staleness[:, ik[1]].tolist()})")

    for i in range(ranks):
        for j in range(ranks):
            if i == j:
                continue
            together = mask[i, :, j]
            bad_group = np.flatnonzero(together & np.any(mask[i] != mask[j], axis=1))
            report("members disagree on the group", np.array([[i, j, x] for x in bad_group]).reshape(-1, 3),
                   lambda ijk: f"rank {ijk[0]} and rank {ijk[1]} in round {ijk[2]}")
            if i < j:
                bad_sum = np.flatnonzero(together & mask[j, :, i] & (digests[i] != digests[j]))
                report("group members got different sums", np.array([[i, j, x] for x in bad_sum]).reshape(-1, 3),
                       lambda ijk: f"rank {ijk[0]} and rank {ijk[1]} in round {ijk[2]}")
    return count, found


def published_totals(ranks: int, rounds: int, weights: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The sum (int64) of every buffer all ranks publish in rounds 0..rounds-1."""
    u, v = weights
    gsum = int(np.sum(g(np.arange(rounds, dtype=np.int64))))
    return np.concatenate([np.full(ranks, rounds, dtype=np.int64), np.full(ranks, gsum, dtype=np.int64),
                           rounds * u.sum(axis=0) + gsum * v.sum(axis=0)])


def check_totals(summed_out: np.ndarray, published: np.ndarray) -> list[str]:
    """eager-SGD: everything summed out over all rounds must be everything published."""
    wrong = np.flatnonzero(summed_out != published)
    if not wrong.size:
        return []
    i = int(wrong[0])
    return [f"summed out != published at {wrong.size} slots (first [{i}]: {summed_out[i]} != {published[i]})"]


# push-sum messages: [amounts (MASS_SLOTS)] [1: message counter] [one-hot sender (ranks)]
def push_length(ranks: int) -> int:
    return MASS_SLOTS + 1 + ranks


def initial_mass(rank: int, ranks: int) -> np.ndarray:
    return np.array([1000 * (rank % 7 + 1), 1024], dtype=np.int64)


def push_message(rank: int, ranks: int, amounts: np.ndarray) -> np.ndarray:
    msg = np.zeros(push_length(ranks), dtype=np.float32)
    msg[:MASS_SLOTS] = amounts
    msg[MASS_SLOTS] = 1
    msg[MASS_SLOTS + 1 + rank] = 1
    return msg


def check_drained(out: np.ndarray, got: int, ranks: int) -> list[str]:
    """What is wrong with a drained accumulator ``out`` that ``drain`` said holds ``got`` messages."""
    if not np.all(np.isfinite(out)) or not np.all(out == np.rint(out)) or np.any(out < 0):
        return [f"drained values that are not non-negative integers: {out.tolist()}"]
    bad = []
    counter = int(out[MASS_SLOTS])
    senders = out[MASS_SLOTS + 1:].astype(np.int64)
    if counter != got:
        bad.append(f"drain() returned {got} messages, their counters sum to {counter}")
    if int(senders.sum()) != counter:
        bad.append(f"sender slots sum to {int(senders.sum())}, counters to {counter}")
    if got == 0 and np.any(out):
        bad.append(f"no message, yet something arrived: {out.tolist()}")
    return bad


def check_push_totals(held: np.ndarray, initial_total: np.ndarray, sent: np.ndarray, received: np.ndarray) -> list[str]:
    """At a quiescent point: held[i] the mass of rank i; sent[i, j] messages i pushed to j,
    received[j, i] messages j drained from i. Mass conserved exactly, no message lost or doubled."""
    bad = []
    total = held.sum(axis=0)
    if not np.array_equal(total, initial_total):
        bad.append(f"mass not conserved: total {total.tolist()}, initially {initial_total.tolist()}")
    if np.any(held < 0):
        bad.append(f"negative mass on ranks {np.flatnonzero(np.any(held < 0, axis=1)).tolist()}")
    diff = np.argwhere(sent != received.T)
    for i, j in diff[:MAX_REPORTED]:
        bad.append(f"rank {i} pushed {sent[i, j]} messages to rank {j}, which drained {received[j, i]} from it")
    return bad


# -- arguments (shared with harness.commands.bench) ---------------------------------------------
def _float_in(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
        if not low <= value <= high:
            raise ValueError(f"must be in [{low:g}, {high:g}] (got {text})")
        return value

    return argtype(parse)


def parse_parts(text: str) -> list[str]:
    """Comma-separated parts out of ``PARTS``, run in the order of ``PARTS``."""
    names = set(split_list(text, "part", ",".join(PARTS)))
    bad = sorted(names - set(PARTS))
    if bad:
        raise ValueError(f"unknown part {bad[0]!r}: choose from {', '.join(PARTS)}")
    return [p for p in PARTS if p in names]


def add_arguments(parser: argparse.ArgumentParser, *, ranks_default: int | None = None) -> None:
    """The stress test's options (the parent command and the worker take the same ones)."""
    parser.add_argument("--ranks", type=int_at_least(1), default=ranks_default,
                        help="number of ranks (default 8, or the size of the MPI job already running)")
    parser.add_argument("--rounds", type=int_at_least(1), default=DEFAULT_ROUNDS,
                        help=f"rounds per part (default {DEFAULT_ROUNDS}; eager-SGD rounds up to a synchronous round)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help=f"seed of every rank's RNG (default {DEFAULT_SEED})")
    parser.add_argument("--max-delay-ms", type=_float_in(0, 10_000), default=DEFAULT_MAX_DELAY_MS,
                        help=f"longest random sleep before a round (default {DEFAULT_MAX_DELAY_MS:g} ms)")
    parser.add_argument("--delay-fraction", type=_float_in(0, 1), default=DEFAULT_DELAY_FRACTION,
                        help=f"fraction of rounds with a sleep (default {DEFAULT_DELAY_FRACTION:g})")
    parser.add_argument("--parts", type=argtype(parse_parts), default=list(PARTS),
                        help=f"comma-separated parts: {', '.join(PARTS)} (default all)")
    parser.add_argument("--group-size", type=int_at_least(1), default=DEFAULT_GROUP_SIZE,
                        help=f"WAGMA group size (default {DEFAULT_GROUP_SIZE})")
    parser.add_argument("--sync-every", type=int_at_least(1), default=DEFAULT_SYNC_EVERY,
                        help=f"synchronous round every this many rounds (default {DEFAULT_SYNC_EVERY})")
    parser.add_argument("--payload", type=int_at_least(0), default=DEFAULT_PAYLOAD,
                        help=f"float32 elements after the 2*ranks header (default {DEFAULT_PAYLOAD}; "
                             "16384 and more take the ring algorithm)")
    parser.add_argument("--max-peers", type=int_at_least(1), default=DEFAULT_MAX_PEERS,
                        help=f"push-sum: most out-peers per push (default {DEFAULT_MAX_PEERS})")
    parser.add_argument("--flush-every", type=int_at_least(1), default=DEFAULT_FLUSH_EVERY,
                        help="push-sum: flush and check the mass every this many rounds "
                             f"(default {DEFAULT_FLUSH_EVERY})")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON (rank 0)")
    parser.add_argument("--corrupt", metavar="PART:RANK:ROUND", default=None,
                        help=argparse.SUPPRESS)  # tests only: falsify one result to see the checks fail
    comm = parser.add_argument_group("native communicator options (default: the Communicator's)")
    comm.add_argument("--spin-us", type=_float_in(0, math.inf), help="progress thread spin before sleeping")
    comm.add_argument("--max-sleep-us", type=_float_in(0, math.inf), help="longest progress thread sleep")


def to_argv(args: argparse.Namespace, ranks: int) -> list[str]:
    """The worker's command-line options for parsed ``args`` (like ``collectives.to_argv``)."""
    argv = ["--ranks", str(ranks), "--rounds", str(args.rounds), "--seed", str(args.seed),
            "--max-delay-ms", repr(args.max_delay_ms), "--delay-fraction", repr(args.delay_fraction),
            "--parts", ",".join(args.parts), "--group-size", str(args.group_size),
            "--sync-every", str(args.sync_every), "--payload", str(args.payload),
            "--max-peers", str(args.max_peers), "--flush-every", str(args.flush_every)]
    if args.json is not None:
        argv += ["--json", str(Path(args.json).absolute())]
    if args.corrupt is not None:
        argv += ["--corrupt", args.corrupt]
    for flag, value in (("--spin-us", args.spin_us), ("--max-sleep-us", args.max_sleep_us)):
        if value is not None:
            argv += [flag, repr(value)]
    return argv


def worker_argv(args: argparse.Namespace, ranks: int) -> list[str]:
    """The whole command each rank runs: ``run_ranks(ranks, worker_argv(args, ranks))``."""
    return [sys.executable, "-m", "harness.bench.stress", *to_argv(args, ranks)]


def comm_options(args: argparse.Namespace) -> dict[str, Any]:
    names = {"spin_us": args.spin_us, "max_sleep_us": args.max_sleep_us}
    return {k: v for k, v in names.items() if v is not None}


def _parse_corrupt(text: str | None) -> tuple[str, int, int] | None:
    if text is None:
        return None
    part, rank, rnd = text.split(":")
    return part, int(rank), int(rnd)


# -- the worker ---------------------------------------------------------------------------------
class _Delays:
    """Random sleeps of one rank in one part (seeded per rank and part)."""

    def __init__(self, args: argparse.Namespace, rank: int, part: str) -> None:
        self.rng = np.random.default_rng([args.seed, rank, PARTS.index(part), 1])
        self.fraction, self.max_s = args.delay_fraction, args.max_delay_ms / 1000.0
        self.slept = 0.0

    def sleep(self) -> None:
        if self.max_s > 0 and self.rng.random() < self.fraction:
            s = self.rng.uniform(0.0, self.max_s)
            time.sleep(s)
            self.slept += s


class _Failures:
    """One rank's violations: all counted, the first MAX_REPORTED described."""

    def __init__(self) -> None:
        self.count = 0
        self.first: list[str] = []

    def add(self, where: str, problems: Sequence[str]) -> None:
        for p in problems:
            self.count += 1
            if len(self.first) < MAX_REPORTED:
                self.first.append(f"{where}: {p}")


def _combine(world: Any, local: _Failures, global_count: int = 0,
             global_first: Sequence[str] = ()) -> tuple[int, list[str]]:
    """Every rank's failures plus rank 0's cross-rank ones: the total count (on every rank) and the
    first MAX_REPORTED descriptions (on rank 0; empty elsewhere)."""
    from mpi4py import MPI  # noqa: PLC0415

    count = world.allreduce(local.count, op=MPI.SUM) + world.bcast(global_count, root=0)
    gathered = world.gather(local.first, root=0)
    first = list(global_first) if world.Get_rank() == 0 else []
    if world.Get_rank() == 0:
        for lst in gathered:
            first.extend(lst)
    return count, first[:MAX_REPORTED]


def run_group_part(comm: Any, world: Any, args: argparse.Namespace, part: str) -> dict[str, Any]:
    """``wagma`` or ``eager``: rounds of the wait-avoiding allreduce, every one checked."""
    from mpi4py import MPI  # noqa: PLC0415

    from harness.schedules import wagma_phases  # noqa: PLC0415

    n, rank = world.Get_size(), world.Get_rank()
    accumulate = part == "eager"
    se = args.sync_every
    rounds = -(-args.rounds // se) * se if accumulate else args.rounds
    phases = [list(range(n))] if accumulate else wagma_phases(rank, n, args.group_size)
    weights = payload_weights(n, args.payload)
    length = buffer_length(n, args.payload)
    initial = np.zeros(length, dtype=np.float32) if accumulate else publish_buffer(rank, -1, n, weights)
    corrupt = _parse_corrupt(args.corrupt)
    delays = _Delays(args, rank, part)
    fails = _Failures()
    staleness = np.zeros(rounds, dtype=np.int64)
    early = np.zeros(rounds, dtype=bool)
    headers = np.zeros((rounds, 2 * n), dtype=np.int64)
    digests = np.zeros(rounds, dtype=np.int64)
    summed = np.zeros(length, dtype=np.int64)
    out = np.empty(length, dtype=np.float32)

    wa = comm.wait_avoiding(initial, phases=phases, sync_every=se, accumulate=accumulate)
    world.Barrier()
    t0 = time.perf_counter()
    for k in range(rounds):
        delays.sleep()
        buf = publish_buffer(rank, k, n, weights)
        out.fill(np.nan)  # a slot the op never writes shows up
        may_activate = True if not accumulate or k % 2 == 0 else rank == (7 * k + 3) % n
        info = wa.round(buf, out, may_activate=may_activate)
        if corrupt == (part, rank, k):
            out[n] += 1  # a deliberately wrong sum (rank 0's B slot): the checks must catch it
        members = group_members(phases, k, n, se)
        problems = check_info(info, k, members, se) + check_result(out, members, n, weights, accumulate)
        fails.add(f"{part} rank {rank} round {k}", problems)
        staleness[k] = info["staleness"]
        early[k] = info["joined_early"]
        if np.all(np.isfinite(out)):
            headers[k] = np.rint(out[:2 * n]).astype(np.int64)
            summed += np.rint(out).astype(np.int64)
        digests[k] = zlib.crc32(out.tobytes())
    t1 = time.perf_counter()
    wa.close()
    elapsed = world.allreduce(t1 - t0, op=MPI.MAX)

    if accumulate:
        fails.add(f"{part} rank {rank} after round {rounds - 1}",
                  check_totals(summed, published_totals(n, rounds, weights)))
    all_phases = world.gather(phases, root=0)
    all_stale = world.gather(staleness, root=0)
    all_headers = world.gather(headers, root=0)
    all_digests = world.gather(digests, root=0)
    g_count, g_first = 0, []
    if rank == 0:
        g_count, g_first = check_group_rounds(all_phases, np.stack(all_stale), np.stack(all_headers),
                                              np.stack(all_digests), se, accumulate)
        g_first = [f"{part} {f}" for f in g_first]
    violations, first = _combine(world, fails, g_count, g_first)
    sync_rounds = int(np.count_nonzero(is_sync(np.arange(rounds), se)))
    slept = world.allreduce(delays.slept, op=MPI.SUM)
    return {
        "part": part, "rounds": rounds, "seconds": elapsed, "rounds_per_s": rounds / elapsed if elapsed > 0 else None,
        "sync_rounds": sync_rounds, "phases": len(phases),
        "group_sizes": sorted({len(p) for p in phases}),
        "max_staleness": world.allreduce(int(staleness.max(initial=0)), op=MPI.MAX),
        "mean_staleness": world.allreduce(float(staleness.sum()), op=MPI.SUM) / (rounds * n),
        "early_joins": world.allreduce(int(early.sum()), op=MPI.SUM),
        "mean_sleep_s_per_rank": slept / n,
        "summed_out_equals_published": None if not accumulate else
        bool(world.allreduce(int(np.array_equal(summed, published_totals(n, rounds, weights))), op=MPI.MIN)),
        "violations": violations, "failures": first,
    }


def run_push_part(comm: Any, world: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Push-sum with random out-peers: messages counted, mass conserved exactly."""
    from mpi4py import MPI  # noqa: PLC0415

    n, rank = world.Get_size(), world.Get_rank()
    rng = np.random.default_rng([args.seed, rank, PARTS.index("push"), 2])
    delays = _Delays(args, rank, "push")
    corrupt = _parse_corrupt(args.corrupt)
    fails = _Failures()
    g_count, g_first = 0, []
    held = initial_mass(rank, n)
    initial_total = np.sum([initial_mass(r, n) for r in range(n)], axis=0)
    sent = np.zeros(n, dtype=np.int64)  # to each rank
    received = np.zeros(n, dtype=np.int64)  # from each rank
    others = np.array([r for r in range(n) if r != rank], dtype=np.int64)
    flushes = 0
    chan = comm.push_channel(push_length(n))

    def drain(where: str) -> int:
        nonlocal held
        out = np.zeros(push_length(n), dtype=np.float32)
        got = chan.drain(out)
        if corrupt == ("push", rank, t) and got:
            out[0] += 1
        fails.add(where, check_drained(out, got, n))
        if np.all(np.isfinite(out)):
            held = held + np.rint(out[:MASS_SLOTS]).astype(np.int64)
            received[:] += np.rint(out[MASS_SLOTS + 1:]).astype(np.int64)
        return got

    def checkpoint(where: str) -> None:
        nonlocal g_count, flushes
        chan.flush()
        drain(where)
        flushes += 1
        all_held = world.gather(held, root=0)
        all_sent = world.gather(sent.copy(), root=0)
        all_received = world.gather(received.copy(), root=0)
        if rank == 0:
            problems = check_push_totals(np.stack(all_held), initial_total, np.stack(all_sent), np.stack(all_received))
            g_count += len(problems)
            g_first.extend(f"push {where}: {p}" for p in problems[: MAX_REPORTED - len(g_first)])
        world.Barrier()  # nobody pushes again before every rank has drained and reported

    world.Barrier()
    t0 = time.perf_counter()
    t = 0
    for t in range(args.rounds):
        delays.sleep()
        if others.size:
            k = int(rng.integers(1, min(args.max_peers, others.size) + 1))
            peers = rng.choice(others, size=k, replace=False)
            amounts = rng.integers(0, held // (2 * k) + 1)  # stays >= 0: at most half the mass goes
            chan.send(push_message(rank, n, amounts), peers.tolist())
            held = held - amounts * k
            sent[peers] += 1
        if rng.random() < 0.5:
            drain(f"push rank {rank} round {t}")
        if (t + 1) % args.flush_every == 0 and t + 1 < args.rounds:
            checkpoint(f"flush after round {t}")
    checkpoint(f"final flush after round {t}")
    t1 = time.perf_counter()
    chan.close()
    late = np.zeros(push_length(n), dtype=np.float32)
    got = chan.drain(late)
    if got or np.any(late):
        fails.add(f"push rank {rank} after close", [f"{got} messages arrived after the final flush"])
    elapsed = world.allreduce(t1 - t0, op=MPI.MAX)
    violations, first = _combine(world, fails, g_count, g_first)
    total_held = np.sum(world.allgather(held), axis=0)
    slept = world.allreduce(delays.slept, op=MPI.SUM)
    return {
        "part": "push", "rounds": args.rounds, "seconds": elapsed,
        "rounds_per_s": args.rounds / elapsed if elapsed > 0 else None,
        "messages_sent": world.allreduce(int(sent.sum()), op=MPI.SUM),
        "messages_received": world.allreduce(int(received.sum()), op=MPI.SUM),
        "flushes": flushes,
        "mass_initial": initial_total.tolist(), "mass_final": total_held.tolist(),
        "mean_sleep_s_per_rank": slept / n,
        "violations": violations, "failures": first,
    }


def report_line(row: dict[str, Any]) -> str:
    rate = f"{row['rounds_per_s']:.0f} rounds/s" if row["rounds_per_s"] else "- rounds/s"
    head = f"# {row['part']:6s} {row['rounds']} rounds in {row['seconds']:.1f} s ({rate})"
    if row["part"] == "push":
        body = (f", {row['messages_sent']} messages sent / {row['messages_received']} received, "
                f"{row['flushes']} flushes, mass {row['mass_final']} (initially {row['mass_initial']})")
    else:
        sizes = "/".join(map(str, row["group_sizes"]))
        body = (f", groups of {sizes} over {row['phases']} phase(s), {row['sync_rounds']} sync rounds, "
                f"max staleness {row['max_staleness']}, mean {row['mean_staleness']:.2f}, "
                f"{row['early_joins']} early joins")
        if row["summed_out_equals_published"] is not None:
            body += f", summed out == published: {row['summed_out_equals_published']}"
    return head + body + f", violations {row['violations']}"


def run_worker(args: argparse.Namespace) -> int:
    """Run the stress test on this rank; rank 0 prints (and writes ``--json``). 0, 1 on a violation."""
    from mpi4py import MPI  # noqa: PLC0415

    from harness.comm import Communicator  # noqa: PLC0415

    world = MPI.COMM_WORLD
    n, rank = world.Get_size(), world.Get_rank()
    if not job_size_matches(args, world):
        return 2
    problem = magnitude_problem(n, args.sync_every, args.payload)
    if problem is not None:
        if rank == 0:
            print(f"error: {problem}", file=sys.stderr, flush=True)
        return 2
    header = {"benchmark": "stress", "ranks": n, "rounds": args.rounds, "seed": args.seed,
              "max_delay_ms": args.max_delay_ms, "delay_fraction": args.delay_fraction, "parts": args.parts,
              "group_size": args.group_size, "sync_every": args.sync_every, "payload": args.payload,
              "max_peers": args.max_peers, "flush_every": args.flush_every, "comm_options": comm_options(args)}
    if rank == 0:
        say(f"# stress: {n} ranks, {args.rounds} rounds per part, seed {args.seed}, sleep before "
             f"{args.delay_fraction:.0%} of rounds uniform in [0, {args.max_delay_ms:g}] ms; "
             f"sync every {args.sync_every}, payload {args.payload} floats")

    results: list[dict[str, Any]] = []
    start = time.perf_counter()
    comm = Communicator(world, **comm_options(args))
    try:
        for part in args.parts:
            row = run_push_part(comm, world, args) if part == "push" else run_group_part(comm, world, args, part)
            results.append(row)
            if rank == 0:
                say(report_line(row))
                for f in row["failures"]:
                    say(f"#   FAILED {f}")
    finally:
        comm.close()
    wall = time.perf_counter() - start

    total = sum(r["violations"] for r in results)
    if rank == 0:
        say(f"# violations total: {total}" + ("  OK" if total == 0 else "  FAILED") + f" ({wall:.1f} s)")
        if args.json is not None:
            from harness.results.atomic import write_json  # noqa: PLC0415  (pandas; rank 0 only)

            write_json(args.json, {**header, "wall_s": wall, "violations": total, "ok": total == 0,
                                   "results": {r["part"]: r for r in results}})
    return 1 if total else 0


def main(argv: list[str] | None = None) -> int:
    return worker_main("python -m harness.bench.stress", __doc__, add_arguments, run_worker, argv)


if __name__ == "__main__":
    sys.exit(main())
