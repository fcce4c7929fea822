"""The `kvgate` command line.

Each subcommand lives in `kvgate.commands.<name>` and is imported only when used, so
`kvgate stats` does not pay for lm-eval or kopf. A command module defines `EXAMPLES` (command
lines, shown at the end of its --help), `configure(parser)` and `run(args) -> int`; its one-line
help is its line in `kvgate.commands.catalog`.
Every option's default is shown by one formatter, as "(default: X)".

Exit codes: 0 done / pass / not needed, 1 the gate says no, 2 usage or input error,
3 inconclusive, 4 something outside failed, 70 unexpected bug (with traceback).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from collections.abc import Sequence
from typing import NoReturn

from kvgate import __version__
from kvgate.commands import catalog
from kvgate.commands.exit_codes import EXIT_BUG as EXIT_BUG
from kvgate.commands.exit_codes import EXIT_EXTERNAL as EXIT_EXTERNAL
from kvgate.commands.exit_codes import EXIT_GATE_FAILED as EXIT_GATE_FAILED
from kvgate.commands.exit_codes import EXIT_INCONCLUSIVE as EXIT_INCONCLUSIVE
from kvgate.commands.exit_codes import EXIT_INPUT as EXIT_INPUT
from kvgate.commands.exit_codes import EXIT_OK as EXIT_OK
from kvgate.commands.failure import print_traceback, report_error, token_hidden
from kvgate.errors import ExternalError, KvgateError

# Subcommand -> its module (imported only when that command runs or shows its own help).
COMMANDS: dict[str, str] = {n: "kvgate.commands." + n.replace("-", "_") for n in catalog.COMMANDS}


class _Parser(argparse.ArgumentParser):
    # The command an error is reported under, and whether that command has --json and got it;
    # set on the chosen command's parser and on the top one (which finds unrecognized arguments).
    command: str | None = None
    json_errors = False

    def error(self, message: str) -> NoReturn:  # one line, exit 2, as for any bad input
        report_error(self.command, message, EXIT_INPUT, as_json=self.json_errors)
        self.exit(EXIT_INPUT)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """One style for defaults: "(default: X)" after every option that has one.

    An option whose default is None, False or empty says its default in words in the same
    form when it has one ("(default: the kubeconfig's)"); a help that already holds
    "(default: " is left as written. Descriptions and epilogs keep their line breaks.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "(default: " in text or "%(default)" in text or not shows_default(action):
            return action.help
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def shows_default(action: argparse.Action) -> bool:
    """Whether `action` has a default worth printing (not None, False, empty or suppressed)."""
    if action.help == argparse.SUPPRESS or action.default in (None, False, argparse.SUPPRESS):
        return False
    if isinstance(action.default, list | tuple) and not action.default:
        return False
    return bool(action.option_strings) or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)


def _epilog(notes: str | None, examples: Sequence[str]) -> str:
    lines = [textwrap.fill(notes, 88), ""] if notes else []
    lines.append("example:" if len(examples) == 1 else "examples:")
    lines.extend(f"  {example}" for example in examples)
    return "\n".join(lines)


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = _Parser(prog="kvgate", description="Gate an FP8 KV-cache change on evidence.")
    parser.add_argument("--version", action="version", version=f"kvgate {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, module_name in COMMANDS.items():
        line = catalog.COMMANDS[name]
        if name != chosen:  # listed by its help line; its module (numpy, scipy...) stays unloaded
            sub.add_parser(name, help=line)
            continue
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(name, help=line, description=line, formatter_class=HelpFormatter)
        # SUPPRESS: an absent sub-level --debug must not reset `kvgate --debug CMD`
        cmd.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        module.configure(cmd)
        cmd.epilog = _epilog(cmd.epilog, module.EXAMPLES)
        for action in cmd._actions:  # argparse prints no line for an option without help
            if action.help is None and shows_default(action):
                action.help = "(default: %(default)s)"
        cmd.command = name
        cmd.json_errors = "--json" in argv and "--json" in cmd._option_string_actions
        parser.command, parser.json_errors = name, cmd.json_errors
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error (2, reported by _Parser.error), --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_INPUT
    if getattr(args, "_run", None) is None:
        parser.print_help(sys.stderr)
        return report_error(
            None, "give a command; kvgate COMMAND --help shows its options", EXIT_INPUT
        )
    try:
        return int(args._run(args))
    except KvgateError as exc:  # InputError, or anything not ExternalError: bad input (2)
        code = EXIT_EXTERNAL if isinstance(exc, ExternalError) else EXIT_INPUT
        if getattr(args, "debug", False):
            print_traceback()
        return _report(args, str(exc), code)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:
        # a bug, not a verdict: never let it read as "the gate says no" (exit 1)
        print_traceback()
        message = f"internal error (a bug; the traceback is above): {type(exc).__name__}: {exc}"
        return _report(args, message, EXIT_BUG)


def _report(args: argparse.Namespace, message: str, code: int) -> int:
    shown = token_hidden(message)  # an error may quote the request that carried HF_TOKEN
    return report_error(args.command, shown, code, as_json=bool(getattr(args, "json", False)))
