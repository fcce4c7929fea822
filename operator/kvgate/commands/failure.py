"""How every `kvgate` command reports an error: one line, one prefix, one JSON shape.

The line is `kvgate <cmd>: error: <what>` on stderr; under `--json` the same error is also one
JSON object on stdout, `{"error": {"command": ..., "message": ..., "exitCode": N}}`, so a script
that parses stdout gets an answer for a failure too. `kvgate.cli` calls `report_error` for usage
errors, input and outside errors alike; a command never prints its own error line.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Mapping
from typing import Any, Final

from kvgate import redact

MAX_MESSAGE: Final = 1000


def one_line(text: str) -> str:
    """The message as one printable line: hostile input may hold line breaks or control bytes."""
    if len(text) > MAX_MESSAGE:
        text = text[: MAX_MESSAGE - 3] + "..."
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def error_line(command: str | None, message: str) -> str:
    """`kvgate scrape: error: <message>`; `kvgate: error: ...` before a command is known."""
    prog = f"kvgate {command}" if command else "kvgate"
    return f"{prog}: error: {one_line(message)}"


def report_error(
    command: str | None, message: str, exit_code: int, *, as_json: bool = False
) -> int:
    """Print the error line (and, `as_json`, the JSON object on stdout); returns `exit_code`."""
    if as_json:
        error = {"command": command, "message": one_line(message), "exitCode": exit_code}
        print(json.dumps({"error": error}, sort_keys=True), flush=True)
    print(error_line(command, message), file=sys.stderr)
    return exit_code


def error_text(
    exc: Exception, expected: type[Exception] | tuple[type[Exception], ...], text: str = ""
) -> str:
    """A summary's error: an `expected` failure's `text` (default: its message); else a bug's
    (ours or a library's), its traceback on stderr: its type and the start of its text. The
    summary reaches the rollout's status: `token_hidden` runs before any cut (a cut token would
    leak its start)."""
    if isinstance(exc, expected):
        return token_hidden(text or str(exc))
    print_traceback()
    return f"internal error: {type(exc).__name__}: {token_hidden(str(exc))[:300]}"


def token_hidden(text: str) -> str:
    """`text` without the hub token this process was given (`HF_TOKEN`), whatever its shape,
    and scrubbed (`redact.hide`): what a command prints reaches a Job's log and status."""
    return redact.hide(text, os.environ.get("HF_TOKEN"))


def print_traceback() -> None:
    """The exception being handled, its traceback on stderr (a Job's log), the token hidden."""
    print(token_hidden(traceback.format_exc()), end="", file=sys.stderr)


def report_summary_error(command: str, summary: Mapping[str, Any], verdict: str) -> None:
    """`eval` and `diverge` end in their summary line on stdout, which the operator's Job reads,
    also for an error (`"verdict": "error"`, `"error": <message>`); an error also gets every
    command's error line on stderr, on a terminal or piped (first-hour-2 N4)."""
    if verdict != "error":
        return
    blocks = [
        summary,
        *(b for k in ("long_context", "divergence") if isinstance(b := summary.get(k), Mapping)),
    ]
    message = next((str(b["error"]) for b in blocks if b.get("error")), "ended in error")
    print(error_line(command, message), file=sys.stderr)
