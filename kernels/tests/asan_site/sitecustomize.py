"""Loads the instrumented native module in place of the installed one (.ci/native_checks.sh).

The sanitizer build of ``harness._core`` lives in a build directory of its own, so the venv's
module stays as ``pip install -e .`` built it. The editable install maps ``harness._core`` to
the venv's file with a finder at the front of ``sys.meta_path``, which a ``PYTHONPATH`` entry
cannot shadow; this file (first on ``PYTHONPATH``, imported at interpreter start by ``site``)
puts a finder in front of it that answers ``harness._core`` with ``$HARNESS_CORE_OVERRIDE``.
Every rank the launcher starts inherits the environment, so all of them load the same module.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_PATH = os.environ.get("HARNESS_CORE_OVERRIDE")


class _InstrumentedCore:
    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname != "harness._core":
            return None
        return importlib.util.spec_from_file_location(fullname, _PATH)


if _PATH:
    if not os.path.isfile(_PATH):
        raise SystemExit(f"HARNESS_CORE_OVERRIDE={_PATH}: no such file")
    sys.meta_path.insert(0, _InstrumentedCore())
