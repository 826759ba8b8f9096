"""Trace-driven simulation of a torch.distributed script run: its recorded collectives, replayed.

A script run under ``launch --scenario`` has no algorithm the simulator could run: the script
is the algorithm. What it did is in its results directory: every rank's local work per step
(steps.csv, as for any trace-driven replay) and every operation of the ``harness`` backend with
its group, size and place in the step (collectives.csv, :mod:`harness.dist.sequence`).
:class:`ScriptReplay` is an algorithm whose hooks post that sequence on the simulated
communicator, and the shared training loop (``harness.runner.loop.train``) runs it exactly as
it runs the built-in algorithms:

- ``before`` operations in ``before_forward`` (before the injected delay, as in the run), one
  after the other where the script waited for each;
- ``overlap`` operations at their place in the step's local work (``at`` of it after the
  compute starts; after the previous one has ended where the script waited for it, as a
  communication hook's chained collectives), all waited for in ``after_backward``: the exposed
  tail that DDP's reducer waits for before the optimizer step;
- ``after`` operations in ``after_step``, as ``before`` ones.

At another rank count (``simulate --ranks``) a rank r replays rank r mod R of the R recorded
(its local work and its sequence) where the sequence does not depend on the rank count: every
operation an allreduce, broadcast or barrier over all ranks, of sizes that every rank gave alike
(DDP's buckets, plain ``dist.all_reduce``). Anything else (FSDP's all-gathers and
reduce-scatters of shards, ``ZeroRedundancyOptimizer``'s per-rank broadcasts, subgroups,
point-to-point) is refused with the operation that decides it.

What the replay cannot know: an operation posted at a fixed place of the step in the run
(``at``) is posted there in the simulation too, although a slower network might have moved it
(a hook's follow-up collective is chained, a DDP bucket is not); waits inside the forward pass
(FSDP's all-gathers) are in the recorded local work, as the run's estimate of blocked time
(``comm_blocked_s``) leaves them there.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.params import AlgorithmParams
from harness.errors import HarnessError
from harness.results.columns import COLLECTIVE_COLUMNS, COLLECTIVE_FILE, read_frame
from harness.sim.engine import SimDeadlock
from harness.sim.handles import SimCommError
from harness.sim.script_scaling import ScalingError, ScriptStructure, scale_step
from harness.sim.script_timing import ScriptComputeModel, reading_scale
from harness.sim.simulate import injection_arrays, simulate_algorithm
from harness.sim.step_programs import FLOAT_BYTES
from harness.sim.timing import TraceTiming


class ReplayError(HarnessError, ValueError):
    """A recorded sequence that cannot be replayed as asked (the message says why): the commands
    print it as an error, never a traceback."""


@dataclass(frozen=True)
class ReplayOp:
    """One operation of a rank's recorded sequence, as the simulator posts it."""

    op: str
    members: tuple[int, ...]  # world ranks of its group
    nbytes: int  # payload bytes (harness.dist.sequence), the largest any member gave
    peer: int  # world rank of the root or peer; -1: none
    phase: str
    at: float
    waited: bool

    @property
    def count(self) -> int:
        """The payload in floats, rounded up: what the simulated network sizes it by."""
        return -(-self.nbytes // FLOAT_BYTES)

    @property
    def root_index(self) -> int:
        return self.members.index(self.peer) if self.peer >= 0 else 0


class ScriptTrace:
    """Every rank's recorded sequence: ``ops[r][t]`` is rank r's operations in step t, in the
    order r posted them."""

    def __init__(self, ops: list[list[list[ReplayOp]]]) -> None:
        self.ops = ops

    @property
    def ranks(self) -> int:
        return len(self.ops)

    @classmethod
    def read(cls, run_dir: Path, ranks: int, iterations: int) -> ScriptTrace:
        path = Path(run_dir) / COLLECTIVE_FILE
        if not path.is_file():
            raise ReplayError(
                f"{run_dir}: no {COLLECTIVE_FILE}: not a torch.distributed script run of "
                "`python -m harness launch --scenario` (or one from before it was recorded)"
            )
        return cls.from_frame(read_frame(path, COLLECTIVE_COLUMNS), ranks, iterations)

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, ranks: int, iterations: int) -> ScriptTrace:
        """The sequence of collectives.csv rows; ReplayError where ranks disagree on a collective."""
        frame = frame.sort_values(["rank", "iteration", "seq"], kind="stable")
        rows_of: dict[int, list[Any]] = defaultdict(list)
        for row in frame.itertuples(index=False):
            if not 0 <= row.rank < ranks:
                raise ReplayError(f"{COLLECTIVE_FILE}: rank {row.rank} in a run of {ranks} ranks")
            rows_of[int(row.rank)].append(row)
        # The k-th collective a rank posts over a group matches every member's k-th there:
        # check that they agree and size it by the largest payload any member gave.
        instances: dict[tuple[str, int], list[tuple[int, Any]]] = defaultdict(list)
        instance_of: dict[tuple[int, int], tuple[str, int]] = {}  # (rank, row index) -> its collective
        for r in range(ranks):
            posted: dict[str, int] = defaultdict(int)
            for i, row in enumerate(rows_of[r]):
                if row.op in ("send", "recv"):
                    continue
                k = posted[row.group_ranks]
                posted[row.group_ranks] = k + 1
                instances[(row.group_ranks, k)].append((r, row))
                instance_of[(r, i)] = (row.group_ranks, k)
        size: dict[tuple[str, int], int] = {}
        for (group, k), members in instances.items():
            first_rank, first = members[0]
            for r, row in members[1:]:
                if (row.op, row.peer) != (first.op, first.peer):
                    raise ReplayError(
                        f"{COLLECTIVE_FILE}: the collective {k} over ranks [{group}] is a {first.op} on "
                        f"rank {first_rank} and a {row.op} on rank {r} (or of another root)"
                    )
            size[(group, k)] = max(int(row.payload_bytes) for _, row in members)
        ops: list[list[list[ReplayOp]]] = [[[] for _ in range(iterations)] for _ in range(ranks)]
        for r in range(ranks):
            for i, row in enumerate(rows_of[r]):
                instance = instance_of.get((r, i))
                nbytes = int(row.payload_bytes) if instance is None else size[instance]
                if not 0 <= row.iteration < iterations:
                    continue  # steps beyond the ones the run counts
                group_ranks = tuple(int(m) for m in str(row.group_ranks).split())
                ops[r][int(row.iteration)].append(
                    ReplayOp(
                        str(row.op), group_ranks, nbytes, int(row.peer), str(row.phase), float(row.at), bool(row.waited)
                    )
                )
        return cls(ops)

    def at_ranks(self, n: int, structure: ScriptStructure | None = None) -> ScriptTrace:
        """The sequence at ``n`` ranks: itself at the recorded count; else rank r replays recorded
        rank r mod R, each operation rewritten by :mod:`harness.sim.script_scaling`'s rules
        (with the run's ``structure``); ReplayError naming the operation that has no rule."""
        if n == self.ranks:
            return self
        structure = structure or ScriptStructure()
        try:
            return ScriptTrace(
                [
                    [
                        scale_step(ops, r % self.ranks, t, self.ranks, r, n, structure)
                        for t, ops in enumerate(self.ops[r % self.ranks])
                    ]
                    for r in range(n)
                ]
            )
        except ScalingError as exc:
            raise ReplayError(
                f"cannot replay the recorded sequence at {n} ranks: {exc}; replay it at the recorded "
                f"{self.ranks} ranks, or run the script at {n}"
            ) from exc


class ScriptParams(AlgorithmParams):
    """The replayed script, named by the run's label."""


class ScriptReplay(Algorithm):
    """One simulated rank of a torch.distributed script: its recorded sequence (module doc).

    ``steps[t]``: this rank's operations of step t; ``delay[t]``: its injected delay in step t,
    which the loop sleeps between ``before_forward`` and the local work; ``local(t)``: how long
    that work takes (the timing source's). ``stalls``: the work is CPU time without the waits
    (the predictive model), so the waits the script made hold it up (``_at_places``); a
    trace-driven replay's recorded work already holds them."""

    def __init__(
        self,
        params: ScriptParams,
        ctx: AlgorithmContext,
        steps: list[list[ReplayOp]],
        delay: list[float],
        local: Any,
        stalls: bool = False,
    ) -> None:
        super().__init__(params, ctx)
        self._stalls = stalls
        self._steps = steps
        self._delay = delay
        self._local = local
        self._comm = ctx.comm
        self._overlap: tuple | None = None  # this step's: handles, events, ops, when its work ends

    # -- posting ---------------------------------------------------------------------------------
    def _post(self, op: ReplayOp) -> Any:
        comm = self._comm
        if op.op == "send":
            return comm.isend(op.peer, op.count * FLOAT_BYTES)
        if op.op == "recv":
            return comm.irecv(op.peer, op.count * FLOAT_BYTES)
        return comm.igroup(op.op, op.members, op.count, op.root_index)

    def _in_order(self, ops: list[ReplayOp]) -> None:
        """Post ``ops`` one after the other (waiting where the script did), then wait for all."""
        handles = []
        for op in ops:
            h = self._post(op)
            handles.append(h)
            if op.waited:
                h.wait()
        for h in handles:
            h.wait()

    def _at_places(self, ops: list[ReplayOp], start: float, local: float) -> None:
        """Post each of ``ops`` at ``start + at * local``, from the event loop (the rank itself
        is computing meanwhile), never before its predecessor, and after it ended where the
        script waited for it. With ``stalls`` the waiting also holds the rank's computation: an
        operation posted late pushes the rest of the step's work back by as much (FSDP2's
        forward pass waits for each layer's all-gather)."""
        env = self._comm.engine.env
        posted: list[Any] = [None] * len(ops)
        events = [env.event() for _ in ops]
        shift = [0.0]  # how far waiting has pushed the computation back (stalls only)

        def due(i: int) -> float:
            return start + ops[i].at * local + shift[0]

        def ready(i: int) -> None:
            if i > 0 and ops[i - 1].waited:
                before = posted[i - 1]
                end = before.end()
                if end is None and hasattr(before, "op"):  # a collective not every member has joined yet
                    before.op.complete.callbacks.append(lambda _e: ready(i))
                    return
                if end is not None and end > env.now:
                    env.timeout(end - env.now).callbacks.append(lambda _e: ready(i))
                    return
            if self._stalls:
                shift[0] += max(0.0, env.now - due(i))
            posted[i] = self._post(ops[i])
            events[i].succeed()
            if i + 1 < len(ops):  # one at a time: the ranks' collectives match in posting order
                env.timeout(max(0.0, due(i + 1) - env.now)).callbacks.append(lambda _e: ready(i + 1))

        env.timeout(max(0.0, due(0) - env.now)).callbacks.append(lambda _e: ready(0))
        self._overlap = (posted, events, ops, lambda: start + local + shift[0])

    # -- the loop's hooks ---------------------------------------------------------------------------
    def _phase(self, t: int, phase: str) -> list[ReplayOp]:
        return [op for op in self._steps[t] if op.phase == phase] if t < len(self._steps) else []

    def before_forward(self, t: int) -> None:
        self._in_order(self._phase(t, "before"))
        overlap = self._phase(t, "overlap")
        if overlap:
            engine = self._comm.engine
            self._at_places(overlap, engine.now() + self._delay[t], self._local(t))

    def after_backward(self, t: int) -> None:
        if self._overlap is None:
            return
        posted, events, ops, work_end = self._overlap
        self._overlap = None
        engine = self._comm.engine
        for i, event in enumerate(events):
            if posted[i] is None:
                engine.wait(event, lambda i=i: f"its {ops[i].op} to be posted (step's collective {i})")
            posted[i].wait()
        if self._stalls:
            engine.sleep_until(work_end())  # the computation's own end, pushed back by its waits

    def after_step(self, t: int) -> None:
        self._in_order(self._phase(t, "after"))


def script_label(meta: dict) -> str:
    """The label of the script run whose run.json is ``meta`` ("" if it finished nothing)."""
    return (meta.get("finished_algorithms") or [""])[0]


def steps_taken(scenario: Any, meta: dict) -> Any:
    """``scenario`` (a script run's) with ``workload.iterations`` the optimizer steps every rank
    took (run.json's ``optimizer_steps``): what the run's summary counts and a replay replays."""
    counts = meta.get("optimizer_steps") or [scenario.workload.iterations]
    taken = max(1, min(int(c) for c in counts))
    return scenario.model_copy(update={"workload": scenario.workload.model_copy(update={"iterations": taken})})


def replay_script(
    scenario: Any,
    label: str,
    real_steps: pd.DataFrame,
    trace: ScriptTrace,
    recorded: Any,
    network: Any,
    hosts: Any = None,
    mode: str = "trace",
    structure: ScriptStructure | None = None,
    reading: str = "machine",
    cpus: int | None = None,
) -> tuple[pd.DataFrame, Any]:
    """Simulate the script run ``label`` at ``scenario.ranks`` ranks (the recorded ones, or
    another count by :meth:`ScriptTrace.at_ranks`'s rules) on calibrated ``network``; returns its
    steps frame and :class:`harness.sim.simulate.SimStats`. ``recorded``: the run's scenario
    (its ranks and injection). ``mode``: ``trace`` takes every step's local work from
    ``real_steps`` (steps.csv of the run; the recorded rank count only), ``predictive`` from
    :class:`harness.sim.script_timing.ScriptComputeModel` in ``reading`` (``machine``: the
    run's, with ``cpus`` cores, default this machine's; ``cluster``: a core per rank).
    ReplayError where the sequence cannot be replayed so."""
    w = scenario.workload
    n, iterations, recorded_ranks = scenario.ranks, w.iterations, recorded.ranks
    structure = structure or ScriptStructure()
    trace = trace.at_ranks(n, structure)
    mine = real_steps[(real_steps["algorithm"] == label) & (real_steps["iteration"] < iterations)]
    params = ScriptParams(name=label)
    largest = max((op.count for steps in trace.ops for ops in steps for op in ops), default=1)
    # The stand-in buffers' length is never moved (the replay posts the recorded sizes); no
    # evaluation points: the harness cannot evaluate a script's model.
    replayed = scenario.model_copy(
        update={
            "algorithms": [params],
            "workload": w.model_copy(update={"params": max(1, largest), "eval_every": iterations}),
        }
    )
    delays, factors = injection_arrays(replayed)
    timing: TraceTiming | ScriptComputeModel
    if mode == "trace":
        if n != recorded_ranks:
            raise ReplayError(
                f"a trace-driven replay of {label!r} takes every step's local work from the run's "
                f"{recorded_ranks} ranks; at {n} ranks the script's compute is modelled (predictive)"
            )
        timing = TraceTiming(mine, recorded_ranks, iterations)
    else:
        _, recorded_factors = injection_arrays(
            recorded.model_copy(
                update={
                    "algorithms": [params],
                    "workload": recorded.workload.model_copy(update={"iterations": iterations}),
                }
            )
        )
        shard = structure.shard_ratio(recorded_ranks, n)
        scale = reading_scale(recorded_ranks, n, cpus or os.cpu_count() or 1, reading)
        timing = ScriptComputeModel(mine, recorded_ranks, recorded_factors, factors, structure, scale, shard)
    delay_of = delays.T.tolist()

    def make(r: int, ctx: AlgorithmContext) -> ScriptReplay:
        return ScriptReplay(
            params,
            ctx,
            trace.ops[r],
            delay_of[r],
            lambda t, r=r: timing.compute(t, r),
            stalls=mode != "trace" and structure.waits_apart,
        )

    try:
        return simulate_algorithm(replayed, params, timing, network, delays, factors, hosts=hosts, make_algorithm=make)
    except (SimCommError, SimDeadlock) as exc:  # the recorded ranks' sequences do not line up
        raise ReplayError(f"cannot replay the script run {label!r} at {n} ranks: {exc}") from exc
