"""Test support shared by the tests (``tests/``) and the benchmarks (``harness.bench``).

The benchmarks that check the harness at scale run the same fixtures as the tests, with the
same scenarios and the same oracles; the code for them lives here rather than under ``tests/``,
because the library ships the benchmarks and must not reach into its own test directory.

- ``real_runs``: commands run with their output captured and a timeout that stops a launcher's
  ranks; ``python -m harness run`` followed by ``compare``; the two exceptions of a case.
- ``processes``: the processes a job left running.
- ``scenarios``: the small real runs the simulator is compared with (``bench agreement`` and
  the tests of the simulator, the topology and the allreduce algorithms).
- ``nic_exchange``: messages through shared emulated NICs, and what the simulator says of them.
- ``stress_rule``: the exact rule ``bench stress`` checks every round against.
- ``vhosts``: the virtual-host test bed (its shell scripts are files of that package) and the
  kernel's shaping of a link on it.

Nothing here imports pytest: it runs in benchmarks as well as under the test runner.
"""
