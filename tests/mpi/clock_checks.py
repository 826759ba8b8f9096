"""The run's common clock (harness.runner.clock) on ranks whose clocks are seconds apart.

Usage (tests/test_clock.py): mpiexec's MPMD form, some ranks in a time namespace whose
CLOCK_MONOTONIC is shifted by whole seconds (and, with --uts, named as another host):

    mpiexec -n 1 python tests/mpi/clock_checks.py REPORT.json -v \\
        : -n 2 unshare --time --monotonic=7 --uts --fork sh -c 'hostname clock-b && exec "$@"' sh \\
          python tests/mpi/clock_checks.py REPORT.json -v

Each rank reads the shift it runs under from /proc/self/timens_offsets (the kernel's own record
of its time namespace), so the true offset of rank r from rank 0 is known exactly and every
estimate can be held against it. Without the common clock the records of a shifted rank would
be seconds off its peers'. Every estimate is held against its own error bound, half the best round
trip it measured (Cristian's bound, which holds however slow the machine), not a fixed time; a
check's line reports how far inside 1 ms, the target, the estimates came.
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mpi4py import MPI

from checklib import Checks, Skip, run_checks
from harness.runner.clock import Clock

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.rank, WORLD.size
OUT = Path(WORLD.bcast(tempfile.mkdtemp(prefix="clock-checks-") if RANK == 0 else None, root=0))
CHECKS = check = Checks()
TARGET_S = 1e-3  # the target, reported (not asserted): timelines of ranks on different clocks line up within 1 ms
EPS_S = 1e-6  # float rounding of the offsets' arithmetic
REPEATS = 5  # estimates per check, for the error's spread


def monotonic_shift() -> float:
    """The CLOCK_MONOTONIC shift of this process's time namespace (0 outside one, or on a kernel
    without time namespaces)."""
    try:
        lines = Path("/proc/self/timens_offsets").read_text().splitlines()
    except OSError:
        return 0.0
    for line in lines:
        name, seconds, nanoseconds = line.split()
        if name == "monotonic":
            return int(seconds) + int(nanoseconds) * 1e-9
    return 0.0


SHIFTS = WORLD.allgather(monotonic_shift())
TRUE_OFFSETS = [s - SHIFTS[0] for s in SHIFTS]  # each rank's clock minus rank 0's, exactly
HOSTS = WORLD.allgather(socket.gethostname())


def needs_skew() -> None:
    if SIZE < 2 or len(set(SHIFTS)) < 2:
        raise Skip(f"needs ranks in time namespaces shifted differently (shifts {SHIFTS})")


@check
def offsets_match_the_injected_skew():
    """Every estimate within its own error bound (half its round trip) of the true offset."""
    needs_skew()
    errors, bounds, took = [], [], []
    for _ in range(REPEATS):
        t = time.monotonic()
        clock = Clock.synchronize(WORLD)
        took.append(time.monotonic() - t)
        clock.close()
        for r, estimate in enumerate(clock.start):
            error = abs(estimate.offset_s - TRUE_OFFSETS[r])
            # Cristian's bound holds whatever the legs took: half the round trip kept.
            assert error <= estimate.round_trip_s / 2 + EPS_S, (r, estimate, TRUE_OFFSETS[r])
            if r:
                errors.append(error)
                bounds.append(estimate.round_trip_s / 2)
    assert clock.offset_s == clock.start[RANK].offset_s
    return (f"offset error over {REPEATS} estimates x {SIZE - 1} ranks: median {statistics.median(errors) * 1e6:.1f} "
            f"us, max {max(errors) * 1e6:.1f} us; error bound median {statistics.median(bounds) * 1e6:.1f} us, max "
            f"{max(bounds) * 1e6:.1f} us; {sum(e <= TARGET_S for e in errors)} of {len(errors)} within 1 ms; an estimate "
            f"took {statistics.median(took) * 1e3:.1f} ms (median); true offsets {TRUE_OFFSETS}")


@check
def origin_is_one_instant():
    """``origin()`` is rank 0's time on every rank's clock: minus the true offset, all equal up
    to the offsets' error bounds, however late each rank left the barrier (which is all that
    taking ``time.monotonic()`` after it would give: ~0.1 ms apart here, more under load)."""
    needs_skew()
    clock = Clock.synchronize(WORLD)
    WORLD.Barrier()
    t0 = clock.origin()
    clock.close()
    on_rank0 = WORLD.allgather(t0 - TRUE_OFFSETS[RANK])
    spread = max(on_rank0) - min(on_rank0)
    bound = 2 * max(e.round_trip_s / 2 for e in clock.start) + 1e-6  # two ranks' errors, opposite signs
    assert spread <= bound, (on_rank0, bound)
    return f"origin spread on rank 0's clock: {spread * 1e6:.1f} us (bound {bound * 1e6:.1f} us)"


@check
def host_offsets_are_the_medians_of_their_ranks():
    needs_skew()
    clock = Clock.synchronize(WORLD)
    clock.close()
    meta = clock.run_json()
    assert meta["rank_hosts"] == HOSTS
    by_host = meta["clock"]["host_offsets_s"]
    bounds = meta["clock"]["error_bound_s"]
    assert list(by_host) == list(dict.fromkeys(HOSTS))
    for host, offset in by_host.items():
        ranks = [r for r in range(SIZE) if HOSTS[r] == host]
        true = {TRUE_OFFSETS[r] for r in ranks}
        if len(true) > 1:
            raise Skip(f"ranks named {host} run on different clocks {true}: start shifted ranks with --uts")
        # The median of its ranks' estimates, each within its own bound of the true offset.
        assert abs(offset - true.pop()) <= max(bounds[r] for r in ranks) + EPS_S, (host, offset, TRUE_OFFSETS, bounds)
    return f"host offsets {by_host}"


def timelines_line_up(run_dir: Path, algorithm: str) -> str:
    """On rank 0: the records of ``algorithm`` (every rank's allreduce and iteration) line up
    as causality demands; run.json's clock has the true offsets."""
    import pandas as pd

    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["rank_hosts"] == HOSTS, meta.get("rank_hosts")
    clock = meta["clock"]
    assert clock["reference"] == "rank 0's CLOCK_MONOTONIC" and clock["drift_corrected"] is False
    bounds, end_bounds = clock["error_bound_s"], clock["end_error_bound_s"]
    for r in range(SIZE):
        assert bounds[r] >= 0 and end_bounds[r] >= 0, (bounds, end_bounds)
        assert abs(clock["offsets_s"][r] - TRUE_OFFSETS[r]) <= bounds[r] + EPS_S, (r, clock["offsets_s"], TRUE_OFFSETS)
        # One machine, one clock: the namespaces shift it, they do not change its rate; the two
        # estimates may each be off by their bound.
        assert abs(clock["drift_s"][r]) <= bounds[r] + end_bounds[r] + EPS_S, (clock["drift_s"], bounds, end_bounds)
    assert clock["drift_span_s"] > 0
    # Two ranks' records can be off from each other by both their estimates' errors.
    slack_allowed = 2 * max(bounds) + EPS_S

    ops = pd.read_csv(run_dir / "comm_ops.csv")
    ops = ops[(ops.algorithm == algorithm) & (ops.op == "allreduce")].sort_values(["rank", "post_s"])
    ops["k"] = ops.groupby("rank").cumcount()  # the k-th blocking allreduce of every rank is one collective
    per = ops.groupby("k").agg(latest_start=("start_s", "max"), earliest_end=("end_s", "min"),
                               ranks=("rank", "nunique"))
    assert len(per) > 0 and (per.ranks == SIZE).all(), per
    # No rank can finish an allreduce before every rank has started it.
    op_slack = per.earliest_end - per.latest_start
    assert op_slack.min() >= -slack_allowed, per[op_slack < -slack_allowed].head()

    steps = pd.read_csv(run_dir / "steps.csv")
    steps = steps[steps.algorithm == algorithm]
    it = steps.groupby("iteration").agg(latest_start=("start_s", "max"), earliest_end=("end_s", "min"),
                                        first_start=("start_s", "min"))
    # No rank ends iteration t (after its allreduce) before every rank has begun it.
    step_slack = it.earliest_end - it.latest_start
    assert step_slack.min() >= -slack_allowed, it[step_slack < -slack_allowed].head()
    # Each algorithm starts at its own origin: every rank begins iteration 0 at or after 0, and
    # before half the time to the last iteration's start has passed (an origin taken earlier,
    # at the run's start, would put iteration 0 seconds after it).
    assert -slack_allowed <= it.first_start.iloc[0], it.head(2)
    assert it.latest_start.iloc[0] < 0.5 * it.latest_start.iloc[-1], (it.head(2), it.tail(1))

    trace = json.loads((run_dir / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e.get("cat") == "comm" and e["name"] == "allreduce"]
    assert sorted(e["ts"] for e in spans) == sorted(round(s * 1e6, 3) for s in
                                                   pd.read_csv(run_dir / "comm_ops.csv").query("op == 'allreduce'")
                                                   .start_s), "trace.json's comm spans are not comm_ops.csv's times"
    return (f"{len(per)} allreduces, least slack {op_slack.min() * 1e6:.1f} us; {len(it)} iterations, least slack "
            f"{step_slack.min() * 1e6:.1f} us; run.json offsets {clock['offsets_s']}, error bounds "
            f"{clock['error_bound_s']} (target {TARGET_S * 1e3:g} ms)")


@check
def run_records_are_on_one_clock():
    """A real run (the worker, as `python -m harness run` starts it) records aligned timelines."""
    needs_skew()
    from harness.results.records import RunDirectory
    from harness.runner.worker import main
    from harness.scenario import scenario_from_dict

    data = {"name": "clock", "ranks": SIZE, "seed": 3,
            "workload": {"model": "logreg", "dataset": "digits", "batch_size": 8, "iterations": 20,
                         "eval_every": 20, "compute": {"emulate_ms": 3, "jitter": 0.5}, "params": 1000},
            "algorithms": ["allreduce_sgd"], "results": {"provenance": "none"}}
    path = None
    if RANK == 0:
        scenario = scenario_from_dict(data, source="clock_checks")
        run = RunDirectory.create(OUT / "run", scenario.name)
        run.write_resolved_scenario(scenario.resolved_dict())
        run.write_run_json("incomplete", [], ranks=SIZE)
        path = str(run.path)
    path = WORLD.bcast(path, root=0)
    assert main(path) == 0
    return timelines_line_up(Path(path), "allreduce_sgd") if RANK == 0 else ""


@check
def api_records_are_on_one_clock():
    """A training script through harness.api records aligned timelines too."""
    needs_skew()
    import torch

    from harness.api import DistributedOptimizer, Run

    with Run(algorithm="allreduce_sgd", iterations=12, batch_size=8, out=OUT / "api", name="clock_api") as run:
        torch.manual_seed(RANK)
        model = torch.nn.Linear(6, 2)
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        for _ in range(run.iterations):
            opt.zero_grad()
            loss = model(torch.randn(8, 6)).pow(2).mean()
            loss.backward()
            opt.step(loss=loss)
        path = run.path
    return timelines_line_up(path, "allreduce_sgd") if RANK == 0 else ""


if __name__ == "__main__":
    sys.exit(run_checks(CHECKS, sys.argv[1], WORLD))
