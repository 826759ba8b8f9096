"""Scripts that regenerate the papers' key figures from results (``python -m harness figures``).

Each ``fig*.py`` module reads result files only and draws one figure into ``paper_figs/out/``
as ``<name>.png`` plus ``<name>.csv``, the exact data plotted. ``manifest.py`` names which
experiment produces each figure's data; ``style.py`` holds the shared look.
"""
