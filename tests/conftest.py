"""Shared test helpers: the harness CLI as a subprocess, scenario runs, multi-rank check scripts."""

from __future__ import annotations

import _posixsubprocess
import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import yaml

from harness.launch import run_ranks
from harness.sim.calibration import save_fixed_calibration
from harness.testing.real_runs import CaseFailed, run_command

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


# -- the fast lane: `python -m pytest -m unit` -----------------------------------------------------
# A test that starts a process of any kind (ranks under mpiexec, the harness CLI, a script, a
# tool) is marked `mpi` (it launches ranks), `slow` (a long end-to-end run) or `subprocess` (other
# processes, no ranks); every other test is marked `unit` here, and `-m unit` runs those alone.
# Checked, not trusted: an audit hook sees every process a test starts (in its set-up or its
# call), and a `unit` test that starts one fails at once, as does a test without `mpi` that runs
# mpiexec itself. So a test added without its marker fails in the fast lane and in the full
# suite alike, and the lane cannot slowly fill with process launches.

PROCESS_MARKERS = ("mpi", "slow", "subprocess")
_PROCESS_EVENTS = {"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
                   "tests.fork_exec"}
_LAUNCHERS = {"mpiexec", "mpirun", "mpiexec.hydra", "srun", "mpiexec.mpich", "mpirun.mpich", "mpirun.openmpi",
              "mpiexec.openmpi", "prterun", "orterun"}
_watched: dict = {"item": None, "problems": []}  # the test in set-up or call, and what it did wrong


def _process_problem(event: str, args: tuple) -> str | None:
    item = _watched["item"]
    if item is None or event not in _PROCESS_EVENTS:
        return None
    argv = {"subprocess.Popen": 1, "os.system": 0, "os.posix_spawn": 1, "os.spawn": 2, "tests.fork_exec": 0}.get(event)
    argv = () if argv is None else args[argv]  # os.fork, os.forkpty: no command
    words = argv.split() if isinstance(argv, (str, bytes)) else list(argv or ())
    words = [os.fsdecode(w) if isinstance(w, (str, bytes, os.PathLike)) else str(w) for w in words]
    command = " ".join(words)
    marked = {m for m in PROCESS_MARKERS if item.get_closest_marker(m) is not None}
    if not marked:
        return (f"{item.nodeid} starts a process ({event}: {command[:200] or 'fork'}) but is marked neither mpi, "
                "slow nor subprocess: mark it (the fast lane, -m unit, runs only tests that start none)")
    if "mpi" not in marked and any(Path(w).name in _LAUNCHERS for w in words):
        return f"{item.nodeid} launches ranks ({command[:200]}) but is not marked mpi"
    return None


def _audit_processes(event: str, args: tuple) -> None:
    if event in _PROCESS_EVENTS and (problem := _process_problem(event, args)) is not None:
        _watched["problems"].append(problem)
        raise RuntimeError(problem)


sys.addaudithook(_audit_processes)  # for good (an audit hook cannot be removed): it checks only while a test runs


def _audited_fork_exec(*args, **kwargs):
    """multiprocessing's spawn and forkserver start their processes with _posixsubprocess.fork_exec,
    which raises no audit event of its own (subprocess, which does, holds its own reference)."""
    sys.audit("tests.fork_exec", args[0] if args else ())
    return _fork_exec(*args, **kwargs)


_fork_exec, _posixsubprocess.fork_exec = _posixsubprocess.fork_exec, _audited_fork_exec


@pytest.hookimpl(tryfirst=True)  # before `-m` selects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if not any(item.get_closest_marker(m) is not None for m in PROCESS_MARKERS):
            item.add_marker(pytest.mark.unit)


def _watching(item):
    _watched["item"], _watched["problems"] = item, []
    try:
        result = yield
    finally:
        _watched["item"] = None
    if _watched["problems"]:  # raised where the process was started; should that have been swallowed:
        pytest.fail("\n".join(_watched["problems"]), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _watching(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _watching(item))


def launch_checks(script: str, ranks: int, tmp_path: Path, timeout: float = 240, env: dict | None = None) -> dict:
    """Run ``tests/mpi/<script>`` on ``ranks`` ranks (``env``: more environment); return rank 0's
    JSON report."""
    out = tmp_path / f"{Path(script).stem}-{ranks}.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
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
        ranks = {f"{var}={rank}".encode() for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK")}  # Hydra's, mpirun's
        if "harness.runner.worker" in cmdline and marker in cmdline and ranks & set(environ):
            return int(entry.name)
    return None


def kill_rank_mid_run(cmd: Sequence[str], out: Path, rank: int, sig: int,
                      cwd: Path | None = None) -> tuple[int, subprocess.CompletedProcess]:
    """Start ``cmd`` (a ``harness run`` writing under ``out``), send ``sig`` to ``rank``'s process
    in mid-run (nothing injected: as the kernel's out-of-memory killer or a crash would), and wait
    for the run; (that rank's pid, what the run printed). Mid-run: once rank 0's progress bar
    shows an iteration done (a first iteration ends with a collective: every rank is in the
    training loop). The test fails when that never shows (the run ended, or not within 120 s)."""
    import threading

    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    printed: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    def read(stream, into: bytearray) -> None:  # chunks: the progress bar rewrites its line with \r
        while chunk := os.read(stream.fileno(), 65536):
            into += chunk

    readers = [threading.Thread(target=read, args=(getattr(proc, name), printed[name]), daemon=True)
               for name in printed]
    for reader in readers:
        reader.start()
    iteration_done = re.compile(rb" [1-9][0-9]*/[0-9]+ \[")  # tqdm's "  5%|5   | 200/4000 [00:01<..."
    try:
        deadline = time.monotonic() + 120
        while (pid := rank_pid(str(out), rank)) is None or not iteration_done.search(bytes(printed["stderr"])):
            assert proc.poll() is None, f"the run ended before rank {rank} was killed: {printed['stderr'][-3000:]}"
            assert time.monotonic() < deadline, f"no iteration done in 120 s: {printed['stderr'][-3000:]}"
            time.sleep(0.05)  # polls for the rank and the progress bar, with a deadline
        os.kill(pid, sig)
        proc.wait()
    finally:
        if proc.poll() is None:  # a failed assertion above: stop the run like Ctrl+C
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
        for reader in readers:
            reader.join(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
    out_text, err = (printed[name].decode(errors="replace") for name in ("stdout", "stderr"))
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


# .ci/system_mpi.sh runs a slice of the suite under each system MPI with HARNESS_TEST_RANKS=2,3,4,5:
# every check suite of that slice at those rank counts instead of its own.
SLICE_RANKS = tuple(int(n) for n in os.environ.get("HARNESS_TEST_RANKS", "").split(",") if n.strip())


def mpi_check_suite(script: str, ranks: Sequence[int], *, checks: int, slow_ranks: Sequence[int] = (),
                    timeout: float = 240, marks: Sequence[pytest.MarkDecorator] = (),
                    launch: Callable[[int, Path], dict] | None = None, doc: str | None = None) -> type:
    """The checks of ``tests/mpi/<script>`` as a test class; a test file assigns it to a ``Test...`` name::

        TestCommChecks = mpi_check_suite("comm_checks.py", ranks=(1, 2, 3), checks=12)

    * ``test_check[<check>-<n>ranks]``: each ``@check`` of the script at each rank count of
      ``ranks`` (and of ``slow_ranks``, those marked ``slow``), marked ``mpi`` and ``marks``. One
      launch per rank count runs every check (``launch(ranks, tmp_dir)``, by default
      ``launch_checks`` with ``timeout``), started by the first test that needs it; when it fails or
      skips, the tests after it fail or skip with its message instead of launching again.
    * ``test_checks_found``: the script has exactly ``checks`` checks, none named twice (read
      without launching anything: a check renamed, lost to a bad decorator or added without a
      look at the suite shows here).
    * ``reports(ranks, tmp_path_factory)``: that launch's report, for other tests of the file.
    """
    if SLICE_RANKS:  # the slice under a system MPI (.ci/system_mpi.sh)
        ranks, slow_ranks = SLICE_RANKS, ()
    stem = Path(script).stem
    names = check_names(script)
    launched: dict[int, dict | BaseException] = {}  # a report, or how its launch ended (pytest's skip or fail)

    def run(n: int, tmp: Path) -> dict:
        return launch_checks(script, n, tmp, timeout=timeout)

    def reports(n: int, tmp_path_factory) -> dict:
        if n not in launched:
            try:
                launched[n] = (launch or run)(n, tmp_path_factory.mktemp(f"{stem}{n}"))
            except (pytest.skip.Exception, pytest.fail.Exception) as exc:
                launched[n] = exc
                raise
        got = launched[n]
        if isinstance(got, pytest.skip.Exception):
            pytest.skip(got.msg)
        if isinstance(got, BaseException):
            pytest.fail(f"(the launch on {n} ranks, in an earlier test) {got.msg}", pytrace=False)
        return got

    params = [pytest.param(name, n, id=f"{name}-{n}ranks", marks=[pytest.mark.slow] if n in slow_ranks else [])
              for n in [*ranks, *slow_ranks] for name in names]

    def test_check(self, tmp_path_factory, check: str, ranks: int) -> None:
        report = reports(ranks, tmp_path_factory)
        if check not in report:
            pytest.fail(f"{script} on {ranks} ranks reported nothing for {check} (its report: {sorted(report)})")
        assert_check(report, check)

    test_check.__doc__ = doc
    test_check = pytest.mark.parametrize(("check", "ranks"), params)(test_check)
    for mark in [pytest.mark.mpi, *marks]:
        test_check = mark(test_check)

    def test_checks_found(self) -> None:
        found = check_names(script)
        assert len(found) == len(set(found)), f"{script} names a check twice: {found}"
        assert len(found) == checks, f"{script} has {len(found)} checks, its suite declares {checks}: {found}"

    name = "Test" + "".join(part.capitalize() for part in stem.split("_"))
    return type(name, (), {"__doc__": f"tests/mpi/{script} under mpiexec.", "test_check": test_check,
                           "test_checks_found": test_checks_found, "reports": staticmethod(reports)})


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
