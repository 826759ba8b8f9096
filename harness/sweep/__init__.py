"""Sweeps: one command runs a scenario at every point of a grid of overrides.

``python -m harness simulate FILE --sweep imbalance.0.delay_ms=range(0,641,160) --sweep ranks=16,64``
(or ``run``, or ``sbatch`` for a SLURM job array) validates every point, then runs each into a
directory of its own and writes ``sweep.csv``, ``sweep.png`` and ``report.html`` beside them.
The modules, one job each:

- ``grid``: the points (every combination of the ``--sweep`` values, Hydra's sweep syntax);
- ``store``: the sweep directory (``sweep.json``, a run directory, log and status per point);
- ``execute``: validating, running the points (simulated ones in parallel), resuming;
- ``table``: ``sweep.csv`` and ``sweep.png``;
- ``page``: the sweep's ``report.html``.
"""
