"""The kernel's shaping of a link on the virtual-host test bed (:mod:`harness.testing.vhosts`, used
by ``tests/test_vhosts.py`` and ``bench agreement``'s ``kernel_shaping`` case): two ranks on two
virtual hosts, vh2's link shaped by ``tc tbf``, against the native layer's emulation of the same
link and the simulator's replay of it."""

from __future__ import annotations

import csv
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.testing.real_runs import CaseFailed, run_dirs, succeeded
from harness.testing.vhosts.bed import harness_on_vh1, vhost_scenario

SHAPED_MBIT = 100  # one virtual host's link, both ways: 400 kB messages take 32 ms each way
#: The least time per iteration at SHAPED_MBIT: one 400 kB message each way (the ranks' exchange).
SHAPED_LEAST_S = 100_000 * 4 * 8 / (SHAPED_MBIT * 1e6)


def shape_link(rate_mbit: int | None) -> None:
    """tbf on vh2's link, both directions (its eth0, and the switch port towards it); None: off.
    The bucket holds 16 kB, little more than the 12.5 kB one timer tick sends at 100 Mb/s: a
    bucket that fills up while the ranks compute lets the next message's first bytes through at
    the full speed of the veth pair (64 kB took 5 ms off every 35 ms iteration), which no link
    of the emulator or the simulator does."""
    for ns, dev in (("harness-vh2", "eth0"), ("harness-vswitch", "vh2-port")):
        subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], capture_output=True)
        if rate_mbit is not None:
            subprocess.run(
                [
                    "tc",
                    "-n",
                    ns,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    f"{rate_mbit}mbit",
                    "burst",
                    "16kb",
                    "latency",
                    "200ms",
                ],
                check=True,
                capture_output=True,
            )


@dataclass
class ShapingTimes:
    """Median time per iteration (s) of one 2-host run with vh2's link shaped by the kernel, of
    the same run with the link emulated by the native layer, and of compare's trace-driven
    simulation of the emulated run; the calibration (of the two hosts) and compare's output."""

    kernel_s: float
    native_s: float
    simulated_s: float
    calibration: Path
    compare_output: str


def _iteration_s(run: Path) -> float:
    with open(run / "summary.csv", newline="") as f:
        return float(next(csv.DictReader(f))["iter_time_median_s"])


def kernel_shaping_times(
    out: Path, harness: Callable[..., subprocess.CompletedProcess] = harness_on_vh1, iterations: int = 40
) -> ShapingTimes:
    """Calibrate vh1 and vh2 (``calibrate --hosts --quick``), run 2 ranks on them with vh2's link
    shaped by the kernel (``tbf``, :data:`SHAPED_MBIT`) and again emulated by the native layer,
    and compare the emulated run (trace-driven); every command through ``harness`` on vh1."""
    out.mkdir(parents=True, exist_ok=True)
    if any((out / d).exists() for d in ("shaped", "emulated")):
        raise CaseFailed(f"{out} holds the runs of an earlier measurement: give an empty directory")
    hosts = out / "hosts"
    hosts.write_text("vh1:1\nvh2:1\n")

    def scenario_file(name: str, **extra: Any) -> Path:
        path = out / f"{name}.yaml"
        path.write_text(yaml.safe_dump(vhost_scenario(2, name=name, iterations=iterations, **extra), sort_keys=False))
        return path

    def only_run(root: Path, name: str) -> Path:
        runs = sorted(run_dirs(root / name))
        if len(runs) != 1:
            raise CaseFailed(f"expected one run directory in {root / name}, found {runs}")
        return runs[0]

    calibration = out / "calibration.json"
    succeeded(
        harness(
            "calibrate",
            "--hosts",
            str(hosts),
            "--ranks",
            "2",
            "--quick",
            "--output",
            str(calibration),
            "--scenario",
            str(scenario_file("vhcal")),
        )
    )
    shape_link(SHAPED_MBIT)
    try:
        succeeded(harness("run", str(scenario_file("vhshaped")), "--hosts", str(hosts), "--out", str(out / "shaped")))
    finally:
        shape_link(None)
    emulated = scenario_file("vhemulated", network={"links": [{"rank": 1, "bandwidth_gbps": SHAPED_MBIT / 1000}]})
    succeeded(harness("run", str(emulated), "--hosts", str(hosts), "--out", str(out / "emulated")))
    emulated_run = only_run(out / "emulated", "vhemulated")
    proc = succeeded(harness("compare", str(emulated_run), "--calibration", str(calibration), "--mode", "trace"))
    import pandas as pd  # noqa: PLC0415  (compare.csv only: the CLI imports this module at start-up)

    table = pd.read_csv(emulated_run / "compare.csv")
    simulated = float(table[table["mode"] == "trace"]["predicted_iter_s"].iloc[0])
    return ShapingTimes(
        _iteration_s(only_run(out / "shaped", "vhshaped")),
        _iteration_s(emulated_run),
        simulated,
        calibration,
        proc.stdout + proc.stderr,
    )
