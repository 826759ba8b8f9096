"""Emulated compute time: a pure function shared by the training loop and the simulator.

With ``workload.compute: {emulate_ms: MS, jitter: SIGMA}`` a rank sleeps, instead of a
forward/backward pass, ``MS * factor * exp(N(0, SIGMA))`` milliseconds, where ``factor`` is the
injected compute factor and the normal draw is a pure function of (seed, iteration, rank), so
the real run and the SimPy model see the very same durations.

>>> emulated_compute_s(10.0, 0.0, seed=1, iteration=0, rank=0, factor=2.0)
0.02
"""

from __future__ import annotations

import numpy as np


def jitter_factor(seed: int, iteration: int, rank: int, sigma: float) -> float:
    """Lognormal multiplier ``exp(N(0, sigma))`` for (seed, iteration, rank); 1 when sigma is 0."""
    if sigma <= 0:
        return 1.0
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xC0, iteration, rank]))
    return float(np.exp(rng.normal(0.0, sigma)))


def emulated_compute_s(emulate_ms: float, jitter: float, seed: int, iteration: int, rank: int,
                       factor: float) -> float:
    """Seconds rank ``rank`` sleeps for its emulated compute of ``iteration``."""
    return emulate_ms / 1000.0 * factor * jitter_factor(seed, iteration, rank, jitter)
