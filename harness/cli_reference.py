"""The command-line reference (the docs site's ``reference/cli.md``), generated from the argparse
parsers of ``harness.cli``: what ``--help`` says, every command and subcommand as a section with
its usage, a table of its arguments and its examples. Change an option's help and the page follows.
"""

from __future__ import annotations

import argparse

from harness.cli import build_parser

PROG = "python -m harness"


def cli_reference_markdown() -> str:
    """The whole page, in Markdown."""
    parser = build_parser()
    lines = [
        "# Command line",
        "",
        f"Every command is `{PROG} COMMAND ...`; `--help` prints what this page says about it. "
        "Generated from the commands' own parsers.",
        "",
    ]
    for prog, command in _commands(parser, PROG):
        lines += _section(prog, command)
    return "\n".join(lines).rstrip() + "\n"


def _commands(parser: argparse.ArgumentParser, prog: str):
    """(prog, parser) of every command and subcommand, depth first, in registration order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                child._reference_help = helps.get(name)  # the one-line help the parent lists
                yield f"{prog} {name}", child
                yield from _commands(child, f"{prog} {name}")


def _section(prog: str, parser: argparse.ArgumentParser) -> list[str]:
    depth = prog.count(" ") - PROG.count(" ")
    lines = [f"{'#' * (depth + 1)} `{prog.removeprefix(PROG + ' ')}`", ""]
    summary = getattr(parser, "_reference_help", None) or parser.description
    if summary:
        lines += [_escape_text(summary[:1].upper() + summary[1:]), ""]
    usage = parser.format_usage().removeprefix("usage: ").strip()
    lines += ["```text", " ".join(usage.split()), "```", ""]
    rows = [
        _row(action)
        for action in parser._actions
        if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
        and action.help is not argparse.SUPPRESS
    ]
    if rows:
        lines += ["| argument | default | what |", "|---|---|---|", *rows, ""]
    if parser.epilog and "examples:" in parser.epilog:
        examples = parser.epilog.split("examples:", 1)[1].strip("\n")
        lines += [
            "Examples:",
            "",
            "```bash",
            *(line[2:] if line.startswith("  ") else line for line in examples.splitlines()),
            "```",
            "",
        ]
    return lines


def _row(action: argparse.Action) -> str:
    metavar = " ".join(action.metavar) if isinstance(action.metavar, tuple) else action.metavar
    if action.option_strings:
        name = ", ".join(action.option_strings)
        if action.nargs != 0:
            name += f" {metavar or action.dest.upper()}"
    else:
        name = metavar or action.dest
        if action.nargs in ("*", "?"):
            name = f"[{name}]" + ("..." if action.nargs == "*" else "")
    default = "" if action.default in (None, argparse.SUPPRESS, False) or action.nargs == 0 else f"`{action.default}`"
    if isinstance(action.default, list):
        default = f"`{','.join(map(str, action.default))}`" if action.default else ""
    what = action.help or ""
    if action.choices and not isinstance(action.choices, dict):
        what += f" (one of: {', '.join(f'`{c}`' for c in action.choices)})"
    return f"| `{_escape_cell(name)}` | {_escape_cell(default)} | {_escape_cell(_escape_text(what))} |"


def _escape_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _escape_text(text: str) -> str:
    """Help text as Markdown: angle brackets shown, not taken for HTML."""
    return text.replace("<", "&lt;").replace(">", "&gt;")
