"""What a job left running: the live processes whose command line mentions a marker (its run
directory, its scenario file). ``bench faults`` counts them after every case, and the tests of
faults and of the watchdog require there be none."""

from __future__ import annotations

import os

from harness.process_tree import command_line, live_pids


def processes_mentioning(marker: str) -> list[str]:
    """Command lines of live processes (not this one) that mention ``marker`` (a run directory,
    a scenario file): what a job left running."""
    lines = (command_line(pid) for pid in live_pids() if pid != os.getpid())
    return [line for line in lines if line is not None and marker in line]
