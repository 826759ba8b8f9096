"""``python -m harness.dist.launched SCRIPT [ARGS]``: one rank of a torch.distributed script under a scenario.

``python -m harness launch --scenario FILE SCRIPT`` starts every rank this way when the scenario
lists no algorithms: the session (:class:`harness.dist.session.ScriptSession`) is set up, then
the script runs unchanged as ``__main__`` (``sys.argv`` and ``sys.path[0]`` as ``python SCRIPT
ARGS`` would have them), then rank 0 writes the results. Needs ``HARNESS_RUN_DIR`` (the run
directory launch created) and ``HARNESS_LABEL``.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from harness.rank_exit import abort_job_after_error


def main(argv: list[str]) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does for several ranks per host (before torch)
    from harness.api.session import ENV_RUN_DIR  # noqa: PLC0415  (torch: after OMP_NUM_THREADS is set)
    from harness.dist.session import ENV_LABEL, ScriptSession  # noqa: PLC0415  (the same)

    if not argv:
        print("usage: python -m harness.dist.launched SCRIPT [ARGS]", file=sys.stderr)
        return 2
    script, args = argv[0], argv[1:]
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir:
        print(f"error: {ENV_RUN_DIR} is unset: start the script with `python -m harness launch --scenario FILE "
              f"{script}`", file=sys.stderr)
        return 2
    session = ScriptSession(Path(run_dir), os.environ.get(ENV_LABEL) or Path(script).stem, script)
    sys.argv = [script, *args]
    sys.path[0] = str(Path(script).resolve().parent)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    except BaseException as exc:
        session.beat.failed(exc)
        if session.world.size > 1 and not isinstance(exc, KeyboardInterrupt):
            abort_job_after_error()  # prints the error; then no peer waits for this rank forever
        raise
    session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
