"""The run's common clock (harness.runner.clock): the offset arithmetic, and real ranks whose
clocks are seconds apart.

The arithmetic is tested on made-up exchanges with a known offset. Under real mpiexec
(tests/mpi/clock_checks.py) some ranks run in a Linux time namespace whose CLOCK_MONOTONIC is
shifted by whole seconds and whose host name differs (``unshare --time --uts``, so root), the
way ranks on other hosts would see the world; those tests skip, saying why, where that cannot
be done.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import MPI_DIR, mpi_check_suite
from harness.runner.clock import REFERENCE, Clock, Estimate, best_exchange, drift, exchange_offsets, host_offsets

SCRIPT = "clock_checks.py"

# --- the arithmetic ---------------------------------------------------------------------------


def exchanges(true_offset: float, t_ref: np.ndarray, there_s: np.ndarray, back_s: np.ndarray) -> np.ndarray:
    """Rows (t_send, t_ref, t_recv) of a rank whose clock is ``true_offset`` ahead of rank 0's:
    each ping took ``there_s`` to reach rank 0, which read ``t_ref``, and the answer ``back_s``."""
    return np.column_stack([t_ref - there_s + true_offset, t_ref, t_ref + back_s + true_offset])


def test_symmetric_legs_give_the_offset_exactly():
    t_ref = np.array([100.0, 100.5, 101.0])
    legs = np.array([1e-4, 3e-4, 2e-5])
    offsets, trips = exchange_offsets(exchanges(-7.25, t_ref, legs, legs))
    assert offsets == pytest.approx(-7.25, abs=1e-9)
    assert trips == pytest.approx(2 * legs)


def test_the_exchange_with_the_smallest_round_trip_is_kept():
    # A slow, lopsided exchange (5 ms out, 10 us back) reads 2.5 ms low; the quick one is exact.
    samples = exchanges(3.0, np.array([10.0, 10.1, 10.2]), np.array([5e-3, 4e-5, 1e-3]), np.array([1e-5, 4e-5, 3e-3]))
    best = best_exchange(samples)
    assert best == Estimate(pytest.approx(3.0, abs=1e-9), pytest.approx(8e-5), 10.1, 3)
    assert exchange_offsets(samples)[0][0] == pytest.approx(3.0 - 2.495e-3)


def test_the_error_never_exceeds_half_the_round_trip():
    rng = np.random.default_rng(5)
    for _ in range(200):
        true = rng.uniform(-1e4, 1e4)
        there, back = rng.exponential(1e-4, 20), rng.exponential(1e-4, 20)  # any legs, however lopsided
        best = best_exchange(exchanges(true, np.sort(rng.uniform(0, 60, 20)), there, back))
        assert abs(best.offset_s - true) <= best.round_trip_s / 2 + 1e-9
        assert best.round_trip_s == pytest.approx(min(there + back))


@pytest.mark.parametrize("samples, words", [
    (np.empty((0, 3)), "no clock exchanges"),
    (np.array([[2.0, 1.0, 1.5]]), "t_recv >= t_send"),
    (np.array([[1.0, np.nan, 1.5]]), "finite"),
])
def test_bad_exchanges_are_refused(samples, words):
    with pytest.raises(ValueError, match=words):
        best_exchange(samples)


def test_host_offsets_are_medians_in_rank_order():
    hosts = ["b", "a", "b", "b", "a"]
    assert host_offsets(hosts, [7.0, 0.0, 7.2, 6.9, 1e-6]) == {"b": 7.0, "a": 5e-7}
    assert list(host_offsets(hosts, [0.0] * 5)) == ["b", "a"]
    with pytest.raises(ValueError):
        host_offsets(hosts, [0.0])


def test_drift_is_the_change_per_second_of_rank0s_clock():
    start = [Estimate(0.0, 0.0, 100.0, 0), Estimate(5.0, 1e-5, 100.001, 32)]
    end = [Estimate(0.0, 0.0, 700.0, 0), Estimate(5.0 + 6e-3, 1e-5, 700.001, 32)]
    drift_s, per_s = drift(start, end)
    assert drift_s == pytest.approx([0.0, 6e-3])
    assert per_s == pytest.approx([0.0, 1e-5])  # 10 ppm
    assert drift(start, start) == ([0.0, 0.0], [0.0, 0.0])  # no time between: no rate


class _OneRank:
    def Get_rank(self):
        return 1


def test_run_json_has_the_documented_keys():
    start = [Estimate(0.0, 0.0, 10.0, 0), Estimate(-9.0, 4e-6, 10.0, 32)]
    clock = Clock(_OneRank(), ["a", "b"], start, 32)
    assert clock.offset_s == -9.0
    meta = clock.run_json()
    assert meta["rank_hosts"] == ["a", "b"]
    c = meta["clock"]
    assert c["reference"] == REFERENCE and "Cristian" in c["method"]
    assert c["offsets_s"] == [0.0, -9.0] and c["host_offsets_s"] == {"a": 0.0, "b": -9.0}
    assert c["error_bound_s"] == [0.0, 2e-6]
    assert c["drift_s"] is None and c["drift_per_s"] is None and c["drift_corrected"] is False
    clock.end = [Estimate(0.0, 0.0, 20.0, 0), Estimate(-9.0 + 1e-4, 6e-6, 20.0, 32)]
    c = clock.run_json()["clock"]
    assert c["drift_s"] == pytest.approx([0.0, 1e-4]) and c["drift_per_s"] == pytest.approx([0.0, 1e-5])
    assert c["drift_span_s"] == 10.0 and c["end_error_bound_s"] == [0.0, 3e-6]
    json.dumps(meta, allow_nan=False)  # plain JSON


# --- ranks on clocks seconds apart ------------------------------------------------------------

# Per rank count, the MPMD segments: (ranks, CLOCK_MONOTONIC shift in s, host name; None: as is).
# 2 ranks: rank 0 ahead (negative offsets); 3: two ranks on one shifted "host".
LAYOUTS = {2: [(1, 9, "clock-a"), (1, 0, None)], 3: [(1, 0, None), (2, 7, "clock-b")]}


def _why_clocks_cannot_be_shifted() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "shifting a rank's clock needs root (time and UTS namespaces: unshare --time --uts)"
    unshare = shutil.which("unshare")
    if unshare is None:
        return "no unshare on PATH (util-linux) to shift a rank's clock"
    proc = subprocess.run([unshare, "--time", "--monotonic=1", "--uts", "--fork", "true"], check=False,
                          capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        return f"unshare --time --uts fails here (kernel without time namespaces?): {proc.stderr.strip()}"
    return None


def _command(ranks: int, out: Path) -> list[str]:
    """mpiexec's MPMD command line: ``-n K ARGV : -n K ARGV ...``, shifted segments wrapped."""
    from harness.launch import mpiexec_path

    argv = [sys.executable, "-u", str(MPI_DIR / SCRIPT), str(out), "-v"]
    cmd = [str(mpiexec_path())]
    for i, (n, shift, host) in enumerate(LAYOUTS[ranks]):
        wrap = []
        if shift or host:  # sh renames the host inside the new UTS namespace, then becomes the rank
            wrap = [shutil.which("unshare"), "--time", f"--monotonic={shift}", "--uts", "--fork",
                    "sh", "-c", 'hostname "$1" && shift && exec "$@"', "sh", host]
        cmd += [*([":"] if i else []), "-n", str(n), *wrap, *argv]
    return cmd


def _launch_on_shifted_clocks(ranks: int, tmp: Path) -> dict:
    """One launch of the checks with LAYOUTS[ranks]; skips where clocks cannot be shifted."""
    reason = _why_clocks_cannot_be_shifted()
    if reason is not None:
        pytest.skip(reason)
    from harness.process_tree import stop_job

    out = tmp / "report.json"
    proc = subprocess.Popen(_command(ranks, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        stdout, stderr = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        stop_job(proc)
        pytest.fail(f"{SCRIPT} on {ranks} ranks did not finish in 180 s")
    if proc.returncode != 0 or not out.exists():
        pytest.fail(f"{SCRIPT} on {ranks} ranks exited {proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return json.loads(out.read_text())


TestClockChecks = mpi_check_suite(SCRIPT, sorted(LAYOUTS), checks=5, launch=_launch_on_shifted_clocks,
                                  doc="The clock checks on ranks whose clocks are seconds apart (LAYOUTS).")
