"""Training algorithms: one class per file behind ``Algorithm``; a registry maps scenario names.

Parameters are validated by each algorithm's ``Params`` model (``harness.algorithms.params``).
The registry is lazy (module paths, imported on use) so that listing names stays cheap.
"""

from __future__ import annotations

import importlib
import importlib.util

from harness.algorithms.base import Algorithm, AlgorithmContext

_REGISTRY: dict[str, str] = {
    "allreduce_sgd": "harness.algorithms.allreduce_sgd:AllreduceSGD",
    "local_sgd": "harness.algorithms.local_sgd:LocalSGD",
    "overlap_local_sgd": "harness.algorithms.overlap_local_sgd:OverlapLocalSGD",
    "easgd": "harness.algorithms.easgd:EASGD",
    "cocod_sgd": "harness.algorithms.cocod_sgd:CoCoDSGD",
    "bmuf": "harness.algorithms.bmuf:BMUF",
    "sgp": "harness.algorithms.sgp:SGP",
    "osgp": "harness.algorithms.osgp:OSGP",
    "dpsgd": "harness.algorithms.dpsgd:DPSGD",
    "adpsgd": "harness.algorithms.adpsgd:ADPSGD",
    "wagma": "harness.algorithms.wagma:WAGMA",
    "eager_sgd": "harness.algorithms.eager_sgd:EagerSGD",
}


def implemented() -> list[str]:
    """Scenario names whose implementation is present."""
    return [name for name, target in _REGISTRY.items() if importlib.util.find_spec(target.split(":")[0])]


def algorithm_class(name: str) -> type[Algorithm]:
    """The class implementing scenario name ``name``; the error lists the valid names."""
    target = _REGISTRY.get(name)
    if target is None or name not in implemented():
        raise ValueError(f"algorithm {name!r} is not implemented (available: {', '.join(implemented())})")
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


__all__ = ["Algorithm", "AlgorithmContext", "algorithm_class", "implemented"]
