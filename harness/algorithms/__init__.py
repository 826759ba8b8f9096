"""Training algorithms: one class per file behind ``Algorithm``; ``ALGORITHMS`` maps scenario names.

Parameters are validated by each algorithm's ``Params`` model (``harness.algorithms.params``).
"""

from __future__ import annotations

from harness.algorithms.allreduce_sgd import AllreduceSGD
from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.local_sgd import LocalSGD

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (AllreduceSGD, LocalSGD)}


def algorithm_class(name: str) -> type[Algorithm]:
    """The class implementing scenario name ``name``; the error lists the valid names."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"algorithm {name!r} is not implemented (available: {', '.join(ALGORITHMS)})") from None


__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmContext", "algorithm_class"]
