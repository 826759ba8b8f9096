"""One algorithm's run inside a user's training script: the scenario, the ranks, the results.

A :class:`Run` is what ``python -m harness.runner.worker`` is for the harness's own loop: it
joins the MPI job, opens the native communicators with the scenario's emulated links, injects
the scenario's imbalance and faults (through :class:`harness.api.DistributedOptimizer`), reports
to the watchdog (``python -m harness launch``'s, or, when you start the ranks with your own
``mpiexec``, one that rank 0 runs and that aborts a job that hangs), and at the end has rank 0 write
the records into a results directory of the usual schema (``harness.runner.report``).

Where the settings come from, first match wins:

1. ``python -m harness launch --scenario FILE`` started the script: the run directory it
   created (``HARNESS_RUN_DIR``) and the algorithm it names (``HARNESS_ALGORITHM``); the
   script's own ``scenario``/``algorithm`` arguments are ignored (a note says so).
2. ``scenario=`` (a file or a mapping): its ranks, seed, imbalance, network, faults and
   algorithms; ``algorithm=`` picks one of its algorithms (default: the first). A missing
   ``workload.iterations`` / ``batch_size`` / ``ranks`` is taken from the arguments / the job.
3. Only arguments: ``algorithm=`` and its parameters, ``iterations=``, ``batch_size=``,
   ``seed=``; no injection.

A scenario for a script needs no ``workload.model``/``dataset``: the script trains its own.
The results directory's ``scenario.resolved.yaml`` then records what a simulation needs of the
script's workload: the model's size (``workload.params``) and the measured median local work per
iteration as emulated compute (``workload.compute.emulate_ms``); ``run.json`` says so
(``"script"``), so ``python -m harness simulate``/``compare`` can predict the run.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import torch

from harness.algorithms import scenario_facts
from harness.comm.call_log import CallLog
from harness.device import local_rank, torch_device
from harness.errors import HarnessError
from harness.faults import FaultPlan
from harness.injection import InjectionPlan
from harness.launch import srun_without_pmi
from harness.mpi_library import import_mpi
from harness.rank_exit import abort_job_after_error, exit_promptly_when_interrupted
from harness.results.columns import CommCallRecord
from harness.results.layout import SCENARIO_FILE
from harness.runner.clock import Clock
from harness.runner.loop import Iterations
from harness.runner.report import gather, publish
from harness.scenario import load_scenario, read_yaml, scenario_from_dict
from harness.watchdog.heartbeat_row import Phase
from harness.watchdog.in_job import join_watchdog

ENV_RUN_DIR = "HARNESS_RUN_DIR"  # set by `python -m harness launch --scenario FILE`
ENV_ALGORITHM = "HARNESS_ALGORITHM"


class ScriptError(HarnessError):
    """A mistake in how a training script uses ``harness.api``; the message says which and how to fix it."""


class _Optimizer(Protocol):
    """What a Run uses of its :class:`harness.api.DistributedOptimizer` (whose module imports this one)."""

    clock: Clock
    loop: Iterations
    t0: float
    evals: list
    call_log: CallLog | None
    model_floats: int
    inner: torch.optim.Optimizer

    def finish(self) -> None: ...


class Run:
    """One algorithm's training in this script, on every rank of the MPI job (see the module doc).

    Use it as a context manager (``with Run(...) as run:``): on a normal exit rank 0 writes the
    results; on an error in one rank the whole job is aborted (no rank waits forever for a
    peer that is gone). Without ``with``, call :meth:`close` at the end.

    ``threads``: torch's intra-op threads per rank (1, as the harness's own ranks use: ranks
    usually outnumber cores); None leaves torch's default.
    """

    _current: ClassVar[Run | None] = None

    def __init__(
        self,
        scenario: str | Path | dict | None = None,
        *,
        algorithm: str | None = None,
        iterations: int | None = None,
        batch_size: int | None = None,
        seed: int | None = None,
        name: str | None = None,
        out: str | Path = "results",
        threads: int | None = 1,
        **params: Any,
    ) -> None:
        if Run._current is not None:
            raise ScriptError(
                "a harness.api.Run is already open in this process: close it first (one Run, one "
                "algorithm at a time; `python -m harness launch` runs the script once per algorithm)"
            )
        problem = srun_without_pmi()  # each srun task would otherwise train alone, as a job of one
        if problem is not None:
            raise ScriptError(problem.replace("`python -m harness run FILE`", "`python -m harness launch ...`"))
        MPI = import_mpi()  # initializes MPI: once a Run starts, not at import

        if _on_main_thread():
            exit_promptly_when_interrupted()  # Ctrl+C or the watchdog's stop ends every rank with a status
        self.world = MPI.COMM_WORLD
        self.rank, self.size = self.world.rank, self.world.size
        self.script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "script"
        launched = os.environ.get(ENV_RUN_DIR)
        if launched:
            self.scenario, self.algorithm_params = _launched_scenario(Path(launched), os.environ.get(ENV_ALGORITHM))
        else:
            self.scenario, self.algorithm_params = _script_scenario(
                scenario,
                algorithm,
                params,
                iterations=iterations,
                batch_size=batch_size,
                seed=seed,
                name=name or re.sub(r"[^A-Za-z0-9_-]", "_", Path(self.script).stem),
                ranks=self.size,
                rank=self.rank,
            )
        if self.scenario.ranks != self.size:
            raise ScriptError(
                f"the scenario {self.scenario.name!r} has {self.scenario.ranks} ranks, this MPI job "
                f"{self.size}: start it with -n {self.scenario.ranks}"
            )
        self._start(Path(launched) if launched else None, Path(out), threads)
        Run._current = self

    # -- what the script reads -----------------------------------------------------------------
    @property
    def algorithm(self) -> str:
        """The name of the algorithm this run trains."""
        return self.algorithm_params.name

    @property
    def iterations(self) -> int:
        """How many optimizer steps the scenario has the script take (``workload.iterations``)."""
        return self.scenario.workload.iterations

    @property
    def batch_size(self) -> int:
        """Samples per rank and step (``workload.batch_size``; the summary's throughput counts them)."""
        return self.scenario.workload.batch_size

    @property
    def seed(self) -> int:
        return self.scenario.seed

    @property
    def path(self) -> Path:
        """The results directory this run writes."""
        return self.results.path

    @classmethod
    def current(cls) -> Run:
        """The open Run of this process; ScriptError when there is none."""
        if cls._current is None:
            raise ScriptError(
                "no harness.api.Run is open: create one (`with harness.api.Run(...) as run:`) before "
                "the DistributedOptimizer"
            )
        return cls._current

    # -- set-up and the end ----------------------------------------------------------------------
    def _start(self, launched: Path | None, out: Path, threads: int | None) -> None:
        from harness.comm import Communicator  # noqa: PLC0415  (loads mpi4py.MPI, which initializes MPI)

        # pandas: not for `import harness.dist`, which reads ENV_RUN_DIR from this module
        from harness.results.records import RunDirectory  # noqa: PLC0415

        s = self.scenario
        if threads is not None:
            torch.set_num_threads(int(threads))
        self.faults = FaultPlan(s, self.rank)
        self.faults.delay_start()
        self.beat = join_watchdog(self.world, s)  # the launcher's watchdog, or one rank 0 runs (collective)
        self.beat.report_in()
        on_host = local_rank(self.world)
        self.hosts = self.world.allreduce(int(on_host == 0))
        self.device = torch_device(s.workload.device, on_host)
        self.comm = Communicator(self.world)
        self.eval_comm = Communicator(self.world)
        self.comm.emulate_network(s)
        self.plan = InjectionPlan.from_scenario(s)
        path = str(launched) if launched is not None else None
        if path is None and self.rank == 0:
            run = RunDirectory.create(out, s.name)
            run.write_resolved_scenario(s.resolved_dict())
            run.write_run_json("incomplete", [], ranks=s.ranks, extra={"script": self.script})
            path = str(run.path)
        self.results = RunDirectory.open(self.world.bcast(path, root=0))
        index = [a.name for a in s.algorithms].index(self.algorithm)
        self.beat.algorithm(index)
        self.optimizer: _Optimizer | None = None  # the DistributedOptimizer, which registers itself
        self.closed = False

    def close(self) -> None:
        """Finish the algorithm (flush what is in flight) and have rank 0 write the results. Collective."""
        if self.closed:
            return
        self.closed = True
        Run._current = None
        try:
            if self.optimizer is None:
                if self.rank == 0:
                    print("note: no harness.api.DistributedOptimizer was created: nothing to record", file=sys.stderr)
                return
            self.optimizer.finish()
            self.beat.stage(Phase.RESULTS)
            self._write_results()
            self.beat.stage(Phase.DONE)
        finally:
            self.eval_comm.close()
            self.comm.close()

    def _write_results(self) -> None:
        opt, name = self.optimizer, self.algorithm
        assert opt is not None  # close() returns early without one
        opt.clock.remeasure()  # the end estimate: run.json's drift (harness.runner.clock)
        opt.clock.close()
        own_steps, own_ops = opt.loop.records(opt.t0)
        steps, evals, ops = (gather(self.world, x) for x in (own_steps, opt.evals, own_ops))
        calls = None
        if opt.call_log is not None:
            calls = gather(self.world, [CommCallRecord(name, self.rank, *c) for c in opt.call_log.calls])
        if self.rank != 0:
            return
        assert steps is not None and evals is not None and ops is not None  # gathered on rank 0
        run = self.results
        finished = [a for a in run.finished_algorithms if a != name] + [name]
        run.append_algorithm(name, steps, evals, ops)  # first, so the workload's description sees every step
        scenario, median_ms = self._recorded_scenario(opt.model_floats)
        run.write_resolved_scenario(scenario.resolved_dict())
        workload = {"params": opt.model_floats, "compute_median_ms": median_ms, "optimizer": repr(opt.inner)}
        publish(
            run,
            scenario,
            name,
            steps,
            evals,
            ops,
            calls,
            finished,
            hosts=self.hosts,
            extra={
                "script": self.script,
                "script_workload": workload,
                "device": str(self.device),
                **scenario_facts(scenario),
                **opt.clock.run_json(),
            },
        )
        print(f"{name}: results in {run.path}", file=sys.stderr)

    def _recorded_scenario(self, model_floats: int):
        """The scenario as the results directory keeps it, and the median local work (ms): the script's
        workload described by what a simulation needs (its model's size, the median local work per
        iteration of every step recorded so far) and the iterations the script took."""
        steps = self.results.steps
        later = steps[steps["iteration"] > 0] if (steps["iteration"] > 0).any() else steps
        median_ms = float(np.median(later["compute_s"])) * 1e3
        data = self.scenario.resolved_dict()
        iterations = int(steps["iteration"].max()) + 1
        data["workload"] = {
            **data["workload"],
            "iterations": iterations,
            "params": int(model_floats),
            "compute": {"emulate_ms": round(median_ms, 4), "jitter": 0.0},
            "eval_every": min(data["workload"]["eval_every"], iterations),
        }
        return scenario_from_dict(data, source=str(self.results.path)), round(median_ms, 4)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if exc is None:
            self.close()
            return
        self.beat.failed(exc)
        if self.size > 1 and not isinstance(exc, KeyboardInterrupt):
            abort_job_after_error()  # prints the error, then no peer waits for this rank forever


def _on_main_thread() -> bool:
    """Signal handlers can only be set from the main thread."""
    return threading.current_thread() is threading.main_thread()


def _launched_scenario(run_dir: Path, algorithm: str | None):
    scenario = load_scenario(run_dir / SCENARIO_FILE)
    return scenario, _pick(scenario, algorithm, ENV_ALGORITHM)


def _script_scenario(source, algorithm: str | None, params: dict, *, iterations, batch_size, seed, name, ranks, rank):
    """The scenario of a script run from a file, a mapping or the arguments alone."""
    base_dir = None
    if source is None:
        if algorithm is None:
            raise ScriptError("harness.api.Run needs algorithm= (e.g. 'wagma') or a scenario naming the algorithms")
        data: dict = {"name": name, "algorithms": [{"name": algorithm, **params}]}
        where = "harness.api.Run(...)"
    else:
        if params:
            raise ScriptError(
                f"algorithm parameters {sorted(params)} go into the scenario's algorithms entry "
                "when a scenario is given"
            )
        if isinstance(source, dict):
            data, where = dict(source), "harness.api.Run(scenario={...})"
        else:
            data, where, base_dir = read_yaml(source), str(source), Path(source).parent
            if not isinstance(data, dict):
                data = {"": data}  # the loader names the problem
    data.setdefault("ranks", ranks)
    if seed is not None:
        data.setdefault("seed", seed)
    workload = data.get("workload")
    if workload is None or isinstance(workload, dict):
        workload = dict(workload or {})
        for key, value in (("iterations", iterations), ("batch_size", batch_size)):
            if value is not None:
                workload.setdefault(key, value)
            elif key not in workload:
                raise ScriptError(
                    f"{where}: give {key}= (or workload.{key} in the scenario): the summary and the injection need it"
                )
        data["workload"] = workload
    scenario = scenario_from_dict(data, source=where, base_dir=base_dir)
    return scenario, _pick(scenario, algorithm, "algorithm=", say_note=rank == 0)


def _pick(scenario, algorithm: str | None, where: str, say_note: bool = False):
    """The entry of ``algorithm`` (default: the first; with ``say_note``, a note says so when there
    are others)."""
    names = [a.name for a in scenario.algorithms]
    if not names:
        raise ScriptError(
            f"{where}: the scenario lists no algorithms: harness.api.Run trains one of them (a "
            "torch.distributed script needs no Run: `python -m harness launch --scenario FILE` runs it "
            "as the algorithm)"
        )
    if algorithm is None:
        if len(names) > 1 and say_note:
            print(
                f"note: the scenario lists {len(names)} algorithms; this run trains the first, {names[0]} "
                "(`python -m harness launch --scenario FILE` runs the script once per algorithm)",
                file=sys.stderr,
            )
        return scenario.algorithms[0]
    if algorithm not in names:
        raise ScriptError(f"{where}: {algorithm!r} is not among the scenario's algorithms ({', '.join(names)})")
    return scenario.algorithms[names.index(algorithm)]
