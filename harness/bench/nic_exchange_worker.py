"""The MPI worker of ``bench agreement``'s ``nic_messages`` case, which every rank of its job runs.

Every rank takes part in one exchange through shared emulated NICs
(:func:`harness.testing.nic_exchange.exchange_through_nics`); rank 0 writes every rank's spans
as JSON to OUT.json, which the case compares with the simulator. The case runs it as::

    mpiexec -n 8 python -m harness.bench.nic_exchange_worker OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.bench.arguments import worker_main
from harness.mpi_library import import_mpi
from harness.testing.nic_exchange import NIC_RANKS, exchange_through_nics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", type=Path, metavar="OUT.json", help="where rank 0 writes the spans")


def run_worker(args: argparse.Namespace) -> int:
    """One :func:`exchange_through_nics` on this rank; rank 0 writes it as JSON. 0."""
    MPI = import_mpi()  # initializes MPI: on the ranks only

    exchange = exchange_through_nics(MPI.COMM_WORLD)
    if MPI.COMM_WORLD.Get_rank() == 0:
        args.out.write_text(
            json.dumps(
                {"spans": exchange.spans, "control": exchange.control, "received_right": exchange.received_right}
            )
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    return worker_main(
        f"mpiexec -n {NIC_RANKS} python -m harness.bench.nic_exchange_worker", __doc__, add_arguments, run_worker, argv
    )


if __name__ == "__main__":
    sys.exit(main())
