"""The validation cases, by name (``python -m harness bench validation``): published
measurements of other people's clusters, each simulated as that system ran.

Every case names its source and whether its number is stated in text, in a table or read off a
plot, the setup it was measured on, and every constant the simulation needs that the source
does not give, with where that constant came from. Where a number could not be found in a
source, the case says so rather than guessing. A constant fitted on one published number is
never scored on that number.

- :mod:`harness.validation.collective_cases`: nccl-tests bus bandwidths (one node against four,
  a ring against a tree);
- :mod:`harness.validation.training_cases`: data-parallel training's time per iteration and
  scaling (SGP, Goyal et al., Horovod) and the decentralized methods' speed-ups and order
  (eager-SGD, WAGMA-SGD).
"""

from __future__ import annotations

from harness.validation.collective_cases import COLLECTIVE_CASES
from harness.validation.model import Case
from harness.validation.training_cases import TRAINING_CASES

CASES: dict[str, Case] = {case.name: case for case in COLLECTIVE_CASES + TRAINING_CASES}
