"""``python -m harness validate FILE``: check a scenario file and summarize what it resolves to.

Exit status 0 when the file is valid, 2 with one ``error:`` line per problem on stderr otherwise
(a scenario asking for a device this machine lacks, ``device: cuda`` without a usable GPU, is
refused too, and so is the user's code the scenario names, a ``"module:callable"`` model or
dataset that does not import or returns the wrong thing: ``harness.scenario.checks``). A valid
file's notes go to stderr: old spellings of parameters it uses (e.g. ``sync_period``, now
``period``) and WAGMA groups that are not of ``group_size`` ranks (``AlgorithmParams.notes``).

Example::

    python -m harness validate scenarios/straggler.yaml --ranks 4
    python -m harness validate scenarios/straggler.yaml imbalance.0.delay_ms=640 algorithms.local_sgd.period=8
    python -m harness validate scenarios/straggler.yaml --ranks 4 workload.iterations=30
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from harness.algorithms import scenario_notes
from harness.commands.overrides import add_overrides_argument
from harness.commands.shared_options import add_scenario_options, scenario_overrides
from harness.device import scenario_device_problem
from harness.scenario import Scenario, load_scenario_with_notes
from harness.scenario.checks import check_user_code
from harness.scenario.network import link_table
from harness.workload.names import workload_labels


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``validate`` command."""
    parser = subparsers.add_parser("validate", help="check a scenario file and print what it resolves to")
    parser.add_argument("file", help="scenario YAML file")
    add_overrides_argument(parser)
    add_scenario_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load ``args.file``; print its summary (0). A file that does not load raises ScenarioError,
    which ``harness.cli`` prints as one ``error:`` line per problem (2)."""
    scenario, renamed = load_scenario_with_notes(
        args.file, overrides=scenario_overrides(args), assignments=args.assignments
    )
    problem = scenario_device_problem(scenario)
    if problem is not None:
        print(f"error: {args.file}: {problem}", file=sys.stderr)
        return 2
    check_user_code(scenario, args.file)  # the user's model, dataset...: imported and called
    print(summary(scenario))
    for note in renamed + scenario_notes(scenario):
        print(f"note: {note}", file=sys.stderr)
    return 0


def summary(scenario: Scenario) -> str:
    """A few lines: name, workload, algorithms with resolved parameters, injectors, links, faults."""
    w = scenario.workload
    injectors = [(s.model_dump(exclude={"kind"}, exclude_defaults=True), s.kind) for s in scenario.imbalance]
    compute = "real compute" if w.compute == "real" else f"emulated compute {w.compute.emulate_ms:g} ms"
    trained = "the training script's own model and data" if w.model is None else " on ".join(workload_labels(w))
    lines = [
        f"{scenario.name}: {scenario.ranks} ranks, seed {scenario.seed}",
        f"workload: {trained}, batch {w.batch_size}, {w.iterations} iterations, {compute}{_local_costs(w)}",
        "optimizer: the training script's own"
        if w.of_script
        else f"optimizer: {_entry(scenario.optimizer.model_dump(exclude={'name'}), scenario.optimizer.name)}",
        "algorithms:"
        if scenario.algorithms
        else "algorithms: none (a torch.distributed script that `python -m harness launch --scenario` runs is the "
        "algorithm)",
        *(f"  {_algorithm_line(p, w.of_script)}" for p in scenario.algorithms),
        "imbalance:" if scenario.imbalance else "imbalance: none",
        *(f"  {_entry(fields, kind)}" for fields, kind in injectors),
        f"network: {len(link_table(scenario))} emulated links, {scenario.network.allreduce} allreduce",
        *_topology_lines(scenario),
        "faults:" if scenario.faults else "faults: none",
        *(f"  {_entry(f.model_dump(exclude={'kind'}, exclude_defaults=True), f.kind)}" for f in scenario.faults),
    ]
    return "\n".join(lines)


def _local_costs(w) -> str:
    """``workload.node`` and ``workload.staging`` in the units of the scenario file, if set."""
    parts = []
    if w.node is not None:
        bandwidth = "unlimited" if w.node.link.bandwidth_gbps is None else f"{w.node.link.bandwidth_gbps:g} Gb/s"
        parts.append(
            f"a rank is a node of {w.node.gpus} GPUs ({w.node.link.latency_us:g} us, {bandwidth} between them)"
        )
    if w.staging is not None:
        parts.append(f"staged through the host at {w.staging.bandwidth_gbps:g} Gb/s")
    return "".join(f"; {p}" for p in parts)


def _topology_lines(scenario: Scenario) -> list[str]:
    """The nodes and their links, in the units of the scenario file."""
    topology = scenario.network.topology
    if topology is None:
        return []
    node_of = topology.node_of(scenario.ranks)
    sizes = sorted({node_of.count(n) for n in set(node_of)})
    per_node = "/".join(str(s) for s in sizes)

    def link(settings) -> str:
        bandwidth = "unlimited" if settings.bandwidth_gbps is None else f"{settings.bandwidth_gbps:g} Gb/s"
        return f"{settings.latency_us:g} us, {bandwidth}"

    fabric = "" if topology.bisection_gbps is None else f"; fabric {topology.bisection_gbps:g} Gb/s"
    preset = f" ({topology.preset})" if topology.preset else ""
    return [
        f"  topology{preset}: {max(node_of) + 1} nodes of {per_node} ranks; NIC {link(topology.nic)}; "
        f"intra-node {link(topology.intra)}{fabric}"
    ]


def _algorithm_line(params: Any, of_script: bool) -> str:
    """``name k=v ...``, and the entry's own optimizer (its own or its model's default) after ``|``."""
    line = _entry(params.model_dump(exclude={"name", "optimizer"}), params.name)
    if params.optimizer is None or of_script:
        return line
    spec = params.optimizer
    return f"{line} | optimizer: {_entry(spec.model_dump(exclude={'name'}), spec.name)}"


def _entry(fields: dict[str, object], name: str) -> str:
    return " ".join([name, *(f"{k}={v}" for k, v in fields.items())])
