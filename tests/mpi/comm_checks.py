"""Multi-rank checks of the native collective layer, run once per rank count under mpiexec.

Each check runs on every rank; rank 0 writes ``{name: {"status": ..., "detail": ...}}`` as JSON
to the path given on the command line. Statuses: ``pass``, ``fail`` (detail says why, per
rank) and ``skip`` (detail gives the reason: the rank count cannot show the property).
torch is deliberately not imported here: it costs seconds per launch.
"""

from __future__ import annotations

import hashlib
import math
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

from checklib import Checks, Skip, run_checks
from harness.comm import CommError, Communicator, EmulatedLink
from harness.schedules import wagma_phases

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
LENGTHS = (1, 7, 1000, 1_000_003)
CHECKS = check = Checks()





def rank_data(n: int, seed: int, rank: int = RANK) -> np.ndarray:
    return np.random.default_rng([seed, rank, n]).standard_normal(n).astype(np.float32)


def tell_once_inside(method, dest: int, tag: int) -> threading.Thread:
    """A thread that sends ``dest`` an empty message (``tag``) once this rank's main thread is
    inside ``method`` (a Python method whose native call waits without the GIL): the sign that
    this rank now waits there and makes no other call. Nothing is sent when it never gets there
    within 30 s (``dest`` then fails its check at its own timeout)."""

    def watch() -> None:
        main = threading.main_thread().ident
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            frame = sys._current_frames().get(main)
            if frame is not None and frame.f_code is method.__code__:
                WORLD.send(None, dest=dest, tag=tag)
                return
            time.sleep(0.001)  # polls for the condition, with a deadline

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def recv_within(source: int, tag: int, what: str, timeout: float = 30) -> None:
    """Receive the empty message ``tag`` from ``source``; AssertionError naming ``what`` did not
    happen when it has not come within ``timeout`` s (a hang would stop every later check)."""
    request = WORLD.irecv(source=source, tag=tag)
    deadline = time.monotonic() + timeout
    while not request.test()[0]:
        if time.monotonic() > deadline:
            request.Cancel()
            raise AssertionError(f"rank {source}: {what} (no word within {timeout} s)")
        time.sleep(0.001)  # polls for the message, with a deadline


def all_equal_across_ranks(a: np.ndarray) -> bool:
    digests = WORLD.allgather(hashlib.sha1(a.tobytes()).hexdigest())
    return len(set(digests)) == 1


@check
def allreduce_sum_and_mean_match_mpi(comm: Communicator) -> None:
    for threshold_comm in (comm, RING):
        for n in LENGTHS:
            x = rank_data(n, 1)
            ref = np.empty_like(x)
            WORLD.Allreduce(x, ref, op=MPI.SUM)
            got = x.copy()
            threshold_comm.allreduce(got, op="sum")
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * SIZE)
            assert all_equal_across_ranks(got), f"sum of length {n} differs across ranks"
            mean = x.copy()
            threshold_comm.iallreduce(mean, op="mean").wait()
            np.testing.assert_allclose(mean, ref / SIZE, rtol=1e-5, atol=1e-5)


@check
def allreduce_length_zero_and_many_outstanding(comm: Communicator) -> None:
    empty = np.zeros(0, dtype=np.float32)
    comm.allreduce(empty)
    bufs = [np.full(n, RANK + 1, dtype=np.float32) for n in (3, 5000, 70000, 1, 100)]
    handles = [comm.iallreduce(b) for b in bufs]
    for h in handles:
        h.wait()
    for b in bufs:
        assert np.all(b == SIZE * (SIZE + 1) / 2), b[:4]


@check
def broadcast_from_every_root(comm: Communicator) -> None:
    for root in range(SIZE):
        for n in (1, 7, 100_003):
            x = rank_data(n, 2) if RANK != root else rank_data(n, 2, root)
            comm.broadcast(x, root=root)
            np.testing.assert_array_equal(x, rank_data(n, 2, root))


@check
def exchange_with_partner(comm: Communicator) -> None:
    if SIZE < 2:
        raise Skip("needs 2 ranks")
    got = []  # (received, from whom)
    for n in (1, 7, 1_000_003):
        partner = RANK ^ 1 if (RANK ^ 1) < SIZE else None
        send = rank_data(n, 4)
        if partner is not None:
            recv = np.zeros_like(send)
            comm.exchange(send, recv, partner)
            got.append((recv, partner, n))
        if SIZE % 2 == 1 and RANK in (0, SIZE - 1):  # odd rank count: the last rank pairs with 0 too
            other = SIZE - 1 if RANK == 0 else 0
            recv = np.zeros_like(send)
            comm.exchange(send, recv, other)
            got.append((recv, other, n))
    for recv, peer, n in got:
        np.testing.assert_array_equal(recv, rank_data(n, 4, peer))


@check
def push_sum_conserves_mass(comm: Communicator) -> None:
    n = 1001
    x = np.full(n + 1, 0.0, dtype=np.float32)
    x[:n] = rank_data(n, 5)
    x[n] = 1.0  # push-sum weight
    total0 = np.empty_like(x)
    WORLD.Allreduce(x.astype(np.float64).astype(np.float32), total0)
    chan = comm.push_channel(n + 1)
    expected_msgs = 0
    received = 0
    levels = max(1, (SIZE - 1).bit_length())
    for t in range(30):
        if SIZE > 1:
            hop = 2 ** (t % levels)
            peer = (RANK + hop) % SIZE
            x *= 0.5
            chan.send(x, [peer]).wait()
            expected_msgs += 1  # the exponential graph is a permutation: one in-message per round
        if t % 3 == 0:
            received += chan.drain(x)
    chan.flush()
    received += chan.drain(x)
    chan.close()
    total = np.empty_like(x)
    WORLD.Allreduce(x, total)
    assert received == expected_msgs, f"received {received} messages, expected {expected_msgs}"
    np.testing.assert_allclose(total, total0, rtol=1e-5, atol=1e-5)
    assert abs(total[n] - SIZE) < 1e-5, f"push-sum weights sum to {total[n]}, expected {SIZE}"


@check
def push_arrives_without_receiver_posting(comm: Communicator) -> None:
    if SIZE < 2:
        raise Skip("needs 2 ranks")
    chan = comm.push_channel(4)
    in_drain = 301  # the tag of "this receiver waits in drain()"
    if RANK == 0:
        for p in range(1, SIZE):  # every receiver waits in drain(), not in a receive call
            recv_within(p, in_drain, "never came to wait in drain()")
        handles = [chan.send(np.full(4, float(p), dtype=np.float32), [p]) for p in range(1, SIZE)]
        for h in handles:
            h.wait()
        chan.close()
    else:
        out = np.zeros(4, dtype=np.float32)
        assert chan.pending() == 0  # nothing can have come: rank 0 sends once this rank is in drain()
        watcher = tell_once_inside(type(chan).drain, 0, in_drain)
        count = chan.drain(out, min_messages=1, timeout=30)
        watcher.join()
        chan.close()
        assert count == 1 and np.all(out == RANK), (count, out)


@check
def push_rounds_are_kept_apart_and_summed_in_source_order(comm: Communicator) -> None:
    """Ranks 1-3 push round 1 first, then round 0, arriving in the order 1, 3, 2. Rank 0's drain of
    round 0 must not count round 1's messages, and must add in source order: with float32 values
    1e8, 1, -1e8 that gives (1e8 + 1) - 1e8 = 0, while the arrival order 1, 3, 2 would give 1.
    The order of arrival is made, not hoped for: pushes are synchronous sends (done once rank 0
    took the message in), and each sender of round 0 passes a token to the next once its push
    is done."""
    if SIZE < 4:
        raise Skip("needs 4 ranks: three senders, one receiver")
    chan = comm.push_channel(2)
    round0 = {1: 1e8, 2: 1.0, 3: -1e8}
    got = None
    arrival = [1, 3, 2]
    if RANK in round0:
        chan.send(np.full(2, 100.0 + RANK, dtype=np.float32), [0], round=1).wait()
        turn = arrival.index(RANK)
        if turn:
            recv_within(arrival[turn - 1], 302, "its push never arrived")  # the token: the sender before arrived
        chan.send(np.full(2, round0[RANK], dtype=np.float32), [0], round=0).wait()
        if turn + 1 < len(arrival):
            WORLD.send(None, dest=arrival[turn + 1], tag=302)
    elif RANK == 0:
        first = np.zeros(2, dtype=np.float32)
        count0 = chan.drain(first, min_messages=3, timeout=30, round=0)
        later = np.zeros(2, dtype=np.float32)
        count1 = chan.drain(later, min_messages=3, timeout=30, round=1)
        got = (count0, first.tolist(), count1, later.tolist(), chan.pending())
    chan.close()
    if RANK == 0:
        assert got == (3, [0.0, 0.0], 3, [306.0, 306.0], 0), got


@check
def link_emulation_delays_messages(comm: Communicator) -> None:
    # Assertions come after every collective call: a rank that failed half-way would leave
    # the others waiting in a collective it never joins.
    if SIZE < 2:
        raise Skip("needs 2 ranks")
    n = 250_000  # 1 MB
    buf = np.ones(n, dtype=np.float32)
    recv = np.zeros_like(buf)
    times, back = {}, (0.0, 0.0)
    # 10 MB/s on the 0 -> 1 link only: 1 MB is delivered >= 100 ms after rank 0 posts it.
    # Then 50 ms latency only. Both ranks share the host's monotonic clock.
    for case, link, n_send in (("bandwidth", EmulatedLink(0, 1, 0.0, 10e6), n), ("latency", EmulatedLink(0, 1, 0.05, None), 1)):
        comm.set_links([link])
        comm.barrier()
        if RANK in (0, 1):
            t0 = time.monotonic()
            comm.exchange(buf[:n_send], recv[:n_send], 1 - RANK)
            times[case] = (t0, time.monotonic())
        if case == "latency":
            # The untouched 1 -> 0 direction alone (an exchange also waits for its own send):
            # a broadcast from rank 1, which never sends towards rank 1.
            began = time.monotonic()
            comm.broadcast(buf[:1], root=1)
            back = (began, time.monotonic())
        comm.set_links([])
        comm.barrier()
    sent = WORLD.bcast(times, root=0)
    lat = WORLD.bcast(times["latency"][1] - sent["latency"][0] if RANK == 1 else None, root=1)
    back_began = WORLD.bcast(back[0], root=1)
    if RANK == 1:
        bw = times["bandwidth"][1] - sent["bandwidth"][0]
        assert bw >= 0.1, f"1 MB over a 10 MB/s link arrived {bw:.3f} s after it was posted"
        assert lat >= 0.05, f"a 50 ms latency link delivered after {lat:.3f} s"
    if RANK == 0:
        # From when both had posted to rank 0's receipt, against the delayed direction measured
        # just before (a slower machine slows both).
        took = back[1] - max(back[0], back_began)
        assert took < 0.5 * lat, f"the untouched 1 -> 0 direction took {took:.3f} s, the delayed one {lat:.3f} s"


def _run_wait_avoiding(comm, group_size, sync_every, rounds, slow_rank, sleep_s):
    """Each rank publishes value 1000*rank + round; returns (durations, infos, results)."""
    n = 17
    phases = wagma_phases(RANK, SIZE, group_size)
    wa = comm.wait_avoiding(np.full(n, -1.0, dtype=np.float32), phases=phases, sync_every=sync_every)
    if comm._native.shm_path == "host":  # every rank here: each group's rounds go through shared memory
        assert wa._native.shm_phases == len(phases), (wa._native.shm_phases, phases)
    comm.barrier()
    durations, infos, results = [], [], []
    for k in range(rounds):
        if RANK == slow_rank:
            time.sleep(sleep_s)
        buf = np.full(n, 1000.0 * RANK + k, dtype=np.float32)
        out = np.zeros(n, dtype=np.float32)
        t0 = time.monotonic()
        info = wa.round(buf, out)
        durations.append(time.monotonic() - t0)
        infos.append(info)
        results.append(out.copy())
    wa.close()
    return durations, infos, results, phases


def _expected_sum(all_infos, k, members, sync):
    total = 0.0
    for j in members:
        s = all_infos[j][k]["staleness"]
        src_round = k - s
        total += -1.0 if src_round < 0 else 1000.0 * j + src_round
    return total


@check
def wait_avoiding_rounds_follow_the_rule(comm: Communicator) -> None:
    sync_every, rounds, slow = 4, 10, SIZE - 1
    durations, infos, results, phases = _run_wait_avoiding(comm, 2, sync_every, rounds, slow, 0.05)
    all_infos = WORLD.allgather(infos)
    for k in range(rounds):
        sync = (k % sync_every) == sync_every - 1
        members = list(range(SIZE)) if sync else phases[k % len(phases)]
        assert infos[k]["sync"] == sync and infos[k]["group_size"] == len(members)
        if sync:
            assert all(all_infos[j][k]["staleness"] == 0 for j in range(SIZE)), "stale buffer in a sync round"
        want = _expected_sum(all_infos, k, members, sync)
        assert np.all(results[k] == np.float32(want)), f"round {k}: got {results[k][0]}, rule gives {want}"


@check
def wait_avoidance_fast_ranks_do_not_wait(comm: Communicator) -> None:
    if SIZE < 2:
        raise Skip("needs 2 ranks: one slow, one fast")
    sync_every, rounds, slow, sleep_s = 4, 8, SIZE - 1, 0.3
    began = time.monotonic()
    durations, infos, _, _ = _run_wait_avoiding(comm, 2, sync_every, rounds, slow, sleep_s)
    # The slow rank's time per round (its sleep and its round), measured in the same run: a rank
    # that waited for it in a round would wait about that long; a slower machine slows both.
    per_round = WORLD.bcast((time.monotonic() - began) / rounds if RANK == slow else None, root=slow)
    if RANK != slow:
        for k, d in enumerate(durations):
            if (k % sync_every) != sync_every - 1:
                assert d < 0.5 * per_round, \
                    f"fast rank waited {d:.3f} s in non-sync round {k} (the slow rank takes {per_round:.3f} s a round)"
        sync_waits = [d for k, d in enumerate(durations) if (k % sync_every) == sync_every - 1]
        assert min(sync_waits) > 0.2, f"sync rounds did not wait for the slow rank: {sync_waits}"
    else:
        assert any(i["joined_early"] for i in infos), "the slow rank's progress thread never contributed for it"


@check
def eager_solo_and_majority_carry_every_gradient(comm: Communicator) -> None:
    # eager-SGD: publishing adds, contributing consumes; what a late rank had not published yet
    # goes into a later round. With a final synchronous round nothing is lost.
    for majority in (False, True):
        n, rounds, sync_every = 5, 9, 3
        wa = comm.wait_avoiding(np.zeros(n, dtype=np.float32), phases=[list(range(SIZE))], sync_every=sync_every, accumulate=True)
        total = np.zeros(n, dtype=np.float64)
        for k in range(rounds):
            if RANK == SIZE - 1:
                time.sleep(0.02)
            initiator = (k * 7 + 3) % SIZE  # shared by all ranks
            out = np.zeros(n, dtype=np.float32)
            wa.round(np.full(n, RANK + 1.0, dtype=np.float32), out, may_activate=(not majority) or RANK == initiator)
            total += out
        wa.close()
        want = rounds * SIZE * (SIZE + 1) / 2
        assert np.all(total == want), f"majority={majority}: applied {total[0]}, published {want}"
        assert all_equal_across_ranks(total.astype(np.float32))


@check
def pairwise_averaging_answers_without_the_passive_caller(comm: Communicator) -> None:
    # AD-PSGD: even ranks ask odd ones; a passive rank sleeps (busy computing) through all of
    # it, its progress thread answers. Checked after close(): both sides moved to the average.
    if SIZE < 2 or SIZE % 2:
        raise Skip("needs an even rank count (bipartite graph)")
    n = 9
    x = np.full(n, 10.0 * RANK, dtype=np.float32)
    avg = comm.pairwise_averager(x)
    peer = RANK + 1 if RANK % 2 == 0 else RANK - 1
    answered = woke = 0.0
    drained = 0
    WORLD.Barrier()  # the request and the sleep start together
    if RANK % 2 == 0:
        out = np.zeros_like(x)
        avg.irequest(x.copy(), out, peer).wait()
        answered = time.monotonic()
        x += (out - x) / 2
    else:
        time.sleep(0.5)  # the caller is busy; its progress thread must answer meanwhile
        woke = time.monotonic()
        drained = avg.drain(x)
    avg.close()
    got = WORLD.allgather(x.copy())
    peer_woke = WORLD.allgather(woke)[peer]  # one machine: one CLOCK_MONOTONIC
    want = (10.0 * RANK + 10.0 * peer) / 2
    assert np.all(got[RANK] == want), (RANK, got[RANK][0], want)
    if RANK % 2 == 0:
        # Answered while the passive rank still slept: an order on one clock, not a duration.
        assert answered < peer_woke, f"answered {answered - peer_woke:.3f} s after the passive rank woke up"
    else:
        assert drained == 1, drained


@check
def pairwise_averaging_conserves_mass_with_concurrent_requests(comm: Communicator) -> None:
    # Every active rank asks passive rank 1 at once: its agent must compose the averagings
    # one after another (each reply is its current view), so the total is conserved exactly.
    if SIZE < 4 or SIZE % 2:
        raise Skip("needs an even rank count >= 4: several active ranks asking one passive rank")
    n = 5
    x = np.full(n, float(2 ** RANK), dtype=np.float32)
    total0 = WORLD.allreduce(float(x[0]))
    squares0 = WORLD.allreduce(float(x[0]) ** 2)
    avg = comm.pairwise_averager(x)
    if RANK % 2 == 0:
        out = np.zeros_like(x)
        sent = x.copy()
        avg.irequest(sent, out, 1).wait()
        x += (out - sent) / 2
    else:
        time.sleep(0.3)
    avg.close()
    if RANK % 2:
        avg.drain(x)
    total = WORLD.allreduce(float(x[0]))
    squares = WORLD.allreduce(float(x[0]) ** 2)
    assert total == total0, f"mass {total} after pairwise averaging, {total0} before"
    # Averaging pairs one after another never spreads the models apart.
    assert squares <= squares0, f"sum of squares grew from {squares0} to {squares}"


@check
def pairwise_averaging_serves_one_request_at_a_time(comm: Communicator) -> None:
    # The active ranks 0 and 2 ask passive rank 1 at once; its replies cross private 25 MB/s
    # links (1 MB: 40 ms each). Answered one at a time, the second reply is posted only when the
    # first has left, so the later request cannot end before two transfers after the earlier
    # post: a bound the emulator guarantees and load only lengthens (unlike the gap between the
    # two ends, which a late wake-up of the first caller shrinks). Answered at once, both would
    # end one transfer after posting.
    if SIZE < 4 or SIZE % 2:
        raise Skip("needs an even rank count >= 4: two active ranks asking one passive rank")
    n = 250_000
    x = np.full(n, float(RANK), dtype=np.float32)
    comm.set_links([EmulatedLink(1, dst, 0.0, 25e6) for dst in range(SIZE) if dst != 1])
    avg = comm.pairwise_averager(x)
    posted, ended = math.inf, -math.inf
    WORLD.Barrier()
    if RANK in (0, 2):
        out = np.zeros_like(x)
        posted = time.monotonic()
        avg.irequest(x.copy(), out, 1).wait()
        ended = time.monotonic()
    avg.close()
    comm.set_links([])
    first_post = min(WORLD.allgather(posted))  # one machine: one CLOCK_MONOTONIC
    last_end = max(WORLD.allgather(ended))
    took = last_end - first_post
    assert took >= 2 * 0.04 * 0.99, f"both requests to rank 1 ended {took * 1e3:.1f} ms after the first post; " \
                                    "two transfers one after another take 80 ms"


@check
def bad_calls_raise_comm_error(comm: Communicator) -> None:
    cases = {
        "float64": lambda: comm.allreduce(np.zeros(3)),
        "non-contiguous": lambda: comm.allreduce(np.zeros(6, dtype=np.float32)[::2]),
        "read-only": lambda: comm.allreduce(np.frombuffer(b"\0" * 8, dtype=np.float32)),
        "bad op": lambda: comm.allreduce(np.zeros(3, dtype=np.float32), op="max"),
        "root out of range": lambda: comm.broadcast(np.zeros(3, dtype=np.float32), root=SIZE),
        "peer out of range": lambda: comm.exchange(np.zeros(3, dtype=np.float32), np.zeros(3, dtype=np.float32), SIZE),
        "negative peer": lambda: comm.exchange(np.zeros(3, dtype=np.float32), np.zeros(3, dtype=np.float32), -1),
        "exchange length": lambda: comm.exchange(np.zeros(3, dtype=np.float32), np.zeros(4, dtype=np.float32), 0),
        "list": lambda: comm.allreduce([1.0, 2.0]),
        "bad link": lambda: comm.set_links([EmulatedLink(RANK, SIZE, 0.0, None)]),
    }
    for name, call in cases.items():
        try:
            call()
        except CommError as exc:
            assert str(exc), name
        else:
            raise AssertionError(f"{name}: no CommError")
    chan = comm.push_channel(3)
    for name, call in {
        "push length": lambda: chan.send(np.zeros(4, dtype=np.float32), []),
        "push to self": lambda: chan.send(np.zeros(3, dtype=np.float32), [RANK]),
        "drain timeout": lambda: chan.drain(np.zeros(3, dtype=np.float32), min_messages=1, timeout=0.05),
    }.items():
        try:
            call()
        except CommError:
            pass
        else:
            raise AssertionError(f"{name}: no CommError")
    chan.close()


@check
def size_mismatch_is_an_error_not_a_hang(comm: Communicator) -> None:
    if SIZE < 2:
        raise Skip("needs 2 ranks")
    own = Communicator(WORLD)  # a communicator of its own: this check leaves it unusable
    x = np.ones(10 if RANK == 0 else 12, dtype=np.float32)
    outcome = "ok"
    try:
        own.iallreduce(x).wait(timeout=3)
    except CommError as exc:
        outcome = "mismatch" if "size mismatch" in str(exc) else f"other: {exc}"
    outcomes = WORLD.allgather(outcome)
    own.close()
    assert "mismatch" in outcomes, outcomes
    assert not any(o.startswith("other") for o in outcomes if "did not complete" not in o), outcomes


@check
def close_raises_the_error_the_operation_ended_with(comm: Communicator) -> None:
    # A user who only closes an op must still learn why it failed; here its communicator was
    # shut down under it, which fails every op still running.
    own = Communicator(WORLD)  # a communicator of its own: this check shuts it down
    x = np.zeros(3, dtype=np.float32)
    ops = {
        "wait-avoiding allreduce": own.wait_avoiding(x, phases=[list(range(SIZE))], sync_every=0),
        "pairwise averager": own.pairwise_averager(x),
    }
    own.close()
    for name, op in ops.items():
        try:
            op.close()
        except CommError as exc:
            assert "shut down" in str(exc), f"{name}: close() raised an unrelated error: {exc}"
        else:
            raise AssertionError(f"{name}: close() after a shutdown raised nothing")


# Element types of the typed collectives with a numpy twin (bfloat16 has none: dist_checks.py
# covers it through torch). Values stay small integers, so every sum is exact in every type.
SHM_DTYPES = ("float32", "float64", "float16", "int64", "int32", "uint8", "int8", "bool")
# 1 element, an odd count, and a count whose reductions span several chunks of the shared
# segment's 256 KiB slot (2 of float32, 3 of float64) without being a multiple of it
# (kernels/shm_collective.hpp: ShmChannel::kSlotBytes)
SHM_COUNTS = (1, 7, 70_001)


def _typed(values: np.ndarray, dtype: str) -> np.ndarray:
    return (values % 2 == 0) if dtype == "bool" else values.astype(dtype)


@check
def typed_collectives_blocking_and_posted_give_exact_results(comm: Communicator) -> None:
    """Every typed collective (harness.dist's), run in the caller's thread (block=True: the
    shared-memory path where the ranks share a host) and posted, for every dtype, gives the
    exact result numpy computes, the same on every rank."""
    from harness._core import DType, ReduceOp

    group = comm._native.group(list(range(SIZE)))
    root = SIZE - 1
    for dtype in SHM_DTYPES:
        code = getattr(DType, dtype)
        total = np.logical_or.reduce if dtype == "bool" else (lambda a: np.sum(a, axis=0).astype(dtype))
        for n in SHM_COUNTS:
            data = [_typed((np.arange(n) + r) % 4, dtype) for r in range(SIZE)]
            blocks = [_typed((np.arange(n * SIZE) + 3 * r) % 3, dtype) for r in range(SIZE)]
            mine, mine_blocks = data[RANK], blocks[RANK]
            for block in (True, False):
                def done(handle):
                    handle.wait()  # at once after block=True on the shared-memory path; posted otherwise

                x = mine.copy()
                done(group.allreduce(x, x.ctypes.data, n, code, ReduceOp.SUM, -1, block=block))
                np.testing.assert_array_equal(x, total(np.stack(data)), err_msg=f"allreduce {dtype} {n}")
                x = mine.copy()
                done(group.broadcast(x, x.ctypes.data, n, code, root, -1, block=block))
                np.testing.assert_array_equal(x, data[root], err_msg=f"broadcast {dtype} {n}")
                x = mine.copy()
                done(group.reduce(x, x.ctypes.data, n, code, ReduceOp.SUM, 0, -1, block=block))
                np.testing.assert_array_equal(x, total(np.stack(data)) if RANK == 0 else mine,
                                              err_msg=f"reduce {dtype} {n}")
                out = np.zeros(n * SIZE, dtype=mine.dtype)
                done(group.allgather(mine, mine.ctypes.data, n, out.ctypes.data, out.size, code, -1, block=block))
                np.testing.assert_array_equal(out, np.concatenate(data), err_msg=f"allgather {dtype} {n}")
                out = np.zeros(n, dtype=mine.dtype)
                done(group.reduce_scatter(mine_blocks, mine_blocks.ctypes.data, mine_blocks.size, out.ctypes.data, n,
                                          code, ReduceOp.SUM, -1, block=block))
                np.testing.assert_array_equal(out, total(np.stack(blocks))[RANK * n:(RANK + 1) * n],
                                              err_msg=f"reduce_scatter {dtype} {n}")
                out = np.zeros(n * SIZE if RANK == root else 0, dtype=mine.dtype)
                done(group.gather(mine, mine.ctypes.data, n, out.ctypes.data, out.size, code, root, -1, block=block))
                if RANK == root:
                    np.testing.assert_array_equal(out, np.concatenate(data), err_msg=f"gather {dtype} {n}")
                out = np.zeros(n, dtype=mine.dtype)
                src = blocks[root]
                done(group.scatter(src, src.ctypes.data, src.size if RANK == root else 0, out.ctypes.data, n, code,
                                   root, -1, block=block))
                np.testing.assert_array_equal(out, src[RANK * n:(RANK + 1) * n], err_msg=f"scatter {dtype} {n}")
    group.barrier(-1, block=True).wait()


def _host_layout() -> tuple[int, int, bool]:
    """(this rank's host, as the lowest world rank on it; how many hosts; whether it leads its host)."""
    local = WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    host = local.allreduce(RANK, op=MPI.MIN)
    leader = local.rank == 0
    local.Free()
    return host, len(set(WORLD.allgather(host))), leader


@check
def across_hosts_each_hosts_members_share_memory(comm: Communicator) -> str:
    """Ranks on several hosts (or MPICH's cliques, which split one machine into several hosts):
    allreduce and barrier run through each host's shared segment and messages between the hosts
    (kernels/host_hierarchy.hpp). Sums are exact and bitwise the same on every rank, blocking,
    posted and many at once, of every dtype through a group; a leader whose exchange with the
    other hosts fails (the hosts' lengths differ) makes its host's other members fail at once,
    naming it, instead of waiting."""
    from harness._core import DType, ReduceOp

    host, hosts, leader = _host_layout()
    if hosts < 2 or hosts == SIZE:
        raise Skip(f"needs ranks on several hosts, some host with two or more ({SIZE} ranks on {hosts} hosts)")
    assert comm._native.shm_path == "hierarchical", comm._native.shm_path
    # 1, odd, several chunks of the 256 KiB slot (not a multiple of it), and past the ring threshold
    for n in (1, 7, 70_001, 1_000_003):
        want = sum((np.arange(n) % 5 + r).astype(np.float32) for r in range(SIZE))
        x = (np.arange(n) % 5 + RANK).astype(np.float32)
        comm.allreduce(x)
        np.testing.assert_array_equal(x, want, err_msg=f"blocking sum of {n}")
        y = rank_data(n, 5)
        comm.iallreduce(y, op="mean").wait()
        assert all_equal_across_ranks(y), f"mean of {n} differs across ranks"
    bufs = [np.full(n, RANK + 1, dtype=np.float32) for n in (3, 5000, 70000, 1, 100)]
    for h in [comm.iallreduce(b) for b in bufs]:
        h.wait()
    assert all(np.all(b == SIZE * (SIZE + 1) / 2) for b in bufs)
    comm.barrier()
    comm.ibarrier().wait()

    group = comm._native.group(list(range(SIZE)))
    assert group.shm_path == "hierarchical", group.shm_path
    for dtype in SHM_DTYPES:
        for n in SHM_COUNTS:
            data = [_typed((np.arange(n) + r) % 4, dtype) for r in range(SIZE)]
            want = np.logical_or.reduce(data) if dtype == "bool" else np.sum(np.stack(data), axis=0).astype(dtype)
            x = data[RANK].copy()
            group.allreduce(x, x.ctypes.data, n, getattr(DType, dtype), ReduceOp.SUM, -1, block=True).wait()
            np.testing.assert_array_equal(x, want, err_msg=f"group allreduce {dtype} {n}")
    group.barrier(-1).wait()

    own = Communicator(WORLD)  # a communicator of its own: this part leaves it unusable
    z = np.ones(10 if host == 0 else 12, dtype=np.float32)
    try:
        # 20 s: a hang guard, not a speed bound. The leaders fail as soon as their lengths
        # differ, and their hosts' members as soon as they read that (milliseconds); a member
        # never told would wait forever and report "did not complete", which fails below.
        own.iallreduce(z).wait(timeout=20)
        outcome = "ok"
    except CommError as exc:
        outcome = str(exc)
    outcomes = WORLD.allgather((leader, outcome))
    own.close()
    for rank, (is_leader, said) in enumerate(outcomes):
        if is_leader:
            assert "size mismatch" in said, (rank, said)
        else:
            assert "given up by member 0" in said, (rank, said)
    return f"{SIZE} ranks on {hosts} hosts"


@check
def use_after_close_raises(comm: Communicator) -> None:
    c = Communicator(WORLD)
    c.close()
    try:
        c.allreduce(np.zeros(2, dtype=np.float32))
    except CommError as exc:
        assert "shut down" in str(exc)
    else:
        raise AssertionError("no CommError after close")


def main(out_path: str, only: list[str] | None = None) -> int:
    global RING
    comm = Communicator(WORLD)
    RING = Communicator(WORLD, ring_threshold_bytes=0)
    run_checks(CHECKS, out_path, WORLD, comm, only=only)
    RING.close()
    comm.close()
    return 0


if __name__ == "__main__":
    # comm_checks.py REPORT [-v] [--only NAME,NAME...]
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    sys.exit(main(sys.argv[1], only))
