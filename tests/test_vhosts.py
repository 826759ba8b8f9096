"""Across hosts, for real: the harness on a test bed of virtual hosts (harness/testing/vhosts/).

``harness/testing/vhosts/start_vhosts.sh`` builds three virtual hosts on this machine (network, host-name and
time namespaces, veth pairs on a bridge, addresses in 198.18.0.0/15, one sshd each; vh2's
CLOCK_MONOTONIC runs SKEW_S[1] seconds ahead of vh1's, vh3's SKEW_S[2] behind). Every command
runs on vh1, as on a cluster's first node, with ``vhost_exec.sh`` beside it: Hydra starts its
proxies on the other hosts over ssh, and MPI's messages between hosts cross the virtual network.

What is shown here:

* ``run --hosts`` over 2 and 3 hosts with odd ranks per host completes; ``run.json`` counts the
  hosts MPI saw and names each rank's host; the clocks are aligned (the estimated host offsets
  are the injected skews within 1 ms, and every blocking allreduce's latest start precedes its
  earliest end on the common clock);
* the native layer across hosts (every check of tests/mpi/comm_checks.py at 2 + 2 ranks): each
  host's members share memory, the hosts' leaders exchange messages, and the listeners (push
  channel, wait-avoiding activations, pairwise averaging) hear every message;
* ``sbatch`` of ``python -m harness sbatch FILE --nodes 2`` on a SLURM of two virtual nodes;
* the watchdog across hosts: a rank killed on vh2 and a rank hung on vh2 are named with their
  host; a host whose ranks never start (its sshd frozen, as on a hung node) is named after the
  start-up timeout, with the ranks that wait for it; ranks started by
  the user's own ``mpiexec`` are watched too (a hang ends in MPI_Abort, the culprit named); and
  nothing is left running on any virtual host afterwards;
* ``calibrate --hosts`` and ``compare`` of a multi-host run: hosts are the simulated nodes;
* the kernel's shaping of a link (``tbf``) against the native link emulator and the simulator:
  the same bandwidth gives iteration times of at least the link's time for the bytes, within a
  factor of 2 of each other (how close they are: ``python -m harness bench agreement --only
  kernel_shaping``, with the test bed running).

Skipped, with the reason, where the test bed cannot be built: not Linux, not root, no network or
time namespaces, the packages not installed (``.ci/provision.sh`` installs them as root), or
``HARNESS_SKIP_VHOSTS=1``.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import MPI_DIR, kill_rank_mid_run
from harness.launch import Launch
from harness.mpi_library import MpiLibrary, native_build
from harness.testing.real_runs import CaseFailed, run_command
from harness.testing.vhosts.bed import SCRIPTS, vhost_scenario
from harness.testing.vhosts.shaping import SHAPED_LEAST_S, SHAPED_MBIT, kernel_shaping_times

REPO = Path(__file__).resolve().parents[1]
BED = SCRIPTS  # the test bed's shell scripts
SLURM = Path(__file__).resolve().parent / "slurm"
HOSTS = ["vh1", "vh2", "vh3"]
SKEW_S = [0, 7, -3]  # each host's CLOCK_MONOTONIC offset, in whole seconds (time namespaces)
START_TIMEOUT_S = 300  # building the bed takes seconds; another session's start may hold the lock
RUN_TIMEOUT_S = 180
SLURM_DIR = "/var/lib/harness-vslurm"  # not the single-node cluster's (tests/test_slurm.py)

# Only the tests that compare measured times run alone (``timing``); the others may share the
# cores with another test file under pytest-xdist.
pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(START_TIMEOUT_S + 4 * RUN_TIMEOUT_S)]


def _cannot_start() -> str | None:
    if os.environ.get("HARNESS_SKIP_VHOSTS") == "1":
        return "HARNESS_SKIP_VHOSTS=1"
    if platform.system() != "Linux":
        return f"virtual hosts need Linux namespaces (this is {platform.system()})"
    if os.geteuid() != 0:
        return "virtual hosts need root (network, UTS and time namespaces, /etc/hosts, sshd)"
    return None


@pytest.fixture(scope="module")
def bed():
    """The test bed's host names; it is stopped at the end only if this session started it."""
    reason = _cannot_start()
    if reason:
        pytest.skip(reason)
    env = dict(os.environ, HARNESS_VHOSTS=str(len(HOSTS)), HARNESS_VHOST_SKEW=" ".join(map(str, SKEW_S)))
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(BED / "start_vhosts.sh")], capture_output=True, text=True, env=env,
                          timeout=START_TIMEOUT_S)
    if proc.returncode != 0 or proc.stdout.split() != HOSTS:
        lines = proc.stderr.strip().splitlines() or ["no output"]
        fail = [ln for ln in lines if "FAIL:" in ln]
        if proc.returncode in (2, 3):  # unsupported here, or the packages are not installed
            pytest.skip(f"virtual hosts cannot be built here: {(fail or lines)[-1]}")
        pytest.fail(f"start_vhosts.sh exited {proc.returncode}: {(fail or lines)[-1]}")
    started = "already running" not in proc.stderr
    print(f"\ntest bed of {len(HOSTS)} virtual hosts ready in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    yield HOSTS
    if started:
        subprocess.run(["bash", str(SLURM / "stop_slurm.sh")], env=dict(os.environ, HARNESS_SLURM_DIR=SLURM_DIR),
                       capture_output=True, timeout=120)
        subprocess.run(["bash", str(BED / "stop_vhosts.sh")], capture_output=True, timeout=120)


def on(host: str, *cmd: str, timeout: float = RUN_TIMEOUT_S, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` on a virtual host (in the repository); on timeout it is interrupted like
    Ctrl+C, so a launcher stops its ranks, then the test fails."""
    try:
        return run_command(["bash", str(BED / "vhost_exec.sh"), host, *cmd], timeout=timeout, cwd=REPO, env=env)
    except CaseFailed as exc:
        pytest.fail(str(exc))


def harness(host: str, *args: str, **kw) -> subprocess.CompletedProcess:
    return on(host, sys.executable, "-m", "harness", *args, **kw)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _daemons() -> set[int]:
    """Pids of the test bed's own daemons (sshd, slurmd, slurmctld and its slurmscriptd), which stay."""
    pids = set()
    for pattern in ("sshd", "slurmd", "slurmctld", "slurmscriptd"):
        proc = subprocess.run(["pgrep", "-x", pattern], capture_output=True, text=True)
        pids |= {int(p) for p in proc.stdout.split()}
    return pids


def left_running(wait_s: float = 10.0) -> dict[str, list[str]]:
    """What still runs on each virtual host besides its daemons, after at most ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        daemons, left = _daemons(), {}
        for host in HOSTS:
            pids = subprocess.run(["ip", "netns", "pids", f"harness-{host}"], capture_output=True,
                                  text=True).stdout.split()
            others = [p for p in pids if int(p) not in daemons]
            if others:
                left[host] = [Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
                              for p in others if Path(f"/proc/{p}/cmdline").exists()]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.fixture
def clean_hosts(bed):
    """Each test ends with nothing of it running on any virtual host."""
    yield
    left = left_running()
    assert not left, f"processes left running on the virtual hosts: {left}"


def host_file(tmp_path: Path, slots: dict[str, int]) -> Path:
    path = tmp_path / "hosts"
    path.write_text("".join(f"{h}:{n}\n" for h, n in slots.items()))
    return path


def scenario(tmp_path: Path, ranks: int, name: str = "vhosts", iterations: int = 30, **extra) -> Path:
    """A small scenario (``harness.testing.vhosts.bed.vhost_scenario``): emulated compute (5 ms), a
    100,000-parameter model (400 kB messages)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(vhost_scenario(ranks, name=name, iterations=iterations, **extra), sort_keys=False))
    return path


def only_run(out: Path, name: str) -> Path:
    runs = [p for p in (out / name).iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def expected_hosts(slots: dict[str, int], ranks: int) -> list[str]:
    """Hydra's placement: each host's slots in file order, wrapping around."""
    order = [h for h, n in slots.items() for _ in range(n)]
    return [order[r % len(order)] for r in range(ranks)]


# ------------------------------------------------------------------------------------------------
# runs across hosts, one clock


def _blocking_allreduce_spans(run: Path) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """{(algorithm, k): [(start, end) of every rank]} of the k-th allreduce of every rank."""
    spans: dict[tuple[str, int], list[tuple[float, float]]] = {}
    seen: dict[tuple[str, int], int] = {}
    with open(run / "comm_ops.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["op"] != "allreduce":
                continue
            rank = (row["algorithm"], int(row["rank"]))
            k = seen[rank] = seen.get(rank, -1) + 1
            spans.setdefault((row["algorithm"], k), []).append((float(row["start_s"]), float(row["end_s"])))
    return spans


# Not `timing`: a loaded machine widens the clock's error bound (half a round trip), and the
# checks follow the bound each estimate reports.
@pytest.mark.parametrize("slots", [{"vh1": 2, "vh2": 1}, {"vh1": 1, "vh2": 2, "vh3": 2}], ids=["2hosts", "3hosts"])
def test_run_across_hosts_on_one_clock(bed, clean_hosts, tmp_path, slots):
    ranks = sum(slots.values())
    out = tmp_path / "out"
    proc = harness("vh1", "run", str(scenario(tmp_path, ranks)), "--hosts", str(host_file(tmp_path, slots)),
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = only_run(out, "vhosts")
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete"
    assert meta["hosts"] == len(slots)
    assert meta["rank_hosts"] == expected_hosts(slots, ranks)

    # One clock: every host's offset is its injected skew, within the estimates' own error bound
    # (half the best round trip each measured; a loaded machine widens it, and this follows).
    clock = meta["clock"]
    bound = max(clock["error_bound_s"]) + 1e-6
    for host, offset in clock["host_offsets_s"].items():
        injected = SKEW_S[HOSTS.index(host)] - SKEW_S[0]
        assert abs(offset - injected) <= bound, (host, offset, injected, clock)
    print(f"\nclock offsets (s): {clock['host_offsets_s']}; error bound {max(clock['error_bound_s']) * 1e3:.3f} ms",
          file=sys.stderr)
    # ... and the timelines line up: nobody leaves a blocking allreduce before the last rank
    # entered it, up to two ranks' estimates' errors.
    spans = _blocking_allreduce_spans(run)
    assert spans and all(len(s) == ranks for s in spans.values())
    worst = max(max(start for start, _ in s) - min(end for _, end in s) for s in spans.values())
    assert worst <= 2 * bound, f"an allreduce ended {worst * 1e3:.3f} ms before its last rank started (bound {bound * 1e3:.3f} ms)"


def test_the_native_layer_across_hosts(bed, clean_hosts, tmp_path):
    """Every check of comm_checks.py on 2 + 2 ranks of vh1 and vh2 (kernels/host_hierarchy.hpp;
    kernels/listener.hpp: over UCX between hosts a wildcard receive went deaf, and the
    wait-avoiding and push checks hung)."""
    report = tmp_path / "report.json"
    launch = Launch.choose("mpiexec", host_file(tmp_path, {"vh1": 2, "vh2": 2}))  # this environment's MPI's
    env = {**os.environ, **MpiLibrary.of_this_environment().rank_env()}
    proc = on("vh1", *launch.command(4, [sys.executable, "-u", str(MPI_DIR / "comm_checks.py"), str(report)], env),
              env=env)
    assert proc.returncode == 0 and report.exists(), proc.stderr[-3000:]
    results = json.loads(report.read_text())
    failed = {name: r["detail"] for name, r in results.items() if r["status"] != "pass"}
    assert not failed, failed
    assert results["across_hosts_each_hosts_members_share_memory"]["detail"] == "4 ranks on 2 hosts"


# ------------------------------------------------------------------------------------------------
# SLURM with two virtual nodes


def _job_state(job_id: str) -> tuple[str, str]:
    proc = on("vh1", "scontrol", "-o", "show", "job", job_id, timeout=30, env=_slurm_env())
    fields = dict(f.split("=", 1) for f in proc.stdout.split() if "=" in f)
    return fields.get("JobState", ""), fields.get("ExitCode", "")


def _slurm_env() -> dict:
    """SLURM's clients' environment: the virtual cluster's configuration; nothing of a job this
    test may run in; and the job runs Hydra's SLURM bootstrap with srun, not the test bed's ssh
    (``HARNESS_VHOST_NO_SSH=1``: Hydra would take HYDRA_LAUNCHER_EXEC for the path of srun)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_", "PMIX_", "SBATCH_", "SRUN_"))}
    return dict(env, SLURM_CONF=f"{SLURM_DIR}/slurm.conf", HARNESS_VHOST_NO_SSH="1")


def test_sbatch_on_two_virtual_nodes(bed, clean_hosts, tmp_path):
    env = dict(os.environ, HARNESS_SLURM_DIR=SLURM_DIR, HARNESS_SLURM_NODES="vh1 vh2")
    proc = subprocess.run(["bash", str(SLURM / "start_slurm.sh")], capture_output=True, text=True, env=env,
                          timeout=START_TIMEOUT_S)
    if proc.returncode in (2, 3):
        pytest.skip(f"SLURM cannot run here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out, ranks = tmp_path / "out", 5
    file = scenario(tmp_path, ranks)
    proc = harness("vh1", "sbatch", str(file), "--nodes", "2", "--out", str(out), "--time", "5", env=_slurm_env())
    assert proc.returncode == 0, proc.stderr
    script = out / "vhosts" / "vhosts.sbatch"
    assert "#SBATCH --nodes=2" in script.read_text().splitlines()
    proc = on("vh1", "sbatch", "--parsable", str(script), timeout=60, env=_slurm_env())
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    submitted = time.monotonic()
    deadline, state = submitted + RUN_TIMEOUT_S, ""
    while time.monotonic() < deadline:
        state, exit_code = _job_state(job)
        if state not in ("", "PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            break
        time.sleep(0.5)
    logs = list((out / "vhosts").glob("slurm-*.out"))
    output = logs[0].read_text(errors="replace")[-3000:] if logs else "(no job output)"
    assert state == "COMPLETED", f"job {job}: {state}\n{output}"
    print(f"\nSLURM job on two virtual nodes: submitted to done in {time.monotonic() - submitted:.1f} s", file=sys.stderr)
    meta = json.loads((only_run(out, "vhosts") / "run.json").read_text())
    assert meta["status"] == "complete" and meta["hosts"] == 2, meta
    assert set(meta["rank_hosts"]) == {"vh1", "vh2"}, meta["rank_hosts"]


# ------------------------------------------------------------------------------------------------
# the watchdog across hosts

SECOND_HOST = {"vh1": 1, "vh2": 2}  # ranks 1 and 2 on vh2
# The start-up timeout covers each algorithm's set-up too, which a loaded machine has taken more
# than 8 s for across hosts (a spurious "no progress in setting up"); only the test of a host that
# never starts waits for it on purpose, and takes the short one.
WATCHDOG = {"stall_timeout_s": 3, "startup_timeout_s": 60}
NEVER_STARTS_TIMEOUT_S = 8


def _fault_scenario(tmp_path: Path, fault: dict | None, ranks: int = 3, iterations: int = 40,
                    startup_timeout_s: float = WATCHDOG["startup_timeout_s"]) -> Path:
    return scenario(tmp_path, ranks, name="vhfault", iterations=iterations, faults=[fault] if fault else [],
                    watchdog={**WATCHDOG, "startup_timeout_s": startup_timeout_s})


def test_killed_rank_on_the_second_host_is_named_with_its_host(bed, clean_hosts, tmp_path):
    file = _fault_scenario(tmp_path, {"kind": "kill", "rank": 2, "at_iteration": 5})
    proc = harness("vh1", "run", str(file), "--hosts", str(host_file(tmp_path, SECOND_HOST)),
                   "--out", str(tmp_path / "out"))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert re.search(r"rank 2 \(pid \d+ on host vh2\) died in iteration 5", proc.stderr), proc.stderr[-3000:]


def test_a_real_crash_on_the_second_host_is_named_by_when_its_connection_ended(bed, clean_hosts, tmp_path):
    # Nothing injected: rank 2, on vh2, is killed from outside in mid-run (an out-of-memory kill,
    # a node going down). Its connection's end crosses the network once; the clean-up's ends of
    # the others need messages through mpiexec and back first. The verdict names rank 2.
    file = _fault_scenario(tmp_path, None, ranks=3, iterations=4000)  # far from done when rank 2 is killed
    out = tmp_path / "out"
    cmd = ["bash", str(BED / "vhost_exec.sh"), "vh1", sys.executable, "-m", "harness", "run", str(file),
           "--hosts", str(host_file(tmp_path, SECOND_HOST)), "--out", str(out)]
    pid, proc = kill_rank_mid_run(cmd, out, 2, signal.SIGKILL, cwd=REPO)
    err = proc.stderr
    assert proc.returncode == 1, err[-3000:]
    assert re.search(rf"rank 2 \(pid {pid} on host vh2\) died [^:]*: its process ended without finishing", err), \
        err[-3000:]
    meta = json.loads((only_run(out, "vhfault") / "run.json").read_text())
    assert meta["fault"]["rank"] == 2 and meta["fault"]["evidence"] == "first_end"


def test_hung_rank_on_the_second_host_is_named_after_the_stall_timeout(bed, clean_hosts, tmp_path):
    file = _fault_scenario(tmp_path, {"kind": "hang", "rank": 2, "at_iteration": 5})
    t0 = time.monotonic()
    proc = harness("vh1", "run", str(file), "--hosts", str(host_file(tmp_path, SECOND_HOST)),
                   "--out", str(tmp_path / "out"))
    took = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr[-3000:]
    match = re.search(r"rank 2 \(pid \d+ on host vh2\) made no progress for ([\d.]+) s in iteration 5", proc.stderr)
    assert match, proc.stderr[-3000:]
    # Not before the timeout. How much later depends on how a loaded machine schedules the
    # watchdog (it looks every 0.5 s): no bound here; the run's own timeout catches one that never looks.
    assert WATCHDOG["stall_timeout_s"] <= float(match.group(1))
    print(f"\nhang on vh2 named after {match.group(1)} s of silence; the whole run took {took:.1f} s", file=sys.stderr)


def test_a_host_that_never_starts_its_ranks_is_named(bed, clean_hosts, tmp_path):
    """vh3's sshd is frozen (SIGSTOP), as on a hung node: Hydra's ssh to it waits, its rank never
    starts, and the watchdog names it and its host after the start-up timeout."""
    sshd = int((Path("/var/lib/harness-vhosts/run/sshd-vh3.pid")).read_text())
    file = _fault_scenario(tmp_path, None, startup_timeout_s=NEVER_STARTS_TIMEOUT_S)
    os.kill(sshd, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        proc = harness("vh1", "run", str(file), "--hosts", str(host_file(tmp_path, {"vh1": 1, "vh2": 1, "vh3": 1})),
                       "--out", str(tmp_path / "out"))
        took = time.monotonic() - t0
    finally:
        os.kill(sshd, signal.SIGCONT)
    assert proc.returncode == 1, proc.stderr[-3000:]
    if native_build()["family"] == "openmpi":
        # mpirun starts no rank before every host's daemon is up: none started, each is named.
        expected = ("error: ranks 0 (on host vh1) and 1 (on host vh2) and 2 (on host vh3) did not start within "
                    f"startup_timeout_s ({NEVER_STARTS_TIMEOUT_S} s")
        assert expected in proc.stderr, proc.stderr[-3000:]
    else:
        assert (f"error: rank 2 (on host vh3) did not start within startup_timeout_s ({NEVER_STARTS_TIMEOUT_S} s"
                in proc.stderr and "; ranks 0, 1 started and wait for it in MPI's start-up" in proc.stderr), \
            proc.stderr[-3000:]
    assert took >= NEVER_STARTS_TIMEOUT_S, took  # not before its timeout (a loaded machine only lengthens it)
    print(f"\nvh3 never started its rank: named and stopped {took:.1f} s after the launch", file=sys.stderr)


def test_ranks_the_user_starts_are_watched_too(bed, clean_hosts, tmp_path):
    """``mpiexec -f HOSTS -n 3 python -m harness run FILE``: no launcher of the harness watches, so
    rank 0 does; a hang on vh2 ends the job with MPI_Abort, the culprit named."""
    file = _fault_scenario(tmp_path, {"kind": "hang", "rank": 2, "at_iteration": 5})
    launch = Launch.choose("mpiexec", host_file(tmp_path, SECOND_HOST))  # this environment's MPI's own
    env = {**os.environ, **MpiLibrary.of_this_environment().rank_env()}
    t0 = time.monotonic()
    proc = on("vh1", *launch.command(3, [sys.executable, "-m", "harness", "run", str(file), "--out",
                                         str(tmp_path / "out")], env), env=env)
    took = time.monotonic() - t0
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert re.search(r"rank 2 \(pid \d+ on host vh2\) made no progress", proc.stderr), proc.stderr[-3000:]
    assert took < RUN_TIMEOUT_S / 2, took
    print(f"\nranks the user started: the hang on vh2 aborted the job {took:.1f} s after mpiexec started", file=sys.stderr)


# ------------------------------------------------------------------------------------------------
# calibrate and compare across hosts; the kernel's shaping against the emulator and the simulator

TWO = {"vh1": 1, "vh2": 1}


@pytest.mark.timing  # the kernel's and the emulator's iteration times are measured side by side
def test_kernel_shaping_emulator_and_simulator_agree_within_a_factor_of_two(bed, clean_hosts, tmp_path):
    """vh2's link at 100 Mb/s both ways, shaped by the kernel (tbf), then by the native emulator;
    compare's trace-driven simulation of the emulated run (harness.testing.vhosts.shaping; bench agreement reports
    how close they are: 38-41 ms each here, 44-56 ms for tbf while the hypervisor stole CPU time).
    Every one pays at least the link's time for a 400 kB message (a bound load cannot break), and
    they are within a factor of 2 of each other: that catches a modelling mistake (a link left
    unshaped: ~6 ms predicted; megabits taken for megabytes: ~10 ms), not a loaded machine."""
    times = kernel_shaping_times(tmp_path / "shaping", harness=lambda *args: harness("vh1", *args))
    entry = json.loads(times.calibration.read_text())
    assert "vh1" in json.dumps(entry) and "vh2" in json.dumps(entry), "the calibration does not record its hosts"
    assert "vh1" in times.compare_output and "vh2" in times.compare_output, times.compare_output
    measured = {"kernel tbf": times.kernel_s, "native emulator": times.native_s, "simulator": times.simulated_s}
    print(f"\nper iteration at {SHAPED_MBIT} Mb/s: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in measured.items()),
          file=sys.stderr)
    assert min(measured.values()) >= SHAPED_LEAST_S, measured
    assert max(measured.values()) <= 2 * min(measured.values()), measured


# ------------------------------------------------------------------------------------------------
# the test bed itself (last: it takes the test bed down)


def test_start_is_idempotent_and_stop_leaves_nothing(bed):
    env = dict(os.environ, HARNESS_VHOSTS=str(len(HOSTS)), HARNESS_VHOST_SKEW=" ".join(map(str, SKEW_S)))
    sshd_pids = [Path(f"/var/lib/harness-vhosts/run/sshd-{h}.pid").read_text() for h in HOSTS]
    proc = subprocess.run(["bash", str(BED / "start_vhosts.sh")], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0 and "already running" in proc.stderr and proc.stdout.split() == HOSTS, proc.stderr
    # Left as it was, not built again: the same sshds (not a time, which load stretches).
    assert [Path(f"/var/lib/harness-vhosts/run/sshd-{h}.pid").read_text() for h in HOSTS] == sshd_pids
    bad = subprocess.run(["bash", str(BED / "start_vhosts.sh")], capture_output=True, text=True, timeout=60,
                         env=dict(env, HARNESS_VHOST_SKEW="0 1.5 0"))
    assert bad.returncode == 2 and "start_vhosts: FAIL: HARNESS_VHOST_SKEW: '1.5' is not a whole number" in bad.stderr
    assert proc.stdout.split() == HOSTS and not bad.stdout  # refused before touching the running bed

    subprocess.run(["bash", str(SLURM / "stop_slurm.sh")], env=dict(os.environ, HARNESS_SLURM_DIR=SLURM_DIR),
                   capture_output=True, timeout=120)
    sshds = [int(Path(f"/var/lib/harness-vhosts/run/sshd-{h}.pid").read_text()) for h in HOSTS]
    subprocess.run(["bash", str(BED / "stop_vhosts.sh")], capture_output=True, timeout=120, check=True)
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "harness-v" not in namespaces, namespaces
    assert "# harness-vhosts" not in Path("/etc/hosts").read_text()
    assert not Path("/run/harness-vhosts").exists()
    deadline = time.monotonic() + 5  # an sshd that left its namespace may still be reaped by its parent
    while [pid for pid in sshds if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in sshds if _alive(pid)], "an sshd of the test bed is still running"
    again = subprocess.run(["bash", str(BED / "stop_vhosts.sh")], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and not again.stderr  # idempotent, and quiet when there is nothing to do
