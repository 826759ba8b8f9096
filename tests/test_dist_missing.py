"""A rank that never posts the collective its peers wait in, under a bare ``mpiexec`` (harness.dist.mismatch).

No launch, no watchdog: the backend's watch names the rank that never posted, the operation and
the evidence that it never will (it finished, or it waits in an operation that cannot complete),
and ends the job (about 2 s here, measured, not asserted); a straggler that only sleeps is not named.
Under ``launch`` the rank named reports it itself, so the watchdog's verdict is about it. The
rest checks the evidence rules on hand-made states.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from harness.dist.mismatch import AFTER_S, TICK_S
from harness.dist.missing import verdict, why
from harness.dist.missing_look import NOTE_AFTER_S, MissingLook
from harness.dist.watch_store import WatchStore
from harness.launch import run_ranks

# A regression hangs: the job is stopped here. How soon the rank is named (about 2 s here: the
# 1 s pending threshold and a look or two) is measured, not asserted: a loaded machine stretches it.
HANG_S = 120
STRAGGLE_S = AFTER_S + 3 * TICK_S  # past the pending threshold and the watch's looks at it

SCRIPT = """
import sys
import time

import torch
import torch.distributed as dist

import harness.dist  # noqa: F401  registers the backend; env:// from MPI

case, odd = sys.argv[1], int(sys.argv[2])  # what the rank that goes astray does, and its rank
dist.init_process_group("harness")
rank, size = dist.get_rank(), dist.get_world_size()
sub = dist.new_group([r for r in range(size) if r != 0])  # ranks 1.. (rank 1 alone at 2 ranks)
t = torch.ones(16)
STEPS, ASTRAY = 6, 4
last = STEPS - 1 if case == "skip" else ASTRAY  # where the others wait for ever
for i in range(STEPS):
    if rank == odd and i == ASTRAY:
        if case == "skip":
            continue
        if case == "return":
            dist.destroy_process_group()
            time.sleep(60)  # other work: the destroyed group alone is the evidence
            break
        if case == "group":
            dist.all_reduce(t, group=sub)
        if case == "recv":
            dist.recv(t, src=(odd + 1) % size)
        if case == "straggler":  # an operation pending while it sleeps, on a group its peer waits elsewhere
            pending = dist.all_reduce(torch.ones(4), group=sub, async_op=True)
            time.sleep(float(sys.argv[3]))
    if rank != odd and i == last:
        print(f"waits at {time.time():.3f}", flush=True)
    dist.all_reduce(t)
    if case == "straggler" and i == ASTRAY:
        if rank == odd:
            pending.wait()
        elif rank in dist.get_process_group_ranks(sub):
            dist.all_reduce(torch.ones(4), group=sub)
print(f"finished {rank}", flush=True)
"""


def _run(tmp_path, ranks: int, *args: str) -> subprocess.CompletedProcess:
    """The script on ``ranks`` ranks: what it did."""
    (tmp_path / "astray.py").write_text(SCRIPT)
    return run_ranks(ranks, [sys.executable, str(tmp_path / "astray.py"), *args], timeout=HANG_S, capture=True)


@pytest.mark.mpi
@pytest.mark.parametrize("case, ranks, odd, message", [
    # the last collective's peers wait for ever; rank 0, which holds the store, names itself at exit
    ("skip", 2, 0, "rank 0 never posted collective #5 of group default_pg [0 1] (all_reduce on 16 float32 elements) "
                   "that rank 1 waits in: rank 0 has finished the script (the interpreter is exiting)"),
    ("skip", 3, 1, "rank 1 never posted collective #5 of group default_pg [0 1 2] (all_reduce on 16 float32 "
                   "elements) that ranks 0 and 2 wait in: rank 1 has finished the script (the interpreter is exiting)"),
    ("return", 2, 1, "rank 1 never posted collective #4 of group default_pg [0 1] (all_reduce on 16 float32 elements) "
                     "that rank 0 waits in: rank 1 has finished the script (destroy_process_group)"),
    ("group", 3, 1, "rank 1 never posted collective #4 of group default_pg [0 1 2] (all_reduce on 16 float32 elements) "
                    "that ranks 0 and 2 wait in: rank 1 is waiting in collective #0 of group 1 [1 2] (all_reduce on 16 "
                    "float32 elements) since * s, which rank 2 never posted: rank 2 is waiting in the collective "
                    "rank 1 never posted (a deadlock)"),
    ("recv", 2, 1, "rank 1 never posted collective #4 of group default_pg [0 1] (all_reduce on 16 float32 elements) "
                   "that rank 0 waits in: rank 1 is waiting in a recv of message #0 from rank 0 to rank 1 (tag 0: 16 "
                   "float32 elements) since * s, which rank 0 never sent: rank 0 is waiting in the collective rank 1 "
                   "never posted (a deadlock)"),
])
def test_a_missing_collective_is_named_under_bare_mpiexec(tmp_path, case, ranks, odd, message):
    proc = _run(tmp_path, ranks, case, str(odd))
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    pattern = re.escape(f"error: {message}").replace(r"\*", r"[\d.]+")
    assert len(re.findall(pattern, proc.stderr)) == 1, proc.stderr[-3000:]  # named once, by one rank
    assert re.findall(r"finished (\d)", proc.stdout) in ([], [str(odd)])  # the ranks that wait never finish


@pytest.mark.mpi
def test_a_straggler_is_not_named(tmp_path):
    """Rank 1 sleeps past the pending threshold with an operation of another group pending (rank
    2 waits in the default group's, which rank 1 has not posted): it is not waiting, so nothing
    shows it never will; it posts, and the job completes."""
    proc = _run(tmp_path, 3, "straggler", "1", str(STRAGGLE_S))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "never posted" not in proc.stderr and "error:" not in proc.stderr, proc.stderr[-3000:]
    assert sorted(re.findall(r"finished (\d)", proc.stdout)) == ["0", "1", "2"]


RETURNS_EARLY = """
import torch
import torch.distributed as dist

dist.init_process_group("harness")
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    if dist.get_rank() == 1 and step == 3:
        break  # returns early, without destroy_process_group: rank 0 waits in its next all_reduce
    model(torch.ones(2, 4)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    optimizer.step()
    optimizer.zero_grad()
"""


@pytest.mark.mpi
def test_under_launch_the_rank_that_returned_is_named_by_the_watchdog_too(tmp_path):
    """The session notes when the script returned; the rank that returned names itself, so the
    watchdog's verdict is about it, not about the rank left waiting."""
    import yaml
    from conftest import harness_cli

    (tmp_path / "early.py").write_text(RETURNS_EARLY)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "missing", "ranks": 2,
                                                     "workload": {"batch_size": 1, "iterations": 6}}))
    proc = harness_cli("launch", "--scenario", "s.yaml", "--out", "out", "early.py", cwd=tmp_path, timeout=HANG_S)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert ("error: rank 1 never posted collective #6 of group default_pg [0 1] (all_reduce on 4 float32 elements) "
            "that rank 0 waits in: rank 1 has finished the script (it returned)") in proc.stderr, proc.stderr[-3000:]
    verdict = r"rank 1 \(pid \d+[^)]*\) raised an error in iteration \d+ of early"  # the watchdog's
    assert re.search(verdict, proc.stderr), proc.stderr[-3000:]


# -- the evidence, on hand-made states -------------------------------------------------------------
def _collective(place: int, group: str = "g [0 1 2]", ranks=(0, 1, 2), op: str = "all_reduce", age: float = 5.0,
                root: int = -1) -> dict:
    return {"kind": "c", "group": group, "ranks": list(ranks), "place": str(place), "op": op, "dtype": "float32",
            "count": 4, "root": root, "age": age}


def _state(rank: int, counts: dict, blocked: dict | None = None, end: str | None = None, stuck=(), gone=(),
           sent=(), received=()) -> dict:
    return {"rank": rank, "seq": 1, "end": end, "gone": list(gone), "counts": counts, "sent": list(sent),
            "received": list(received), "stuck": list(stuck), "blocked": blocked}


def _why(states: dict, q: int, x: dict):
    chain = why(states.get, q, x, AFTER_S, [], set())
    return chain, (verdict(states.get, chain) if chain else None)


def _look(rank: int) -> MissingLook:
    return MissingLook(rank, WatchStore(), lambda message: None, AFTER_S, TICK_S)


def test_only_evidence_names_a_rank():
    x = _collective(7)
    waiting = {0: _state(0, {"g [0 1 2]": 8}, blocked=x, stuck=[x]), 2: _state(2, {"g [0 1 2]": 8}, stuck=[x])}
    # computing or sleeping (its main thread in no wait of the backend): it may still post it
    assert _why({**waiting, 1: _state(1, {"g [0 1 2]": 7})}, 1, x)[0] is None
    # it posted it already (a slow link, a state not yet read): never named
    assert _why({**waiting, 1: _state(1, {"g [0 1 2]": 8}, end="exit")}, 1, x)[0] is None
    # it finished: named, with the ranks that wait
    _, (culprit, op, message) = _why({**waiting, 1: _state(1, {"g [0 1 2]": 7}, end="destroy_process_group")}, 1, x)
    assert (culprit, op["place"]) == (1, "7")
    assert message == ("rank 1 never posted collective #7 of group g [0 1 2] (all_reduce on 4 float32 elements) that "
                       "ranks 0 and 2 wait in: rank 1 has finished the script (destroy_process_group)")
    _, (_, _, message) = _why({**waiting, 1: _state(1, {}, gone=["g [0 1 2]"])}, 1, x)
    assert message.endswith("rank 1 has destroyed group g [0 1 2] (destroy_process_group)")


def test_a_wait_is_evidence_only_when_it_cannot_complete():
    x = _collective(7)
    other = _collective(0, group="h [1 2]", ranks=(1, 2))
    states = {0: _state(0, {"g [0 1 2]": 8}, blocked=x, stuck=[x]), 2: _state(2, {"g [0 1 2]": 8}, stuck=[x]),
              1: _state(1, {"g [0 1 2]": 7, "h [1 2]": 1}, blocked=other, stuck=[other])}
    # rank 2 computes (its wait in x is an async operation): rank 1's wait in h may still complete
    assert _why(states, 1, x)[0] is None
    # rank 2 waits in x, which needs rank 1: a deadlock, named after the collective most ranks wait in
    states[2] = _state(2, {"g [0 1 2]": 8}, blocked=x, stuck=[x])
    _, (culprit, op, message) = _why(states, 1, x)
    assert (culprit, op["group"]) == (1, "g [0 1 2]")
    assert "rank 1 is waiting in collective #0 of group h [1 2] (all_reduce on 4 float32 elements) since 5.0 s, " \
           "which rank 2 never posted: rank 2 is waiting in the collective rank 1 never posted (a deadlock)" in message
    # found from rank 2's side (it never posted h #0, which rank 1 waits in), the same rank is named
    assert _why(states, 2, other)[1][0] == 1
    # a wait younger than the pending threshold is no evidence yet
    states[1] = _state(1, {"g [0 1 2]": 7}, blocked=_collective(0, group="h [1 2]", ranks=(1, 2), age=AFTER_S / 2))
    assert _why(states, 1, x)[0] is None
    # a rooted collective surely needs only its root: rank 1 waits in a broadcast from itself
    states[1] = _state(1, {"g [0 1 2]": 7}, blocked=_collective(0, group="h [1 2]", ranks=(1, 2), op="broadcast",
                                                                 root=1))
    assert _why(states, 1, x)[0] is None
    # a chain that ends in a rank that finished names that rank
    states[1] = _state(1, {"g [0 1 2]": 7, "h [1 2]": 1}, blocked=other)
    states[2] = _state(2, {"g [0 1 2]": 8}, end="exit")
    _, (culprit, op, message) = _why(states, 1, x)
    assert (culprit, op["group"]) == (2, "h [1 2]")
    assert message.startswith("rank 2 never posted collective #0 of group h [1 2] (all_reduce on 4 float32 elements) "
                              "that rank 1 waits in: rank 2 has finished the script (the interpreter is exiting); "
                              "rank 1, waiting in it, cannot post collective #7 of group g [0 1 2]")


def test_a_receive_waits_for_its_send():
    x = _collective(4, group="g [0 1]", ranks=(0, 1))
    recv = {"kind": "m", "op": "recv", "src": 0, "dst": 1, "tag": 0, "n": 0, "dtype": "float32", "count": 4, "age": 3.0}
    states = {0: _state(0, {"g [0 1]": 5}, blocked=x, stuck=[x]),
              1: _state(1, {"g [0 1]": 4}, blocked=recv, received=[[0, 0, 1]])}
    _, (culprit, _, message) = _why(states, 1, x)
    assert culprit == 1 and "which rank 0 never sent" in message
    # rank 0 had sent it (the receive is only slow): no evidence
    states[0] = _state(0, {"g [0 1]": 5}, blocked=x, stuck=[x], sent=[[1, 0, 1]])
    assert _why(states, 1, x)[0] is None


def test_a_long_wait_for_a_rank_that_is_not_waiting_is_a_note(capsys):
    x = _collective(7, age=NOTE_AFTER_S + 1)
    states = {0: _state(0, {"g [0 1 2]": 8}, blocked=x, stuck=[x]), 2: _state(2, {"g [0 1 2]": 8}, stuck=[x]),
              1: _state(1, {"g [0 1 2]": 7})}
    _look(2)._note(states.get, 1, x)  # by the lowest rank that waits ...
    look = _look(0)  # ... once
    look._note(states.get, 1, x)
    look._note(states.get, 1, x)
    err = capsys.readouterr().err
    assert err.count("note: ") == 1 and "error" not in err
    assert err.startswith("note: rank 0 has waited 61 s in collective #7 of group g [0 1 2] (all_reduce on 4 float32 "
                          "elements), which rank 1 has not posted; rank 1 is not waiting in an operation of the "
                          "harness backend (it computes, sleeps or waits elsewhere): if it never posts it, it "
                          "skipped it")
