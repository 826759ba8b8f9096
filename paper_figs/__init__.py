"""Scripts that regenerate the papers' key figures from results (``python -m harness figures``).

Each ``fig*.py`` module reads result files only and draws one figure as ``<name>.png`` plus
``<name>.csv``, the exact data plotted (by default under ``results/figures/``, which git
ignores). ``out/`` here is the committed gallery the README shows, written only by
``python -m harness figures --gallery``. ``manifest.py`` names which experiment produces each
figure's data; ``command.py`` is the ``figures`` command (found by ``harness.cli`` through
the ``harness.commands`` entry point); the shared look is the library's, ``harness.report.style``.
"""

from pathlib import Path

GALLERY_DIR = Path(__file__).resolve().parent / "out"
