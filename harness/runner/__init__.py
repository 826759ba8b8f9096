"""Running a scenario on real MPI ranks: the training loop, evaluation and the per-rank worker."""
