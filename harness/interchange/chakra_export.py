"""A torch.distributed script run's results directory as Chakra ET files, one per rank.

Each rank's file holds, after its ``GlobalMetadata`` (``producer: harness``, the harness's
version, the rank, the rank count, the label), a ``process_group:init`` ``METADATA_NODE``
(the groups, :class:`harness.interchange.chakra.ProcessGroups`) and then, step by step, the
graph that the simulator's replay of the step (``harness.sim.script_replay``) follows:

1. the ``before`` operations, in posting order; one the script waited for (``waited``) is a
   data dependency of the next, one it did not wait for shares its predecessor's dependencies
   (the next is posted right after it);
2. a ``COMP_NODE`` for the step's injected delay (``injected_delay_s``; 0 us when none), after
   every ``before`` operation: the replay waits for them, then sleeps the delay;
3. the step's local work (``compute_s``) as ``COMP_NODE`` segments in a chain, cut where an
   ``overlap`` operation is posted: the operation posted at ``at`` of the local work depends on
   the segment that ends there (and on its predecessor where the script waited for it, as a
   communication hook's chained collective). The segments' durations add up to the local work
   (the cuts are rounded to microseconds, the unit of ``duration_micros``);
4. the ``after`` operations, after the last segment and every ``overlap`` operation (the step
   waits for those before its optimizer step), chained as the ``before`` ones;
5. a zero-length ``COMP_NODE`` that ends the step, after everything in it; the next step's
   first node depends on it.

Node ids ascend in that order (ASTRA-sim issues nodes that are ready together in id order, so
every group's collectives keep their order). COMM nodes have no duration: the simulator times
them. Every node also has the ``harness_*`` attributes that make an import exact.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness import __version__
from harness.interchange import chakra as c
from harness.interchange import et_format as et
from harness.results import atomic, columns
from harness.results.columns import COLLECTIVE_FILE, STEP_COLUMNS, STRUCTURE_FILE, read_frame
from harness.results.layout import RUN_FILE, STEPS_FILE, read_run_json
from harness.sim.script_replay import script_label


@dataclass(frozen=True)
class Export:
    """What :func:`export_run` wrote."""

    files: list[Path]
    comm_groups: Path
    prefix: Path
    steps: list[int]  # per rank
    nodes: list[int]  # per rank


def _us(seconds: float) -> int:
    return max(0, round(float(seconds) * 1e6)) if math.isfinite(float(seconds)) else 0


class _Graph:
    """One rank's nodes, ids in creation order."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []

    def add(self, name: str, kind: str, deps: list[int], duration_us: int = 0, attrs: tuple = ()) -> int:
        node = et.Node(
            id=len(self.nodes),
            name=name,
            type=et.NODE_TYPE[kind],
            data_deps=sorted(set(deps)),
            duration_micros=duration_us,
        )
        node.attr.extend([et.attribute(c.IS_CPU_OP, False), *attrs])
        self.nodes.append(node)
        return node.id


def _op_attrs(row: Any, groups: c.ProcessGroups, rank: int, tag: int, extra: list[str]) -> list[Any]:
    kind, comm_type = c.OP_TO_CHAKRA[row.op]
    attrs = [
        et.attribute(c.COMM_SIZE, int(row.payload_bytes), "int64"),
        et.attribute(c.PG_NAME, groups.name_of(row.group_ranks), "string"),
    ]
    if comm_type is not None:
        attrs.insert(0, et.attribute(c.COMM_TYPE_ATTR, et.COMM_TYPE[comm_type], "int64"))
    peer = int(row.peer)
    if row.op == "send":
        attrs += [et.attribute(c.COMM_SRC, rank, "int32"), et.attribute(c.COMM_DST, peer, "int32")]
    elif row.op == "recv":
        attrs += [et.attribute(c.COMM_SRC, peer, "int32"), et.attribute(c.COMM_DST, rank, "int32")]
    elif row.op in c.ROOT_IS_SOURCE and peer >= 0:
        attrs.append(et.attribute(c.COMM_SRC, peer, "int32"))
    elif row.op in c.ROOT_IS_DESTINATION and peer >= 0:
        attrs.append(et.attribute(c.COMM_DST, peer, "int32"))
    if kind != "COMM_COLL_NODE":
        attrs.append(et.attribute(c.COMM_TAG, tag, "int32"))
    attrs += [
        et.attribute(c.H_STEP, int(row.iteration), "int64"),
        et.attribute(c.H_SEQ, int(row.seq), "int64"),
        et.attribute(c.H_PHASE, str(row.phase), "string"),
        et.attribute(c.H_AT, float(row.at), "double"),
        et.attribute(c.H_WAITED, bool(row.waited), "bool"),
    ]
    attrs += [et.attribute(c.H_COLUMN + name, str(getattr(row, name)), "string") for name in extra]
    return attrs


def _chain(g: _Graph, ops: list[tuple[Any, list]], deps: list[int]) -> list[int]:
    """Post ``ops`` in order after ``deps``; the ids of the operations."""
    ids = []
    for row, attrs in ops:
        kind = c.OP_TO_CHAKRA[row.op][0]
        node = g.add(f"{row.op} (step {int(row.iteration)}, #{int(row.seq)})", kind, deps, attrs=tuple(attrs))
        ids.append(node)
        if bool(row.waited):
            deps = [node]
    return ids


def rank_graph(
    rank: int, steps: pd.DataFrame, ops: pd.DataFrame, groups: c.ProcessGroups, extra: list[str]
) -> list[Any]:
    """The nodes of one rank's file (after its metadata): see the module doc."""
    g = _Graph()
    last = g.add(c.PG_INIT_NAME, "METADATA_NODE", [])
    g.nodes[last].inputs.values = groups.pytorch_values()
    order = {p: i for i, p in enumerate(("before", "overlap", "after"))}
    tags: dict[tuple[int, int], int] = defaultdict(int)
    by_step: dict[int, list] = defaultdict(list)
    for row in ops.sort_values(["iteration", "seq"], kind="stable").itertuples(index=False):
        tag = 0
        if row.op in ("send", "recv"):  # the k-th message from one rank to another: its k-th receive there
            pair = (rank, int(row.peer)) if row.op == "send" else (int(row.peer), rank)
            tag, tags[pair] = tags[pair], tags[pair] + 1
        by_step[int(row.iteration)].append((row, _op_attrs(row, groups, rank, tag, extra)))
    for step in steps.sort_values("iteration").itertuples(index=False):
        t = int(step.iteration)
        phased = sorted(by_step.get(t, []), key=lambda item: order.get(str(item[0].phase), 1))
        before = [o for o in phased if o[0].phase == "before"]
        overlap = [o for o in phased if o[0].phase == "overlap"]
        after = [o for o in phased if o[0].phase == "after"]
        here = (et.attribute(c.H_STEP, t, "int64"),)
        posted = _chain(g, before, [last])
        delay = g.add(
            f"injected delay (step {t})",
            "COMP_NODE",
            posted or [last],
            _us(step.injected_delay_s),
            (*here, et.attribute(c.H_ROLE, c.ROLE_DELAY, "string")),
        )
        local = _us(step.compute_s)
        cuts, place = [], 0.0
        for row, _ in overlap:
            place = max(place, min(max(float(row.at), 0.0), 1.0))
            cuts.append(round(place * local))
        bounds = [0, *cuts, local]
        segment, tail, waited_for = delay, [], None
        for i in range(len(bounds) - 1):
            work = g.add(
                f"local work (step {t}, {i + 1}/{len(bounds) - 1})",
                "COMP_NODE",
                [segment],
                bounds[i + 1] - bounds[i],
                (*here, et.attribute(c.H_ROLE, c.ROLE_WORK, "string")),
            )
            segment = work
            if i < len(overlap):
                row, attrs = overlap[i]
                deps = [work] + ([waited_for] if waited_for is not None else [])
                node = g.add(
                    f"{row.op} (step {t}, #{int(row.seq)})", c.OP_TO_CHAKRA[row.op][0], deps, attrs=tuple(attrs)
                )
                tail.append(node)
                waited_for = node if bool(row.waited) else None
        done = _chain(g, after, [segment, *tail])
        loss, accuracy = float(step.loss), float(step.accuracy) if hasattr(step, "accuracy") else math.nan
        ends = [
            et.attribute(c.H_ROLE, c.ROLE_END, "string"),
            et.attribute(c.H_START, float(step.start_s), "double"),
            et.attribute(c.H_BLOCKED, float(step.comm_blocked_s), "double"),
            et.attribute(c.H_BYTES, int(step.bytes_sent), "int64"),
        ]
        ends += [
            et.attribute(name, v, "double")
            for name, v in ((c.H_LOSS, loss), (c.H_ACCURACY, accuracy))
            if math.isfinite(v)
        ]
        last = g.add(f"end of step {t}", "COMP_NODE", [segment, *tail, *done, delay], 0, here + tuple(ends))
    return g.nodes


def export_run(run_dir: Path, out_dir: Path | None = None, name: str | None = None) -> Export:
    """Write ``<name>.<rank>.et`` for every rank of the script run in ``run_dir`` (default
    ``run_dir/chakra/``, ``name`` the run's label) and ``<name>.comm_groups.json``."""
    run_dir = Path(run_dir)
    if not (run_dir / RUN_FILE).is_file():
        raise c.ChakraError(f"{run_dir}: not a results directory (no {RUN_FILE})")
    meta = read_run_json(run_dir)
    label = script_label(meta)
    if not meta.get("torch_distributed") or not (run_dir / COLLECTIVE_FILE).is_file():
        raise c.ChakraError(
            f"{run_dir}: not a torch.distributed script run of `python -m harness launch --scenario` "
            f"(run.json has no torch_distributed, or there is no {COLLECTIVE_FILE}): only a script "
            "run's recorded collectives can be exported"
        )
    steps = read_frame(run_dir / STEPS_FILE, STEP_COLUMNS)
    steps = steps[steps["algorithm"] == label]
    if not label or steps.empty:
        raise c.ChakraError(f"{run_dir}: the script run finished no step: nothing to export")
    ops = read_frame(run_dir / COLLECTIVE_FILE, columns.COLLECTIVE_COLUMNS)  # read now: the columns may grow
    unknown = sorted(set(ops["op"]) - set(c.OP_TO_CHAKRA))
    if unknown:
        raise c.ChakraError(f"{run_dir / COLLECTIVE_FILE}: operation {unknown[0]!r} has no Chakra counterpart")
    ranks = int(meta.get("ranks") or int(steps["rank"].max()) + 1)
    groups = c.ProcessGroups.of_members(ops["group_ranks"], ranks)
    extra = [col for col in columns.COLLECTIVE_COLUMNS if col not in c.MAPPED_COLUMNS]
    structure = (
        json.loads((run_dir / STRUCTURE_FILE).read_text()).get("ranks", [])
        if (run_dir / STRUCTURE_FILE).is_file()
        else []
    )
    name = name or label
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "chakra"
    out_dir.mkdir(parents=True, exist_ok=True)
    files, counts, sizes = [], [], []
    for rank in range(ranks):
        mine = steps[steps["rank"] == rank]
        nodes = rank_graph(rank, mine, ops[ops["rank"] == rank], groups, extra)
        metadata = et.GlobalMetadata(
            version=et.SCHEMA_VERSION,
            attr=[
                et.attribute("producer", c.PRODUCER, "string"),
                et.attribute("producer_version", __version__, "string"),
                et.attribute("rank", rank, "int64"),
                et.attribute("ranks", ranks, "int64"),
                et.attribute("label", label, "string"),
                et.attribute("scenario", str(meta.get("scenario", "")), "string"),
                et.attribute("steps", len(mine), "int64"),
                et.attribute("time_unit", "duration_micros: microseconds", "string"),
            ],
        )
        if rank < len(structure):
            metadata.attr.append(et.attribute(c.H_STRUCTURE, json.dumps(structure[rank]), "string"))
        files.append(et.write_trace(out_dir / f"{name}.{rank}.et", metadata, nodes))
        counts.append(len(mine))
        sizes.append(len(nodes))
    config = atomic.write_text(
        out_dir / f"{name}.comm_groups.json", json.dumps(groups.comm_group_configuration(), indent=1) + "\n"
    )
    return Export(files, config, out_dir / name, counts, sizes)
