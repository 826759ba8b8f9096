"""``python -m harness bench collectives``: size parsing, argument errors, and one real 2-rank run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import harness_cli

from harness.bench.collective_ops import iterations_for
from harness.bench.sizes import SizeError, format_size, parse_size, parse_sizes

# A child must not believe it already runs inside an MPI job (pytest may itself run under one).
_JOB_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_STEP_ID")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _JOB_VARS}


def _harness(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], env=_env(), capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize(
    ("text", "size"),
    [("4K", 4096), ("64k", 65536), ("1M", 1 << 20), ("16M", 16 << 20), ("1048576", 1048576), ("4", 4),
     ("1G", 1 << 30), (" 8KB ", 8192), ("2KiB", 2048)],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "expected a byte count"), ("4X", "expected a byte count"), ("1.5M", "expected a byte count"),
     ("-4K", "expected a byte count"), ("K", "expected a byte count"), ("0", "must be positive"),
     ("6", "not a whole number of float32 elements"), ("2G", "at most 1G")],
)
def test_parse_size_refuses(text, message):
    with pytest.raises(SizeError, match=message):
        parse_size(text)


def test_parse_sizes_sorts_and_dedupes():
    assert parse_sizes("1M,4K,4096,64K") == [4096, 65536, 1 << 20]
    with pytest.raises(SizeError, match="empty entry"):
        parse_sizes("4K,,1M")


def test_format_size_and_iteration_cut():
    assert [format_size(s) for s in (4096, 1 << 20, 1536 * 1024, 100)] == ["4K", "1M", "1536K", "100"]
    assert iterations_for(1 << 20, 20, 5) == (20, 5)
    iters, warmup = iterations_for(16 << 20, 20, 5)
    assert 5 <= iters < 20 and 1 <= warmup < 5
    assert iterations_for(1 << 30, 3, 0) == (3, 0)  # never more than asked


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--sizes", "4K,abc"], "argument --sizes: bad size 'abc'"),
     (["--sizes", "6"], "not a whole number of float32 elements"),
     (["--ranks", "0"], "argument --ranks: must be >= 1"),
     (["--iters", "0"], "argument --iters: must be >= 1"),
     (["--ops", "allreduce,reduce"], "unknown op 'reduce': choose from allreduce, broadcast")],
)
@pytest.mark.subprocess
def test_bad_arguments_exit_2(args, message):
    proc = _harness("bench", "collectives", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stdout == ""


@pytest.mark.subprocess
def test_parent_launches_worker_without_importing_mpi4py():
    script = textwrap.dedent("""
        import json, subprocess, sys
        import harness.commands.bench as bench
        calls = []
        def fake_run_ranks(n, argv, **kw):
            calls.append([n, list(argv)])
            return subprocess.CompletedProcess(argv, 3 if "--baselines" in argv else 0)
        bench.run_ranks = fake_run_ranks
        from harness.cli import main
        rc = main(["bench", "collectives", "--sizes", "1M,4K", "--ops", "broadcast", "--spin-us", "10"])
        print(json.dumps({"rc": rc, "calls": calls, "mpi4py": "mpi4py" in sys.modules}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["rc"] == 3  # the job's status is the command's
    assert not out["mpi4py"]
    options = ["--ranks", "4", "--sizes", "4096,1048576", "--iters", "20", "--warmup", "5", "--ops", "broadcast"]
    # MPI alone at each thread level, each in a job of its own, then the native job reading their times
    single, multiple, native = out["calls"]
    rows = []
    for (ranks, argv), mode in ((single, "single"), (multiple, "multiple")):
        assert ranks == 4
        assert argv[:3] == [sys.executable, "-m", "harness.bench.collectives_worker"]
        assert argv[3:13] == options and argv[13:16] == ["--mpi-baseline", mode, "--rows"]
        rows.append(argv[16])
    ranks, argv = native
    assert ranks == 4
    assert argv[3:] == options + ["--baselines", *rows, "--spin-us", "10.0"]


@pytest.mark.mpi
def test_collectives_two_ranks(tmp_path):
    out = tmp_path / "bench.json"
    proc = _harness("bench", "collectives", "--ranks", "2", "--sizes", "4K,64K", "--iters", "3", "--warmup", "1",
                    "--json", str(out), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header = ("size(B) count(elems) time(us) algbw(GB/s) busbw(GB/s) #wrong mpi_single(us) mpi_multi(us) "
              "mpi_busbw(GB/s) ratio floor(us) floor/time")
    tables = [line for line in proc.stdout.splitlines() if " ".join(line.split()[1:]) == header]
    assert len(tables) == 4, proc.stdout  # allreduce, broadcast, allgather, reduce_scatter
    assert "2 ranks, warmup 1, iters 3" in proc.stdout
    assert "# #wrong total: 0  OK" in proc.stdout

    report = json.loads(out.read_text())
    assert (report["ranks"], report["iters"], report["warmup"]) == (2, 3, 1)
    # MPI at its best: each thread level measured in a job of its own, and MPI gave each the level asked
    assert report["mpi_modes"] == {"single": "single", "multiple": "multiple"}
    rows = {(r["op"], r["size_bytes"]): r for r in report["rows"]}
    assert set(rows) == {(op, s) for op in ("allreduce", "broadcast", "allgather", "reduce_scatter")
                         for s in (4096, 65536)}
    for (op, size), row in rows.items():
        assert row["count"] == size // 4
        assert row["wrong"] == 0, (op, size)
        assert row["time_us"] > 0 and row["mpi_time_us"] > 0
        assert row["mpi_time_us"] == min(row["mpi_single_time_us"], row["mpi_multiple_time_us"])
        assert row["ratio"] == pytest.approx(row["mpi_time_us"] / row["time_us"])
        assert row["floor_time_us"] > 0
        assert row["floor_ratio"] == pytest.approx(row["floor_time_us"] / row["time_us"])
    ar = rows["allreduce", 4096]
    assert ar["busbw_gbs"] == pytest.approx(ar["algbw_gbs"] * 2 * (2 - 1) / 2)
    ag = rows["allgather", 4096]
    assert ag["busbw_gbs"] == pytest.approx(ag["algbw_gbs"] * (2 - 1) / 2)
    assert report["min_allreduce_ratio_ge_1MiB"] is None  # no size >= 1M here


@pytest.mark.mpi
def test_collectives_on_emulated_nodes_run_auto_and_hierarchical(tmp_path):
    """4 ranks as 2 nodes of 2 behind 0.2 Gb/s NICs: both allreduces, correct, side by side; the
    hierarchical one crosses each NIC with the buffer once, the ring with 2(p-1)/p of it twice."""
    out = tmp_path / "bench.json"
    proc = _harness("bench", "collectives", "--ranks", "4", "--ranks-per-node", "2", "--nic-gbps", "0.2",
                    "--ops", "allreduce", "--sizes", "1M", "--iters", "3", "--warmup", "1", "--json", str(out),
                    timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "auto allreduce: 2 nodes of 2 ranks, NIC 0.2 Gb/s 50 us" in proc.stdout
    assert "hierarchical allreduce: 2 nodes of 2 ranks" in proc.stdout
    assert "# #wrong total: 0  OK" in proc.stdout
    report = json.loads(out.read_text())
    assert report["emulated_nodes"]["ranks_per_node"] == 2
    times = {r["allreduce_kind"]: r["time_us"] for r in report["rows"]}
    # 1 MiB through 25 MB/s: at least 42 ms for the leaders' exchange, 63 ms for the ring.
    assert times["hierarchical"] > 40e3 and times["auto"] > 60e3
    assert times["hierarchical"] < times["auto"], times
    assert all(r["mpi_time_us"] is None and r["ratio"] is None for r in report["rows"])  # no baseline

    bad = _harness("bench", "collectives", "--ranks", "4", "--ranks-per-node", "3", "--ops", "allreduce",
                   "--sizes", "4K", timeout=120)
    assert bad.returncode != 0
    assert "--ranks-per-node 3 must divide the ranks (4)" in bad.stdout + bad.stderr


@pytest.mark.subprocess
def test_simulator_benchmark_prints_its_speed() -> None:
    proc = harness_cli("bench", "simulator", "--ranks", "16", "--iterations", "5", "--repeat", "2", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "events/s" in proc.stdout and "wagma" in proc.stdout
    assert proc.stdout.count("repetition") == 2
    bad = harness_cli("bench", "simulator", "--ranks", "16", "--algorithm", "{name: wagma, group_size: 32}")
    assert bad.returncode == 2 and "group_size" in bad.stderr


@pytest.mark.subprocess
def test_simulator_shapes_cover_the_targets_and_report_against_them(monkeypatch, capsys) -> None:
    """The --shapes matrix holds the issue's shapes (groups of 2 to 32, rounds every 2 to 50, a
    slow link, NICs with a flat ring, real compute, every built-in at two scales, four at 65,536)
    and each builds a valid scenario; run at a tiny size, a row per algorithm, a missed target
    makes the exit status 1."""
    from harness.algorithms import registry
    from harness.bench import simulator

    matrix = simulator.shapes()
    groups = {a["group_size"] for s in matrix for a in s.algorithms if isinstance(a, dict) and a["name"] == "wagma"}
    assert {2, 3, 32} <= groups
    assert {s.ranks for s in matrix} == {1024, 16384, 65536}
    by_label = {s.label: s for s in matrix}
    assert {a["name"] for a in by_label["all_1024"].algorithms} == set(registry.names())
    assert by_label["big_65536"].memory_gb == 8.0 and by_label["all_16384"].target_s == 60.0
    for shape in matrix:
        simulator.shape_scenario(shape, shape.algorithms[0])  # valid
    tiny = [simulator.Shape("tiny_nics", ("allreduce_sgd", "sgp"), 16, 3, 60.0, by_label["flat_ring_nics"].changes),
            simulator.Shape("tiny_real", ("allreduce_sgd",), 8, 3, 1e-9, {"workload": {"compute": "real"}},
                            real_compute_s=0.05, setting="resnet20")]
    monkeypatch.setattr(simulator, "shapes", lambda: tiny)
    assert simulator.run_shapes(None) == 1  # the second target (1 ns) is missed
    out = capsys.readouterr().out
    assert out.count("tiny_nics") >= 2 and "MISSED" in out and "2 of 3 within their targets" in out
    assert simulator.run_shapes(["tiny_nics"]) == 0


@pytest.mark.subprocess
def test_simulator_benchmark_runs_every_registered_algorithm() -> None:
    from harness.algorithms import registry

    proc = harness_cli("bench", "simulator", "--all", "--ranks", "4", "--iterations", "3", "--setting", "resnet20",
                       timeout=180)
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.split("simulated s", 1)[1]
    # The built-in ones: a test that loaded a scenario with a user's class in this worker has
    # registered that class here too, and the benchmark's own process does not know it.
    for name in (r.name for r in registry.BUILT_IN if r.variant_of is None):
        assert f"\n{name} " in table, name


@pytest.mark.mpi
def test_bench_dist_runs_both_backends_and_prints_the_table():
    """``bench dist`` at 2 ranks, the smallest model, few steps, each wrapper (DDP, FSDP2): the
    table's rows (no speed check)."""
    proc = _harness("bench", "dist", "--ranks", "2", "--sizes", "50k", "--wrappers", "ddp,fsdp2", "--steps", "2",
                    "--repeats", "2", "--warmup", "1", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["model"])
    assert lines[header].split()[3] == "wrapper", lines
    rows = [line.split() for line in lines[header + 1:header + 3]]
    assert [row[:4] for row in rows] == [["50k", "49,472", "32", "DDP"], ["50k", "49,472", "32", "FSDP2"]], lines
    for row in rows:
        gloo_ms, harness_ms, ratio, diff = map(float, row[4:8])
        assert gloo_ms > 0 and harness_ms > 0 and ratio > 0
        assert diff == 0  # 2 ranks: both backends sum in the same order (FSDP2's parameters gathered whole)


def test_bench_dist_arguments_round_trip_to_the_worker():
    import argparse

    from harness.bench import dist, dist_worker

    def parse(argv):
        parser = argparse.ArgumentParser()
        dist.add_arguments(parser)
        return parser.parse_args(argv)

    assert parse([]).wrappers == ["ddp", "fsdp2"] and parse([]).sizes == ["50k", "1M", "25M"]
    args = parse(["--sizes", "1m,50k", "--wrappers", "FSDP2", "--steps", "3", "--repeats", "1", "--warmup", "0"])
    assert args.wrappers == ["fsdp2"] and args.sizes == ["1M", "50k"]
    assert vars(parse(dist.to_argv(args, 3))) == {**vars(args), "ranks": 3}
    assert dist_worker.worker_argv(args, 3)[3:] == dist.to_argv(args, 3)


@pytest.mark.subprocess
def test_bench_dist_refuses_an_unknown_wrapper():
    proc = _harness("bench", "dist", "--wrappers", "ddp,fsdp")
    assert proc.returncode == 2
    assert "unknown wrapper 'fsdp': choose from ddp, fsdp2" in proc.stderr


@pytest.mark.subprocess
def test_bench_dist_refuses_an_unknown_size():
    proc = _harness("bench", "dist", "--sizes", "50k,7M")
    assert proc.returncode == 2
    assert "unknown model size '7M'" in proc.stderr
