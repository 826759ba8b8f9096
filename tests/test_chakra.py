"""Chakra execution traces (harness.interchange, ``python -m harness chakra``), without MPI.

A script run's results directory is made by hand (steps.csv, collectives.csv, run.json, as
``launch --scenario`` writes them; see tests/test_script_replay.py): its export is read back
the way Chakra's ``protolib.decodeMessage`` reads (a varint length, then the message) and every
node checked; export then import gives back the same collectives.csv rows and steps; a trace
made by hand as Chakra's generator makes them imports and replays under a scenario's
injection; what cannot be mapped is refused naming the file and the node. With ``CHAKRA_REPO``
set to a checkout of https://github.com/mlcommons/chakra, Chakra's own reader and generated
classes read an export (CI has no GitHub access: skipped there, saying so).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness import __version__
from harness.cli import main
from harness.interchange import chakra as c
from harness.interchange import et_format as et
from harness.interchange.chakra_export import export_run
from harness.interchange.chakra_import import import_traces
from harness.results import atomic
from harness.results.columns import COLLECTIVE_COLUMNS, COLLECTIVE_FILE, STEP_COLUMNS, read_frame, to_frame
from harness.results.records import RunDirectory
from harness.scenario import scenario_from_dict

SCENARIO = {"name": "chk", "ranks": 3, "workload": {"batch_size": 8, "iterations": 3},
            "imbalance": [{"kind": "fixed", "ranks": [2], "delay_ms": 5}]}
WORLD = "0 1 2"


def operations(rank: int) -> list[tuple]:
    """One step of rank ``rank``: (op, group, payload, peer, phase, at, waited), in posting order."""
    ops = [("broadcast", WORLD, 64, 0, "before", 0.0, True),
           ("allreduce", WORLD, 40_000, -1, "overlap", 0.2, False),  # a bucket; the next is posted meanwhile
           ("allreduce", WORLD, 80_000, -1, "overlap", 0.6, True),
           ("allgather", WORLD, 1_200, -1, "overlap", 0.9, True)]
    if rank in (0, 1):
        ops.append(("allreduce", "0 1", 4_000, -1, "after", 0.0, True))  # a subgroup
    if rank == 1:
        ops.append(("send", WORLD, 256, 2, "after", 0.0, False))
    if rank == 2:
        ops.append(("recv", WORLD, 256, 1, "after", 0.0, True))
    return ops + [("barrier", WORLD, 0, -1, "after", 0.0, True)]


def make_run(root: Path, steps: int = 3) -> Path:
    """A finished script run of 3 ranks x ``steps`` steps, labelled ``train``."""
    scenario = scenario_from_dict(SCENARIO)
    run = RunDirectory.create_at(root / "run", "chk")
    run.write_resolved_scenario(scenario.resolved_dict())
    rows, sequence = [], []
    for r in range(3):
        clock = 0.0
        for t in range(steps):
            delay, compute, blocked = (0.005 if r == 2 else 0.0), 0.010 + 0.001 * r + 0.0003 * t, 0.004 * (r != 2)
            rows.append({"algorithm": "train", "rank": r, "iteration": t, "start_s": clock,
                         "end_s": clock + delay + compute + blocked, "compute_s": compute, "injected_delay_s": delay,
                         "comm_blocked_s": blocked, "loss": 0.5 / (t + 1), "bytes_sent": 1000 + t, "staleness": -1,
                         "accuracy": math.nan})
            clock += delay + compute + blocked
            sequence += [(r, t, i, *op) for i, op in enumerate(operations(r))]
    run.append_algorithm("train", to_frame(pd.DataFrame(rows).reindex(columns=list(STEP_COLUMNS)), STEP_COLUMNS))
    atomic.write_csv(run.path / COLLECTIVE_FILE,
                     to_frame(pd.DataFrame(sequence, columns=list(COLLECTIVE_COLUMNS)), COLLECTIVE_COLUMNS))
    run.write_run_json("complete", ["train"], ranks=3,
                       extra={"torch_distributed": True, "script": "train.py", "optimizer_steps": [steps] * 3})
    # what the run noted of the script (harness.dist.structure), here only its per-rank entries
    atomic.write_json(run.path / "script_structure.json", {"ranks": [{"fsdp": [], "rank": r} for r in range(3)]})
    return run.path


def read_like_protolib(path: Path):
    """GlobalMetadata then Nodes, each after its length as a varint: what Chakra's
    ``protolib.decodeMessage`` does, decoded with the schema's message classes."""
    with open(path, "rb") as fh:
        def message(cls):
            size, shift = 0, 0
            while True:
                byte = fh.read(1)
                if not byte:
                    return None
                size |= (byte[0] & 0x7F) << shift
                shift += 7
                if not byte[0] & 0x80:
                    break
            out = cls()
            out.ParseFromString(fh.read(size))
            return out

        metadata = message(et.GlobalMetadata)
        nodes = []
        while (node := message(et.Node)) is not None:
            nodes.append(node)
    return metadata, nodes


def kind(node) -> str:
    return et.NODE_TYPES[node.type]


def test_an_export_reads_back_node_by_node(tmp_path):
    run = make_run(tmp_path)
    done = export_run(run)
    assert [p.name for p in done.files] == ["train.0.et", "train.1.et", "train.2.et"]
    assert json.loads(done.comm_groups.read_text()) == {"1": [0, 1]}  # ASTRA-sim's group 0 is all ranks
    collectives = read_frame(run / COLLECTIVE_FILE, COLLECTIVE_COLUMNS)
    steps = read_frame(run / "steps.csv", STEP_COLUMNS)
    for rank, path in enumerate(done.files):
        metadata, nodes = read_like_protolib(path)
        assert metadata.version == et.SCHEMA_VERSION
        assert {k: et.attrs_of(metadata)[k] for k in ("producer", "producer_version", "rank", "ranks", "label")} == {
            "producer": "harness", "producer_version": __version__, "rank": rank, "ranks": 3, "label": "train"}
        assert [n.id for n in nodes] == list(range(len(nodes)))
        assert all(d < n.id for n in nodes for d in n.data_deps)  # every dependency is an earlier node
        assert kind(nodes[0]) == "METADATA_NODE" and nodes[0].name == "process_group:init"
        assert c.parse_pytorch_groups(nodes[0].inputs.values, 3, "") == {"0": (0, 1, 2), "1": (0, 1)}
        by_id = {n.id: n for n in nodes}
        for t in range(3):
            here = [n for n in nodes[1:] if et.attrs_of(n)["harness_step"] == t]
            roles = {et.attrs_of(n).get("harness_role") for n in here}
            assert roles == {None, "injected_delay", "local_work", "step_end"}
            step = steps[(steps["rank"] == rank) & (steps["iteration"] == t)].iloc[0]
            delay = next(n for n in here if et.attrs_of(n).get("harness_role") == "injected_delay")
            work = [n for n in here if et.attrs_of(n).get("harness_role") == "local_work"]
            end = here[-1]
            assert delay.duration_micros == round(step.injected_delay_s * 1e6)
            assert sum(n.duration_micros for n in work) == round(step.compute_s * 1e6)
            assert [list(n.data_deps) for n in work] == [[delay.id]] + [[w.id] for w in work[:-1]]  # a chain
            assert et.attrs_of(end)["harness_role"] == "step_end" and end.duration_micros == 0
            assert set(end.data_deps) >= {delay.id, work[-1].id}
            assert et.attrs_of(end)["harness_start_s"] == pytest.approx(step.start_s)
            assert et.attrs_of(end)["harness_comm_blocked_s"] == pytest.approx(step.comm_blocked_s)
            comms = [n for n in here if n.type in c.COMM_NODE_TYPES]
            rows = collectives[(collectives["rank"] == rank) & (collectives["iteration"] == t)]
            assert len(comms) == len(rows)
            cut = 0
            for n, row in zip(comms, rows.itertuples(index=False)):
                a = et.attrs_of(n)
                node_type, comm_type = c.OP_TO_CHAKRA[row.op]
                assert kind(n) == node_type and n.duration_micros == 0 and a["is_cpu_op"] is False
                assert a.get("comm_type") == (None if comm_type is None else et.COMM_TYPE[comm_type])
                assert a["comm_size"] == row.payload_bytes
                assert {"0": WORLD, "1": "0 1"}[a["pg_name"]] == row.group_ranks
                assert (a["harness_seq"], a["harness_phase"], a["harness_at"], a["harness_waited"]) == (
                    row.seq, row.phase, row.at, row.waited)
                if row.op == "send":
                    assert (a["comm_src"], a["comm_dst"], a["comm_tag"]) == (rank, row.peer, t)
                elif row.op == "recv":
                    assert (a["comm_src"], a["comm_dst"], a["comm_tag"]) == (row.peer, rank, t)
                elif row.op == "broadcast":
                    assert a["comm_src"] == row.peer and "comm_dst" not in a
                else:
                    assert "comm_src" not in a and "comm_dst" not in a
                deps = [by_id[d] for d in n.data_deps]
                if row.phase == "before":
                    assert n.id in delay.data_deps  # the delay (and all after it) waits for it
                elif row.phase == "overlap":  # posted where its segment of the local work ends
                    segment = next(d for d in deps if et.attrs_of(d).get("harness_role") == "local_work")
                    cut = sum(w.duration_micros for w in work if w.id <= segment.id)
                    assert cut == round(row.at * round(step.compute_s * 1e6))
                else:  # after the local work and every overlap operation
                    assert work[-1].id in {d.id for d in deps} or all(d.type in c.COMM_NODE_TYPES for d in deps)
                assert n.id in end.data_deps or row.phase == "before"  # those: through the delay
        # the waited-for operation is a dependency of the next one; the unwaited one is not
        first, second, third = [n for n in nodes if et.attrs_of(n).get("harness_phase") == "overlap"][:3]
        assert first.id not in second.data_deps and second.id in third.data_deps


def test_export_then_import_gives_the_same_records(tmp_path):
    run = make_run(tmp_path)
    done = export_run(run, tmp_path / "et", name="ddp")
    imported = import_traces(tmp_path / "et" / "ddp", run / "scenario.resolved.yaml", tmp_path / "back")
    assert (imported.label, imported.ranks, imported.steps, imported.producer) == (
        "ddp", 3, [3, 3, 3], f"harness {__version__}")
    before = read_frame(run / COLLECTIVE_FILE, COLLECTIVE_COLUMNS)
    after = read_frame(imported.path / COLLECTIVE_FILE, COLLECTIVE_COLUMNS)
    pd.testing.assert_frame_equal(before, after)
    real = read_frame(run / "steps.csv", STEP_COLUMNS).drop(columns="algorithm")
    back = read_frame(imported.path / "steps.csv", STEP_COLUMNS).drop(columns="algorithm")
    pd.testing.assert_frame_equal(real, back, atol=1e-6, rtol=0)  # durations in whole microseconds
    meta = json.loads((imported.path / "run.json").read_text())
    assert meta["torch_distributed"] is True and meta["finished_algorithms"] == ["ddp"]
    assert meta["optimizer_steps"] == [3, 3, 3] and meta["imported_from"]["format"] == "chakra"
    assert meta["imported_from"]["step_times"] == "recorded" and meta["script"] == str(done.prefix)
    structure = json.loads((run / "script_structure.json").read_text())
    assert json.loads((imported.path / "script_structure.json").read_text()) == structure
    resolved = scenario_from_dict(__import__("yaml").safe_load((imported.path / "scenario.resolved.yaml").read_text()))
    assert (resolved.ranks, resolved.workload.iterations, resolved.algorithms) == (3, 3, [])


def test_without_the_harness_attributes_the_graph_says_the_same(tmp_path):
    """An importer that knows only the graph (and the step and role of each node) derives every
    operation's phase, place and waited from the dependencies and durations."""
    run = make_run(tmp_path)
    done = export_run(run)
    bare = tmp_path / "bare"
    bare.mkdir()
    for path in done.files:
        metadata, nodes = et.read_trace(path)
        for node in nodes:
            kept = [a for a in node.attr if not a.name.startswith("harness_") or a.name in (c.H_STEP, c.H_ROLE)]
            del node.attr[:]
            node.attr.extend(kept)
        et.write_trace(bare / path.name, metadata, nodes)
    imported = import_traces(bare, run / "scenario.resolved.yaml", tmp_path / "back")
    before = read_frame(run / COLLECTIVE_FILE, COLLECTIVE_COLUMNS)
    after = read_frame(imported.path / COLLECTIVE_FILE, COLLECTIVE_COLUMNS)
    pd.testing.assert_frame_equal(before, after, atol=1e-3, rtol=0)  # `at` from whole microseconds
    back = read_frame(imported.path / "steps.csv", STEP_COLUMNS)
    real = read_frame(run / "steps.csv", STEP_COLUMNS)
    for col in ("compute_s", "injected_delay_s"):
        assert back[col].to_numpy() == pytest.approx(real[col].to_numpy(), abs=1e-6)
    assert (back["comm_blocked_s"] == 0).all()  # no recorded times: the steps follow one another
    assert json.loads((imported.path / "run.json").read_text())["imported_from"]["step_times"].startswith("local")


def write_et(path: Path, nodes: list, metadata=None) -> None:
    et.write_trace(path, metadata or et.GlobalMetadata(version="0.0.4"), nodes)


def node(id_: int, kind_: str, deps=(), duration: int = 0, name: str = "", **attrs):
    n = et.Node(id=id_, name=name or f"{kind_.lower()}_{id_}", type=et.NODE_TYPE[kind_], data_deps=list(deps),
                duration_micros=duration)
    kinds = {"comm_type": "int64", "comm_size": "int64", "comm_src": "int32", "comm_dst": "int32",
             "pg_name": "string", "num_ops": "int64"}
    n.attr.extend(et.attribute(k, v, kinds[k]) for k, v in attrs.items())
    return n


def generator_like(rank: int) -> list:
    """As Chakra's generator and PyTorch converter write them: no steps, no process groups, no
    harness attributes. A 4 MB allreduce after the forward pass; the optimizer after both."""
    return [node(0, "COMP_NODE", duration=1000, name="forward"),
            node(1, "COMM_COLL_NODE", [0], comm_type=et.COMM_TYPE["ALL_REDUCE"], comm_size=4_000_000),
            node(2, "COMP_NODE", [0], duration=500, name="backward"),
            node(3, "COMP_NODE", [1, 2], duration=200, name="optimizer")]


def script_scenario(tmp_path: Path, ranks: int = 2, **extra) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(json.dumps({"name": "imported", "ranks": ranks, "workload": {"batch_size": 8, "iterations": 1},
                                **extra}))
    return path


def test_a_hand_built_trace_replays_under_the_scenarios_injection(tmp_path, capsys, monkeypatch):
    from harness.sim.calibration import NetworkModel
    from harness.sim.script_replay import ScriptTrace, replay_script

    for rank in range(2):
        write_et(tmp_path / f"gen.{rank}.et", generator_like(rank))
    scenario_file = script_scenario(tmp_path, imbalance=[{"kind": "fixed", "ranks": [1], "delay_ms": 10}])
    imported = import_traces(tmp_path / "gen", scenario_file, tmp_path / "run")
    assert imported.steps == [1, 1]  # no notion of iterations: one step per rank
    steps = read_frame(imported.path / "steps.csv", STEP_COLUMNS)
    assert steps["compute_s"].tolist() == pytest.approx([0.0017, 0.0017])  # forward, backward, optimizer
    ops = read_frame(imported.path / COLLECTIVE_FILE, COLLECTIVE_COLUMNS)
    assert ops[["op", "group_ranks", "payload_bytes", "peer", "phase", "waited"]].values.tolist() == [
        ["allreduce", "0 1", 4_000_000, -1, "overlap", True]] * 2
    assert ops["at"].tolist() == pytest.approx([1000 / 1700] * 2)
    from harness.scenario import load_scenario

    scenario = load_scenario(imported.path / "scenario.resolved.yaml")
    network = NetworkModel(latency_s=1e-4, bandwidth_bytes_per_s=1e9)
    trace = ScriptTrace.read(imported.path, 2, 1)
    frame, _ = replay_script(scenario, imported.label, steps, trace, scenario, network)
    frame = frame.sort_values("rank")
    # rank 1 sleeps 10 ms, posts the allreduce 1 ms into its work; 4 MB over 2 ranks: about 4 ms at 1 GB/s
    assert frame["injected_delay_s"].tolist() == pytest.approx([0.0, 0.010])
    assert frame["end_s"].max() == pytest.approx(0.010 + 0.001 + 0.004, rel=0.1)
    assert frame["comm_blocked_s"].iloc[0] > 0.010  # rank 0 waits for the straggler
    # and the command replays it too (no calibration here: the default cluster network)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["simulate", str(imported.path / "scenario.resolved.yaml"), "--out", str(tmp_path / "sim")]) == 0
    assert "replaying gen (torch.distributed, recorded at 2 ranks) at 2 ranks x 1 steps" in capsys.readouterr().err


def test_the_cli_exports_and_imports(tmp_path, capsys):
    run = make_run(tmp_path, steps=2)
    assert main(["chakra", "export", str(run), "-o", str(tmp_path / "et")]) == 0
    out = capsys.readouterr().out
    assert "3 ranks, 6 steps" in out and f"--workload-configuration={tmp_path / 'et' / 'train'}" in out
    assert main(["chakra", "import", str(tmp_path / "et" / "train"), "--scenario", str(run / "scenario.resolved.yaml"),
                 "-o", str(tmp_path / "back")]) == 0
    assert (tmp_path / "back" / "report.html").is_file()
    assert main(["chakra", "import", str(tmp_path / "et"), "--scenario", str(run / "scenario.resolved.yaml"),
                 "-o", str(tmp_path / "back")]) == 2
    assert "exists" in capsys.readouterr().err


def refusal(tmp_path: Path, nodes: list, ranks: int = 1, **scenario) -> str:
    for rank in range(ranks):
        write_et(tmp_path / f"bad.{rank}.et", nodes)
    with pytest.raises(c.ChakraError) as caught:
        import_traces(tmp_path / "bad", script_scenario(tmp_path, ranks, **scenario), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing left behind
    return str(caught.value)


@pytest.mark.parametrize("bad, message", [
    (node(1, "COMM_COLL_NODE", [0], name="weird", comm_type=42, comm_size=8),
     "bad.0.et: node 1 ('weird'): comm_type unknown (42) has no native counterpart"),
    (node(1, "COMM_COLL_NODE", [0], name="sizeless", comm_type=0),
     "node 1 ('sizeless'): an allreduce without comm_size (the bytes it moves)"),
    (node(1, "COMM_COLL_NODE", [0], name="typeless", comm_size=8),
     "node 1 ('typeless'): a COMM_COLL_NODE without comm_type"),
    (node(1, "MEM_LOAD_NODE", [0], name="load"), "node 1 ('load'): a MEM_LOAD_NODE has no native counterpart"),
    (node(1, "COMM_COLL_NODE", [0], name="grouped", comm_type=0, comm_size=8, pg_name="7"),
     "node 1 ('grouped'): pg_name '7': no such process group"),
    (node(1, "COMM_SEND_NODE", [0], name="nowhere", comm_size=8), "node 1 ('nowhere'): a send without comm_dst"),
    (node(1, "COMP_NODE", [0], name="roofline", num_ops=10**9), "timed only by num_ops"),
    (node(1, "COMP_NODE", [2], name="ahead"), "node 1 ('ahead'): depends on node 2, which the file does not have"),
])
def test_what_cannot_be_mapped_is_refused_naming_the_file_and_node(tmp_path, bad, message):
    assert message in refusal(tmp_path, [node(0, "COMP_NODE", duration=5), bad])


def test_a_cycle_a_missing_rank_and_a_scenario_with_algorithms_are_refused(tmp_path):
    cycle = [node(0, "COMP_NODE", [1], duration=5, name="a"), node(1, "COMP_NODE", [0], duration=5, name="b")]
    assert "node 0 ('a'): is on a cycle of data dependencies" in refusal(tmp_path / "c", cycle)
    (tmp_path / "m").mkdir()
    write_et(tmp_path / "m" / "t.0.et", [node(0, "COMP_NODE", duration=5)])
    write_et(tmp_path / "m" / "t.2.et", [node(0, "COMP_NODE", duration=5)])
    with pytest.raises(c.ChakraError, match=r"t\.1\.et: missing: a trace has one file per rank, 0 to 2"):
        import_traces(tmp_path / "m", script_scenario(tmp_path, 3), tmp_path / "run")
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "junk.0.et").write_bytes(b"\x05\xff\xff\xff\xff\xff")
    with pytest.raises(et.TraceFormatError, match="junk.0.et: not a Chakra ET"):
        import_traces(tmp_path / "g" / "junk", script_scenario(tmp_path, 1), tmp_path / "run")
    write_et(tmp_path / "ok.0.et", [node(0, "COMP_NODE", duration=5)])
    with_algorithms = tmp_path / "algos.yaml"
    with_algorithms.write_text(json.dumps({"name": "a", "ranks": 1, "algorithms": [{"name": "allreduce_sgd"}],
                                           "workload": {"batch_size": 8, "iterations": 1}}))
    with pytest.raises(c.ChakraError, match="lists algorithms: the trace is the algorithm"):
        import_traces(tmp_path / "ok", with_algorithms, tmp_path / "run")


def test_the_ranks_must_line_up_and_only_a_script_run_exports(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default results/ of an import without -o
    write_et(tmp_path / "skew.0.et", [node(0, "COMM_COLL_NODE", comm_type=0, comm_size=8)])
    write_et(tmp_path / "skew.1.et", [node(0, "COMM_COLL_NODE", comm_type=5, comm_size=8)])
    with pytest.raises(c.ChakraError, match="the ranks' traces do not line up: .*allreduce on rank 0 and a broadcast"):
        import_traces(tmp_path / "skew", script_scenario(tmp_path, 2), tmp_path / "run")
    capsys.readouterr()
    assert main(["chakra", "import", str(tmp_path / "skew"), "--scenario", str(script_scenario(tmp_path, 2))]) == 2
    assert "error: " in capsys.readouterr().err and not (tmp_path / "results").exists()
    plain = RunDirectory.create_at(tmp_path / "plain", "chk")
    plain.write_run_json("complete", ["sgp"], ranks=2)
    assert main(["chakra", "export", str(plain.path)]) == 2
    assert "not a torch.distributed script run" in capsys.readouterr().err


def test_a_process_group_from_pytorchs_metadata_node_or_astra_sims_file(tmp_path):
    described = node(0, "METADATA_NODE", name="## process_group:init ##")
    described.inputs.values = repr([json.dumps([{"pg_name": "0", "ranks": []}, {"pg_name": "3", "ranks": [1, 2]}])])
    for rank in range(3):
        nodes = [described] + ([node(1, "COMM_COLL_NODE", [0], comm_type=2, comm_size=16, pg_name="3")]
                               if rank else [])
        write_et(tmp_path / f"pg.{rank}.et", nodes)
    imported = import_traces(tmp_path / "pg", script_scenario(tmp_path, 3), tmp_path / "run")
    ops = read_frame(imported.path / COLLECTIVE_FILE, COLLECTIVE_COLUMNS)
    assert ops[["rank", "op", "group_ranks"]].values.tolist() == [[1, "allgather", "1 2"], [2, "allgather", "1 2"]]
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps({"3": [1, 2]}))
    for rank in range(3):
        write_et(tmp_path / f"file.{rank}.et",
                 [node(0, "COMM_COLL_NODE", comm_type=2, comm_size=16, pg_name="3")] if rank else [])
    imported = import_traces(tmp_path / "file", script_scenario(tmp_path, 3), tmp_path / "run2", comm_groups=groups)
    assert read_frame(imported.path / COLLECTIVE_FILE, COLLECTIVE_COLUMNS)["group_ranks"].tolist() == ["1 2"] * 2


# --- Chakra's own reader (by hand: CHAKRA_REPO=<checkout> python -m pytest tests/test_chakra.py -k own) ----


def _chakra_classes(repo: Path, out: Path):
    """Chakra's protolib and its et_def_pb2, generated from the checkout's schema by protoc
    (grpcio-tools' or the one on PATH)."""
    proto = repo / "schema" / "protobuf" / "et_def.proto"
    protolib = repo / "src" / "third_party" / "utils" / "protolib.py"
    if not proto.is_file() or not protolib.is_file():
        pytest.fail(f"CHAKRA_REPO={repo}: not a checkout of mlcommons/chakra (no {proto} or {protolib})")
    out.mkdir()
    args = [f"-I{proto.parent}", f"--python_out={out}", str(proto)]
    if importlib.util.find_spec("grpc_tools") is not None:
        command = [sys.executable, "-m", "grpc_tools.protoc", *args]
    elif shutil.which("protoc"):
        command = ["protoc", *args]
    else:
        pytest.skip("generating Chakra's et_def_pb2 needs protoc (apt-get install protobuf-compiler) or grpcio-tools")
    subprocess.run(command, check=True)
    modules = []
    for name, path in (("chakra_et_def_pb2", out / "et_def_pb2.py"), ("chakra_protolib", protolib)):
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[name] = module
        modules.append(sys.modules[name])
    return modules


def test_chakra_own_reader_reads_an_export(tmp_path):
    repo = os.environ.get("CHAKRA_REPO")
    if not repo:
        pytest.skip("CHAKRA_REPO is not set: give it a checkout of https://github.com/mlcommons/chakra to read an "
                    "export with Chakra's own protolib and generated classes (CI has no GitHub access)")
    from google.protobuf import descriptor_pb2
    from google.protobuf.json_format import MessageToDict

    pb2, protolib = _chakra_classes(Path(repo), tmp_path / "generated")
    theirs = descriptor_pb2.FileDescriptorProto.FromString(pb2.DESCRIPTOR.serialized_pb)
    ours = et._schema()
    assert list(theirs.message_type) == list(ours.message_type) and list(theirs.enum_type) == list(ours.enum_type)
    done = export_run(make_run(tmp_path))
    for rank, path in enumerate(done.files):
        ours_meta, ours_nodes = et.read_trace(path)
        fh = protolib.openFileRd(str(path))
        metadata = pb2.GlobalMetadata()
        assert protolib.decodeMessage(fh, metadata)
        nodes = []
        while True:
            n = pb2.Node()
            if not protolib.decodeMessage(fh, n):
                break
            nodes.append(n)
        fh.close()
        assert MessageToDict(metadata) == MessageToDict(ours_meta)
        assert [MessageToDict(n) for n in nodes] == [MessageToDict(n) for n in ours_nodes]
        comm = [n for n in nodes if n.type == pb2.COMM_COLL_NODE]
        sizes = {a.name: a for n in comm[:1] for a in n.attr}
        assert sizes["comm_type"].int64_val == pb2.BROADCAST and sizes["pg_name"].string_val == "0"
        assert sum(n.type == pb2.COMM_SEND_NODE for n in nodes) == (3 if rank == 1 else 0)


@pytest.mark.subprocess
def test_a_collectives_column_added_later_travels_as_an_attribute(tmp_path, monkeypatch):
    """collectives.csv may gain columns (harness.results.columns): one this mapping does not know
    is carried as a ``harness_column:<name>`` attribute and comes back on import."""
    import harness.results.columns as columns

    run = make_run(tmp_path, steps=1)
    frame = read_frame(run / COLLECTIVE_FILE, COLLECTIVE_COLUMNS).assign(made_at=lambda f: f["seq"] * 0.5)
    monkeypatch.setattr(columns, "COLLECTIVE_COLUMNS", (*COLLECTIVE_COLUMNS, "made_at"))
    atomic.write_csv(run / COLLECTIVE_FILE, frame)
    done = export_run(run)
    _, nodes = et.read_trace(done.files[0])
    assert [et.attrs_of(n)["harness_column:made_at"] for n in nodes if n.type in c.COMM_NODE_TYPES][:2] == ["0.0",
                                                                                                          "0.5"]
    imported = import_traces(done.prefix, run / "scenario.resolved.yaml", tmp_path / "back")
    back = read_frame(imported.path / COLLECTIVE_FILE, columns.COLLECTIVE_COLUMNS)
    pd.testing.assert_frame_equal(back, read_frame(run / COLLECTIVE_FILE, columns.COLLECTIVE_COLUMNS))
