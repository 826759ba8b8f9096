"""``python -m harness chakra export|import``: MLCommons Chakra execution traces, ASTRA-sim's input.

``export RUN_DIR`` writes a torch.distributed script run (``launch --scenario``) as one Chakra
ET file per rank, ``NAME.<rank>.et`` (ASTRA-sim's ``--workload-configuration=OUT/NAME``), and
``NAME.comm_groups.json`` (its ``--comm-group-configuration``): every step's injected delay and
local work as COMP nodes, every operation as a COMM node with its type, size, process group
and peers, the dependencies that the replay of the run follows. ``import`` makes a results
directory of such files (the harness's or another tool's) under a scenario, which ``simulate``
and ``compare`` replay with the scenario's injection. docs/guides/chakra.md has the mapping.

Exit status: 0 done, 2 a run or trace that cannot be carried across (the message names the
file and the node).

Example::

    python -m harness chakra export results/torch_ddp/<run-id>
    python -m harness chakra export results/torch_ddp/<run-id> -o traces --name ddp
    python -m harness chakra import traces/ddp --scenario examples/torch_ddp/scenario.yaml -o results/imported/ddp
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.interchange.chakra import ChakraError
from harness.report import after_command


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chakra",
        help="export a script run as Chakra execution traces (ASTRA-sim), or import them",
        description=__doc__.splitlines()[0],
    )
    what = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    ex = what.add_parser(
        "export",
        help="write a torch.distributed script run as one Chakra ET file per rank",
        description="Write the script run in RUN_DIR as OUT/NAME.<rank>.et and OUT/NAME.comm_groups.json.",
    )
    ex.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="results directory of `launch --scenario SCRIPT`")
    ex.add_argument("-o", "--out", type=Path, metavar="OUT_DIR", help="folder of the files (default: RUN_DIR/chakra)")
    ex.add_argument("--name", help="the files' prefix (default: the run's label)")
    ex.set_defaults(func=run_export)
    im = what.add_parser(
        "import",
        help="make a results directory that simulate and compare replay from Chakra ET files",
        description="Make a script run's results directory from PREFIX.<rank>.et under a scenario.",
    )
    im.add_argument(
        "trace",
        type=Path,
        metavar="ET_PREFIX_OR_DIR",
        help="the trace: DIR/NAME for DIR/NAME.0.et, DIR/NAME.1.et ..., or a folder holding one trace",
    )
    im.add_argument(
        "--scenario",
        type=Path,
        required=True,
        metavar="FILE",
        help="scenario without algorithms (injection, links, workload.batch_size); ranks and "
        "iterations are the trace's",
    )
    im.add_argument(
        "-o",
        "--out",
        type=Path,
        metavar="RUN_DIR",
        help="the results directory to create (default: a new one under results/<scenario>/)",
    )
    im.add_argument("--label", help="the run's name for the script (default: the trace's NAME)")
    im.add_argument(
        "--comm-groups",
        type=Path,
        metavar="FILE",
        help='ASTRA-sim\'s communicator group file ({"<pg_name>": [ranks]}) for pg_names the trace does not describe',
    )
    im.set_defaults(func=run_import)


def run_export(args: argparse.Namespace) -> int:
    from harness.interchange.chakra_export import export_run  # noqa: PLC0415  (pandas: not for --help)

    done = export_run(args.run_dir, args.out, args.name)
    print(
        f"{len(done.files)} ranks, {sum(done.steps)} steps, {sum(done.nodes)} nodes: {done.prefix}.<rank>.et "
        f"(ASTRA-sim: --workload-configuration={done.prefix} --comm-group-configuration={done.comm_groups})"
    )
    return 0


def run_import(args: argparse.Namespace) -> int:
    from harness.interchange.chakra_import import import_traces  # noqa: PLC0415  (pandas, torch: not for --help)

    if args.out is not None and args.out.exists():
        raise ChakraError(f"{args.out}: exists; give a new results directory")
    done = import_traces(args.trace, args.scenario, args.out, args.label, args.comm_groups)
    for note in done.notes:
        print(f"note: {note}", file=sys.stderr)
    print(
        f"{done.label}: {done.ranks} ranks x {min(done.steps)} steps from {args.trace} ({done.producer}): "
        f"results in {done.path}",
        file=sys.stderr,
    )
    print(f"simulate it: python -m harness simulate {done.path}/scenario.resolved.yaml")
    return after_command(done.path)
