"""Emulated compute time: a pure function shared by the training loop and the simulator.

With ``workload.compute: {emulate_ms: MS, jitter: SIGMA}`` a rank sleeps, instead of a
forward/backward pass, ``MS * factor * exp(N(0, SIGMA))`` milliseconds, where ``factor`` is the
injected compute factor and the normal draws of an iteration are a pure function of
(seed, iteration): one vector for all ranks, so the real run (each rank takes its element) and
the SimPy model (all ranks at once) see the very same durations.

>>> emulated_compute_s(10.0, 0.0, seed=1, iteration=0, ranks=4, factors=np.full(4, 2.0))
array([0.02, 0.02, 0.02, 0.02])
"""

from __future__ import annotations

import numpy as np


def jitter_factors(seed: int, iteration: int, ranks: int, sigma: float) -> np.ndarray:
    """Lognormal multipliers ``exp(N(0, sigma))`` of every rank at ``iteration``; ones when sigma is 0."""
    if sigma <= 0:
        return np.ones(ranks)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xC0, iteration]))
    return np.exp(rng.normal(0.0, sigma, size=ranks))


def emulated_compute_s(
    emulate_ms: float, jitter: float, seed: int, iteration: int, ranks: int, factors: np.ndarray
) -> np.ndarray:
    """Seconds each rank sleeps for its emulated compute of ``iteration`` (``factors``: injected)."""
    return emulate_ms / 1000.0 * np.asarray(factors, dtype=float) * jitter_factors(seed, iteration, ranks, jitter)
