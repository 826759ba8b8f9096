"""The watchdog over the network: heartbeats over TCP (clocks of other hosts, a connection's end
as a rank's death), where each rank starts, a stop that reaches ranks on other hosts, and the
watchdog rank 0 runs in a job the user started. On loopback; ``tests/test_vhosts.py`` runs the
same across virtual hosts."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time

import pytest

from conftest import harness_cli, write_scenario_file
from harness.launch import Launch, hydra_placement, mpiexec_path, read_hosts, start_ranks
from harness.process_tree import descends_from, stop_job
from harness.scenario import scenario_from_dict
from harness.testing.processes import processes_mentioning
from harness.watchdog import heartbeat_net
from harness.watchdog.heartbeat import Heartbeat
from harness.watchdog.heartbeat_net import ADDRESS_ENV, HeartbeatServer, watchdog_address
from harness.watchdog.heartbeat_row import FIELDS, Field, Phase
from harness.watchdog.supervision import read_states, supervise
from harness.watchdog.verdict import JobJudge

HERE = socket.gethostname()


def _scenario(**changes) -> dict:
    data = {
        "name": "netdog",
        "ranks": 3,
        "workload": {"model": "logreg", "dataset": "synthetic", "batch_size": 8, "iterations": 40,
                     "compute": {"emulate_ms": 5}},
        "algorithms": ["allreduce_sgd"],
        "watchdog": {"stall_timeout_s": 2, "startup_timeout_s": 30},
    }
    data.update(changes)
    return data


def _fake_rank(url: str, rank: int, clock_offset_s: float, rows: list[dict], host: str, pause_s: float = 0.0):
    """A rank on another host, speaking the wire protocol itself: its clock runs
    ``clock_offset_s`` ahead of this one; ``rows`` are sent in turn ("progress_ago": seconds
    before the moment of sending, on its clock), then the connection closes."""
    address, port, key = heartbeat_net.parse_url(url)
    with socket.create_connection((address, port), timeout=10) as sock:
        sock.sendall((json.dumps({"key": key, "rank": rank, "pid": 4242, "host": host}) + "\n").encode())
        for row in rows:
            cells = [0.0] * FIELDS
            cells[Field.PID] = 4242.0
            cells[Field.PHASE] = float(row["phase"])
            cells[Field.ALGORITHM] = 0.0
            cells[Field.ITERATION] = float(row.get("iteration", -1))
            now_there = time.monotonic() + clock_offset_s
            progress_there = now_there - row["progress_ago"]
            cells[Field.PROGRESS_AT] = now_there - progress_there  # what a Sender ships: the age
            sock.sendall(heartbeat_net._ROW.pack(*cells))
            time.sleep(pause_s)


def _until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# --- the transport ----------------------------------------------------------------------------------


def test_round_trip_turns_ages_into_this_clock_and_an_early_end_into_a_death():
    scenario = scenario_from_dict(_scenario(ranks=2, watchdog={"stall_timeout_s": 30}))
    with HeartbeatServer(2, "127.0.0.1") as server:
        dog = JobJudge(scenario, time.monotonic())
        # Rank 0 lives on a host whose clock is 1000 s ahead and last progressed 4 s ago, in
        # iteration 3; rank 1's clock is 500 s behind, in iteration 7. Then both connections end.
        done = threading.Thread(target=_fake_rank, args=(server.url, 0, 1000.0, [
            {"phase": Phase.LOCAL, "iteration": 3, "progress_ago": 4.0}], "vh2", 2.0))
        died = threading.Thread(target=_fake_rank, args=(server.url, 1, -500.0, [
            {"phase": Phase.LOCAL, "iteration": 7, "progress_ago": 0.5}], "vh3", 3.0))
        done.start()
        died.start()
        assert _until(lambda: all(st.started for st in read_states(server)))
        zero, one = read_states(server)
        now = time.monotonic()
        assert (zero.host, one.host) == ("vh2", "vh3")
        assert zero.progress_at == pytest.approx(now - 4.0, abs=0.5)  # not 1000 s in the future
        assert one.progress_at == pytest.approx(now - 0.5, abs=0.5)  # not 500 s in the past
        assert server.snapshot()[2] == {}  # both connected
        done.join()
        died.join()
        # Both connections ended before their rows said DONE: both processes died, rank 0 first.
        assert server.wait_closed([0, 1], timeout=5)
        verdict = dog.check(read_states(server), time.monotonic(), server.snapshot()[2])
        assert verdict.kind == "died" and verdict.rank == 0 and verdict.host == "vh2"
        assert "rank 0 (pid 4242 on host vh2) died in iteration 3 of allreduce_sgd" in verdict.message
        assert verdict.message.endswith("; then: rank 1 was stopped (ended after it)")

        # DONE, then the end of the connection: finished, not dead. A new connection of a rank
        # replaces its old one.
        finished = threading.Thread(target=_fake_rank, args=(server.url, 0, 1000.0, [
            {"phase": Phase.LOCAL, "iteration": 39, "progress_ago": 0.1},
            {"phase": Phase.DONE, "progress_ago": 0.0}], "vh2"))
        finished.start()
        finished.join()
        assert _until(lambda: 0 in server.snapshot()[2] and read_states(server)[0].phase == Phase.DONE)
        states = read_states(server)
        verdict = dog.check(states, time.monotonic(), server.snapshot()[2])
        assert verdict.kind == "died" and verdict.rank == 1  # rank 1 still counts as dead
        assert dog.check(states[:1], time.monotonic(), {0}) is None  # rank 0 is not


def test_a_real_heartbeat_ships_done_before_its_end_and_an_expected_delay_as_progress():
    with HeartbeatServer(1, "127.0.0.1") as server:
        beat = Heartbeat(server.url, 0)
        assert beat.watched
        beat.report_in()
        beat.algorithm(0)
        beat.iteration(0)
        beat.expect(60.0)  # an injected delay: progress 60 s ahead (a negative age on the wire)
        assert _until(lambda: read_states(server)[0].progress_at > time.monotonic() + 55)
        beat.stage(Phase.DONE)
        beat._sender._drop()  # as if the process ended right after: no further shipping, just the end
        assert server.wait_closed([0], timeout=5)
        (state,) = read_states(server)
        assert state.phase == Phase.DONE and state.pid == os.getpid() and state.host == HERE


def test_strangers_are_not_admitted():
    with HeartbeatServer(2, "127.0.0.1") as server:
        address, port, key = heartbeat_net.parse_url(server.url)
        for hello in ({"key": "wrong", "rank": 0, "pid": 1, "host": "x"}, {"key": key, "rank": 2, "pid": 1, "host": "x"},
                      {"key": key, "rank": "0", "pid": 1, "host": "x"}):
            with socket.create_connection((address, port), timeout=5) as sock:
                sock.sendall((json.dumps(hello) + "\n").encode() + bytes(64))
                sock.settimeout(5)
                assert sock.recv(1) == b""  # dropped: the server closed it
        with socket.create_connection((address, port), timeout=5) as sock:
            sock.sendall(b"x" * (heartbeat_net.HELLO_MAX + 10))  # no hello line at all
            sock.settimeout(5)
            assert sock.recv(1) == b""
        table, hosts, closed = server.snapshot()
        assert not table.any() and hosts == [None, None] and closed == {}


def test_a_rank_that_cannot_reach_the_watchdog_warns_once_and_runs_unwatched(monkeypatch, capsys):
    monkeypatch.setattr(heartbeat_net, "CONNECT_S", 0.5)
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # nothing listens there
    t0 = time.monotonic()
    beat = Heartbeat(f"tcp://127.0.0.1:{port}/key", 3)
    assert time.monotonic() - t0 < 5
    assert not beat.watched
    beat.report_in()
    beat.stage(Phase.DONE)  # no-ops
    beat.close()
    err = capsys.readouterr().err
    assert err.count("warning:") == 1, err
    assert f"rank 3 on host {HERE} cannot reach the watchdog at 127.0.0.1:{port}" in err
    assert "this rank runs unwatched" in err and ADDRESS_ENV in err
    assert not Heartbeat("file:///tmp/x", 0).watched  # a malformed address: the same, with its reason
    assert "expected tcp://ADDRESS:PORT/KEY" in capsys.readouterr().err


def test_the_watchdog_address(monkeypatch, capsys):
    monkeypatch.delenv(ADDRESS_ENV, raising=False)
    assert watchdog_address(all_here=True) == "127.0.0.1"
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "10.1.2.3")
    assert watchdog_address(all_here=False) == "10.1.2.3"
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "127.0.1.1")  # Debian's /etc/hosts
    assert watchdog_address(all_here=False) == "127.0.1.1"
    assert "a loopback address other hosts cannot reach" in capsys.readouterr().err
    monkeypatch.setenv(ADDRESS_ENV, "192.0.2.7")
    assert watchdog_address(all_here=True) == "192.0.2.7"
    # An address that is not this host's own (a forwarded one): listen on every interface.
    with HeartbeatServer(1, "192.0.2.7") as server:
        assert server.url.startswith("tcp://192.0.2.7:")
    for url in ("tcp://[::1]:5/k", "tcp://h:5/k"):
        assert heartbeat_net.parse_url(url)[1:] == (5, "k")
    assert heartbeat_net.parse_url("tcp://[::1]:5/k")[0] == "::1"
    with pytest.raises(ValueError, match="expected tcp://ADDRESS:PORT/KEY"):
        heartbeat_net.parse_url("tcp://h/k")


# --- where ranks start ---------------------------------------------------------------------------------


def test_hydra_placement_fills_slots_in_order_and_wraps_around(tmp_path):
    assert hydra_placement([("a", 2), ("b", 1)], 3) == ["a", "a", "b"]
    assert hydra_placement([("a", None), ("b", None), ("c", None)], 2) == ["a", "b"]  # no slots: 1 each
    assert hydra_placement([("a", 2), ("b", None)], 7) == ["a", "a", "b", "a", "a", "b", "a"]  # more ranks
    hosts = tmp_path / "hosts"
    hosts.write_text("vh1:1  # first\nvh2:2\n")
    assert Launch.choose("mpiexec", hosts).rank_hosts(5) == ["vh1", "vh2", "vh2", "vh1", "vh2"]
    assert read_hosts(hosts) == [("vh1", 1), ("vh2", 2)]


@pytest.mark.subprocess
def test_slurm_placement_from_the_allocation(monkeypatch, tmp_path):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text('#!/bin/sh\n[ "$1 $2 $3" = "show hostnames n[1-3]" ] && printf "n1\\nn2\\nn3\\n"\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "3")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-3]")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x2),1")
    assert Launch.choose("slurm").rank_hosts(5) == ["n1", "n1", "n2", "n2", "n3"]
    monkeypatch.delenv("SLURM_TASKS_PER_NODE")
    assert Launch.choose("slurm").rank_hosts(2) == [None, None]  # unknown: "host unknown"
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    assert Launch.choose("slurm").rank_hosts(2) == [HERE, HERE]


# --- whole jobs under real mpiexec ---------------------------------------------------------------------


def _left_running(marker: str, wait_s: float = 5.0) -> list[str]:
    """Processes mentioning ``marker`` that are still there after at most ``wait_s`` (processes
    just killed may take a moment to go on a loaded machine; leftovers stay)."""
    _until(lambda: not processes_mentioning(marker), wait_s)
    return processes_mentioning(marker)


def test_only_the_launchers_descendants_count_as_its_local_ranks():
    # A host name alone could match another pid namespace's process (a container, a virtual host).
    assert descends_from(os.getpid(), os.getppid()) and descends_from(os.getpid(), os.getpid())
    assert not descends_from(os.getppid(), os.getpid())
    assert not descends_from(2 ** 22 + 12345, os.getpid())  # no such process


@pytest.mark.parametrize("ranks, local", [(3, ()), (4, (0, 2))], ids=["all-remote", "mixed"])
@pytest.mark.mpi
def test_a_stuck_verdict_on_ranks_of_other_hosts_ends_the_job(tmp_path, monkeypatch, ranks, local):
    """The ranks ``local`` are taken for this host's, the others for ranks on other hosts: the
    local ones get SIGINT at once, every rank gets it through mpiexec, and the job ends."""
    from harness.commands.run_directory import create_run_dir
    from harness.scenario import load_scenario
    from harness.watchdog import supervision as watchdog  # the module whose descends_from is patched

    data = _scenario(ranks=ranks, faults=[{"kind": "hang", "rank": 1, "at_iteration": 3}])
    scenario = load_scenario(write_scenario_file(tmp_path, data))
    run_dir = create_run_dir(scenario, str(tmp_path / "out"))
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_HEARTBEAT"}
    with HeartbeatServer(ranks, "127.0.0.1") as server:
        monkeypatch.setattr(watchdog, "descends_from", lambda pid, ancestor: pid in {
            st.pid for st in read_states(server) if st.rank in local})
        proc = start_ranks(ranks, [sys.executable, "-m", "harness.runner.worker", str(run_dir.path)],
                           env={**env, "HARNESS_HEARTBEAT": server.url}, capture=True)
        try:
            stops = []

            def stop(proc, reported_in, remote=False):
                stops.append((time.monotonic(), set(reported_in), remote))
                stop_job(proc, reported_in, remote=remote)

            rc, verdict = supervise(proc, server, JobJudge(scenario, time.monotonic()), stop,
                                    here=HERE if local else "elsewhere")
            ended = time.monotonic()
            pids = {st.rank: st.pid for st in read_states(server)}
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                stop_job(proc)
    assert verdict is not None and verdict.kind == "stuck" and verdict.rank == 1, err[-3000:]
    assert re.search(rf"rank 1 \(pid \d+ on host {re.escape(HERE)}\) made no progress for [\d.]+ s in iteration 3 "
                     "of allreduce_sgd", verdict.message)
    (stopped_at, reported_in, remote), = stops
    assert reported_in == {pids[r] for r in local} and remote
    print(f"\nstopped through mpiexec in {ended - stopped_at:.1f} s (rc {rc})", file=sys.stderr)
    assert rc != 0 and ended - stopped_at < 10, (rc, ended - stopped_at)
    assert not _left_running(str(run_dir.path)), "ranks left running"


@pytest.mark.parametrize("ranks", [3])
@pytest.mark.mpi
def test_ranks_the_user_starts_are_watched_by_rank_0(tmp_path, ranks):
    """``mpiexec -n 3 python -m harness run FILE`` with a hang: rank 0's watchdog names the rank
    and aborts the job soon after the stall timeout; run.json says why."""
    data = _scenario(ranks=ranks, faults=[{"kind": "hang", "rank": 2, "at_iteration": 3}])
    t0 = time.monotonic()
    proc = harness_cli("run", str(write_scenario_file(tmp_path, data)), "--out", str(tmp_path / "out"), timeout=90,
                       prefix=[str(mpiexec_path()), "-n", str(ranks)])
    took = time.monotonic() - t0
    # MPI_Abort(world, 1): mpiexec ends with its code. (MPICH's own "application called MPI_Abort"
    # line is not checked: the aborting rank writes it just before it tells Hydra, and Hydra may
    # kill the job before it has read it. The watchdog's verdict comes out before that.)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    match = re.search(rf"error: watchdog: rank 2 \(pid \d+ on host {re.escape(HERE)}\) made no progress for ([\d.]+) s "
                      r"in iteration 3 of allreduce_sgd \(local work .*?\); timeout stall_timeout_s = 2 s;.*"
                      r"faults\[0\] hang\); aborting the MPI job", proc.stderr)
    assert match, proc.stderr[-3000:]
    assert 2 <= float(match.group(1)) < 2 + 2, proc.stderr[-3000:]  # judged every 0.5 s
    (run,) = (tmp_path / "out" / "netdog").iterdir()
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "failed" and meta["fault"]["kind"] == "stuck" and meta["fault"]["host"] == HERE, meta
    assert not _left_running(str(run)), "ranks left running"
    assert took < 60, took


_RAISING_SCRIPT = '''
import torch
import harness.api as hx

with hx.Run(algorithm="allreduce_sgd", iterations=8, batch_size=8) as run:
    model = torch.nn.Linear(4, 2)
    opt = hx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
    for t in range(run.iterations):
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()  # the forward pass begins iteration t
        if t == 3 and run.rank == 1:
            raise RuntimeError("the script's own bug")
        loss.backward()
        opt.step()
'''


@pytest.mark.mpi
def test_a_rank_that_raises_is_named_with_its_host(tmp_path):
    """FAILED is shipped before the rank aborts the job, so the verdict is "raised", not "died"."""
    (tmp_path / "train.py").write_text(_RAISING_SCRIPT)
    proc = harness_cli("launch", "-n", "3", str(tmp_path / "train.py"), timeout=120, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "RuntimeError: the script's own bug" in proc.stderr
    assert re.search(rf"error: .*train.py: rank 1 \(pid \d+ on host {re.escape(HERE)}\) raised an error in "
                     r"iteration 3 of train \(its traceback is above\)", proc.stderr), proc.stderr[-3000:]


class _AskedFor:
    """A stand-in for a server's lock (a ``threading.Condition``): ``asked`` is set once another
    thread than the one that made it asks for the lock."""

    def __init__(self, condition: threading.Condition) -> None:
        self._condition, self._maker, self.asked = condition, threading.current_thread(), threading.Event()

    def __enter__(self):
        if threading.current_thread() is not self._maker:
            self.asked.set()
        return self._condition.__enter__()

    def __exit__(self, *exc):
        return self._condition.__exit__(*exc)

    def __getattr__(self, name: str):  # wait_for, notify_all: the condition's own
        return getattr(self._condition, name)


def test_ends_are_ordered_as_they_arrived_even_when_the_server_reads_late():
    # A watchdog starved of CPU reads its sockets late, and a socket with unread rows is queued for
    # reading before one whose process ended later. The order of the ends must still be the order
    # in which they arrived. Rank 0 keeps sending rows while the server is held up; rank 1's
    # process ends; then rank 0's. Rank 1 ended first.
    with HeartbeatServer(2, "127.0.0.1") as server:
        socks = []
        for rank in (0, 1):
            address, port, key = heartbeat_net.parse_url(server.url)
            sock = socket.create_connection((address, port), timeout=10)
            sock.sendall((json.dumps({"key": key, "rank": rank, "pid": 4242 + rank, "host": "here"}) + "\n").encode())
            socks.append(sock)
        assert _until(lambda: all(h is not None for h in server.snapshot()[1]))
        row = [0.0] * FIELDS
        row[Field.PID], row[Field.PHASE], row[Field.PROGRESS_AT] = 4242.0, float(Phase.LOCAL), 0.0
        # Each step waits for its signal: the server thread asking for the table's lock (it then
        # has rank 0's first row in hand), and the server's end watch holding each end (peeked:
        # the watch is level-triggered, a poll takes nothing from it; the server thread is held up).
        lock = server._changed = _AskedFor(server._changed)
        queued_ends = lambda: [conn.rank for conn in server._ends.ended()]  # noqa: E731
        with lock:  # holds the server thread up as soon as it has rows to store
            socks[0].sendall(heartbeat_net._ROW.pack(*row))
            assert lock.asked.wait(10), "the server thread never came to store rank 0's row"
            socks[0].sendall(heartbeat_net._ROW.pack(*row))  # unread rows: rank 0's socket is queued first
            socks[1].close()
            assert _until(lambda: queued_ends() == [1]), queued_ends()
            socks[0].close()
            assert _until(lambda: queued_ends() == [1, 0]), queued_ends()
        assert server.wait_closed([0, 1], timeout=5)
        closed = server.snapshot()[2]
        assert closed[1] < closed[0], closed
