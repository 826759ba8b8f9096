"""The simulator validated against published measurements of other people's clusters
(``python -m harness bench validation``): the cases (:mod:`harness.validation.cases`), the
systems they ran on (:mod:`harness.validation.systems`) and how a case is scored
(:mod:`harness.validation.model`)."""
