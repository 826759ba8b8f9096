"""Simulated runs that train (``simulate --train``, ``compare --train``; harness.sim.training).

Three kinds of proof:

* The numerics of the simulated network: an allreduce adds in the order of the native ring,
  recursive-doubling and tree schedules (kernels/step_program.cpp), checked against a literal
  step-by-step replay of those schedules written here.
* Equal to the real run: real runs under mpiexec (3 ranks on a ring allreduce, 4 on recursive
  doubling, a straggler injected), then ``compare --train --mode trace``: every algorithm whose
  numerics do not depend on arrival order, and the wait-avoiding ones (replayed from the
  staleness the real run recorded), end with the real run's final models; the others train to
  a comparable accuracy. The simulated run directory has the real run's files.
* Equal to an independent computation at scale: at 64 simulated ranks, Allreduce-SGD,
  Local SGD and D-PSGD end with the final models that a plain single-process recomputation from
  the run's provenance gives (the rules of docs/algorithms/, written here with torch.optim.SGD,
  not with the algorithm classes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import harness_cli as harness, run_scenario, write_scenario_file
from harness.sim.calibration import save_fixed_calibration
from harness.sim.step_programs import FLOAT_BYTES, allreduce_program, tree_chunks, tree_shape
from harness.sim.sums import doubling_sum, native_sum, ring_sum, tree_sum

# A trace-driven simulation with values ends with the real run's models (docs/algorithms/index.md,
# "In the simulator"): the algorithms whose numerics do not depend on the order messages arrive
# in, and the wait-avoiding ones, whose rounds contribute what the real run recorded.
ORDER_FREE = ("allreduce_sgd", "local_sgd", "overlap_local_sgd", "easgd", "cocod_sgd", "bmuf", "sgp", "dpsgd",
              "diloco", "streaming_diloco", "slowmo", "gossip_pga", "wagma", "eager_sgd")
ORDER_DEPENDENT = ("osgp", "adpsgd", "quorum_diloco")


# -- the native orders of addition ----------------------------------------------------------------
def literal_ring(xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """kernels/step_program.cpp's ring_allreduce, step by step: reduce-scatter (member m sends chunk
    m - st, receives chunk m - st - 1 and adds it into its own), then allgather."""
    p, n = len(xs), xs[0].numel()
    buf = [x.clone() for x in xs]

    def chunk(k: int) -> slice:
        base, extra = divmod(n, p)
        k %= p
        return slice(k * base + min(k, extra), (k + 1) * base + min(k + 1, extra))

    for st in range(p - 1):
        sent = [buf[m][chunk(m - st)].clone() for m in range(p)]
        for m in range(p):
            buf[m][chunk(m - st - 1)] += sent[(m - 1) % p]
    for st in range(p - 1):
        sent = [buf[m][chunk(m + 1 - st)].clone() for m in range(p)]
        for m in range(p):
            buf[m][chunk(m - st)] = sent[(m - 1) % p]
    return buf


def literal_doubling(xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """kernels/step_program.cpp's rd_allreduce: fold the members beyond a power of two into their
    neighbours, exchange and add with partner v ^ mask, unfold."""
    p = len(xs)
    buf = [x.clone() for x in xs]
    pow2 = 1 << (p.bit_length() - 1)
    rem = p - pow2
    for m in range(1, 2 * rem, 2):
        buf[m] += buf[m - 1]

    def real(v: int) -> int:
        return 2 * v + 1 if v < rem else v + rem

    mask = 1
    while mask < pow2:
        sent = {real(v): buf[real(v)].clone() for v in range(pow2)}
        for v in range(pow2):
            buf[real(v)] += sent[real(v ^ mask)]
        mask <<= 1
    for m in range(0, 2 * rem, 2):
        buf[m] = buf[m + 1].clone()
    return buf


@pytest.mark.parametrize("p,n", [(3, 10), (5, 13), (7, 7), (8, 1001), (12, 50)])
def test_ring_sum_adds_in_the_native_ring_order(p: int, n: int) -> None:
    xs = [torch.randn(n, generator=torch.Generator().manual_seed(10 * p + i)) * 1e3 ** (i % 3) for i in range(p)]
    total = ring_sum(xs)
    assert all(torch.equal(b, total) for b in literal_ring(xs))
    rows = torch.stack(xs)
    assert torch.equal(ring_sum(list(rows)), total)  # rows of one tensor: the strided path
    assert not torch.equal(total, rows.sum(0)) or p < 4  # the order matters: a plain sum differs


@pytest.mark.parametrize("p", [2, 3, 5, 6, 8])
def test_doubling_sum_adds_in_the_native_recursive_doubling_order(p: int) -> None:
    xs = [torch.randn(33, generator=torch.Generator().manual_seed(p + i)) * 1e3 ** (i % 3) for i in range(p)]
    total = doubling_sum(xs)
    assert all(torch.equal(b, total) for b in literal_doubling(xs))


def literal_tree(xs: list[torch.Tensor], nodes: tuple[int, ...], chunk_bytes: int) -> list[torch.Tensor]:
    """kernels/step_program.cpp's tree_allreduce, round by round from the simulator's schedule: the
    k-th message a member sends its parent carries its chunk k, which the parent adds into its
    own; the k-th message a parent sends a child carries its chunk k, which replaces the child's.
    Every message of a round (all of its steps) leaves before any arrives, and a member adds its
    children's chunks in child order; sizes are checked against the chunks."""
    p, n = len(xs), xs[0].numel()
    schedule = allreduce_program(p, n, 0, "tree", nodes, chunk_bytes)
    shape = tree_shape(nodes)
    parent, children = shape.parent, shape.children
    k = tree_chunks(n, chunk_bytes)
    base, extra = divmod(n, k)
    chunks = [slice(c * base + min(c, extra), (c + 1) * base + min(c + 1, extra)) for c in range(k)]
    buf = [x.clone() for x in xs]
    sent_on: dict[tuple[int, int], int] = {}  # messages so far per (sender, receiver)
    for steps in schedule.rounds:
        messages = []
        for i in steps:
            for m in range(p):
                to = int(schedule.send_to[i, m])
                if to < 0:
                    continue
                c = sent_on.get((m, to), 0)
                sent_on[(m, to)] = c + 1
                assert schedule.send_bytes[i, m] == (chunks[c].stop - chunks[c].start) * FLOAT_BYTES
                messages.append((m, to, c, buf[m][chunks[c]].clone()))
        # Arrivals in child order at every parent (the native step's reduces); broadcasts as they come.
        messages.sort(key=lambda msg: children[msg[1]].index(msg[0]) if parent[msg[0]] == msg[1] else -1)
        for m, to, c, data in messages:
            if parent[m] == to:
                buf[to][chunks[c]] += data
            else:
                assert parent[to] == m
                buf[to][chunks[c]] = data
    return buf


@pytest.mark.parametrize("nodes", [(0, 1), (0, 1, 2), tuple(range(7)), (0, 0, 0, 1, 1, 2, 2, 2, 2),
                                   (1, 0, 1, 0, 2), tuple(r // 4 for r in range(12)), (0,) * 5])
@pytest.mark.parametrize("chunk_bytes", [8, 52, 1 << 20])
def test_tree_sum_adds_in_the_native_tree_order(nodes: tuple[int, ...], chunk_bytes: int) -> None:
    """Every member of the replayed tree ends with bitwise tree_sum (whatever the chunks), which
    native_sum picks for a tree schedule; a plain sum differs (the order matters)."""
    p = len(nodes)
    xs = [torch.randn(37, generator=torch.Generator().manual_seed(p + i)) * 1e3 ** (i % 3) for i in range(p)]
    total = tree_sum(xs, nodes)
    assert all(torch.equal(b, total) for b in literal_tree(xs, nodes, chunk_bytes))
    assert torch.equal(native_sum(xs, allreduce_program(p, 37, 0, "tree", nodes, chunk_bytes)), total)
    rows = torch.stack(xs)
    assert torch.equal(tree_sum(list(rows), nodes), total)  # rows of one tensor: the strided path
    assert not torch.equal(total, rows.sum(0)) or p < 4


# -- equal to the real run --------------------------------------------------------------------------
ALL = list(ORDER_FREE + ORDER_DEPENDENT)
REAL = {
    3: {"name": "sim_values_3", "ranks": 3, "seed": 11,
        # mlp on digits: 26,122 floats, over 64 KiB: the ring allreduce
        "workload": {"model": "mlp", "dataset": "digits", "batch_size": 16, "iterations": 12, "eval_every": 6},
        "algorithms": ["allreduce_sgd", {"name": "local_sgd", "period": 4}, {"name": "overlap_local_sgd", "period": 4},
                       {"name": "easgd", "period": 4}, {"name": "cocod_sgd", "period": 4}, {"name": "bmuf", "period": 4},
                       "sgp", "osgp", "dpsgd", {"name": "wagma", "group_size": 2, "period": 5},
                       {"name": "eager_sgd", "mode": "majority"}, {"name": "diloco", "inner_steps": 4},
                       {"name": "streaming_diloco", "inner_steps": 4, "fragments": 2},
                       {"name": "quorum_diloco", "inner_steps": 4}, {"name": "slowmo", "period": 4},
                       {"name": "gossip_pga", "period": 4}],
        "imbalance": [{"kind": "random_ranks", "count": 1, "delay_ms": 20}],
        "results": {"provenance": "full"}},
    4: {"name": "sim_values_4", "ranks": 4, "seed": 12,
        # logreg on digits: 650 floats: recursive doubling
        "workload": {"model": "logreg", "dataset": "digits", "batch_size": 16, "iterations": 12, "eval_every": 6},
        "algorithms": ["allreduce_sgd", "sgp", "adpsgd", {"name": "wagma", "group_size": 2, "period": 5}],
        "imbalance": [{"kind": "random_ranks", "count": 1, "delay_ms": 20}],
        "results": {"provenance": "full"}},
}


@pytest.fixture(scope="module", params=sorted(REAL))
def compared(request, tmp_path_factory) -> tuple[int, Path]:
    """A real run, then ``compare --train --mode trace`` of it (a fixed calibration: trace mode
    takes each rank's compute from the run)."""
    ranks = request.param
    tmp = tmp_path_factory.mktemp(f"values{ranks}")
    run = run_scenario(tmp, REAL[ranks])
    calibration = save_fixed_calibration(tmp / "calibration.json", ranks)
    out = harness("compare", str(run), "--train", "--mode", "trace", "--calibration", str(calibration))
    assert out.returncode == 0, out.stderr
    return ranks, run


@pytest.mark.mpi
@pytest.mark.slow
def test_trace_driven_values_end_with_the_real_final_models(compared) -> None:
    ranks, run = compared
    sim = run / "sim-trace"
    assert torch.equal(torch.load(sim / "provenance" / "initial_model.pt"), torch.load(run / "provenance" / "initial_model.pt"))
    names = [a if isinstance(a, str) else a["name"] for a in REAL[ranks]["algorithms"]]
    for name in names:
        real = torch.load(run / "provenance" / f"final_models_{name}.pt")
        simulated = torch.load(sim / "provenance" / f"final_models_{name}.pt")
        assert simulated.shape == real.shape == (ranks, real.shape[1])
        relative = float(((simulated - real).norm(dim=1) / real.norm(dim=1)).max())
        if name in ORDER_FREE:
            assert relative <= 1e-5, f"{name}: final models differ by {relative:.2e} (relative) from the real run's"
            real_average = torch.load(run / "provenance" / f"final_average_{name}.pt")
            simulated_average = torch.load(sim / "provenance" / f"final_average_{name}.pt")
            assert float((simulated_average - real_average).norm() / real_average.norm()) <= 1e-5, name


@pytest.mark.mpi
@pytest.mark.slow
def test_trace_driven_values_train_every_algorithm_like_the_real_run(compared) -> None:
    ranks, run = compared
    real, sim = pd.read_csv(run / "evals.csv"), pd.read_csv(run / "sim-trace" / "evals.csv")
    table = pd.read_csv(run / "compare.csv")
    for name, rows in table.groupby("algorithm"):
        row = rows.iloc[0]
        assert row.predicted_final_accuracy == pytest.approx(
            float(sim[(sim.algorithm == name) & (sim.model == "average")].sort_values("iteration").test_accuracy.iloc[-1]))
        if name in ORDER_FREE:
            assert row.accuracy_error_max == 0.0, name
        else:  # its exchanges follow the simulated timing: close to the real run, not equal
            assert row.accuracy_error_max < 25.0, f"{name}: {row.accuracy_error_max} points from the real run"
            assert row.predicted_final_accuracy > 0.5, name  # it trains (10 classes: chance is 0.1)
    assert set(sim.iteration) == set(real.iteration)  # the real run's evaluation points


@pytest.mark.mpi
@pytest.mark.slow
def test_a_simulated_run_with_values_has_the_real_run_files(compared) -> None:
    ranks, run = compared
    sim = run / "sim-trace"
    real_files = {p.name for p in (run / "provenance").iterdir()}
    assert {p.name for p in (sim / "provenance").iterdir()} == real_files
    meta = json.loads((sim / "run.json").read_text())
    assert meta["simulated"] and meta["trained"] and meta["provenance"] == "full"
    steps = pd.read_csv(sim / "steps.csv")
    assert steps["loss"].notna().all()
    summary = pd.read_csv(sim / "summary.csv")
    assert summary["final_accuracy"].between(0.0, 1.0).all()
    assert not list(run.glob(".sim-values-*"))  # no staging folder left behind


# -- equal to an independent computation at scale ---------------------------------------------------
SCALE_WORKLOAD = {"model": "logreg", "dataset": "digits", "batch_size": 8, "iterations": 12, "eval_every": 6}
SCALE_OPTIMIZER = {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4}


def _recompute(run: Path, scenario: dict, algorithm: str) -> torch.Tensor:
    """Every rank's final model by the rules of docs/algorithms (not the harness's classes):
    rank r computes its gradient on its batch of iteration t (``batch_indices`` of its shard in
    provenance/shards.npz), then
      allreduce_sgd: every rank steps with the mean gradient;
      local_sgd:     every rank steps with its own; after steps t with (t + 1) % period == 0
                     the models are averaged;
      dpsgd (ring):  x_r <- (x_{r-1} + x_r + x_{r+1}) / 3, then the step with the gradient taken
                     at the model before the mix."""
    import numpy as np

    from harness.scenario import load_scenario
    from harness.workload import batch_indices, scenario_dataset
    from harness.workload.models import scenario_model

    sc = load_scenario(run / "scenario.resolved.yaml")
    data = scenario_dataset(sc)
    shards = np.load(run / "provenance" / "shards.npz")
    initial = torch.load(run / "provenance" / "initial_model.pt")
    p, w = scenario["ranks"], scenario["workload"]
    models = [scenario_model(sc, data) for _ in range(p)]
    for m in models:
        torch.nn.utils.vector_to_parameters(initial.clone(), m.parameters())  # storage of its own
    opts = [torch.optim.SGD(m.parameters(), lr=SCALE_OPTIMIZER["lr"], momentum=SCALE_OPTIMIZER["momentum"],
                            weight_decay=SCALE_OPTIMIZER["weight_decay"]) for m in models]

    def flat(m):
        return torch.nn.utils.parameters_to_vector(m.parameters()).detach()

    for t in range(w["iterations"]):
        grads = []
        for r, m in enumerate(models):
            idx = torch.from_numpy(batch_indices(shards[f"rank{r}"], w["batch_size"], t, sc.seed, r))
            m.zero_grad()
            torch.nn.functional.cross_entropy(m(data.train_x[idx]), data.train_y[idx]).backward()
            grads.append([q.grad.clone() for q in m.parameters()])
        if algorithm == "allreduce_sgd":
            mean = [torch.stack(g).mean(0) for g in zip(*grads)]
            for m in models:
                for q, g in zip(m.parameters(), mean):
                    q.grad.copy_(g)
        if algorithm == "dpsgd":
            xs = [flat(m) for m in models]
            for r, m in enumerate(models):
                torch.nn.utils.vector_to_parameters((xs[r - 1] + xs[r] + xs[(r + 1) % p]) / 3, m.parameters())
        for o in opts:
            o.step()
        if algorithm == "local_sgd" and (t + 1) % 4 == 0:
            mean = torch.stack([flat(m) for m in models]).mean(0)
            for m in models:
                torch.nn.utils.vector_to_parameters(mean.clone(), m.parameters())
    return torch.stack([flat(m) for m in models])


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [64])  # 32 ran the same code paths (both powers of two), in the same time
def test_values_at_scale_equal_an_independent_computation(ranks: int, tmp_path: Path) -> None:
    scenario = {"name": f"scale{ranks}", "ranks": ranks, "seed": 5, "workload": SCALE_WORKLOAD,
                "optimizer": SCALE_OPTIMIZER, "results": {"provenance": "full"},
                "algorithms": ["allreduce_sgd", {"name": "local_sgd", "period": 4}, "dpsgd"],
                "imbalance": [{"kind": "random_ranks", "count": 3, "delay_ms": 30}]}
    path = write_scenario_file(tmp_path, scenario)
    calibration = save_fixed_calibration(tmp_path / "calibration.json", ranks, [("logreg", "digits", 8, 0.002)])
    out = harness("simulate", str(path), "--train", "--calibration", str(calibration), "--out", str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr
    (run,) = (tmp_path / "out" / f"scale{ranks}").glob("sim-*")
    for name in ("allreduce_sgd", "local_sgd", "dpsgd"):
        simulated = torch.load(run / "provenance" / f"final_models_{name}.pt")
        expected = _recompute(run, scenario, name)
        relative = float(((simulated - expected).norm(dim=1) / expected.norm(dim=1)).max())
        assert relative <= 1e-5, f"{name} at {ranks} ranks: {relative:.2e} from the independent computation"
    evals = pd.read_csv(run / "evals.csv")
    assert sorted(set(evals.iteration)) == [6, 12]
    summary = pd.read_csv(run / "summary.csv")
    assert summary["final_accuracy"].notna().all()


# -- bad input ----------------------------------------------------------------------------------------
@pytest.mark.subprocess
def test_train_with_emulated_compute_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = write_scenario_file(tmp_path, {"name": "emulated", "ranks": 2, "workload": {
        "model": "logreg", "dataset": "digits", "batch_size": 8, "iterations": 4, "compute": {"emulate_ms": 1}},
        "algorithms": ["allreduce_sgd"]})
    out = harness("simulate", str(path), "--train", "--out", str(tmp_path / "out"))
    assert out.returncode == 2
    assert "simulation.train" in out.stderr and "emulated compute" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.csv"))


def test_a_run_that_would_not_fit_is_refused_with_the_estimate(monkeypatch) -> None:
    from harness.scenario import load_scenario
    from harness.sim import training

    scenario = load_scenario(Path(__file__).parents[1] / "scenarios" / "straggler.yaml",
                             overrides={"ranks": 1024, "only": ["allreduce_sgd", "wagma"]})
    assert training.fit_problem(scenario, torch.device("cpu")) is None or training.available_bytes(
        torch.device("cpu")) < 8e9
    monkeypatch.setattr(training, "available_bytes", lambda device: 1_000_000_000)
    problem = training.fit_problem(scenario, torch.device("cpu"))
    assert problem is not None
    assert "1,024 simulated ranks" in problem and "118,282-parameter" in problem and "1 GB" in problem


VALUE_DEPENDENT = {
    # reads a value to decide: a comparison of a stand-in fails
    "compares": """
from harness.algorithms import Algorithm, AlgorithmParams

class Compares(Algorithm):
    class Params(AlgorithmParams):
        pass
    def after_step(self, t):
        if self.ctx.params.norm() > 1.0:
            self.ctx.comm.allreduce(self.ctx.params, op="mean")
""",
    # reads a value with float(): 0.0 on a stand-in, so the simulation would silently differ
    "reads": """
from harness.algorithms import Algorithm, AlgorithmParams

class Reads(Algorithm):
    class Params(AlgorithmParams):
        pass
    def after_backward(self, t):
        self.ctx.comm.allreduce(self.ctx.grads, op="mean")  # every rank keeps the same model
    def after_step(self, t):
        if float(self.ctx.params.norm()) > 0.0:
            self.ctx.comm.barrier()
""",
}


@pytest.mark.parametrize("module", sorted(VALUE_DEPENDENT))
@pytest.mark.subprocess
def test_an_algorithm_whose_communication_depends_on_values_is_named(module: str, tmp_path: Path) -> None:
    (tmp_path / f"{module}.py").write_text(VALUE_DEPENDENT[module])
    cls = module.capitalize()
    path = write_scenario_file(tmp_path, {
        "name": "values", "ranks": 3,
        "workload": {"model": "logreg", "dataset": "digits", "batch_size": 8, "iterations": 6,
                     "compute": {"emulate_ms": 1}},
        "algorithms": ["allreduce_sgd", {"name": "mine", "class": f"{module}:{cls}"}]})
    out = harness("simulate", str(path), "--out", str(tmp_path / "out"))
    assert out.returncode == 2, out.stderr
    assert "algorithm 'mine'" in out.stderr and "--train" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()


def test_an_algorithm_of_ones_own_whose_communication_ignores_values_passes_the_check(tmp_path: Path) -> None:
    from harness.scenario import load_scenario
    from harness.sim.value_check import built_in, value_dependence

    (tmp_path / "plain.py").write_text(VALUE_DEPENDENT["reads"].replace("Reads", "Plain").replace(
        "if float(self.ctx.params.norm()) > 0.0:", "if float(self.ctx.params.norm()) > 0.0 or True:"))
    path = write_scenario_file(tmp_path, {
        "name": "plain", "ranks": 3,
        "workload": {"model": "logreg", "dataset": "digits", "batch_size": 8, "iterations": 6},
        "algorithms": [{"name": "mine", "class": "plain:Plain"}, "sgp"]})
    scenario = load_scenario(path)
    mine, sgp = scenario.algorithms
    assert not built_in(mine) and built_in(sgp)
    assert value_dependence(scenario, mine) is None


def test_the_algorithm_reference_says_which_algorithms_a_replay_ends_with_the_real_models_of() -> None:
    from harness.algorithms.registry import BUILT_IN

    text = (Path(__file__).parents[1] / "docs" / "algorithms" / "index.md").read_text(encoding="utf-8")
    table = text.split("## In the simulator", 1)[1].split("\n## ", 1)[0]
    said = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            said[cells[0].strip("`")] = cells[1].startswith("yes")
    assert set(said) == {entry.name for entry in BUILT_IN}
    assert {name for name, yes in said.items() if yes} == set(ORDER_FREE)
    assert {name for name, yes in said.items() if not yes} == set(ORDER_DEPENDENT)


@pytest.mark.subprocess
def test_more_ranks_than_training_samples_is_refused_naming_the_dataset(tmp_path: Path) -> None:
    path = write_scenario_file(tmp_path, {"name": "small", "ranks": 2048, "workload": {
        "model": "logreg", "dataset": "digits", "batch_size": 8, "iterations": 2}, "algorithms": ["allreduce_sgd"]})
    calibration = save_fixed_calibration(tmp_path / "calibration.json", 2048, [("logreg", "digits", 8, 0.001)])
    out = harness("simulate", str(path), "--train", "--calibration", str(calibration), "--out", str(tmp_path / "out"))
    assert out.returncode == 2, out.stderr
    assert "workload.dataset: digits has 1,438 training samples" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.csv"))
