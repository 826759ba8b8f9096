"""Chakra ET files as a results directory that ``simulate`` and ``compare`` replay.

One file per rank (``<prefix>.<rank>.et``, ranks 0 to R-1) becomes a torch.distributed script
run's directory (``harness.sim.script_replay`` replays it under a scenario's injection):
``steps.csv``, ``collectives.csv``, ``scenario.resolved.yaml`` (the given scenario at the
trace's rank and step counts), ``run.json`` (``torch_distributed``, ``imported_from``), the
summary and ``trace.json``.

Steps: a node's step is its ``harness_step`` attribute (an export of the harness writes it);
a trace without it (PyTorch's, ASTRA-sim's own) is one step per rank. In a step:

- local work (``compute_s``): the longest path through the step's ``COMP_NODE`` durations
  along data dependencies, COMM nodes taken as instantaneous (CPU operators that run beside
  GPU kernels on another branch count once); ``injected_delay_s``: the COMP nodes an export
  marked ``harness_role: injected_delay``;
- each COMM node is an operation, in id order (its posting order). Its ``phase``: ``before``
  where no COMP node of the step precedes it, ``after`` where all of them do, else
  ``overlap``, posted ``at`` (the longest path of local work before it) / (the local work);
  ``waited`` where the step's next operation depends on it (the step's last: yes). A COMP
  node that depends on an ``overlap`` operation does not wait for it in the replay (the replay
  waits for them at the step's end);
- ``start_s``, ``comm_blocked_s``, ``bytes_sent``, loss and accuracy from the step's end node
  where an export wrote them; else the steps follow one another from 0 with nothing blocked.

The ``harness_*`` attributes of an export (phase, place, waited, seq) are taken as they are.
Anything else is refused with the file and the node: MEM_LOAD/MEM_STORE/INVALID nodes, a
``comm_type`` outside the schema, a COMM node without ``comm_size``, a send without
``comm_dst``, an unknown ``pg_name``, a cycle, a dependency on a node the file lacks.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.interchange import chakra as c
from harness.interchange import et_format as et
from harness.results import atomic, columns
from harness.results.columns import COLLECTIVE_FILE, STEP_COLUMNS, STRUCTURE_FILE, to_frame
from harness.results.records import RunDirectory
from harness.runner.report import write_summary
from harness.scenario import load_scenario
from harness.sim.script_replay import ReplayError, ScriptTrace

_FILE = re.compile(r"^(?P<name>.+)\.(?P<rank>\d+)\.et$")
_COMP, _META = et.NODE_TYPE["COMP_NODE"], et.NODE_TYPE["METADATA_NODE"]
_SEND, _RECV = et.NODE_TYPE["COMM_SEND_NODE"], et.NODE_TYPE["COMM_RECV_NODE"]


@dataclass
class Imported:
    """What :func:`import_traces` wrote."""

    path: Path
    label: str
    ranks: int
    steps: list[int]
    producer: str
    notes: list[str] = field(default_factory=list)


def trace_files(spec: Path) -> tuple[Path, list[Path]]:
    """(the prefix, its files in rank order) of ``spec``: a prefix as ASTRA-sim takes it
    (``DIR/NAME`` for ``DIR/NAME.<rank>.et``), or a directory that holds one such trace."""
    spec = Path(spec)
    found: dict[str, dict[int, Path]] = defaultdict(dict)
    folder = spec if spec.is_dir() else spec.parent
    for path in folder.iterdir() if folder.is_dir() else ():
        m = _FILE.match(path.name)
        if m and (spec.is_dir() or m["name"] == spec.name):
            found[m["name"]][int(m["rank"])] = path
    if not found:
        raise c.ChakraError(
            f"{spec}: no Chakra ET files ({'<name>' if spec.is_dir() else spec.name}.<rank>.et)"
            + (" in it" if spec.is_dir() else ": give the prefix of NAME.0.et, NAME.1.et ... or their directory")
        )
    if len(found) > 1:
        raise c.ChakraError(
            f"{spec}: holds the ET files of several traces ({', '.join(sorted(found))}): give one as {spec}/NAME"
        )
    name, files = found.popitem()
    missing = [r for r in range(max(files) + 1) if r not in files]
    if missing:
        raise c.ChakraError(
            f"{folder / f'{name}.{missing[0]}.et'}: missing: a trace has one file per rank, 0 to {max(files)}"
        )
    return folder / name, [files[r] for r in range(len(files))]


def _refuse(path: Path, node: Any, why: str) -> c.ChakraError:
    return c.ChakraError(f"{path}: node {node.id} ({node.name!r}): {why}")


def _operation(path: Path, node: Any, attrs: dict, rank: int, groups: c.ProcessGroups, notes: set) -> dict:
    """collectives.csv's values of one COMM node (but its step, seq and place)."""
    op: str | None
    if node.type in (_SEND, _RECV):
        op = "send" if node.type == _SEND else "recv"
    else:
        number = attrs.get(c.COMM_TYPE_ATTR)
        if number is None:
            raise _refuse(path, node, "a COMM_COLL_NODE without comm_type: which collective it is is unknown")
        op = c.COMM_TYPE_TO_OP.get(int(number))
        if op is None:
            raise _refuse(
                path,
                node,
                f"comm_type {c.comm_type_name(int(number))} has no native counterpart "
                f"(the native layer has {', '.join(sorted(set(c.COMM_TYPE_TO_OP.values())))})",
            )
    size = attrs.get(c.COMM_SIZE)
    if size is None or int(size) < 0:
        raise _refuse(
            path,
            node,
            f"{c.a_(op)} without comm_size (the bytes it moves)" if size is None else f"comm_size {size} is negative",
        )
    pg = str(attrs.get(c.PG_NAME, ""))
    members = groups.members(pg)
    if members is None:
        raise _refuse(
            path,
            node,
            f"pg_name {pg!r}: no such process group (no process_group:init node of the file "
            "and no --comm-groups file describes it)",
        )
    src, dst = attrs.get(c.COMM_SRC), attrs.get(c.COMM_DST)
    world = groups.world
    if op in ("send", "recv"):
        mine, theirs, side = (src, dst, "comm_dst") if op == "send" else (dst, src, "comm_src")
        if theirs is None:
            raise _refuse(path, node, f"{c.a_(op)} without {side}: its peer is unknown")
        if mine is not None and int(mine) != rank:
            raise _refuse(path, node, f"{c.a_(op)} of rank {mine} in rank {rank}'s file")
        if not 0 <= int(theirs) < world or int(theirs) == rank:
            raise _refuse(path, node, f"{c.a_(op)} with peer {theirs} in a trace of {world} ranks")
        peer = int(theirs)
    else:
        if rank not in members:
            raise _refuse(
                path,
                node,
                f"{c.a_(op)} over process group {pg or c.WORLD_PG} {list(members)}, which rank {rank} is not in",
            )
        root = src if op in c.ROOT_IS_SOURCE else dst if op in c.ROOT_IS_DESTINATION else None
        peer = -1
        if op in c.ROOT_IS_SOURCE | c.ROOT_IS_DESTINATION:
            if root is None:
                notes.add(f"{c.a_(op)} without its root (comm_src/comm_dst): its group's first rank is taken")
                root = members[0]
            if int(root) not in members:
                raise _refuse(path, node, f"{c.a_(op)} rooted at rank {root}, outside its group {list(members)}")
            peer = int(root)
    return {"op": op, "group_ranks": " ".join(map(str, members)), "payload_bytes": int(size), "peer": peer}


def _topological(path: Path, nodes: dict[int, Any]) -> list[int]:
    waiting = {i: len(set(n.data_deps)) for i, n in nodes.items()}
    children: dict[int, list[int]] = defaultdict(list)
    for i, n in nodes.items():
        for d in set(n.data_deps):
            if d not in nodes:
                raise _refuse(path, n, f"depends on node {d}, which the file does not have")
            children[d].append(i)
    ready = sorted(i for i, w in waiting.items() if w == 0)
    order: list[int] = []
    while ready:
        i = ready.pop()
        order.append(i)
        for child in children[i]:
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    if len(order) < len(nodes):
        stuck = min(i for i, w in waiting.items() if w > 0)
        raise _refuse(path, nodes[stuck], "is on a cycle of data dependencies")
    return order


def analyze_rank(
    rank: int, path: Path, nodes: list[Any], groups: c.ProcessGroups, notes: set
) -> tuple[list[dict], list[dict], bool]:
    """(steps.csv rows, collectives.csv rows, whether every step has its recorded times) of one
    rank's nodes: see the module doc."""
    by_id: dict[int, Any] = {}
    for node in nodes:
        if node.id in by_id:
            raise _refuse(path, node, "its id is used twice in the file")
        by_id[node.id] = node
    table = dict(groups.ranks_of)
    for node in nodes:
        if node.type == _META and c.PG_INIT_NAME in node.name and node.inputs.values:
            table.update(c.parse_pytorch_groups(node.inputs.values, groups.world, f"{path}: node {node.id}"))
    groups = c.ProcessGroups(table, groups.world)
    attrs, kind, step, ops = {}, {}, {}, {}
    for node in nodes:
        a = attrs[node.id] = et.attrs_of(node)
        step[node.id] = int(a.get(c.H_STEP, 0))
        if step[node.id] < 0:
            raise _refuse(path, node, f"{c.H_STEP} {step[node.id]} is negative")
        if node.type == _META:
            kind[node.id] = "meta"
        elif node.type == _COMP:
            role = a.get(c.H_ROLE, c.ROLE_WORK)
            kind[node.id] = role if role in (c.ROLE_DELAY, c.ROLE_END) else c.ROLE_WORK
            if node.duration_micros == 0 and a.get("num_ops"):
                raise _refuse(
                    path,
                    node,
                    "a COMP_NODE timed only by num_ops and tensor_size (ASTRA-sim's roofline "
                    "model): the harness needs its duration_micros",
                )
        elif node.type in c.COMM_NODE_TYPES:
            kind[node.id] = "comm"
            ops[node.id] = _operation(path, node, a, rank, groups, notes)
        else:
            name = et.NODE_TYPES[node.type] if 0 <= node.type < len(et.NODE_TYPES) else f"node type {node.type}"
            raise _refuse(
                path,
                node,
                f"{c.a_(name)} has no native counterpart (the harness replays compute and communication only)",
            )
    bits = {i: 1 << b for b, i in enumerate(i for i in sorted(by_id) if kind[i] in ("comm", c.ROLE_WORK))}
    finish: dict[int, int] = {}
    ancestors: dict[int, int] = {}
    for i in _topological(path, by_id):
        same = [d for d in set(by_id[i].data_deps) if step[d] == step[i]]
        ready = max((finish[d] for d in same), default=0)
        finish[i] = ready + (by_id[i].duration_micros if kind[i] == c.ROLE_WORK else 0)
        below = 0
        for d in same:
            below |= ancestors[d] | bits.get(d, 0)
        ancestors[i] = below
    steps = max(step.values(), default=0) + 1
    work = [0] * steps
    local = [0] * steps
    delay = [0] * steps
    ends: list[dict] = [{} for _ in range(steps)]
    for i, k in kind.items():
        t = step[i]
        if k == c.ROLE_WORK:
            work[t] |= bits[i]
            local[t] = max(local[t], finish[i])
        elif k == c.ROLE_DELAY:
            delay[t] += by_id[i].duration_micros
        elif k == c.ROLE_END and not ends[t]:
            ends[t] = attrs[i]
    rows: list[dict] = []
    for t in range(steps):
        mine = sorted(i for i in ops if step[i] == t)
        exact = all(c.H_SEQ in attrs[i] for i in mine)
        for n, i in enumerate(mine):
            a, before = attrs[i], ancestors[i] & work[t]
            phase = a.get(c.H_PHASE) or ("before" if not before else "after" if before == work[t] else "overlap")
            at = a.get(c.H_AT)
            if at is None:
                at = min(max(finish[i] / local[t], 0.0), 0.999) if phase == "overlap" and local[t] else 0.0
            waited = a.get(c.H_WAITED)
            if waited is None:
                waited = n + 1 == len(mine) or bool(ancestors[mine[n + 1]] & bits[i])
            extra = {k[len(c.H_COLUMN) :]: v for k, v in a.items() if k.startswith(c.H_COLUMN)}
            rows.append(
                {
                    "rank": rank,
                    "iteration": t,
                    "seq": int(a[c.H_SEQ]) if exact else n,
                    **ops[i],
                    "phase": phase,
                    "at": float(at),
                    "waited": bool(waited),
                    **extra,
                }
            )
    step_rows, clock = [], 0.0
    for t in range(steps):
        end = ends[t]
        start = float(end.get(c.H_START, clock))
        blocked = float(end.get(c.H_BLOCKED, 0.0))
        compute, injected = local[t] / 1e6, delay[t] / 1e6
        clock = start + injected + compute + blocked
        step_rows.append(
            {
                "rank": rank,
                "iteration": t,
                "start_s": start,
                "end_s": clock,
                "compute_s": compute,
                "injected_delay_s": injected,
                "comm_blocked_s": blocked,
                "bytes_sent": int(end.get(c.H_BYTES, 0)),
                "loss": float(end.get(c.H_LOSS, math.nan)),
                "accuracy": float(end.get(c.H_ACCURACY, math.nan)),
            }
        )
    return step_rows, rows, all(c.H_START in end for end in ends)


def _frames(label: str, steps: list[dict], ops: list[dict]) -> tuple[Any, Any]:
    all_columns = columns.COLLECTIVE_COLUMNS  # read now: the columns may grow
    defaults = {"algorithm": label, "loss": math.nan, "bytes_sent": 0, "staleness": -1, "accuracy": math.nan}
    step_frame = to_frame(
        pd.DataFrame([{**defaults, **row} for row in steps]).reindex(columns=list(STEP_COLUMNS)), STEP_COLUMNS
    )
    op_frame = pd.DataFrame(
        ops, columns=[col for col in all_columns if col in c.MAPPED_COLUMNS or any(col in row for row in ops)]
    )
    if list(op_frame.columns) == list(all_columns):
        op_frame = to_frame(op_frame, all_columns)
    return step_frame, op_frame


def import_traces(
    spec: Path,
    scenario_file: Path,
    out: Path | None = None,
    label: str | None = None,
    comm_groups: Path | None = None,
    results_root: Path = Path("results"),
) -> Imported:
    """Make a script run's results directory (``out``, default a new one under
    ``results_root/<scenario>/``) from the trace ``spec``, under ``scenario_file``."""
    prefix, files = trace_files(spec)
    world = len(files)
    groups = c.ProcessGroups(c.read_comm_group_configuration(comm_groups) if comm_groups else {}, world)
    steps: list[dict] = []
    ops: list[dict] = []
    counts: list[int] = []
    timed: list[bool] = []
    structures: list[str | None] = []
    notes: set[str] = set()
    producers: set[str] = set()
    versions: set[str] = set()
    for rank, path in enumerate(files):
        metadata, nodes = et.read_trace(path)
        meta = et.attrs_of(metadata)
        if "rank" in meta and int(meta["rank"]) != rank:
            raise c.ChakraError(f"{path}: its metadata says rank {meta['rank']}")
        if "ranks" in meta and int(meta["ranks"]) != world:
            raise c.ChakraError(f"{path}: its metadata says {meta['ranks']} ranks; {prefix} has {world} files")
        structures.append(meta.get(c.H_STRUCTURE))
        versions.add(metadata.version)
        producers.add(f"{meta.get('producer', 'unknown')} {meta.get('producer_version', '')}".strip())
        rank_steps, rank_ops, rank_timed = analyze_rank(rank, path, nodes, groups, notes)
        timed.append(rank_timed)
        steps += rank_steps
        ops += rank_ops
        counts.append(len(rank_steps))
    label = label or re.sub(r"[^A-Za-z0-9_-]", "_", prefix.name) or "chakra"
    scenario = load_scenario(scenario_file, overrides={"ranks": world, "iterations": min(counts)})
    if scenario.algorithms:
        raise c.ChakraError(
            f"{scenario_file}: lists algorithms: the trace is the algorithm, so its scenario lists "
            "none (as one for `python -m harness launch --scenario SCRIPT`)"
        )
    step_frame, op_frame = _frames(label, steps, ops)
    parent = Path(results_root) / scenario.name if out is None else Path(out).parent
    fresh = None  # the outermost folder the run directory's creation makes
    while not parent.exists():
        fresh, parent = parent, parent.parent
    run = (
        RunDirectory.create(results_root, scenario.name) if out is None else RunDirectory.create_at(out, scenario.name)
    )

    def remove() -> None:  # nothing of a refused import is left behind
        shutil.rmtree(run.path, ignore_errors=True)
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)

    try:
        run.write_resolved_scenario(scenario.resolved_dict())
        run.append_algorithm(label, step_frame)
        atomic.write_csv(run.path / COLLECTIVE_FILE, op_frame)
        if all(structures):  # an export of the harness: what rescales the sequence to other rank counts
            atomic.write_json(run.path / STRUCTURE_FILE, {"ranks": [json.loads(s) for s in structures if s]}, indent=1)
        ScriptTrace.read(run.path, world, min(counts))  # the ranks' sequences line up as the replay needs
        write_summary(run, scenario)
        run.write_trace()
        source = {
            "format": "chakra",
            "files": f"{prefix}.<rank>.et",
            "producer": ", ".join(sorted(producers)),
            "version": ", ".join(sorted(versions)),  # GlobalMetadata.version
            "step_times": "recorded" if all(timed) else "local work only (no waits: the trace has none)",
        }
        run.write_run_json(
            "complete",
            [label],
            ranks=world,
            extra={
                "script": str(prefix),
                "torch_distributed": True,
                "optimizer_steps": counts,
                "imported_from": source,
            },
        )
    except ReplayError as exc:
        remove()
        raise c.ChakraError(f"{prefix}: the ranks' traces do not line up: {exc}") from None
    except BaseException:
        remove()
        raise
    return Imported(run.path, label, world, counts, ", ".join(sorted(producers)), sorted(notes))
