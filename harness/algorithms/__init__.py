"""Training algorithms: one class per file behind ``Algorithm``, each registered once by name.

``harness.algorithms.registry`` holds the registrations (scenario name, parameter model,
class, figure label and colour); parameters are validated by each algorithm's model in
``harness.algorithms.params``. Classes are imported on use, so listing names stays cheap.
"""

from __future__ import annotations

from harness.algorithms.base import Algorithm, AlgorithmContext
from harness.algorithms.registry import Registration, algorithm_class, names, params_model, register, registration

__all__ = [
    "Algorithm",
    "AlgorithmContext",
    "Registration",
    "algorithm_class",
    "names",
    "params_model",
    "register",
    "registration",
]
