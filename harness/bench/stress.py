"""Stress test of the wait-avoiding group allreduce and the push-sum channel under random delays.

``python -m harness bench stress`` launches its worker (:mod:`harness.bench.stress_worker`) on
``--ranks`` ranks; this module is what the command and the worker share: the options, and the
report line rank 0 prints per part.

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

Every round is checked exactly against a rule (:mod:`harness.testing.stress_rule`): each rank
publishes integers from which every sum's content follows, so a lost, doubled, stale or
misplaced contribution shows up in the sum itself.

Rank 0 prints one report line per part and writes ``--json``; the exit status is 1 when any
check failed (the first failures are printed: part, check, rank, round), 2 on bad arguments.
Neither this module nor the worker imports mpi4py or the native layer before the worker runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.arguments import choice_list, int_at_least, number_in

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


# -- arguments (the command's and the worker's) ------------------------------------------------
_parts_list = choice_list("part", PARTS, ",".join(PARTS), in_given_order=False)  # run in the order of PARTS


def add_arguments(parser: argparse.ArgumentParser, *, ranks_default: int | None = None) -> None:
    """The stress test's options (the parent command and the worker take the same ones)."""
    parser.add_argument(
        "--ranks",
        type=int_at_least(1),
        default=ranks_default,
        help="number of ranks (default 8, or the size of the MPI job already running)",
    )
    parser.add_argument(
        "--rounds",
        type=int_at_least(1),
        default=DEFAULT_ROUNDS,
        help=f"rounds per part (default {DEFAULT_ROUNDS}; eager-SGD rounds up to a synchronous round)",
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help=f"seed of every rank's RNG (default {DEFAULT_SEED})"
    )
    parser.add_argument(
        "--max-delay-ms",
        type=number_in(0, 10_000),
        default=DEFAULT_MAX_DELAY_MS,
        help=f"longest random sleep before a round (default {DEFAULT_MAX_DELAY_MS:g} ms)",
    )
    parser.add_argument(
        "--delay-fraction",
        type=number_in(0, 1),
        default=DEFAULT_DELAY_FRACTION,
        help=f"fraction of rounds with a sleep (default {DEFAULT_DELAY_FRACTION:g})",
    )
    parser.add_argument(
        "--parts",
        type=_parts_list,
        default=list(PARTS),
        help=f"comma-separated parts: {', '.join(PARTS)} (default all)",
    )
    parser.add_argument(
        "--group-size",
        type=int_at_least(1),
        default=DEFAULT_GROUP_SIZE,
        help=f"WAGMA group size (default {DEFAULT_GROUP_SIZE})",
    )
    parser.add_argument(
        "--sync-every",
        type=int_at_least(1),
        default=DEFAULT_SYNC_EVERY,
        help=f"synchronous round every this many rounds (default {DEFAULT_SYNC_EVERY})",
    )
    parser.add_argument(
        "--payload",
        type=int_at_least(0),
        default=DEFAULT_PAYLOAD,
        help=f"float32 elements after the 2*ranks header (default {DEFAULT_PAYLOAD}; "
        "16384 and more take the ring algorithm)",
    )
    parser.add_argument(
        "--max-peers",
        type=int_at_least(1),
        default=DEFAULT_MAX_PEERS,
        help=f"push-sum: most out-peers per push (default {DEFAULT_MAX_PEERS})",
    )
    parser.add_argument(
        "--flush-every",
        type=int_at_least(1),
        default=DEFAULT_FLUSH_EVERY,
        help=f"push-sum: flush and check the mass every this many rounds (default {DEFAULT_FLUSH_EVERY})",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON (rank 0)")
    parser.add_argument(
        "--corrupt", metavar="PART:RANK:ROUND", default=None, help=argparse.SUPPRESS
    )  # tests only: falsify one result to see the checks fail
    comm = parser.add_argument_group("native communicator options (default: the Communicator's)")
    comm.add_argument("--spin-us", type=number_in(0), help="progress thread spin before sleeping")
    comm.add_argument("--max-sleep-us", type=number_in(0), help="longest progress thread sleep")


def to_argv(args: argparse.Namespace, ranks: int) -> list[str]:
    """The worker's command-line options for parsed ``args`` (like ``collectives.to_argv``)."""
    argv = [
        "--ranks",
        str(ranks),
        "--rounds",
        str(args.rounds),
        "--seed",
        str(args.seed),
        "--max-delay-ms",
        repr(args.max_delay_ms),
        "--delay-fraction",
        repr(args.delay_fraction),
        "--parts",
        ",".join(args.parts),
        "--group-size",
        str(args.group_size),
        "--sync-every",
        str(args.sync_every),
        "--payload",
        str(args.payload),
        "--max-peers",
        str(args.max_peers),
        "--flush-every",
        str(args.flush_every),
    ]
    if args.json is not None:
        argv += ["--json", str(Path(args.json).absolute())]
    if args.corrupt is not None:
        argv += ["--corrupt", args.corrupt]
    for flag, value in (("--spin-us", args.spin_us), ("--max-sleep-us", args.max_sleep_us)):
        if value is not None:
            argv += [flag, repr(value)]
    return argv


def comm_options(args: argparse.Namespace) -> dict[str, Any]:
    names = {"spin_us": args.spin_us, "max_sleep_us": args.max_sleep_us}
    return {k: v for k, v in names.items() if v is not None}


# -- the report --------------------------------------------------------------------------------
def report_line(row: dict[str, Any]) -> str:
    rate = f"{row['rounds_per_s']:.0f} rounds/s" if row["rounds_per_s"] else "- rounds/s"
    head = f"# {row['part']:6s} {row['rounds']} rounds in {row['seconds']:.1f} s ({rate})"
    if row["part"] == "push":
        body = (
            f", {row['messages_sent']} messages sent / {row['messages_received']} received, "
            f"{row['flushes']} flushes, mass {row['mass_final']} (initially {row['mass_initial']})"
        )
    else:
        sizes = "/".join(map(str, row["group_sizes"]))
        body = (
            f", groups of {sizes} over {row['phases']} phase(s), {row['sync_rounds']} sync rounds, "
            f"max staleness {row['max_staleness']}, mean {row['mean_staleness']:.2f}, "
            f"{row['early_joins']} early joins"
        )
        if row["summed_out_equals_published"] is not None:
            body += f", summed out == published: {row['summed_out_equals_published']}"
    return head + body + f", violations {row['violations']}"
