"""The exact rule ``bench stress`` checks every round of the wait-avoiding allreduce and the
push-sum channel against: what each rank publishes, and what every sum and every drain must then
hold. Pure functions of numpy arrays, no MPI: the worker (:mod:`harness.bench.stress_worker`)
calls them on what the ranks got, and the tests feed them right and wrong rounds to see that
they catch every kind of mistake.

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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

ROUND_MOD = 4093  # g(r) = (r + 1) % ROUND_MOD + 1 keeps values small whatever the round count
EXACT = 1 << 24  # float32 represents every integer of magnitude <= 2^24
U_MOD, V_MOD = 11, 3  # payload weights: U in 1..11, V in 0..2
MASS_SLOTS = 2
MAX_REPORTED = 20  # failures printed / kept in the JSON


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
    buf[2 * ranks :] = u[rank] + v[rank] * g(r)
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
        return (
            f"{ranks} ranks with --sync-every {sync_every} could sum to {worst} >= 2^24 in one slot: "
            "use fewer ranks or a smaller --sync-every"
        )
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


def check_result(
    out: np.ndarray, members: Sequence[int], ranks: int, weights: tuple[np.ndarray, np.ndarray], accumulate: bool
) -> list[str]:
    """What is wrong with one rank's round sum ``out`` on its own (empty: nothing)."""
    if not np.all(np.isfinite(out)):
        return [f"{int(np.count_nonzero(~np.isfinite(out)))} non-finite values (a slot never written?)"]
    if not np.all(out == np.rint(out)) or np.any(np.abs(out) >= EXACT):
        return ["a value that is not an integer below 2^24 (only such values were published)"]
    vals = out.astype(np.int64)
    a, b, pay = vals[:ranks], vals[ranks : 2 * ranks], vals[2 * ranks :]
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
            bad.append(
                f"members {missing.tolist()} did not contribute exactly one buffer: "
                f"A={a[missing].tolist()} B={b[missing].tolist()}"
            )
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


def check_group_rounds(
    phases_by_rank: Sequence[Sequence[Sequence[int]]],
    staleness: np.ndarray,
    headers: np.ndarray,
    digests: np.ndarray,
    sync_every: int,
    accumulate: bool,
    limit: int = MAX_REPORTED,
) -> tuple[int, list[str]]:
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
    report(
        "contributed buffer went back in time",
        np.argwhere(r < prev),
        lambda jk: f"rank {jk[0]} round {jk[1]}: buffer of round {r[jk]} after round {prev[jk]}",
    )
    report(
        "contributed a buffer from the future",
        np.argwhere(r > k[None, :]),
        lambda jk: f"rank {jk[0]} round {jk[1]}: staleness {staleness[jk]}",
    )
    oldest = prev_sync_round(k, sync_every)
    report(
        "contributed a buffer older than the previous synchronous round",
        np.argwhere(r < oldest[None, :]),
        lambda jk: f"rank {jk[0]} round {jk[1]}: buffer of round {r[jk]}, synchronous round {oldest[jk[1]]}",
    )

    mask = membership(phases_by_rank, rounds, sync_every)
    a, b = contributions(staleness, accumulate)  # (ranks j, rounds k)
    want = np.concatenate([mask * a.T[None, :, :], mask * b.T[None, :, :]], axis=2)  # (i, k, 2*ranks)
    diff = np.argwhere(np.any(headers != want, axis=2))
    report(
        "sum differs from the rule",
        diff,
        lambda ik: (
            f"rank {ik[0]} round {ik[1]}: got A={headers[ik][:ranks].tolist()} "
            f"B={headers[ik][ranks:].tolist()}, rule gives A={want[ik][:ranks].tolist()} "
            f"B={want[ik][ranks:].tolist()} (staleness {staleness[:, ik[1]].tolist()})"
        ),
    )

    for i in range(ranks):
        for j in range(ranks):
            if i == j:
                continue
            together = mask[i, :, j]
            bad_group = np.flatnonzero(together & np.any(mask[i] != mask[j], axis=1))
            report(
                "members disagree on the group",
                np.array([[i, j, x] for x in bad_group]).reshape(-1, 3),
                lambda ijk: f"rank {ijk[0]} and rank {ijk[1]} in round {ijk[2]}",
            )
            if i < j:
                bad_sum = np.flatnonzero(together & mask[j, :, i] & (digests[i] != digests[j]))
                report(
                    "group members got different sums",
                    np.array([[i, j, x] for x in bad_sum]).reshape(-1, 3),
                    lambda ijk: f"rank {ijk[0]} and rank {ijk[1]} in round {ijk[2]}",
                )
    return count, found


def published_totals(ranks: int, rounds: int, weights: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The sum (int64) of every buffer all ranks publish in rounds 0..rounds-1."""
    u, v = weights
    gsum = int(np.sum(g(np.arange(rounds, dtype=np.int64))))
    return np.concatenate(
        [
            np.full(ranks, rounds, dtype=np.int64),
            np.full(ranks, gsum, dtype=np.int64),
            rounds * u.sum(axis=0) + gsum * v.sum(axis=0),
        ]
    )


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
    senders = out[MASS_SLOTS + 1 :].astype(np.int64)
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
