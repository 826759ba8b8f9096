"""One list syntax for every command: ``--only a,b``, ``--ranks 2,8``, ``--sizes 4K,1M``."""

from __future__ import annotations

import argparse

import pytest

from harness.arguments import name_list, split_list
from harness.cli import build_parser, main
from conftest import harness_cli, write_scenario_file

SCENARIO = {
    "name": "lists",
    "ranks": 4,
    "seed": 1,
    "workload": {"model": "mlp", "dataset": "digits", "batch_size": 8, "iterations": 4, "eval_every": 4,
                 "compute": {"emulate_ms": 1}, "params": 100},
    "algorithms": ["allreduce_sgd", "sgp", {"name": "wagma", "group_size": 2}],
}


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) of every command and sub-command, e.g. (("bench", "stress"), parser)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in parser._actions if flag in a.option_strings), None)


def test_every_only_option_takes_a_comma_list() -> None:
    commands = {path: _option(p, "--only") for path, p in _parsers(build_parser())}
    commands = {" ".join(path): action for path, action in commands.items() if action is not None}
    assert set(commands) == {"run", "launch", "validate", "sbatch", "simulate", "figures", "bench faults",
                             "bench agreement", "bench simulator", "bench training", "bench validation"}
    picks = {"bench agreement": ("small_run", "nic_messages"), "bench simulator": ("wagma_g3_p6", "slow_link"),
             "bench validation": ("nccl_h200_4node_ring", "goyal_256_hours")}
    for name, action in commands.items():
        # bench agreement's and bench validation's --only pick cases, bench simulator's shapes; the rest algorithms.
        a, b = picks.get(name, ("sgp", "wagma"))
        assert action.nargs is None, f"{name} --only must be one comma-separated argument"
        assert action.type(f"{a},{b}") == [a, b], name
        assert action.type(f" {a} , {b},{a}") == [a, b], name  # spaces ignored, duplicates dropped
        with pytest.raises(argparse.ArgumentTypeError, match="empty entry"):
            action.type(f"{a},,{b}")


@pytest.mark.parametrize(("command", "flag", "good", "expected"), [
    (("calibrate",), "--ranks", "8,2", [2, 8]),
    (("bench", "collectives"), "--sizes", "4K,1M", [4096, 1 << 20]),
    (("bench", "collectives"), "--ops", "broadcast,allreduce", ["broadcast", "allreduce"]),
    (("bench", "stress"), "--parts", "push,wagma", ["wagma", "push"]),  # run in their fixed order
    (("bench", "dist"), "--wrappers", "FSDP2,ddp", ["fsdp2", "ddp"]),
])
def test_other_list_options_share_the_syntax_and_its_errors(command, flag, good, expected) -> None:
    parser = dict(_parsers(build_parser()))[command]
    action = _option(parser, flag)
    assert action.type(good) == expected
    for bad, message in ((",", "empty entry"), ("", "it is empty")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            action.type(bad)


def test_split_list_names_the_list_and_an_example() -> None:
    assert split_list("a, b,c", "name", "x,y") == ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"bad rank list '2,,8': empty entry \(write it like 2,8\)"):
        split_list("2,,8", "rank", "2,8")
    assert name_list("name", "x,y")("b,a,b") == ["b", "a"]


def test_validate_takes_a_comma_list_and_names_the_valid_algorithms(tmp_path, capsys) -> None:
    path = write_scenario_file(tmp_path, SCENARIO)
    assert main(["validate", str(path), "--only", "wagma,sgp"]) == 0
    out = capsys.readouterr().out
    assert "allreduce_sgd" not in out and "  sgp" in out and "  wagma" in out
    assert main(["validate", str(path), "--only", "sgp,nope"]) == 2
    assert "--only: 'nope' is not among the scenario's algorithms (available: allreduce_sgd, sgp, wagma)" in capsys.readouterr().err


@pytest.mark.subprocess
def test_validate_refuses_space_separated_names_with_a_usage_error(tmp_path) -> None:
    proc = harness_cli("validate", str(write_scenario_file(tmp_path, SCENARIO)), "--only", "sgp", "wagma")
    assert proc.returncode == 2 and "unrecognized arguments: wagma" in proc.stderr


@pytest.mark.subprocess
def test_run_applies_the_comma_list_before_launching(tmp_path) -> None:
    path = write_scenario_file(tmp_path, SCENARIO)
    proc = harness_cli("run", str(path), "--out", str(tmp_path / "out"), "--only", "sgp,nope", timeout=60)
    assert proc.returncode == 2 and "--only: 'nope' is not among the scenario's algorithms" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.subprocess
def test_simulate_keeps_the_listed_algorithms(tmp_path) -> None:
    path = write_scenario_file(tmp_path, SCENARIO)
    proc = harness_cli("simulate", str(path), "--out", str(tmp_path / "out"), "--only", "wagma,sgp", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (run,) = (tmp_path / "out" / "lists").iterdir()
    assert (run / "summary.csv").read_text().splitlines()[1].startswith("sgp,")


def test_sbatch_writes_the_comma_list_into_its_script(tmp_path) -> None:
    path = write_scenario_file(tmp_path, SCENARIO)
    assert main(["sbatch", str(path), "--out", str(tmp_path / "out"), "--only", "sgp,wagma"]) == 0
    script = (tmp_path / "out" / "lists" / "lists.sbatch").read_text()
    assert "--only sgp,wagma" in script


@pytest.mark.subprocess
def test_figures_takes_a_comma_list_of_figures() -> None:
    proc = harness_cli("figures", "--only", "fig99_nothing,fig98_neither")
    assert proc.returncode == 2 and "unknown figures fig99_nothing, fig98_neither (known: " in proc.stderr


def test_report_takes_one_results_directory_and_refuses_another(tmp_path, capsys) -> None:
    parser = dict(_parsers(build_parser()))[("report",)]
    assert [a.dest for a in parser._actions if not a.option_strings] == ["run_dir"]
    assert [a.dest for a in parser._actions if a.option_strings] == ["help"]
    (tmp_path / "summary.csv").write_text("algorithm\n")  # a file or two do not make a run directory
    assert main(["report", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"error: {tmp_path}: not a results directory (it has no run.json and "
                                 "scenario.resolved.yaml): give a directory `python -m harness run` or `simulate` "
                                 "wrote, e.g. results/<scenario>/<run-id>\n")
    assert main(["report", str(tmp_path / "absent")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'absent'}: no such directory\n"
    with pytest.raises(SystemExit):  # no directory: argparse's usage error
        build_parser().parse_args(["report"])


def _command_parsers(parser, prog="python -m harness"):
    import argparse

    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _command_parsers(child, f"{prog} {name}")


def test_every_commands_help_ends_with_examples_that_run_it(capsys) -> None:
    from harness.cli import build_parser

    for prog, parser in _command_parsers(build_parser()):
        if prog == "python -m harness bench":
            continue  # the benchmarks' own pages have theirs
        help_text = parser.format_help()
        tail = help_text.rstrip().split("examples:", 1)
        assert len(tail) == 2, f"{prog} --help has no examples"
        examples = [line.strip() for line in tail[1].splitlines() if line.strip().startswith("python -m harness")]
        assert examples and all(e.startswith(prog) for e in examples if prog != "python -m harness"), (prog, examples)


def test_the_cli_reference_is_the_parsers(monkeypatch) -> None:
    """The generated reference page says what --help says: change a help text, the page follows."""
    import harness.commands.report as report
    from harness.cli_reference import cli_reference_markdown

    page = cli_reference_markdown()
    for command in ("run", "simulate", "bench simulator", "report"):
        assert f"`{command}`" in page
    assert "| `--sweep KEY=V1,V2,...` |" in page and "python -m harness run scenarios/straggler.yaml\n" in page
    original = report.register

    def register(sub):
        original(sub)
        sub.choices["report"]._actions[-1].help = "a changed help text"

    monkeypatch.setattr(report, "register", register)
    assert "| a changed help text |" in cli_reference_markdown()
