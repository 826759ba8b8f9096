"""A torch.distributed script run under a scenario: one iteration per optimizer step.

``python -m harness launch --scenario FILE SCRIPT`` starts every rank as
``python -m harness.dist.launched SCRIPT ARGS`` when the scenario lists no algorithms (the
script is the algorithm). Before the script runs, :class:`ScriptSession` on every rank:

- joins the MPI job, reports to the launcher's watchdog, sets torchrun's variables (RANK,
  WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) from MPI and
  OMP_NUM_THREADS=1 where unset (as torchrun does);
- opens the native world communicator with the scenario's emulated links and topology and hands
  it to the ``harness`` backend (:func:`harness.dist.use_communicator`), so
  ``dist.init_process_group("harness")`` in the script carries its traffic under the scenario;
- warns on stderr when the script asks for another backend (gloo, nccl, or none: torch's
  default), whose traffic bypasses the emulation;
- registers torch's global hooks that make one optimizer step one iteration:

  * iteration t begins when iteration t - 1's optimizer step returns (iteration 0: at the first
    forward pass with gradients enabled); whatever the script does between two steps (averaging
    after the step as ``PostLocalSGDOptimizer`` does, loading data, logging) belongs to the next
    iteration;
  * at the first forward pass with gradients enabled of iteration t (any ``nn.Module``, through
    ``register_module_forward_pre_hook``), a fault due at iteration t strikes, then the
    scenario's imbalance delay of this rank for iteration t is slept: before any of the step's
    compute, as in the harness's own loop. (A script that never calls an ``nn.Module`` gets the
    delay at the optimizer step's pre-hook instead.) The ``slowdown``/``jitter`` compute factor
    stretches the iteration's local work, slept at the end of the step;
  * the optimizer step's post-hook ends iteration t and records it (nested optimizers, e.g.
    ``ZeroRedundancyOptimizer`` over an inner one, count once: the outermost step).

At the end of the script every rank's records are gathered and rank 0 writes the results
directory ``launch`` created (steps.csv, comm_ops.csv with each collective's group, trace.json,
summary.csv, run.json). docs/guides/torch-distributed.md describes the columns for such a run.
"""

from __future__ import annotations

import bisect
import math
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

import harness.dist  # registers "harness"; sets torchrun's variables from MPI
from harness.mpi_library import import_mpi
from harness.dist import work
from harness.dist.metrics import Recorder, evaluation_records
from harness.dist.mismatch import MismatchWatch, fail, install
from harness.dist.process_group import HarnessProcessGroup, observe
from harness.dist.sequence import Shape, StepMarks, sequence_rows
from harness.dist.structure import StructureNotes
from harness.dist.work import HarnessWork
from harness.faults import FaultPlan
from harness.injection import InjectionPlan
from harness.rank_exit import exit_promptly_when_interrupted
from harness.results import atomic
from harness.results.columns import (
    COLLECTIVE_COLUMNS,
    COLLECTIVE_FILE,
    STRUCTURE_FILE,
    CommOpRecord,
    StepRecord,
    to_frame,
)
from harness.results.records import SCENARIO_FILE, RunDirectory
from harness.runner.clock import Clock
from harness.runner.report import gather, write_summary
from harness.scenario import load_scenario
from harness.watchdog.heartbeat_row import Phase
from harness.watchdog.in_job import join_watchdog

BACKEND_NAME = "harness"
ENV_LABEL = "HARNESS_LABEL"  # the run's label (launch --label; default: the script's stem)
OTHER_BACKENDS_NOTE = (
    "warning: init_process_group({backend!r}) under `python -m harness launch --scenario`: {what}'s traffic "
    "bypasses the scenario's emulated network (no links, no topology; comm_ops.csv will not see it); use "
    "init_process_group(\"harness\")"
)


def other_backend_warning(backend: Any) -> str | None:
    """The warning for ``init_process_group(backend)`` under a scenario; None for ``harness``."""
    name = str(backend).lower() if backend is not None else ""
    if BACKEND_NAME in name and not any(b in name for b in ("gloo", "nccl", "mpi", "ucc")):
        return None
    what = name if name else "torch's default backend (gloo on CPU, nccl on CUDA)"
    return OTHER_BACKENDS_NOTE.format(backend=backend, what=what)


def blocked_s(ops: list[tuple[float, float, bool]], forward_s: float, pre_s: float, end_s: float) -> float:
    """The time an iteration was blocked in collectives, from its operations' (post, end, posted
    by the main thread) times: an estimate (torch's C++ callers, such as DDP's reducer, wait for
    a collective where Python cannot see it).

    Operations posted before the step's first forward pass (``forward_s``: those between two
    steps) or from the optimizer step's pre-hook on (``pre_s``) are waited for where they are
    posted: the union of their intervals counts. Those posted in between (DDP's bucket allreduces
    during the backward pass, and what communication hooks post from their callbacks) overlap the
    compute; only their exposed tail counts: from the main thread's last post (the end of the
    backward pass) to when all of them had ended (at most ``pre_s``).
    """
    overlapped = [(p, e, main) for p, e, main in ops if forward_s <= p < pre_s]
    waited = sorted((p, min(e, end_s)) for p, e, _ in ops if not forward_s <= p < pre_s)
    total = 0.0
    if overlapped:
        last_post = max((p for p, _, main in overlapped if main), default=max(p for p, _, _ in overlapped))
        total += max(0.0, min(pre_s, max(e for _, e, _ in overlapped)) - last_post)
    reach = -math.inf
    for p, e in waited:
        p = max(p, reach)
        if e > p:
            total += e - p
            reach = e
    return total


class _StepOfWrapper:
    """Makes ``PostLocalSGDOptimizer.step`` an optimizer step to the session's hooks.

    It wraps the script's optimizer but, unlike torch's optimizers, never runs
    ``Optimizer.__init__``, so torch's global step hooks fire only for the inner optimizer's step:
    its model averaging, which runs after that, would land in the next step. While the session
    runs, its ``step`` is wrapped in the session's pre- and post-hooks (the inner step then
    nests, as ``ZeroRedundancyOptimizer``'s does); ``remove()`` restores it."""

    def __init__(self, session: ScriptSession) -> None:
        try:
            from torch.distributed.optim import PostLocalSGDOptimizer  # noqa: PLC0415  (2 s of imports, to patch)
        except ImportError:  # a torch without it
            self._cls = None
            return
        self._cls, self._original = PostLocalSGDOptimizer, PostLocalSGDOptimizer.step
        original = self._original

        def step(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            session._on_step_pre(optimizer, args, kwargs)
            try:
                return original(optimizer, *args, **kwargs)
            finally:
                session._on_step_post(optimizer, args, kwargs)

        # patches torch's class while the session runs (remove() restores it)
        PostLocalSGDOptimizer.step = step  # type: ignore[method-assign, assignment]

    def remove(self) -> None:
        if self._cls is not None:
            self._cls.step = self._original  # type: ignore[method-assign]  # restores the patched method


class ScriptSession:
    """Everything around one torch.distributed script on this rank (see the module doc)."""

    def __init__(self, run_dir: Path, label: str, script: str) -> None:
        MPI = import_mpi()  # initializes MPI: on the ranks, not at import

        from harness.comm import Communicator  # noqa: PLC0415  (loads mpi4py.MPI, as above)

        exit_promptly_when_interrupted()
        self.world = MPI.COMM_WORLD
        self.rank = self.world.rank
        self.run_dir, self.label, self.script = run_dir, label, script
        self.scenario = load_scenario(run_dir / SCENARIO_FILE)
        # The watchdog and the fault plan know the run by its label, as one algorithm.
        self.watched = self.scenario.model_copy(update={"algorithms": [SimpleNamespace(name=label)]})
        self.faults = FaultPlan(self.watched, self.rank)
        self.faults.delay_start()
        self.beat = join_watchdog(self.world, self.watched)
        self.beat.report_in()
        self.faults.watched_by(self.beat)
        self.hosts = self.world.allreduce(int(int(os.environ.get("LOCAL_RANK", "0")) == 0))
        self.comm = Communicator(self.world)
        self.comm.emulate_network(self.scenario)
        harness.dist.use_communicator(self.comm)
        self.plan = InjectionPlan.from_scenario(self.scenario)
        self.beat.algorithm(0)
        # Collectives of the backend: native post time -> the group's description.
        self.groups: dict[float, str] = {}
        self.shapes: dict = {}  # native post time -> harness.dist.sequence.Shape (what the simulator replays)
        self.marks: list = []  # per step: harness.dist.sequence.StepMarks
        self.structure = StructureNotes()  # what makes the collectives scale (harness.dist.structure)
        self._main_thread = threading.get_ident()
        self._main_posts: set[float] = set()  # post times of this step's collectives posted by the main thread
        self.rows: list[list[float]] = []  # per step: start, end, compute, delay, blocked, bytes
        self.ops: list = []  # the native records of every operation (OpRecord)
        self.metrics = Recorder(self)  # what the script hands harness.dist.record (harness/dist/metrics.py)
        self.t = 0
        self._start = self._forward = self._pre = 0.0
        self._began = False
        self._delay, self._factor = 0.0, 1.0
        self._depth = 0
        self._pending: list = []  # records drained but not yet attributed
        self.clock = Clock.synchronize(self.world)
        self.comm.barrier()
        self.t0 = self.clock.origin()
        self.comm.drain_records()  # the session's own set-up
        self._start = time.monotonic()
        self._cpu_start = self._cpu_pre = time.thread_time()
        self._waited_start = 0.0
        self._installed: list[Any] = []
        self.mismatch = install(MismatchWatch(self.rank, lambda message: fail(message, self.beat)))
        observe(self._observe)
        self._install_hooks()
        self._warn_other_backends()

    # -- torch's hooks -------------------------------------------------------------------------
    def _install_hooks(self) -> None:
        self._torch = torch
        self._installed = [register_module_forward_pre_hook(self._on_forward),
                           register_optimizer_step_pre_hook(self._on_step_pre),
                           register_optimizer_step_post_hook(self._on_step_post),
                           _StepOfWrapper(self)]

    def _on_forward(self, module, args) -> None:
        if self._began or self._depth or not self._torch.is_grad_enabled():
            return
        self.structure.modules(module)
        self._begin()

    def _begin(self) -> None:
        t = self.t
        self._began = True
        if t == 0:
            self._start = time.monotonic()  # iteration 0 starts at the first training forward pass
            self._cpu_start = time.thread_time()
            self._waited_start = work.main_thread_wait_s
        self.beat.iteration(t)
        self.faults.at_iteration(self.label, t)
        delays, factors = self.plan.at(t)
        self._delay, self._factor = float(delays[self.rank]), float(factors[self.rank])
        if self._delay > 0:
            self.beat.expect(self._delay)
            time.sleep(self._delay)
        self._forward = time.monotonic()

    def _on_step_pre(self, optimizer, args, kwargs) -> None:
        self._depth += 1
        if self._depth > 1:
            return
        if not self._began:
            self._begin()
        self.structure.optimizer(optimizer)
        self._pre = time.monotonic()
        self._cpu_pre = time.thread_time()

    def _on_step_post(self, optimizer, args, kwargs) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        self._end()

    def _end(self) -> None:
        now = time.monotonic()
        records = self.comm.drain_records()
        main = self._main_posts
        mine = [(r.post_s, r.end_s, r.post_s in main) for r in records if r.post_s >= self._start]
        main.clear()
        blocked = blocked_s(mine, self._forward, self._pre, now)
        compute = max(0.0, now - self._start - self._delay - blocked)
        if self._factor != 1.0 and compute > 0:  # injected slowdown / jitter stretches the local work
            extra = compute * (self._factor - 1.0)
            if extra > 0:
                time.sleep(extra)
                compute += extra
                now = time.monotonic()
        self.rows.append([self._start, now, compute, self._delay, blocked, 0])
        self.marks.append(StepMarks(self._start, self._forward, self._pre, now))
        cpu = time.thread_time()
        waited = work.main_thread_wait_s - self._waited_start
        self.structure.step_window(self._pre, now, cpu - self._cpu_start, cpu - self._cpu_pre,
                                   max(0.0, compute - max(0.0, waited - blocked)))
        self._collect(records)
        self.beat.iteration_done(now - self._start)
        self.t += 1
        self._began = False
        self._start = now  # the next iteration begins here (see the module doc)
        self._cpu_start = time.thread_time()
        self._waited_start = work.main_thread_wait_s

    def _collect(self, records: list) -> None:
        """Keep the records; count each one's bytes in the step that posted it (iterations follow
        one another: iteration t runs from its start to iteration t + 1's)."""
        self.ops.extend(records)
        starts = [row[0] for row in self.rows]
        for r in records:
            t = bisect.bisect_right(starts, r.post_s) - 1
            if t >= 0 and r.post_s <= self.rows[t][1]:
                self.rows[t][5] += r.bytes

    def _observe(self, group: HarnessProcessGroup, work: HarnessWork) -> None:
        """A collective of the backend was posted: remember its group; a fault may strike."""
        where = group.description()
        on_main = threading.get_ident() == self._main_thread
        ranks = group.world_ranks
        members = " ".join(str(r) for r in ranks)
        self.structure.group_used(tuple(ranks))
        for h, (op, nbytes, peer, _tag) in zip(work._handles, work.shapes, strict=True):
            post = h.times()[0]
            self.groups[post] = where
            self.shapes[post] = Shape(op, nbytes, ranks[peer] if peer >= 0 else -1, members)
            if on_main:
                self._main_posts.add(post)
        self.faults.posted()

    def _warn_other_backends(self) -> None:
        original = c10d.init_process_group

        def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
            warning = other_backend_warning(backend)
            if warning is not None:
                print(warning, file=sys.stderr, flush=True)
            return original(backend, *args, **kwargs)

        init_process_group.__doc__ = original.__doc__
        self._restore = (original,)
        dist.init_process_group = init_process_group
        c10d.init_process_group = init_process_group

    # -- the end ---------------------------------------------------------------------------------
    def close(self) -> None:
        """After the script: strike a fault due at the finish, gather the records, have rank 0
        write the results. Collective."""
        for hook in self._installed:
            hook.remove()
        observe(None)
        self.faults.at_finish(self.label)
        self.comm.barrier()  # every rank is done with the script's collectives
        self._collect(self.comm.drain_records())
        self.mismatch.close(flush=True)  # every rank is here, the store still up: audit the last batches
        self.beat.stage(Phase.RESULTS)
        t0, name, rank = self.t0, self.label, self.rank
        self.metrics.close()
        trained, none = self.metrics.steps(), (math.nan, math.nan)  # per step: the loss and accuracy recorded
        steps = [StepRecord(name, rank, t, start - t0, end - t0, compute, delay, blocked, trained.get(t, none)[0],
                            int(sent), -1, trained.get(t, none)[1])
                 for t, (start, end, compute, delay, blocked, sent) in enumerate(self.rows)]
        evals = gather(self.world, self.metrics.evaluations(rank, t0))
        ops = [CommOpRecord(name, rank, r.op, r.post_s - t0, r.start_s - t0, r.end_s - t0, r.bytes,
                            self.groups.get(r.post_s, ""))
               for r in self.ops if r.post_s - t0 >= 0 and r.post_s in self.groups]
        self.clock.remeasure()
        self.clock.close()
        all_steps, all_ops = gather(self.world, steps), gather(self.world, ops)
        sequence = gather(self.world, sequence_rows(rank, self.marks, self.ops, self.shapes))
        self._structures = self.world.gather(self.structure.as_dict(), root=0)  # per rank; rank 0 writes them
        counts = self.world.gather(len(self.rows), root=0)
        if self.rank == 0:
            # rank 0 holds what was gathered
            assert all_steps is not None and all_ops is not None and counts is not None and sequence is not None
            self._write(all_steps, all_ops, counts, sequence, evals or [])
        self.beat.stage(Phase.DONE)
        self.comm.close()

    def _write(self, steps: list, ops: list, counts: list[int], sequence: list[tuple],
               evals: Sequence[Any] = ()) -> None:
        run = RunDirectory.open(self.run_dir)
        run.append_algorithm(self.label, steps, evaluation_records(self.label, list(evals)), ops)
        atomic.write_csv(run.path / COLLECTIVE_FILE,
                         to_frame(pd.DataFrame(sequence, columns=list(COLLECTIVE_COLUMNS)), COLLECTIVE_COLUMNS))
        atomic.write_json(run.path / STRUCTURE_FILE, {"ranks": self._structures}, indent=1)
        taken = max(1, min(counts))
        summary_scenario = self.scenario.model_copy(
            update={"workload": self.scenario.workload.model_copy(update={"iterations": taken})})
        write_summary(run, summary_scenario)
        run.write_trace()
        if min(counts) != max(counts):
            print(f"note: the ranks took different numbers of optimizer steps ({min(counts)} to {max(counts)})",
                  file=sys.stderr)
        extra = {"script": self.script, "torch_distributed": True, "optimizer_steps": counts,
                 **self.clock.run_json()}
        run.write_run_json("complete", [self.label], ranks=self.scenario.ranks, hosts=self.hosts, extra=extra)
        print(f"{self.label}: {len(steps)} steps on {self.scenario.ranks} ranks: results in {run.path}",
              file=sys.stderr)
