"""The `kvgate` command line.

Each subcommand lives in `kvgate.commands.<name>` and is imported only when used, so
`kvgate stats` does not pay for lm-eval or kopf. A command module defines `HELP`,
`configure(parser)` and `run(args) -> int`.

Exit codes: 0 done / pass / not needed, 1 the gate says no, 2 usage or input error,
3 inconclusive, 4 something outside failed, 70 unexpected bug (with traceback).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from kvgate import __version__
from kvgate.commands.exit_codes import EXIT_BUG as EXIT_BUG
from kvgate.commands.exit_codes import EXIT_EXTERNAL as EXIT_EXTERNAL
from kvgate.commands.exit_codes import EXIT_GATE_FAILED as EXIT_GATE_FAILED
from kvgate.commands.exit_codes import EXIT_INCONCLUSIVE as EXIT_INCONCLUSIVE
from kvgate.commands.exit_codes import EXIT_INPUT as EXIT_INPUT
from kvgate.commands.exit_codes import EXIT_OK as EXIT_OK
from kvgate.errors import ExternalError, InputError, KvgateError

COMMANDS: dict[str, str] = {
    "preflight": "kvgate.commands.preflight",
    "scan-logs": "kvgate.commands.scan_logs",
    "scrape": "kvgate.commands.scrape",
    "stats": "kvgate.commands.stats",
    "eval": "kvgate.commands.eval",
    "diverge": "kvgate.commands.diverge",
    "report": "kvgate.commands.report",
    "get": "kvgate.commands.get",
    "wait": "kvgate.commands.wait",
    "approve": "kvgate.commands.approve",
    "abort": "kvgate.commands.abort",
    "run": "kvgate.commands.run",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, as for any bad input
        self.exit(EXIT_INPUT, f"{self.prog}: error: {message}\n")


def _command_name(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if a in COMMANDS), None)


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = _Parser(prog="kvgate", description="Gate an FP8 KV-cache change on evidence.")
    parser.add_argument("--version", action="version", version=f"kvgate {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    chosen = _command_name(argv)
    for name, module_name in COMMANDS.items():
        if chosen is not None and name != chosen:
            sub.add_parser(name)
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # command not built yet
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        cmd.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
        module.configure(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error (exit 2, one line), --help or --version
        return exc.code if isinstance(exc.code, int) else EXIT_INPUT
    if getattr(args, "_run", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_INPUT
    try:
        return int(args._run(args))
    except InputError as exc:
        _report(exc, args)
        return EXIT_INPUT
    except ExternalError as exc:
        _report(exc, args)
        return EXIT_EXTERNAL
    except KvgateError as exc:
        _report(exc, args)
        return EXIT_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception:  # a bug, not a verdict: never let it read as "the gate says no" (exit 1)
        traceback.print_exc()
        return EXIT_BUG


def _report(exc: KvgateError, args: argparse.Namespace) -> None:
    if getattr(args, "debug", False):
        traceback.print_exc()
    print(f"kvgate: {type(exc).__name__}: {_one_line(str(exc))}", file=sys.stderr)


_MAX_MESSAGE = 1000


def _one_line(text: str) -> str:
    """The message as one printable line: hostile input may hold line breaks or control bytes."""
    if len(text) > _MAX_MESSAGE:
        text = text[: _MAX_MESSAGE - 3] + "..."
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
