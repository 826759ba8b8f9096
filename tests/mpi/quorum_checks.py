"""Multi-rank checks of the wait-avoiding allreduce's quorum rule, run once per rank count.

Like comm_checks.py: each check runs on every rank; rank 0 writes ``{name: {"status", "detail"}}``
as JSON to the path on the command line. Every op is eager-SGD style (``accumulate=True``) over
one group of all ranks; rank SIZE - 1 is the slow one. In round k rank r publishes a one-hot
of r, then k + 1, then a weight 1.0: integer floats, so every sum is exact and the sum over
all rounds says how often each rank's publishes were contributed.

    mpiexec -n 4 python tests/mpi/quorum_checks.py report.json -v
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np
from mpi4py import MPI

from checklib import Checks, Skip, agree, agree_that, run_checks
from harness.comm import CommError, Communicator

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
SLOW = SIZE - 1
HALF = math.ceil(SIZE / 2)  # the quorum the fast ranks reach without the slow one (SIZE >= 3)
N = SIZE + 2  # one-hot of the rank, round + 1, weight
CHECKS = check = Checks()


def published(k: int) -> np.ndarray:
    v = np.zeros(N, dtype=np.float32)
    v[RANK] = 1.0
    v[SIZE] = k + 1.0
    v[SIZE + 1] = 1.0
    return v


def run_rounds(
    comm: Communicator, quorum: int, rounds: int, sync_every: int, slow_rounds: set[int], sleep_s: float,
    may_activate: bool = True,
) -> tuple[list[np.ndarray], list[dict], list[tuple[float, float]]]:
    """Rounds of one op; the slow rank sleeps ``sleep_s`` before each of ``slow_rounds``.
    Returns each round's sum, info and when this rank's call began and returned
    (``time.monotonic``: one clock for all ranks of this machine)."""
    wa = comm.wait_avoiding(np.zeros(N, dtype=np.float32), phases=[list(range(SIZE))], sync_every=sync_every,
                            accumulate=True, quorum=quorum)
    comm.barrier()
    outs, infos, spans = [], [], []
    for k in range(rounds):
        if RANK == SLOW and k in slow_rounds:
            time.sleep(sleep_s)
        out = np.zeros(N, dtype=np.float32)
        t0 = time.monotonic()
        infos.append(wa.round(published(k), out, may_activate))
        spans.append((t0, time.monotonic()))
        outs.append(out)
    wa.close()
    return outs, infos, spans


def needs_three() -> None:
    if SIZE < 3:
        raise Skip("needs 3 ranks: a quorum of ceil(P/2) > 1 that the fast ranks reach without the slow one")


@check
def quorum_sums_are_identical_and_exact(comm: Communicator) -> str:
    # quorum = ceil(P/2) with may_activate=False everywhere (ignored with a quorum: if it were
    # honoured no round would ever be activated). Only the last round is synchronous (the op
    # behaves as with sync_every=0 before it); it flushes what the slow rank published after its
    # rounds were joined, so the totals over all rounds are exact. A second op has synchronous
    # rounds in the middle too.
    needs_three()
    seen = []
    for rounds, sync_every, slow_rounds in ((8, 8, {1, 2, 5}), (9, 3, {0, 4, 6})):
        outs, infos, _ = run_rounds(comm, HALF, rounds, sync_every, slow_rounds, 0.1, may_activate=False)
        stacked = np.stack(outs)
        every = WORLD.allgather(stacked.tobytes())
        assert all(b == every[0] for b in every), f"sync_every={sync_every}: ranks got different sums"
        for k, (out, info) in enumerate(zip(outs, infos)):
            sync = k % sync_every == sync_every - 1
            assert info["sync"] == sync and info["group_size"] == SIZE, f"round {k}: {info}"
            # The first `quorum` arrivals each contribute their fresh publish of round k (at least).
            assert sync or out[SIZE + 1] >= HALF, f"round {k} holds {out[SIZE + 1]} publishes, quorum {HALF}"
            if sync:
                assert out[SIZE + 1] >= SIZE, f"synchronous round {k} holds {out[SIZE + 1]} publishes"
        total = stacked.astype(np.float64).sum(0)
        assert np.all(total[:SIZE] == rounds), f"sync_every={sync_every}: publishes per rank {total[:SIZE]}, want {rounds}"
        assert total[SIZE] == SIZE * rounds * (rounds + 1) / 2, f"round numbers sum to {total[SIZE]}"
        assert total[SIZE + 1] == SIZE * rounds, f"weights sum to {total[SIZE + 1]}, want {SIZE * rounds}"
        early = WORLD.bcast(sum(i["joined_early"] for i in infos) if RANK == SLOW else None, root=SLOW)
        seen.append(f"sync_every={sync_every}: slow rank joined early in {early} of {rounds} rounds, "
                    f"weights per round {stacked[:, SIZE + 1].astype(int).tolist()}")
    return "; ".join(seen)


@check
def quorum_waits_for_its_arrivals_only(comm: Communicator) -> str:
    needs_three()
    sleep_s, rounds, slow_rounds = 0.3, 4, {1, 3}
    # quorum = P: every round waits for the slow rank, and every contribution is fresh.
    outs, infos, spans = run_rounds(comm, SIZE, rounds, 0, slow_rounds, sleep_s)

    def every_contribution_is_fresh() -> None:
        for k, (out, info) in enumerate(zip(outs, infos)):
            want = np.concatenate([np.ones(SIZE), [SIZE * (k + 1.0), SIZE]]).astype(np.float32)
            assert np.array_equal(out, want), f"quorum {SIZE}, round {k}: got {out.tolist()}, want {want.tolist()}"
            assert info["staleness"] == 0 and not info["joined_early"], f"quorum {SIZE}, round {k}: {info}"

    agree(every_contribution_is_fresh)
    # Each round needs the slow rank's contribution, so no rank leaves it before the slow rank,
    # done sleeping, entered it. (A per-rank wait of about sleep_s would be the same claim, but
    # it fails when a fast rank itself is held up by a hypervisor pause.)
    slow_entered = WORLD.bcast([t0 for t0, _ in spans], root=SLOW)
    early = {k: round(slow_entered[k] - spans[k][1], 4) for k in sorted(slow_rounds) if spans[k][1] < slow_entered[k]}
    agree_that(not early, f"quorum {SIZE}: left rounds before the slow rank entered them (by s): {early}")
    # quorum = ceil(P/2): the fast ranks are a quorum by themselves and never wait for the slow one:
    # none of their rounds takes half as long as the slow rank's time per round (its sleep and its
    # round, measured in the same run: a slower machine lengthens both).
    _, infos_half, spans_half = run_rounds(comm, HALF, rounds, 0, set(range(rounds)), sleep_s)
    durations_half = [end - begin for begin, end in spans_half]
    slow_spans = WORLD.bcast(spans_half, root=SLOW)
    per_round = (slow_spans[-1][1] - slow_spans[0][1]) / (rounds - 1)
    if RANK != SLOW:
        agree_that(max(durations_half) < 0.5 * per_round,
                   f"quorum {HALF}: fast rank waited {max(durations_half):.3f} s (the slow rank takes "
                   f"{per_round:.3f} s a round, sleeping {sleep_s} s)")
    else:
        agree_that(any(i["joined_early"] for i in infos_half), "the slow rank's progress thread never joined for it")
    worst = WORLD.allreduce(max(durations_half) if RANK != SLOW else 0.0, op=MPI.MAX)
    waited = min(spans[k][1] - spans[k][0] for k in slow_rounds)
    least = WORLD.allreduce(waited if RANK != SLOW else math.inf, op=MPI.MIN)
    return f"quorum {SIZE}: fast ranks waited >= {least:.3f} s; quorum {HALF}: fast rounds took <= {worst:.3f} s"


@check
def quorum_out_of_range_is_refused(comm: Communicator) -> None:
    x = np.zeros(3, dtype=np.float32)
    for bad in (0, -1, SIZE + 1, 1.5):
        try:
            comm.wait_avoiding(x, phases=[list(range(SIZE))], sync_every=0, quorum=bad)
        except ValueError as exc:
            assert "quorum" in str(exc), str(exc)
        else:
            raise AssertionError(f"quorum={bad!r} was accepted")
    # The native layer checks too (before its collective step, so every rank fails alike).
    for bad in (0, SIZE + 1):
        try:
            comm._native.wait_avoiding(x, 0, False, [list(range(SIZE))], bad)
        except CommError as exc:
            assert "quorum" in str(exc), str(exc)
        else:
            raise AssertionError(f"the native layer accepted quorum={bad}")
    # Still usable: a valid op after the refusals.
    out = np.zeros(3, dtype=np.float32)
    wa = comm.wait_avoiding(x, phases=[list(range(SIZE))], sync_every=0, quorum=SIZE)
    wa.round(np.ones(3, dtype=np.float32), out)
    wa.close()
    assert np.all(out == SIZE)


def main(out_path: str) -> int:
    comm = Communicator(WORLD)
    only = [a for a in sys.argv[2:] if not a.startswith("-")]
    run_checks(CHECKS, out_path, WORLD, comm, only=only)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
