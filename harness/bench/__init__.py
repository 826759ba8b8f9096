"""Micro-benchmarks of the native collective layer (``python -m harness bench <benchmark>``).

One module per benchmark; each is a worker runnable under ``mpiexec`` as
``python -m harness.bench.<benchmark>`` and keeps MPI imports out of module import time, so
the launching parent (``harness.commands.bench``) never loads mpi4py.

- ``collectives``: native allreduce / broadcast against the mpi4py baseline, nccl-tests style.
- ``stress``: wait-avoiding allreduce (WAGMA, eager-SGD) and push-sum under random delays,
  every round checked exactly against the rule.
- ``agreement``: the simulator against real runs, case by case (real and simulated times, the
  error, medians over repeats); its real runs through ``real_runs``, its ``nic_messages``
  worker (``nic_exchange``) under ``mpiexec``, its ``kernel_shaping`` case on the virtual-host
  test bed (``vhost_shaping``).
- ``validation``: the simulator against published measurements (``harness.validation``).
"""
