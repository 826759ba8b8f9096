"""Shared test helpers: the harness CLI as a subprocess, scenario runs, multi-rank check scripts."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import yaml

from harness.bench.real_runs import CaseFailed, run_command
from harness.bench.faults import processes_mentioning  # noqa: F401  (the tests import it from here)
from harness.launch import run_ranks
from harness.sim.calibration import save_fixed_calibration

MPI_DIR = Path(__file__).parent / "mpi"


# -- algorithm registrations stay in their test file ---------------------------------------------
# Loading a scenario that names a class of the user's (or a variant) registers it process-wide
# (harness.algorithms.user_class), and xdist runs many test files in one worker: a registration
# one file leaves behind shows up in another's list of names. Each file starts from the registry
# the previous one found.

@pytest.fixture(autouse=True, scope="module")
def _registrations_stay_in_their_file():
    from harness.algorithms import registry

    before = set(registry.names()) | set(registry.variants())
    yield
    for name in [*registry.variants(), *registry.names()]:
        if name not in before:
            registry.unregister(name)


# -- timing tests run alone ----------------------------------------------------------------------
# Under pytest-xdist two test files run at once (pyproject: -n 2), which halves the suite's time
# on two cores; but a test marked `timing` compares times it measured side by side (a ratio
# against a control of the same run, with a margin; never a fixed bound a slower machine could
# break), and a second test's ranks on the same cores would skew one side more than the other.
# So every test holds a readers-writer lock for its whole protocol (fixtures included): `timing` tests exclusively,
# the others shared. The turnstile gives a waiting `timing` test priority: once it queues, no new
# shared holder gets in, so it waits at most for the test running beside it.

def _session_lock_path(name: str) -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / f"harness-pytest-{os.environ['PYTEST_XDIST_TESTRUNUID']}.{name}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if "PYTEST_XDIST_TESTRUNUID" not in os.environ:  # one process: nothing runs beside the test
        yield
        return
    import fcntl

    exclusive = item.get_closest_marker("timing") is not None
    with open(_session_lock_path("turnstile"), "a") as turnstile, open(_session_lock_path("lock"), "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def launch_checks(script: str, ranks: int, tmp_path: Path, timeout: float = 240) -> dict:
    """Run ``tests/mpi/<script>`` on ``ranks`` ranks; return rank 0's JSON report."""
    out = tmp_path / f"{Path(script).stem}-{ranks}.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = run_ranks(ranks, ["python", "-u", str(MPI_DIR / script), str(out), "-v"], timeout=timeout,
                         env=env, capture=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{script} on {ranks} ranks did not finish in {timeout} s; last checks started:\n"
                    f"{(exc.stdout or '')[-2000:]}")
    if proc.returncode != 0 or not out.exists():
        pytest.fail(f"{script} on {ranks} ranks exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def assert_check(report: dict, name: str) -> None:
    result = report[name]
    if result["status"] == "skip":
        pytest.skip(result["detail"])
    assert result["status"] == "pass", result["detail"]


def harness_cli(*args: str, timeout: float = 300, prefix: Sequence[str] = (),
                cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` (after ``prefix``, e.g. an mpiexec command line), in ``cwd``.

    On timeout it is interrupted like Ctrl+C, so a run stops its ranks instead of orphaning them.
    """
    try:
        return run_command([*prefix, sys.executable, "-m", "harness", *args], timeout=timeout, cwd=cwd)
    except CaseFailed as exc:
        pytest.fail(str(exc))


def rank_pid(marker: str, rank: int) -> int | None:
    """The pid of the worker process of ``rank`` in the job whose command lines mention ``marker``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if "harness.runner.worker" in cmdline and marker in cmdline and f"PMI_RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


def kill_rank_mid_run(cmd: Sequence[str], out: Path, rank: int, sig: int, settle_s: float,
                      cwd: Path | None = None) -> tuple[int, subprocess.CompletedProcess]:
    """Start ``cmd`` (a ``harness run`` writing under ``out``), send ``sig`` to ``rank``'s process
    ``settle_s`` after the run began (nothing injected: as the kernel's out-of-memory killer or a
    crash would), and wait for the run; (that rank's pid, what the run printed). Should the rank
    never start, the run's own watchdog ends it (start-up timeout), and the test fails."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        while (pid := rank_pid(str(out), rank)) is None or not list(out.glob("*/*/run.json")):
            assert proc.poll() is None, f"rank {rank} never started: {proc.stderr.read()[-3000:]}"
            time.sleep(0.2)
        time.sleep(settle_s)
        os.kill(pid, sig)
        out_text, err = proc.communicate()
    finally:
        if proc.poll() is None:  # a failed assertion above: stop the run like Ctrl+C
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=30)
    return pid, subprocess.CompletedProcess(proc.args, proc.returncode, out_text, err)


def write_scenario_file(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_scenario(tmp_path: Path, data: dict, timeout: float = 300) -> Path:
    """Run scenario ``data`` with ``python -m harness run``; return its (only) run directory."""
    proc = harness_cli("run", str(write_scenario_file(tmp_path, data)), "--out", str(tmp_path / "out"), timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "out" / data["name"]).iterdir()
    return run


def check_names(script: str) -> list[str]:
    """Names of the ``@check`` functions of ``tests/mpi/<script>``, read without importing it
    (importing would initialize MPI in the pytest process)."""
    tree = ast.parse((MPI_DIR / script).read_text())
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and any(getattr(d, "id", None) == "check" for d in node.decorator_list)
    ]


def report_cache(script: str, tmp_path_factory, timeout: float = 240) -> Callable[[int], dict]:
    """``get(ranks)``: the report of one launch of ``script`` per rank count, launched on first use."""
    cache: dict[int, dict] = {}

    def get(ranks: int) -> dict:
        if ranks not in cache:
            tmp = tmp_path_factory.mktemp(f"{Path(script).stem}{ranks}")
            cache[ranks] = launch_checks(script, ranks, tmp, timeout=timeout)
        return cache[ranks]

    return get


REPO = Path(__file__).resolve().parent.parent


#: A calibration file with one entry: 0.3 ms and 1 GB/s links, compute medians as given; what
#: ``simulate`` and ``compare`` need, without measuring this machine (``bench agreement`` uses it too).
save_test_calibration = save_fixed_calibration


def quick_figure_scenario(name: str) -> dict:
    """``scenarios/<name>.yaml`` made small for tests: 4 ranks, 12 iterations, an evaluation every
    4, injected sleeps of 30 ms (every algorithm of the file kept; WAGMA groups of 2)."""
    data = yaml.safe_load((REPO / "scenarios" / f"{name}.yaml").read_text())
    data["ranks"] = 4
    data["workload"] = {**data["workload"], "iterations": 12, "eval_every": 4}
    data["imbalance"] = [{**entry, "delay_ms": 30} for entry in data.get("imbalance", [])]
    data["algorithms"] = [
        {**entry, "group_size": 2} if isinstance(entry, dict) and entry.get("name") == "wagma" else entry
        for entry in data["algorithms"]
    ]
    return data


@pytest.fixture(scope="session")
def figure_results(tmp_path_factory) -> dict[str, Path]:
    """Quick real runs of the straggler and slow-link scenarios (see ``quick_figure_scenario``),
    each with ``compare`` applied (a fixed calibration: 0.3 ms, 1 GB/s, 3 ms of compute): the
    results the figure scripts read. Maps scenario name to run directory.

    Made once per test session: under pytest-xdist the first worker that needs them makes them
    in the session's directory (above every worker's own), under a lock, and the others read
    what it recorded (three test files use them; they took about 70 s)."""
    import fcntl
    import tempfile

    shared = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        shared = shared.parent
    made = shared / "figure_results.json"
    with open(shared / "figure_results.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if made.exists():
                return {name: Path(run) for name, run in json.loads(made.read_text()).items()}
            root = Path(tempfile.mkdtemp(prefix="figure_results", dir=shared))
            calibration = save_test_calibration(root / "calibration.json", 4, [("mlp", "mnist5k", 32, 0.003)])
            runs = {}
            for name in ("straggler", "slow_link"):
                (root / name).mkdir()
                run = run_scenario(root / name, quick_figure_scenario(name))
                proc = harness_cli("compare", str(run), "--calibration", str(calibration))
                assert proc.returncode == 0, proc.stderr[-3000:]
                runs[name] = run
            made.write_text(json.dumps({name: str(run) for name, run in runs.items()}))
            return runs
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
