"""What a job left running: the live processes whose command line mentions a marker (its run
directory, its scenario file). ``bench faults`` counts them after every case, and the tests of
faults and of the watchdog require there be none."""

from __future__ import annotations

import os
from pathlib import Path


def processes_mentioning(marker: str) -> list[str]:
    """Command lines of live processes (not this one) that mention ``marker`` (a run directory,
    a scenario file): what a job left running."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(cmdline)
    return found
