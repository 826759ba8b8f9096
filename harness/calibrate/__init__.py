"""Calibration of this machine for the simulator (``python -m harness calibrate``).

``measure`` holds the pure parts (what to measure from the scenarios, repetition counts,
statistics, the printed table); ``worker`` is the per-rank MPI program of one calibration
job. The file format is ``harness.sim.calibration``; the command is
``harness.commands.calibrate``.
"""
