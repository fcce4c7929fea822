"""Scan an engine's startup log (vLLM 0.10-0.33, SGLang 0.4-0.5) for what FP8 KV changes.

    >>> scan = scan_log(open("candidate.log").read())
    >>> scan.failed, scan.attention_backend, [f.code for f in scan.findings]
    (True, 'FLASHINFER', ['fp8-kv-enabled', 'attention-backend', ..., 'attention-build-failed'])

The log is read in two passes over very little data:

1. Candidate lines are found in one Aho-Corasick pass (ahocorasick-rs, SIMD prefiltered)
   for all anchor substrings (`ache`, `ackend`, `rror`, ...) over the UTF-8 bytes of whole
   chunks; a request-log line contains none of them, so a 100 MB log costs one fast scan and
   no Python work per noise line. Each rule of an anchor then checks its own needle and only
   then its regex, and a match becomes an `_Event`.
2. `_Folder` turns the events into a `LogScan` once the engine is known (given, or voted by
   the events; when no rule line decides, by the shapes of the head's lines, `shapes.py`), so
   rules of the other engine cannot leak in when detecting.

Message texts are the engines' format strings (reference/engines.md); the `[file.py:NNN]`
part moves between releases, so rules match message text only. Logs from the field (issue 23,
tests/data/field-logs) add vLLM 0.6-0.9 wordings read from their wheels, failures seen only
through a traceback's frames, and wrapper prefixes (journald, kubectl, compose, launchers).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kvgate.errors import ParseError
from kvgate.evidence.logs.collect import _Collector
from kvgate.evidence.logs.fold import _Folder
from kvgate.evidence.logs.model import CHUNK_CHARS, CODES, MAX_LINE, Finding, LogScan
from kvgate.evidence.logs.rules import ANCHORS, RULES
from kvgate.evidence.logs.shapes import engine_by_shape
from kvgate.vocabulary import check_engine

__all__ = [
    "ANCHORS",
    "CODES",
    "RULES",
    "Finding",
    "LogScan",
    "scan_lines",
    "scan_log",
]


def _chunks(lines: Iterable[str]) -> Iterator[str]:
    """Join lines into chunks of whole lines; an item without its newline gets one."""
    buffer: list[str] = []
    size = 0
    for line in lines:
        if len(line) > MAX_LINE:  # rules read no further; keep the chunk small
            line = line[:MAX_LINE] + "\n"
        elif not line.endswith("\n"):
            line += "\n"
        buffer.append(line)
        size += len(line)
        if size >= CHUNK_CHARS:
            yield "".join(buffer)
            buffer, size = [], 0
    if buffer:
        yield "".join(buffer)


def _text_chunks(text: str) -> Iterator[str]:
    start = 0
    while start < len(text):
        end = text.find("\n", start + CHUNK_CHARS)
        end = len(text) if end == -1 else end + 1
        yield text[start:end]
        start = end


def _scan_chunks(chunks: Iterable[str], engine: str | None, source: str) -> LogScan:
    chosen = check_engine(engine)
    collector = _Collector(chosen)
    for chunk in chunks:
        collector.feed_chunk(chunk)
    if not collector.nonblank:
        raise ParseError(source, "the log is empty; pass the engine's startup log")
    detected = chosen
    if detected is None and collector.votes:
        ranked = [*collector.votes.most_common(2), ("", 0)]
        if ranked[0][1] > ranked[1][1]:
            detected = ranked[0][0]
    if detected is None:  # no rule line decides: the shapes of the lines the engine prints
        detected = engine_by_shape("".join(collector.head))
    events = collector.events
    if detected is not None:
        events = [e for e in events if e.engine in (None, detected)]
    return _Folder(detected, events).fold(collector.lines)


def scan_log(text: str, engine: str | None = None, *, source: str = "log") -> LogScan:
    """Scan a whole startup log. `engine` is `vllm`, `sglang`, or None/`auto` to detect it.

    Raises ParseError for an empty log and UnsupportedError for an unknown engine name.
    """
    return _scan_chunks(_text_chunks(text), engine, source)


def scan_lines(lines: Iterable[str], engine: str | None = None, *, source: str = "log") -> LogScan:
    """Like `scan_log` over an iterable of lines (with or without '\\n'), in flat memory."""
    return _scan_chunks(_chunks(lines), engine, source)
