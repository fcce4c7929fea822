"""`kvgate scan-logs FILE|-`: what an engine's startup log says about its FP8 KV cache.

Exit 0: the engine came up (or nothing went wrong); 1: the log shows it failed to start;
2: bad input; 3: neither ready nor failed yet (a log cut short or still starting).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final, TextIO

from kvgate.commands.exit_codes import EXIT_GATE_FAILED, EXIT_INCONCLUSIVE, EXIT_OK
from kvgate.errors import ParseError
from kvgate.evidence.logs import LogScan, scan_lines

EXAMPLES: Final = (
    "kvgate scan-logs vllm-startup.log",
    "kubectl logs deploy/vllm | kvgate scan-logs -",
)

# A startup log is MBs; a day of request logs a few GB. Past this the input is not a log
# (`/dev/zero`, a disk image) and is refused rather than read forever.
MAX_LOG_CHARS = 1 << 30
_READ_CHARS = 64 << 10  # one read: an endless line cannot fill memory


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="log file, or - for standard input")
    parser.add_argument(
        "--engine",
        default="auto",
        metavar="ENGINE",
        help="vllm, sglang or auto (detect from the log)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


@contextmanager
def _open(path: str) -> Iterator[TextIO]:
    if path == "-":
        yield sys.stdin
        return
    try:
        # newline="" keeps '\r' so the scanner sees CRLF and progress-bar redraws as written.
        with open(path, encoding="utf-8", errors="replace", newline="") as handle:
            yield handle
    except FileNotFoundError as exc:
        raise ParseError(path, "no such file") from exc
    except IsADirectoryError as exc:
        raise ParseError(path, "is a directory; pass the log file") from exc
    except PermissionError as exc:
        raise ParseError(path, "permission denied") from exc


def _bounded_lines(handle: TextIO, source: str) -> Iterator[str]:
    """The handle's lines, each cut to _READ_CHARS (the scanner reads less), in flat memory."""
    total = 0
    while True:
        line = handle.readline(_READ_CHARS)
        if not line:
            return
        total += len(line)
        rest = line
        while rest and not rest.endswith(("\n", "\r")) and total <= MAX_LOG_CHARS:
            rest = handle.readline(_READ_CHARS)  # an overlong line: skip its rest
            total += len(rest)
        if total > MAX_LOG_CHARS:
            raise ParseError(source, f"is larger than {MAX_LOG_CHARS >> 30} GiB; not a startup log")
        yield line


def run(args: argparse.Namespace) -> int:
    source = "<stdin>" if args.file == "-" else args.file
    with _open(args.file) as handle:
        scan = scan_lines(_bounded_lines(handle, source), args.engine, source=source)
    if not _engine_facts(scan) and (scan.engine is None or args.engine):
        # "ready" or "not ready" would vouch for a log that is not this engine's
        raise ParseError(source, _not_the_engine(scan, args.engine, source))
    if args.json:
        print(json.dumps({"source": source, **scan.to_dict()}, sort_keys=True))
    else:
        print(render_text(scan, source))
    return exit_code(scan)


_NAMES: Final = {"vllm": "vLLM", "sglang": "SGLang"}


def _engine_facts(scan: LogScan) -> bool:
    """Did any line say something only an engine's log says? A web server's own "Application
    startup complete." (uvicorn, which vLLM and SGLang also run) is not such a line."""
    return bool(
        scan.engine_version
        or scan.kv_cache_dtype
        or scan.attention_backend
        or scan.capacity.kv_tokens is not None
        or scan.failed
        or any(f.code != "ready" for f in scan.findings)
    )


def _not_the_engine(scan: LogScan, named: str | None, source: str) -> str:
    """Why this is not the (named) engine's startup log, and what to run instead."""
    which = _NAMES.get(named or "", "vLLM or SGLang")
    what = f"no {which} line recognised in {scan.lines} line(s)"
    if named and source != "<stdin>":  # what the text is when nothing is assumed
        with _open(source) as handle:
            unnamed = scan_lines(_bounded_lines(handle, source), None, source=source)
        found = unnamed.engine
        if found and found != named:
            article = "an" if found == "sglang" else "a"
            return (
                f"{what}; this looks like {article} {_NAMES.get(found, found)} log "
                f"(drop --engine, or --engine {found})"
            )
        scan = unnamed if unnamed.ready else scan
    if scan.ready:
        return (
            f"{what}, only a web server's startup; is this the engine's container? "
            "(kubectl logs POD -c CONTAINER)"
        )
    return f"{what}; is this the engine's startup log (kubectl logs POD -c CONTAINER)?"


def exit_code(scan: LogScan) -> int:
    if scan.failed:
        return EXIT_GATE_FAILED
    return EXIT_OK if scan.ready else EXIT_INCONCLUSIVE


def _or_unknown(value: object) -> str:
    return "unknown" if value is None else str(value)


def render_text(scan: LogScan, source: str) -> str:
    state = (
        "failed"
        if scan.failed
        else "ready"
        if scan.ready
        else "not ready (still starting or cut short)"
    )
    engine = _or_unknown(scan.engine)
    if scan.engine_version:
        engine += f" {scan.engine_version}"
    backend = _or_unknown(scan.attention_backend)
    if scan.attention_backend_candidates:
        backend += f" (candidates: {', '.join(scan.attention_backend_candidates)})"
    capacity = scan.capacity
    lines = [
        f"{source}: {scan.lines} lines",
        f"  engine:            {engine}",
        f"  kv cache dtype:    {_or_unknown(scan.kv_cache_dtype)}",
        f"  attention backend: {backend}",
        f"  kv tokens:         {_or_unknown(capacity.kv_tokens)}",
        f"  max concurrency:   {_or_unknown(capacity.max_concurrency)}",
        f"  kv memory (GiB):   {_or_unknown(capacity.kv_memory_gib)}",
        f"  state:             {state}",
    ]
    if scan.findings:
        lines.append("findings:")
    for finding in scan.findings:
        repeat = f" (x{finding.count})" if finding.count > 1 else ""
        lines.append(
            f"  {finding.severity.upper():7} line {finding.line:<6} {finding.code}{repeat}: {finding.text}"
        )
        if finding.hint:
            lines.append(f"          hint: {finding.hint}")
    return "\n".join(lines)
