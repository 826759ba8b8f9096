"""The MPI worker of ``bench stress``, which every rank of its job runs.

The parts run one after the other on the world communicator, every round checked against the
rule (:mod:`harness.testing.stress_rule`).

``python -m harness bench stress`` launches it; it can also be started directly under the venv's
mpiexec (the full run is the default)::

    mpiexec -n 8 python -m harness.bench.stress_worker --rounds 10000 --json stress.json

Rank 0 prints one report line per part and writes ``--json``; the exit status is 1 when any
check failed (the first failures are printed: part, check, rank, round), 2 on bad arguments.
mpi4py and the native layer are imported inside the worker's functions only.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.bench.arguments import say, worker_main
from harness.bench.mpi_worker import on_world, worker_command
from harness.bench.stress import PARTS, add_arguments, comm_options, report_line, to_argv
from harness.mpi_library import import_mpi
from harness.results.atomic import write_json
from harness.schedules import wagma_phases
from harness.testing.stress_rule import (
    MASS_SLOTS,
    MAX_REPORTED,
    buffer_length,
    check_drained,
    check_group_rounds,
    check_info,
    check_push_totals,
    check_result,
    check_totals,
    group_members,
    initial_mass,
    is_sync,
    magnitude_problem,
    payload_weights,
    publish_buffer,
    published_totals,
    push_length,
    push_message,
)


def worker_argv(args: argparse.Namespace, ranks: int) -> list[str]:
    """The whole command each rank runs: ``run_ranks(ranks, worker_argv(args, ranks))``."""
    return worker_command("harness.bench.stress_worker", to_argv(args, ranks))


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


def _combine(
    world: Any, local: _Failures, global_count: int = 0, global_first: Sequence[str] = ()
) -> tuple[int, list[str]]:
    """Every rank's failures plus rank 0's cross-rank ones: the total count (on every rank) and the
    first MAX_REPORTED descriptions (on rank 0; empty elsewhere)."""
    MPI = import_mpi()  # initializes MPI: on the ranks only

    count = world.allreduce(local.count, op=MPI.SUM) + world.bcast(global_count, root=0)
    gathered = world.gather(local.first, root=0)
    first = list(global_first) if world.Get_rank() == 0 else []
    if world.Get_rank() == 0:
        for lst in gathered:
            first.extend(lst)
    return count, first[:MAX_REPORTED]


def run_group_part(comm: Any, world: Any, args: argparse.Namespace, part: str) -> dict[str, Any]:
    """``wagma`` or ``eager``: rounds of the wait-avoiding allreduce, every one checked."""
    MPI = import_mpi()  # initializes MPI: on the ranks only

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
            headers[k] = np.rint(out[: 2 * n]).astype(np.int64)
            summed += np.rint(out).astype(np.int64)
        digests[k] = zlib.crc32(out.tobytes())
    t1 = time.perf_counter()
    wa.close()
    elapsed = world.allreduce(t1 - t0, op=MPI.MAX)

    if accumulate:
        fails.add(
            f"{part} rank {rank} after round {rounds - 1}", check_totals(summed, published_totals(n, rounds, weights))
        )
    all_phases = world.gather(phases, root=0)
    all_stale = world.gather(staleness, root=0)
    all_headers = world.gather(headers, root=0)
    all_digests = world.gather(digests, root=0)
    g_count = 0
    g_first: list[str] = []
    if rank == 0:
        g_count, g_first = check_group_rounds(
            all_phases, np.stack(all_stale), np.stack(all_headers), np.stack(all_digests), se, accumulate
        )
        g_first = [f"{part} {f}" for f in g_first]
    violations, first = _combine(world, fails, g_count, g_first)
    sync_rounds = int(np.count_nonzero(is_sync(np.arange(rounds), se)))
    slept = world.allreduce(delays.slept, op=MPI.SUM)
    return {
        "part": part,
        "rounds": rounds,
        "seconds": elapsed,
        "rounds_per_s": rounds / elapsed if elapsed > 0 else None,
        "sync_rounds": sync_rounds,
        "phases": len(phases),
        "group_sizes": sorted({len(p) for p in phases}),
        "max_staleness": world.allreduce(int(staleness.max(initial=0)), op=MPI.MAX),
        "mean_staleness": world.allreduce(float(staleness.sum()), op=MPI.SUM) / (rounds * n),
        "early_joins": world.allreduce(int(early.sum()), op=MPI.SUM),
        "mean_sleep_s_per_rank": slept / n,
        "summed_out_equals_published": None
        if not accumulate
        else bool(world.allreduce(int(np.array_equal(summed, published_totals(n, rounds, weights))), op=MPI.MIN)),
        "violations": violations,
        "failures": first,
    }


def run_push_part(comm: Any, world: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Push-sum with random out-peers: messages counted, mass conserved exactly."""
    MPI = import_mpi()  # initializes MPI: on the ranks only

    n, rank = world.Get_size(), world.Get_rank()
    rng = np.random.default_rng([args.seed, rank, PARTS.index("push"), 2])
    delays = _Delays(args, rank, "push")
    corrupt = _parse_corrupt(args.corrupt)
    fails = _Failures()
    g_count = 0
    g_first: list[str] = []
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
            received[:] += np.rint(out[MASS_SLOTS + 1 :]).astype(np.int64)
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
        "part": "push",
        "rounds": args.rounds,
        "seconds": elapsed,
        "rounds_per_s": args.rounds / elapsed if elapsed > 0 else None,
        "messages_sent": world.allreduce(int(sent.sum()), op=MPI.SUM),
        "messages_received": world.allreduce(int(received.sum()), op=MPI.SUM),
        "flushes": flushes,
        "mass_initial": initial_total.tolist(),
        "mass_final": total_held.tolist(),
        "mean_sleep_s_per_rank": slept / n,
        "violations": violations,
        "failures": first,
    }


@on_world
def run_worker(args: argparse.Namespace, world: Any) -> int:
    """Run the stress test on this rank; rank 0 prints (and writes ``--json``). 0, 1 on a violation."""
    from harness.comm import Communicator  # noqa: PLC0415  (loads MPI and the native layer: ranks only)

    n, rank = world.Get_size(), world.Get_rank()
    problem = magnitude_problem(n, args.sync_every, args.payload)
    if problem is not None:
        if rank == 0:
            print(f"error: {problem}", file=sys.stderr, flush=True)
        return 2
    header = {
        "benchmark": "stress",
        "ranks": n,
        "rounds": args.rounds,
        "seed": args.seed,
        "max_delay_ms": args.max_delay_ms,
        "delay_fraction": args.delay_fraction,
        "parts": args.parts,
        "group_size": args.group_size,
        "sync_every": args.sync_every,
        "payload": args.payload,
        "max_peers": args.max_peers,
        "flush_every": args.flush_every,
        "comm_options": comm_options(args),
    }
    if rank == 0:
        say(
            f"# stress: {n} ranks, {args.rounds} rounds per part, seed {args.seed}, sleep before "
            f"{args.delay_fraction:.0%} of rounds uniform in [0, {args.max_delay_ms:g}] ms; "
            f"sync every {args.sync_every}, payload {args.payload} floats"
        )

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
            write_json(
                args.json,
                {
                    **header,
                    "wall_s": wall,
                    "violations": total,
                    "ok": total == 0,
                    "results": {r["part"]: r for r in results},
                },
            )
    return 1 if total else 0


def main(argv: list[str] | None = None) -> int:
    return worker_main("python -m harness.bench.stress_worker", __doc__, add_arguments, run_worker, argv)


if __name__ == "__main__":
    sys.exit(main())
