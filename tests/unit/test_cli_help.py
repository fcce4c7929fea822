"""Every subcommand's --help: each default in one style, "(default: X)", and an example last."""

from __future__ import annotations

import argparse
import re

import pytest

from kvgate import cli


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = cli.build_parser([name])  # only the chosen command is configured
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    return {name: _subparser(name) for name in cli.COMMANDS}


SUBPARSERS = _subparsers()


def _option_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text argparse prints for one option, on one line."""
    formatter = parser._get_formatter()
    formatter.add_argument(action)
    return " ".join(formatter.format_help().split())


def test_every_command_is_walked() -> None:
    assert set(SUBPARSERS) == set(cli.COMMANDS)


def test_the_command_list_loads_no_command_module() -> None:
    # GIVEN a fresh interpreter WHEN `kvgate --help` lists the commands
    import subprocess
    import sys

    code = (
        "import sys, contextlib, io\n"
        "from kvgate import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    try: cli.main(['--help'])\n"
        "    except SystemExit: pass\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('kvgate.commands.'))\n"
        "heavy = sorted(m for m in ('numpy', 'scipy', 'httpx', 'kopf') if m in sys.modules)\n"
        "print(loaded, heavy, all(h in out.getvalue() for h in ['scan-logs', 'approve']))\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    # THEN every command is listed with its help line, and none of their modules was imported
    assert shown == (
        "['kvgate.commands.catalog', 'kvgate.commands.exit_codes', 'kvgate.commands.failure'] "
        "[] True"
    )


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_the_listed_help_line_is_the_commands_own(name: str) -> None:
    from kvgate.commands import catalog

    assert SUBPARSERS[name].description == catalog.COMMANDS[name]


@pytest.mark.parametrize("name", list(SUBPARSERS))
def test_every_default_is_shown_in_the_one_style(name: str) -> None:
    parser = SUBPARSERS[name]
    assert parser.formatter_class is cli.HelpFormatter
    checked = 0
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        text = _option_help(parser, action)
        if cli.shows_default(action):
            assert f"(default: {action.default})" in text, text
            checked += 1
        # whatever else says "default" says it the same way: "(default: ..." or "; default: ..."
        # (a quoted 'default' is the namespace of that name)
        for match in re.finditer(r"(?<!')default", text, re.IGNORECASE):
            before = text[: match.start()]
            assert before.endswith(("(", "; ")) and text[match.end()] == ":", text
        assert not re.search(r"\(\d+(\.\d+)?\)", text), f"an old-style default in: {text}"
    if name in {"scrape", "eval", "diverge", "preflight", "get", "wait", "run"}:
        assert checked, f"{name}: no option with a default was checked"


@pytest.mark.parametrize("name", list(SUBPARSERS))
def test_help_ends_with_an_example(name: str) -> None:
    lines = SUBPARSERS[name].format_help().rstrip("\n").splitlines()
    heading = max(i for i, line in enumerate(lines) if line in ("example:", "examples:"))
    examples = lines[heading + 1 :]
    assert examples and all(line.startswith(f"  kvgate {name} ") or "| kvgate " in line
                            for line in examples), examples  # fmt: skip
