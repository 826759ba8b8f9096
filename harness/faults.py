"""Injected faults at run time (the scenario's ``faults:``): what this rank does, and when.

A fault is part of the experiment, like a straggler: ``kill`` ends the process with SIGKILL
(nothing is flushed or cleaned up, as after an out-of-memory kill or a node failure),
``hang`` stops the training loop while the process and its progress thread stay alive, and
``slow_start`` makes the rank report in late. What the user then sees is the watchdog's and
the launcher's business (``harness.runner.watchdog``), not this module's.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from harness.scenario.schema import HangFault, KillFault, Scenario, SlowStartFault


class FaultPlan:
    """The faults of one rank. ``enabled=False`` (a resumed run) injects none."""

    def __init__(self, scenario: Scenario, rank: int, enabled: bool = True) -> None:
        mine = [f for f in scenario.faults if f.rank == rank] if enabled else []
        first = scenario.algorithms[0].name
        self.start_delay_s = sum(f.delay_s for f in mine if isinstance(f, SlowStartFault))
        # (algorithm, iteration) -> the fault striking there; the first listed wins.
        self._strikes: dict[tuple[str, int], KillFault | HangFault] = {}
        for f in mine:
            if isinstance(f, (KillFault, HangFault)):
                self._strikes.setdefault((f.algorithm or first, f.at_iteration), f)

    def __bool__(self) -> bool:
        return bool(self.start_delay_s or self._strikes)

    def delay_start(self) -> None:
        """``slow_start``: sleep before the rank reports in."""
        if self.start_delay_s > 0:
            time.sleep(self.start_delay_s)

    def at_iteration(self, algorithm: str, iteration: int) -> None:
        """Called at the start of every iteration: strike if a fault is due here."""
        fault = self._strikes.get((algorithm, iteration))
        if fault is None:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        if isinstance(fault, KillFault):
            from harness.runner.heartbeat_net import flush_all

            flush_all()  # the watchdog gets the row of this iteration, not one up to 0.2 s older
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # hang: sleep (never spin) until the watchdog or Ctrl+C stops the job
            time.sleep(3600)
