"""Every command's parser, walked from ``harness.cli``: ``KEY=VALUE`` overrides are taken anywhere
on the line by the commands that take them, and refused, named, by the others. A command added
later (to ``harness.cli.COMMANDS`` or through the ``harness.commands`` entry points) is covered
without a change here."""

from __future__ import annotations

import argparse

import pytest

from harness.cli import COMMANDS, build_parser
from harness.commands.overrides import OVERRIDES, is_override, parse_command_line

FIRST, SECOND = "workload.iterations=30", "algorithms.wagma.period=6"
PLACEHOLDER = "scenario.yaml"  # every positional: a file that does not exist, so it is no override


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) of every command that runs: a leaf of the subcommand tree."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers and path:
        yield path, parser
    for action in subparsers:
        for name, child in action.choices.items():
            yield from _leaves(child, (*path, name))


LEAVES = dict(_leaves(build_parser()))


def _takes_overrides(parser: argparse.ArgumentParser) -> bool:
    return any(a.dest == OVERRIDES for a in parser._actions) or parser.get_default(OVERRIDES) is not None


def _positionals(parser: argparse.ArgumentParser) -> list[str]:
    """A placeholder for each positional the command takes (its file, directory or script)."""
    return [PLACEHOLDER for a in parser._actions
            if not a.option_strings and a.dest != OVERRIDES and a.nargs != argparse.REMAINDER]


def _value_for(action: argparse.Action) -> str | None:
    """A value ``action`` accepts, or None."""
    for text in ("3", "value"):
        try:
            value = action.type(text) if callable(action.type) else text
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
        if action.choices is None or value in action.choices:
            return text
    return None


def _one_option(parser: argparse.ArgumentParser) -> list[str]:
    """An option of the command with a value it accepts (the overrides go around it)."""
    for action in parser._actions:
        if action.option_strings and action.nargs is None and not action.required:
            value = _value_for(action)
            if value is not None:
                return [action.option_strings[-1], value]
    raise AssertionError(f"{parser.prog}: no option taking a value")


def _required_options(parser: argparse.ArgumentParser) -> list[str]:
    words: list[str] = []
    for action in parser._actions:
        if action.option_strings and action.required:
            words += [action.option_strings[-1], _value_for(action) or PLACEHOLDER]
    return words


def _parse(argv: list[str]) -> dict:
    return vars(parse_command_line(build_parser(), argv))


def test_the_walk_sees_every_registered_command() -> None:
    top = {path[0] for path in LEAVES}
    assert set(COMMANDS) | {"figures"} <= top  # figures: paper_figs's, through the entry point
    assert {" ".join(path) for path, p in LEAVES.items() if _takes_overrides(p)} == {
        "run", "launch", "validate", "sbatch", "simulate"}


@pytest.mark.parametrize("path", [p for p, parser in LEAVES.items() if _takes_overrides(parser)], ids=" ".join)
def test_overrides_before_and_after_options_parse_alike(path) -> None:
    parser = LEAVES[path]
    files, option = _positionals(parser), _one_option(parser) + _required_options(parser)
    lines = [
        [*path, FIRST, *option, SECOND, *files],
        [*path, *option, FIRST, SECOND, *files],
        [*path, FIRST, SECOND, *option, *files],
    ]
    script_last = any(a.nargs == argparse.REMAINDER for a in parser._actions)
    if not script_last:  # after the file too (a script's own arguments follow it instead)
        lines += [
            [*path, *files, *option, FIRST, SECOND],
            [*path, *files, FIRST, *option, SECOND],
            [*path, FIRST, *files, SECOND, *option],
        ]
    parsed = [_parse(line) for line in lines]
    assert parsed[0][OVERRIDES] == [FIRST, SECOND]
    for line, namespace in zip(lines, parsed):
        assert namespace == parsed[0], line
        assert PLACEHOLDER in namespace.values(), line


@pytest.mark.parametrize("path", [p for p, parser in LEAVES.items() if _takes_overrides(parser)], ids=" ".join)
def test_an_unknown_option_is_named_not_taken_for_an_override(path, capsys) -> None:
    parser = LEAVES[path]
    with pytest.raises(SystemExit) as exit_:
        _parse([*path, *_required_options(parser), "--no-such-option", FIRST, *_positionals(parser)])
    assert exit_.value.code == 2
    assert "error: unrecognized arguments: --no-such-option\n" in capsys.readouterr().err


@pytest.mark.parametrize("path", [p for p, parser in LEAVES.items() if not _takes_overrides(parser)],
                         ids=" ".join)
def test_commands_without_overrides_refuse_one_clearly(path, capsys) -> None:
    parser = LEAVES[path]
    with pytest.raises(SystemExit) as exit_:
        _parse([*path, *_positionals(parser), *_required_options(parser), FIRST])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"error: unrecognized arguments: {FIRST} (this command takes no KEY=VALUE overrides)" in err, err


def test_what_counts_as_an_override(tmp_path) -> None:
    for word in (FIRST, "~network.links", "+workload.seed=3", "imbalance.0.delay_ms=-5", "a=b=c", "name='a b'"):
        assert is_override(word), word
    existing = tmp_path / "x=1.yaml"
    existing.write_text("")
    for word in ("scenario.yaml", "--only=sgp", "-n=3", "dir/key=value", "=3", "~", str(existing)):
        assert not is_override(word), word
