"""Benchmarks of the native collective layer and the simulator (``python -m harness bench <benchmark>``).

One module per benchmark: what the command parses and prints. A benchmark that runs on MPI
ranks has its worker beside it, ``<benchmark>_worker``, the module every rank runs under
``mpiexec`` (``python -m harness.bench.<benchmark>_worker``); what every worker does around its
work is ``mpi_worker``. Workers keep MPI imports out of module import time, so the launching
parent (``harness.commands.bench``) never loads mpi4py. The fixtures, scenarios and oracles the
benchmarks share with the tests are :mod:`harness.testing`.

- ``collectives`` (``collectives_worker``): native allreduce / broadcast / all-gather /
  reduce-scatter against the mpi4py baseline, nccl-tests style; the ops and their measurement
  in ``collective_ops``, the byte sizes in ``sizes``.
- ``dist`` (``dist_worker``): DDP and FSDP2 on the harness torch.distributed backend against gloo.
- ``stress`` (``stress_worker``): wait-avoiding allreduce (WAGMA, eager-SGD) and push-sum under
  random delays, every round checked exactly against the rule.
- ``agreement``: the simulator against real runs, case by case (real and simulated times, the
  error, medians over repeats; its report in ``agreement_report``); its ``nic_messages`` case
  runs ``nic_exchange_worker`` under ``mpiexec``.
- ``faults``: injected kills and hangs; does the verdict name the faulted rank?
- ``simulator``, ``training``: the simulator's speed and memory.
- ``scripts``: torch.distributed scripts recorded at 4 ranks, predicted at others.
- ``validation``: the simulator against published measurements (``harness.validation``).
"""
