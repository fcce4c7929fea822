"""Scan an engine's startup log (vLLM 0.10-0.33, SGLang 0.4-0.5) for what FP8 KV changes.

    >>> scan = scan_log(open("candidate.log").read())
    >>> scan.failed, scan.attention_backend, [f.code for f in scan.findings]
    (True, 'FLASHINFER', ['fp8-kv-enabled', 'attention-backend', ..., 'attention-build-failed'])

The log is read in two passes over very little data:

1. Candidate lines are found with `str.find` on a few anchor substrings (`ache`, `ackend`,
   `rror`, ...) over whole chunks of text; a request-log line contains none of them, so a
   100 MB log costs a few fast C scans, not a regex per line. Each rule of an anchor then
   checks its own needle and only then its regex, and a match becomes an `_Event`.
2. `_Folder` turns the events into a `LogScan` once the engine is known (given, or voted by
   the events), so rules of the other engine cannot leak in when detecting.

Message texts are the engines' format strings (reference/engines.md); the `[file.py:NNN]`
part moves between releases, so rules match message text only.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

from kvgate.errors import ParseError, UnsupportedError

ENGINES: Final = ("vllm", "sglang")
SEVERITIES: Final = ("info", "warning", "error")

# Finding codes, in the order a startup prints them.
CODES: Final = (
    "fp8-kv-enabled",
    "kv-scale-default",
    "q-scale-missing",
    "uncalibrated-q-scale",
    "attention-backend",
    "attention-backend-fallback",
    "attention-build-failed",
    "fp8-unsupported",
    "engine-start-failed",
    "out-of-memory",
    "insufficient-kv-memory",
    "invalid-kv-cache-dtype",
    "kv-capacity",
    "ready",
)
_ERROR_CODES: Final = frozenset(
    {
        "attention-build-failed",
        "fp8-unsupported",
        "engine-start-failed",
        "out-of-memory",
        "insufficient-kv-memory",
        "invalid-kv-cache-dtype",
    }
)

_CHUNK_CHARS: Final = 4 << 20
_MAX_TEXT: Final = 400
# Rules look at the first _MAX_LINE characters of a line: real startup lines are a few KiB at
# most (SGLang's ServerArgs line is the longest), and the cap bounds each line's cost whatever
# a pod prints. The patterns are linear as well (tests/unit/test_logs.py checks 1 MB lines).
_MAX_LINE: Final = 64 << 10
# Repeated matches of one rule beyond this only raise its count (a crash loop, a noisy warning).
_MAX_EVENTS_PER_RULE: Final = 200


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finding:
    """One cause seen in the log; `count` is how many lines (workers, restarts) printed it."""

    code: str
    severity: str
    line: int
    text: str
    hint: str = ""
    count: int = 1

    def to_dict(self) -> dict[str, object]:
        return {
            "code": self.code,
            "severity": self.severity,
            "line": self.line,
            "text": self.text,
            "hint": self.hint,
            "count": self.count,
        }


@dataclass(frozen=True, slots=True)
class Capacity:
    """KV pool size as the engine reported it; None where the log does not say."""

    kv_tokens: int | None = None
    max_concurrency: float | None = None
    kv_memory_gib: float | None = None
    max_model_len: int | None = None
    num_gpu_blocks: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "kv_tokens": self.kv_tokens,
            "max_concurrency": self.max_concurrency,
            "kv_memory_gib": self.kv_memory_gib,
            "max_model_len": self.max_model_len,
            "num_gpu_blocks": self.num_gpu_blocks,
        }


@dataclass(frozen=True, slots=True)
class LogScan:
    """What a startup log says about the KV cache, the attention backend and the outcome."""

    engine: str | None
    engine_version: str | None
    kv_cache_dtype: str | None
    attention_backend: str | None
    attention_backend_candidates: tuple[str, ...]
    capacity: Capacity
    ready: bool
    failed: bool
    findings: tuple[Finding, ...]
    lines: int

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def finding(self, code: str) -> Finding | None:
        return next((f for f in self.findings if f.code == code), None)

    def to_dict(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "engine_version": self.engine_version,
            "kv_cache_dtype": self.kv_cache_dtype,
            "attention_backend": self.attention_backend,
            "attention_backend_candidates": list(self.attention_backend_candidates),
            "capacity": self.capacity.to_dict(),
            "ready": self.ready,
            "failed": self.failed,
            "findings": [f.to_dict() for f in self.findings],
            "lines": self.lines,
        }


# -- rules -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Rule:
    name: str
    anchor: str  # every line the rule must see contains this
    needle: str  # cheap check before the regex
    regex: re.Pattern[str] | None = None
    engine: str | None = None  # None: both engines print it (FlashInfer, PyTorch, uvicorn)


def _r(
    name: str, anchor: str, needle: str, pattern: str | None = None, engine: str | None = None
) -> _Rule:
    return _Rule(name, anchor, needle, re.compile(pattern) if pattern else None, engine)


_V, _S = "vllm", "sglang"

RULES: Final[tuple[_Rule, ...]] = (
    # versions and configuration
    _r(
        "v.version",
        "server ",
        "vLLM API server version ",
        r"vLLM API server version v?([\w.+-]+)",
        _V,
    ),
    _r("v.version", "server ", "vLLM server version ", r"vLLM server version v?([\w.+-]+?),? ", _V),
    _r("v.banner", "ache", " LLM engine (v", r"LLM engine \(v([\w.+-]+)\) with config", _V),
    _r("v.dtype.config", "ache", "kv_cache_dtype=", r"\bkv_cache_dtype=([\w.]+)", _V),
    _r("v.dtype.args", "ache", "'kv_cache_dtype': '", r"'kv_cache_dtype': '([\w.]+)'", _V),
    _r(
        "v.dtype.using",
        "ache",
        "data type to store kv cache",
        r"Using (\S+) data type to store",
        _V,
    ),
    _r("s.dtype.args", "ache", "kv_cache_dtype='", r"\bkv_cache_dtype='([\w.]+)'", _S),
    _r("s.dtype.using", "ache", "Using KV cache dtype: ", r"Using KV cache dtype: (\S+)", _S),
    _r("s.skip_warmup", "ache", "skip_server_warmup=True", None, _S),
    # scales
    _r("v.q_scale_missing", "scal", "does not provide a q scaling factor", None, _V),
    _r("v.kv_scale_default", "scal", "Using KV cache scaling factor 1.0", None, _V),
    _r(
        "v.uncalibrated_q",
        "scal",
        "Using uncalibrated q_scale",
        r"q_scale (\S+) and/or prob_scale (\S+)",
        _V,
    ),
    _r(
        "v.scale_not_loaded",
        "scal",
        "but not found the expected name in the model",
        r"Found (kv scale|\S+) in the checkpoint",
        _V,
    ),
    _r("v.per_tensor", "upport", "Only support per-tensor scaling factor", None, _V),
    _r(
        "s.kv_scale_default", "scal", "Using FP8 KV cache but no scaling factors provided", None, _S
    ),
    _r("s.scale_unsupported", "upport", "does not support loading scaling factors", None, _S),
    # attention backend
    _r(
        "v.backend.auto",
        "ackend",
        "attention backend out of potential backends",
        r"Using (\w+) attention backend out of potential backends: (.*)",
        _V,
    ),
    _r(
        "v.backend.explicit",
        "ackend",
        "Using AttentionBackendEnum.",
        r"Using AttentionBackendEnum\.(\w+) backend",
        _V,
    ),
    _r(
        "v.backend.v1",
        "ackend",
        " on V1 engine",
        r"Using (FlashInfer|FlexAttention|Triton|Flash Attention|Tree Attention|XFormers) backend",
        _V,
    ),
    _r(
        "v.backend.v0",
        "ackend",
        " backend.",
        r"Using (XFormers|FlashInfer|Flash Attention) backend\.\s*$",
        _V,
    ),
    _r("v.v0_fallback", "upport", "--kv-cache-dtype is not supported by the V1 Engine", None, _V),
    _r("v.fa_no_fp8", "ackend", "Cannot use FlashAttention backend for FP8 KV cache", None, _V),
    _r(
        "v.block_size_precluded",
        "ackend",
        "precluded higher-priority backend",
        # tempered: a start scans only up to the next start, so many starts stay linear
        r"precluded higher-priority backend\(s\) ((?:(?!precluded )[^.])*)\. Using (\w+) instead",
        _V,
    ),
    _r(
        "v.backend_invalid",
        "ackend",
        "is not valid for this configuration",
        r"Selected backend (?:AttentionBackendEnum\.)?(\w+) is not valid for this configuration\. Reason: (.*)",
        _V,
    ),
    _r("v.no_valid_backend", "ackend", "No valid attention backend found", None, _V),
    _r(
        "s.backend.default",
        "ackend",
        "Attention backend not ",
        r"Attention backend not (?:set|explicitly specified|specified)\. Use (\w+) backend",
        _S,
    ),
    _r(
        "s.backend.mla",
        "ackend",
        "MLA optimization is turned on. Use ",
        r"turned on\. Use (\w+) backend",
        _S,
    ),
    _r(
        "s.backend.model",
        "ackend",
        " as attention backend ",
        r"Us(?:e|ing) (\w+) as attention backend (?:on \w+ )?for",
        _S,
    ),
    _r(
        "s.backend.hybrid",
        "ackend",
        "Using hybrid attention backend",
        r"decode_backend=(\w+), prefill_backend=(\w+)",
        _S,
    ),
    _r(
        "s.backend.args",
        "ackend",
        "attention_backend=",
        r"\battention_backend=(?:'(\w+)'|None)",
        _S,
    ),
    _r("s.fa3_fp8", "ackend", "FlashAttention3 only supports fp8_e4m3 if using FP8", None, _S),
    # FP8 not supported
    _r("v.fa_fp8_device", "upport", "FlashAttention does not support fp8 kv-cache", None, _V),
    _r("triton_fp8e4nv", "upport", "type fp8e4nv not supported", None),
    _r("v.fp8_requires", "ache", "FP8 KV cache requires", None, _V),
    _r("v.v1_env_fp8", "upport", "VLLM_USE_V1=1 is not supported with --kv-cache-dtype", None, _V),
    _r(
        "s.trtllm_mla_fp8",
        "upport",
        "TensorRT-LLM MLA backend only supports kv-cache-dtype",
        None,
        _S,
    ),
    _r("s.cpu_e5m2", "upport", "--kv-cache-dtype fp8_e5m2 is not supported on CPU", None, _S),
    # invalid dtype
    _r("v.unknown_dtype", "ache", "Unknown kv cache dtype:", r"Unknown kv cache dtype: (\S+)", _V),
    _r(
        "v.invalid_dtype",
        "ache",
        "Invalid kv_cache_dtype:",
        r"Invalid kv_cache_dtype: '?([^'\s.]+)",
        _V,
    ),
    _r(
        "s.unsupported_dtype",
        "upport",
        "Unsupported kv_cache_dtype:",
        r"Unsupported kv_cache_dtype: (\S+?)\.?$",
        _S,
    ),
    _r(
        "argparse_dtype",
        "ache",
        "argument --kv-cache-dtype: invalid choice",
        r"invalid choice: '?([^'\s]+?)'? \(choose from ((?:(?!invalid choice: )[^)])*)\)",
    ),
    _r("argparse_error", "rror", ": error: ", r"^[\w./-]+(?: \w+)?: error: (.+)$"),
    # FlashInfer JIT
    _r("fi.ninja_failed", "failed", "Ninja build failed", None),
    _r("fi.ninja_failed", "failed", "ninja: build stopped", None),
    _r(
        "fi.ninja_command", "rror", "CalledProcessError: Command '['ninja'", r"dtype_kv_([a-z0-9]+)"
    ),
    _r("fi.no_nvcc", "rror", "Could not find nvcc", None),
    _r("fi.no_nvcc", "rror", "nvcc not found and PyTorch is not built with CUDA", None),
    _r("fi.jit_disabled", "rror", "JIT compilation is disabled via FLASHINFER_DISABLE_JIT", None),
    _r("fi.sm75", "rror", "FlashInfer requires GPUs with sm75 or higher", None),
    _r("fi.jit_loading", " JIT ", "Loading JIT ops: ", r"Loading JIT ops: (\S+)"),
    _r(
        "fi.jit_finished", " JIT ", "Finished loading JIT ops: ", r"Finished loading JIT ops: (\S+)"
    ),
    _r("fi.jit_building", " JIT ", "Building JIT module ", r"Building JIT module (\S+?);"),
    # memory
    _r("oom", "rror", "out of memory", r"CUDA out of memory\.(?: Tried to allocate ([\d.]+ \w+))?"),
    _r("v.free_memory", "rror", "on startup is less than desired GPU memory utilization", None, _V),
    _r("v.no_cache_blocks", "ache", "No available memory for the cache blocks", None, _V),
    _r(
        "v.max_len",
        "ache",
        "To serve at least one request with the model",
        r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, which is larger than the "
        r"available KV cache memory \(([\d.]+) GiB\)\.(?: Based on the available memory, "
        r"the estimated maximum model length is (\d+)\.)?",
        _V,
    ),
    _r(
        "s.not_enough_memory",
        "rror",
        "Not enough memory. Please try to increase --mem-fraction-static",
        None,
        _S,
    ),
    _r("v.mem_profiling", "rror", "Error in memory profiling", None, _V),
    # capacity
    _r(
        "v.kv_memory",
        "ache",
        "Available KV cache memory: ",
        r"Available KV cache memory: (-?[\d.]+) GiB",
        _V,
    ),
    _r("v.kv_tokens", "ache", "KV cache size: ", r"KV cache size: ([\d,]+) tokens", _V),
    _r(
        "v.concurrency",
        "concurrency for",
        "Maximum concurrency for ",
        r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x",
        _V,
    ),
    _r(
        "v.v0_blocks",
        "# CPU blocks: ",
        "# CPU blocks: ",
        r"# (?:cuda|GPU) blocks: (\d+), # CPU blocks: (\d+)",
        _V,
    ),
    _r("v.num_gpu_blocks", "ache", "after num_gpu_blocks is: ", r"num_gpu_blocks is: (\d+)", _V),
    _r(
        "s.pool",
        "ache",
        "KV Cache ",
        r"KV Cache (?:is allocated|VA upper bound)\.(?: dtype: (\S+),)? #tokens: (\d+), "
        r"(?:K size: ([\d.]+) GB, V size: ([\d.]+) GB|KV size: ([\d.]+) GB)",
        _S,
    ),
    _r(
        "s.pool_post",
        "ache",
        "Post-capture KV sizing: KV cache allocated.",
        r"dtype: (\S+), #tokens: (\d+), KV size: ([\d.]+) GB",
        _S,
    ),
    _r(
        "s.summary",
        "max_total_num_tokens",
        "max_total_num_tokens=",
        r"max_total_num_tokens=(\d+),(?:(?!max_total_num_tokens=).)*?context_len=(\d+)",
        _S,
    ),
    # crashes
    _r("v.core_failed", "failed", "EngineCore failed to start", None, _V),
    _r("v.core_fatal", "rror", "EngineCore encountered a fatal error", None, _V),
    _r("v.worker_failed", "failed", "WorkerProc failed to start", None, _V),
    _r(
        "v.worker_died",
        "died unexpectedly",
        "died unexpectedly",
        r"Worker proc (\S+) died unexpectedly",
        _V,
    ),
    _r("v.core_init_failed", "failed", "Engine core initialization failed", None, _V),
    _r("s.sigquit", "failed", "Received sigquit from a child process", None, _S),
    _r("s.rank_dead", "scheduler is dead", "scheduler is dead", None, _S),
    _r("s.init_failed", "failed", "Initialization failed.", None, _S),
    _r("exception", "rror", "Error", r"^(?:[\w.]+\.)?([A-Z]\w*Error)(?::\s*(.*))?$"),
    # readiness
    _r("startup_complete", "startup complete", "Application startup complete", None),
    _r("s.ready", "server ", "The server is fired up and ready to roll", None, _S),
)

ANCHORS: Final[tuple[str, ...]] = tuple(dict.fromkeys(rule.anchor for rule in RULES))
_RULES_BY_ANCHOR: Final = tuple(
    tuple(rule for rule in RULES if rule.anchor == anchor) for anchor in ANCHORS
)

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
# Bounded `[^\]]{..}`: an unbounded one rescans to the end of the line from every `[date`.
_SGLANG_HEADER = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[,.]\d+)?(?: [^\]]{1,128})?\] ")
_FLASHINFER_HEADER = re.compile(r" - flashinfer\.jit: ")
_LEADING = re.compile(_KUBECTL_TS + _PROCESS_TAG + r"(?:(?:INFO|WARNING|ERROR|DEBUG):\s+)?")


# Lines skipped even when an anchor hits: request echoes (--enable-log-requests, SGLang
# --log-requests), where a prompt quoting "Ninja build failed" must not become a finding, and
# the periodic stats lines ("GPU KV cache usage"), which are most candidates of a busy log.
_SKIP = re.compile(
    r"Received request |Receive: obj=|Finish: obj=|Avg prompt throughput|(?:Decode|Prefill) batch\."
)


@dataclass(frozen=True, slots=True)
class _Event:
    rule: str
    engine: str | None
    line: int
    groups: tuple[str | None, ...]
    text: str


# Headers start within this many characters of a line (after the prefixes above).
_HEADER_WITHIN: Final = 1024


def _message(line: str) -> tuple[str, str | None]:
    """The message part of a log line and the engine its header format belongs to."""
    head = _VLLM_HEADER.search(line, 0, _HEADER_WITHIN)
    if head is not None:
        return line[head.end() :].strip(), _V
    head = _SGLANG_HEADER.search(line, 0, _HEADER_WITHIN)
    if head is not None:
        return line[head.end() :].strip(), _S
    head = _FLASHINFER_HEADER.search(line)
    if head is not None:
        return line[head.end() :].strip(), None
    leading = _LEADING.match(line)  # all optional: always matches
    return line[leading.end() if leading else 0 :].strip(), None


class _Collector:
    """Pass 1: candidate lines by anchor, then rules, then events."""

    def __init__(self, engine: str | None) -> None:
        self.engine = engine
        self.events: list[_Event] = []
        self.per_rule: Counter[str] = Counter()
        self.votes: Counter[str] = Counter()
        self.lines = 0
        self.nonblank = False
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
        first_line = self.lines + 1
        newlines = chunk.count("\n")
        self.lines += newlines + (0 if chunk.endswith("\n") else 1)
        hits: dict[int, int] = {}
        find, rfind = chunk.find, chunk.rfind
        for bit, anchor in enumerate(ANCHORS):
            pos = find(anchor)
            while pos != -1:
                start = rfind("\n", 0, pos) + 1
                hits[start] = hits.get(start, 0) | (1 << bit)
                end = find("\n", pos)
                if end == -1:
                    break
                pos = find(anchor, end)
        line_no, counted_to = first_line, 0
        for start in sorted(hits):
            line_no += chunk.count("\n", counted_to, start)
            counted_to = start
            end = find("\n", start)
            self._feed_line(chunk[start : end if end != -1 else len(chunk)], line_no, hits[start])

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
        if rule.name == "argparse_error" and header_engine is not None:
            return  # argparse writes bare lines; with a logging header it is a message
        engine = rule.engine
        if rule.name == "argparse_dtype":
            engine = _argparse_engine(message)
        if engine is not None:
            self.votes[engine] += 1
        if header_engine is not None:
            self.votes[header_engine] += 1
        self.per_rule[rule.name] += 1
        if self.per_rule[rule.name] <= _MAX_EVENTS_PER_RULE:
            self.events.append(_Event(rule.name, engine, line_no, groups, message[:_MAX_TEXT]))


def _argparse_engine(message: str) -> str | None:
    if "launch_server" in message or "sglang" in message:
        return _S
    if "vllm" in message or "'fp8'," in message or ", fp8," in message:
        return _V  # only vLLM offers plain `fp8`
    if "'fp8_e4m3'" in message or "fp8_e4m3)" in message:
        return _S
    return None


# -- pass 2: events to a LogScan ---------------------------------------------------------------

_V1_BACKENDS: Final = {
    "FlashInfer": "FLASHINFER",
    "FlexAttention": "FLEX_ATTENTION",
    "Triton": "TRITON_ATTN",
    "Flash Attention": "FLASH_ATTN",
    "Tree Attention": "TREE_ATTN",
    "XFormers": "XFORMERS",
}
_UNQUANTISED: Final = frozenset(
    {"auto", "bf16", "bfloat16", "float16", "fp16", "half", "float32", "float"}
)
_INVALID_DTYPE_RULES: Final = (
    "v.unknown_dtype",
    "v.invalid_dtype",
    "argparse_dtype",
    "s.unsupported_dtype",
)
_WRAPPER_ERRORS: Final = ("Engine core initialization failed", "Initialization failed")

_HINT_SCALE_DEFAULT_V: Final = (
    "The checkpoint has no k/v scales, so FP8 KV uses scale 1.0 (values beyond ±448 saturate). "
    "Prefer a checkpoint with calibrated k_scale/v_scale (ModelOpt, llm-compressor); "
    "otherwise let the paired accuracy gate decide."
)
_HINT_SCALE_DEFAULT_S: Final = (
    "SGLang prints this whenever --quantization-param-path is absent, even when per-layer "
    "k_scale/v_scale from the checkpoint are loaded (sglang#31224): check the checkpoint "
    "scan for scales instead of trusting this line."
)
_HINT_SCALE_NOT_LOADED: Final = (
    "The checkpoint carries scales whose names do not map onto this model's attention "
    "layers, so they were ignored and scale 1.0 is used; fix the tensor names or the engine version."
)
_HINT_Q_SCALE: Final = (
    "q is quantised with k_scale; this only matters for FP8 attention backends (flash-attn, "
    "FlashInfer). Calibrate q_scale if the accuracy gate shows a loss."
)
_HINT_UNCALIBRATED_Q: Final = (
    "With --kv-cache-dtype fp8, q_scale and prob_scale default to 1.0; use a checkpoint with "
    "calibrated q/prob scales if the accuracy gate shows a loss."
)
_HINT_OOM: Final = {
    _V: "Lower --gpu-memory-utilization, --max-model-len or --max-num-seqs, or free the GPU "
    "from other processes.",
    _S: "Lower --mem-fraction-static, --max-running-requests or --cuda-graph-max-bs, or free "
    "the GPU from other processes.",
}
_HINT_INVALID_DTYPE: Final = {
    _V: "Use one of auto, fp8, fp8_e4m3, fp8_e5m2 (vLLM's fp8 is e4m3 on CUDA).",
    _S: "SGLang has no plain `fp8`: use --kv-cache-dtype fp8_e4m3 (or fp8_e5m2).",
}


def _jit_hint(engine: str | None, version: tuple[int, ...] | None) -> str:
    if engine == _S:
        return (
            "FlashInfer could not JIT-compile its FP8 KV kernels (no nvcc/ninja in the image; "
            "the L4 trap). Set --attention-backend triton, or use an image with the CUDA "
            "toolkit or a matching flashinfer-jit-cache."
        )
    if version is not None and version < (0, 11):
        backend = "VLLM_ATTENTION_BACKEND=TRITON_ATTN_VLLM_V1"
    elif version is not None and version < (0, 13):
        backend = "VLLM_ATTENTION_BACKEND=TRITON_ATTN"
    else:
        backend = "--attention-backend TRITON_ATTN"
    return (
        "FlashInfer could not JIT-compile its FP8 KV kernels (no nvcc/ninja in the image; the "
        f"L4 trap). Set {backend} and VLLM_USE_FLASHINFER_SAMPLER=0, or use an image with the "
        "CUDA toolkit or a matching flashinfer-jit-cache."
    )


def _fp8_hint(rule: str, engine: str | None) -> str:
    if rule == "triton_fp8e4nv":
        return (
            "Triton has no e4m3 on this GPU (needs SM 8.9+): use --kv-cache-dtype fp8_e5m2, "
            "or keep the BF16 KV cache."
        )
    if rule == "v.per_tensor":
        return "The checkpoint's KV/Q scales are not per-tensor; vLLM needs one scalar per layer."
    if rule == "s.scale_unsupported":
        return "This model class cannot load KV scales: drop --quantization-param-path."
    if engine == _S:
        return "Use --kv-cache-dtype fp8_e4m3 with the flashinfer or triton attention backend."
    return (
        "This GPU/backend cannot store an FP8 KV cache: use --attention-backend TRITON_ATTN "
        "(or FLASHINFER); FLASH_ATTN stores FP8 KV only with FA3 on Hopper (FA4 on Blackwell)."
    )


def _version_tuple(version: str | None) -> tuple[int, ...] | None:
    if version is None:
        return None
    found = re.match(r"(\d+(?:\.\d+)*)", version)
    return tuple(int(p) for p in found.group(1).split(".")) if found else None


def _normalise_dtype(value: str) -> str:
    value = value.strip("'\"")
    value = value.removeprefix("torch.")
    if value in _UNQUANTISED:
        return "auto"
    if value.startswith("float8_e4m3"):
        return "fp8_e4m3"
    if value.startswith("float8_e5m2"):
        return "fp8_e5m2"
    return value


def _number(text: str | None) -> float | None:
    return float(text.replace(",", "")) if text else None


def _integer(text: str | None) -> int | None:
    return int(text.replace(",", "")) if text else None


@dataclass
class _Folder:
    """Pass 2: fold events (already filtered to one engine) into findings and fields."""

    engine: str | None
    events: list[_Event]
    per_rule: Counter[str]
    findings: dict[tuple[str, str], Finding] = field(default_factory=dict)

    def add(self, code: str, cause: str, event: _Event, hint: str = "", text: str = "") -> None:
        key = (code, cause)
        old = self.findings.get(key)
        if old is not None:
            self.findings[key] = Finding(
                old.code, old.severity, old.line, old.text, old.hint, old.count + 1
            )
            return
        severity = "error" if code in _ERROR_CODES else "info"
        if code in {"kv-scale-default", "q-scale-missing", "uncalibrated-q-scale"} or (
            code == "attention-backend-fallback"
        ):
            severity = "warning"
        self.findings[key] = Finding(code, severity, event.line, text or event.text, hint)

    def by_rule(self, *names: str) -> list[_Event]:
        return [e for e in self.events if e.rule in names]

    def fold(self, lines: int) -> LogScan:
        version = self._version()
        version_tuple = _version_tuple(version)
        dtype, dtype_event = self._dtype()
        backend, candidates, backend_event = self._backend()
        self._scales()
        invalid = self.by_rule(*_INVALID_DTYPE_RULES)
        if dtype and dtype.startswith("fp8") and dtype_event is not None and not invalid:
            self.add(
                "fp8-kv-enabled", "fp8", dtype_event, text=self._dtype_text(dtype, dtype_event)
            )
        self._fallbacks()
        if backend is not None and backend_event is not None:
            self._backend_findings(backend, candidates, backend_event, dtype, version_tuple)
        self._failures(version_tuple)
        capacity, capacity_event = self._capacity()
        if capacity_event is not None:
            self.add("kv-capacity", "capacity", capacity_event, text=_capacity_text(capacity))
        ready_event = self._ready()
        if ready_event is not None:
            self.add("ready", "ready", ready_event)
        self._root_cause()
        findings = tuple(
            sorted(self.findings.values(), key=lambda f: (f.line, CODES.index(f.code)))
        )
        return LogScan(
            engine=self.engine,
            engine_version=version,
            kv_cache_dtype=dtype,
            attention_backend=backend,
            attention_backend_candidates=candidates,
            capacity=capacity,
            ready=ready_event is not None,
            failed=any(f.severity == "error" for f in findings),
            findings=findings,
            lines=lines,
        )

    def _version(self) -> str | None:
        for event in self.by_rule("v.version", "v.banner"):
            if event.groups and event.groups[0]:
                return event.groups[0].rstrip(".,")
        return None

    def _dtype(self) -> tuple[str | None, _Event | None]:
        # Rank: what the pool was built with > what was configured > what a message implies.
        ranks = {
            "s.dtype.using": 3,
            "s.pool": 3,
            "s.pool_post": 3,
            "v.dtype.config": 2,
            "v.dtype.args": 2,
            "s.dtype.args": 2,
            "v.dtype.using": 1,
        }
        best: tuple[int, int, str, _Event] | None = None
        for event in self.events:
            rank = ranks.get(event.rule)
            if rank is None or not event.groups or not event.groups[0]:
                continue
            candidate = (rank, event.line, _normalise_dtype(event.groups[0]), event)
            if best is None or candidate[:2] >= best[:2]:
                best = candidate
        dtype, source = (best[2], best[3]) if best else (None, None)
        # vLLM prints no line when a compressed-tensors kv_cache_scheme turns FP8 on, but the
        # scale warnings only fire for an FP8 cache.
        if dtype in (None, "auto"):
            implied = self.by_rule("v.uncalibrated_q", "v.kv_scale_default", "v.q_scale_missing")
            if implied:
                return "fp8", implied[0]
        if dtype is not None and dtype.startswith("fp8"):
            first_fp8 = next(
                (
                    e
                    for e in self.events
                    if e.rule in ranks
                    and e.groups
                    and _normalise_dtype(e.groups[0] or "").startswith("fp8")
                ),
                source,
            )
            return dtype, first_fp8
        return dtype, source

    def _dtype_text(self, dtype: str, event: _Event) -> str:
        if event.rule.startswith("v.") and event.rule not in {
            "v.dtype.config",
            "v.dtype.args",
            "v.dtype.using",
        }:
            return (
                f"FP8 KV cache ({dtype}) is active although no FP8 --kv-cache-dtype was seen: "
                "the checkpoint's kv_cache_scheme switched it on"
            )
        return f"FP8 KV cache enabled: kv_cache_dtype={dtype}"

    def _backend(self) -> tuple[str | None, tuple[str, ...], _Event | None]:
        best: tuple[int, int, str, tuple[str, ...], _Event] | None = None
        for event in self.events:
            name: str | None = None
            candidates: tuple[str, ...] = ()
            rank = 2
            groups = event.groups
            if event.rule == "v.backend.auto":
                name = groups[0]
                candidates = tuple(re.findall(r"'(\w+)'", groups[1] or ""))
            elif event.rule == "v.backend.explicit" or event.rule in {
                "s.backend.default",
                "s.backend.mla",
                "s.backend.model",
            }:
                name = groups[0]
            elif event.rule in {"v.backend.v1", "v.backend.v0"}:
                name = _V1_BACKENDS.get(groups[0] or "")
            elif event.rule == "s.backend.hybrid":
                name = groups[0]
            elif event.rule == "s.fa3_fp8":
                name, rank = "triton", 3
            elif event.rule == "v.block_size_precluded":
                name, rank = groups[1], 3
            elif event.rule == "s.backend.args":
                name, rank = groups[0], 1
            if name is None:
                continue
            candidate = (rank, event.line, name, candidates, event)
            if best is None or candidate[:2] >= best[:2]:
                best = candidate
        if best is None:
            return None, (), None
        return best[2], best[3], best[4]

    def _fallbacks(self) -> None:
        """Backend changes the engine announces itself (the derived ones need the backend)."""
        for fallback in self.by_rule("v.v0_fallback", "v.fa_no_fp8"):
            self.add(
                "attention-backend-fallback",
                "v0-fallback",
                fallback,
                hint="vLLM 0.10 left the V1 engine for V0 (XFormers) because FlashAttention "
                "cannot store FP8 KV on this GPU; throughput drops. Use vLLM >= 0.11, or set "
                "VLLM_ATTENTION_BACKEND=FLASHINFER (0.10.2).",
            )
        for fallback in self.by_rule("v.block_size_precluded"):
            self.add(
                "attention-backend-fallback",
                "block-size",
                fallback,
                hint="Remove --block-size so vLLM can pick its preferred backend.",
            )
        for fallback in self.by_rule("s.fa3_fp8"):
            self.add(
                "attention-backend-fallback",
                "fa3-e5m2",
                fallback,
                hint="fa3 stores only fp8_e4m3: use --kv-cache-dtype fp8_e4m3 to keep fa3.",
            )

    def _backend_findings(
        self,
        backend: str,
        candidates: tuple[str, ...],
        event: _Event,
        dtype: str | None,
        version: tuple[int, ...] | None,
    ) -> None:
        how = "explicitly selected"
        if event.rule == "v.backend.auto":
            how = "auto-selected from " + ", ".join(candidates) if candidates else "auto-selected"
        elif event.rule in {"s.backend.default", "v.backend.v1", "v.backend.v0"}:
            how = "default"
        self.add("attention-backend", "backend", event, text=f"attention backend {backend} ({how})")
        fp8 = dtype is not None and dtype.startswith("fp8")
        if not fp8 or event.rule not in {"v.backend.auto", "v.backend.v1"}:
            return
        if event.rule == "v.backend.auto" and candidates and "FLASH_ATTN" not in candidates:
            self.add(
                "attention-backend-fallback",
                "fp8-not-flash-attn",
                event,
                text=f"FP8 KV cache: FLASH_ATTN is not valid on this GPU, vLLM chose {backend} "
                f"(candidates: {', '.join(candidates)})",
                hint="A BF16 control most likely runs FLASH_ATTN, so the arms differ in backend. "
                "FlashInfer JIT-compiles FP8 kernels on first start (needs nvcc and ninja); pin "
                "--attention-backend TRITON_ATTN if that fails or is too slow.",
            )
        elif (
            event.rule == "v.backend.v1"
            and backend == "TRITON_ATTN"
            and (version is None or version[:2] == (0, 11))
        ):
            self.add(
                "attention-backend-fallback",
                "fp8-triton",
                event,
                text="FP8 KV cache: vLLM picked Triton instead of Flash Attention (FlashAttention "
                "stores FP8 KV only with FA3 on Hopper)",
                hint="Expected on Ada/Ampere unless VLLM_ATTENTION_BACKEND=TRITON_ATTN was set; "
                "the BF16 control runs Flash Attention, so compare throughput per arm.",
            )

    def _scales(self) -> None:
        for event in self.by_rule("v.kv_scale_default"):
            self.add("kv-scale-default", event.rule, event, hint=_HINT_SCALE_DEFAULT_V)
        for event in self.by_rule("s.kv_scale_default"):
            self.add("kv-scale-default", event.rule, event, hint=_HINT_SCALE_DEFAULT_S)
        for event in self.by_rule("v.scale_not_loaded"):
            self.add("kv-scale-default", event.rule, event, hint=_HINT_SCALE_NOT_LOADED)
        for event in self.by_rule("v.q_scale_missing"):
            self.add("q-scale-missing", event.rule, event, hint=_HINT_Q_SCALE)
        for event in self.by_rule("v.uncalibrated_q"):
            self.add("uncalibrated-q-scale", event.rule, event, hint=_HINT_UNCALIBRATED_Q)

    def _failures(self, version: tuple[int, ...] | None) -> None:
        engine = self.engine
        for event in self.by_rule(
            "fi.ninja_failed", "fi.ninja_command", "fi.no_nvcc", "fi.jit_disabled", "fi.sm75"
        ):
            self.add("attention-build-failed", "jit", event, hint=_jit_hint(engine, version))
        self._pending_jit(version)
        fp8_rules = (
            "v.fa_fp8_device",
            "triton_fp8e4nv",
            "v.fp8_requires",
            "v.v1_env_fp8",
            "v.per_tensor",
            "s.trtllm_mla_fp8",
            "s.cpu_e5m2",
            "s.scale_unsupported",
        )
        for event in self.by_rule(*fp8_rules):
            self.add("fp8-unsupported", "fp8", event, hint=_fp8_hint(event.rule, engine))
        for event in self.by_rule("v.backend_invalid", "v.no_valid_backend"):
            if "kv_cache_dtype" in event.text or "FP8" in event.text:
                self.add("fp8-unsupported", "fp8", event, hint=_fp8_hint(event.rule, engine))
            else:
                self.add(
                    "engine-start-failed",
                    "start",
                    event,
                    hint="No attention backend accepts this model and configuration; see the "
                    "reasons in the line.",
                )
        for event in self.by_rule(*_INVALID_DTYPE_RULES):
            hint = _HINT_INVALID_DTYPE.get(event.engine or engine or _V, "")
            self.add("invalid-kv-cache-dtype", "dtype", event, hint=hint)
        for event in self.by_rule("oom", "v.free_memory"):
            self.add("out-of-memory", "oom", event, hint=_HINT_OOM[engine or _V])
        for event in self.by_rule("v.no_cache_blocks", "v.max_len", "s.not_enough_memory"):
            self.add("insufficient-kv-memory", "kv-memory", event, hint=self._kv_memory_hint(event))
        for event in self.by_rule(
            "v.core_failed",
            "v.core_fatal",
            "v.worker_failed",
            "v.worker_died",
            "v.core_init_failed",
            "s.sigquit",
            "s.rank_dead",
            "s.init_failed",
            "argparse_error",
            "v.mem_profiling",
        ):
            self.add("engine-start-failed", "start", event)

    def _pending_jit(self, version: tuple[int, ...] | None) -> None:
        finished = {e.groups[0] for e in self.by_rule("fi.jit_finished")}
        pending = [e for e in self.by_rule("fi.jit_loading") if e.groups[0] not in finished]
        if not pending or self._ready() is not None:
            return
        crashed = any(
            self.by_rule("v.core_failed", "v.core_init_failed", "s.sigquit", "s.init_failed")
        )
        event = pending[-1]
        text = f"FlashInfer JIT op {event.groups[0]} started loading and never finished"
        if crashed:
            self.add("attention-build-failed", "jit", event, _jit_hint(self.engine, version), text)
        else:
            self.findings[("attention-build-failed", "jit-pending")] = Finding(
                "attention-build-failed",
                "warning",
                event.line,
                text + " (still building, hung, or the log is cut)",
                _jit_hint(self.engine, version),
            )

    def _kv_memory_hint(self, event: _Event) -> str:
        if event.rule == "v.max_len":
            max_len, needed, available, estimate = event.groups
            limit = (
                f"--max-model-len {estimate} or less" if estimate else "a smaller --max-model-len"
            )
            return (
                f"max_model_len {max_len} needs {needed} GiB of KV cache but {available} GiB is "
                f"free: set {limit}, or raise --gpu-memory-utilization."
            )
        if event.rule == "s.not_enough_memory":
            return "Raise --mem-fraction-static (or lower --max-running-requests/--context-length)."
        return (
            "Weights and activations left no room for the KV cache: raise "
            "--gpu-memory-utilization, or lower --max-model-len/--max-num-seqs."
        )

    def _root_cause(self) -> None:
        key = ("engine-start-failed", "start")
        failure = self.findings.get(key)
        if failure is None:
            return
        specific = [f for k, f in self.findings.items() if f.severity == "error" and k != key]
        if specific:
            first = min(specific, key=lambda f: f.line)
            hint = f"Root cause: {first.code} at line {first.line}."
        else:
            exceptions = [
                e
                for e in self.by_rule("exception")
                if not any(w in (e.groups[1] or "") for w in _WRAPPER_ERRORS)
            ]
            after = [e for e in exceptions if e.line >= failure.line] or exceptions
            if after:
                hint = f"Root cause at line {after[0].line}: {after[0].text}"
            else:
                hint = f"See the traceback around line {failure.line}."
        self.findings[key] = Finding(
            failure.code, failure.severity, failure.line, failure.text, hint, failure.count
        )

    def _capacity(self) -> tuple[Capacity, _Event | None]:
        tokens: int | None = None
        concurrency: float | None = None
        memory: float | None = None
        max_len: int | None = None
        blocks: int | None = None
        anchor: _Event | None = None
        for event in self.events:
            g = event.groups
            if event.rule == "v.kv_memory":
                # Every worker prints its own; vLLM sizes the pool by the smallest.
                value = _number(g[0])
                memory = value if memory is None or value is None else min(memory, value)
                anchor = anchor or event
            elif event.rule == "v.kv_tokens":
                tokens, anchor = _integer(g[0]), event
            elif event.rule == "v.concurrency":
                max_len, concurrency = _integer(g[0]), _number(g[1])
                anchor = anchor or event
            elif event.rule in {"v.v0_blocks", "v.num_gpu_blocks"}:
                blocks = _integer(g[0])
                anchor = anchor or event
            elif event.rule == "s.pool":
                _, n, k_gb, v_gb, kv_gb = g
                tokens = _integer(n)
                memory = (
                    _number(kv_gb)
                    if kv_gb
                    else round((_number(k_gb) or 0) + (_number(v_gb) or 0), 2)
                )
                anchor = event
            elif event.rule == "s.pool_post":
                tokens, memory, anchor = _integer(g[1]), _number(g[2]), event
            elif event.rule == "s.summary":
                tokens, max_len, anchor = _integer(g[0]), _integer(g[1]), event
                if tokens and max_len:
                    concurrency = round(tokens / max_len, 2)  # SGLang prints no such line
        capacity = Capacity(tokens, concurrency, memory, max_len, blocks)
        return capacity, anchor

    def _ready(self) -> _Event | None:
        if self.engine == _S:
            ready = self.by_rule("s.ready")
            if ready:
                return ready[0]
            # Without the warm-up request SGLang never prints its ready line.
            if self.by_rule("s.skip_warmup"):
                return next(iter(self.by_rule("startup_complete")), None)
            return None
        return next(iter(self.by_rule("startup_complete", "s.ready")), None)


def _capacity_text(capacity: Capacity) -> str:
    parts = []
    if capacity.kv_tokens is not None:
        parts.append(f"{capacity.kv_tokens:,} KV tokens")
    if capacity.max_concurrency is not None:
        at = f" at {capacity.max_model_len:,} tokens/request" if capacity.max_model_len else ""
        parts.append(f"max concurrency {capacity.max_concurrency:g}x{at}")
    if capacity.kv_memory_gib is not None:
        parts.append(f"{capacity.kv_memory_gib:g} GiB KV memory")
    if capacity.num_gpu_blocks is not None:
        parts.append(f"{capacity.num_gpu_blocks:,} GPU blocks")
    return "KV cache: " + ", ".join(parts)


# -- entry points ----------------------------------------------------------------------------


def _check_engine(engine: str | None) -> str | None:
    if engine is None or engine == "auto":
        return None
    name = engine.lower()
    if name not in ENGINES:
        raise UnsupportedError(f"engine '{engine}' is not known; use vllm, sglang or auto")
    return name


def _chunks(lines: Iterable[str]) -> Iterator[str]:
    """Join lines into chunks of whole lines; an item without its newline gets one."""
    buffer: list[str] = []
    size = 0
    for line in lines:
        if len(line) > _MAX_LINE:  # rules read no further; keep the chunk small
            line = line[:_MAX_LINE] + "\n"
        elif not line.endswith("\n"):
            line += "\n"
        buffer.append(line)
        size += len(line)
        if size >= _CHUNK_CHARS:
            yield "".join(buffer)
            buffer, size = [], 0
    if buffer:
        yield "".join(buffer)


def _text_chunks(text: str) -> Iterator[str]:
    start = 0
    while start < len(text):
        end = text.find("\n", start + _CHUNK_CHARS)
        end = len(text) if end == -1 else end + 1
        yield text[start:end]
        start = end


def _scan_chunks(chunks: Iterable[str], engine: str | None, source: str) -> LogScan:
    chosen = _check_engine(engine)
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
    events = collector.events
    if detected is not None:
        events = [e for e in events if e.engine in (None, detected)]
    return _Folder(detected, events, collector.per_rule).fold(collector.lines)


def scan_log(text: str, engine: str | None = None, *, source: str = "log") -> LogScan:
    """Scan a whole startup log. `engine` is `vllm`, `sglang`, or None/`auto` to detect it.

    Raises ParseError for an empty log and UnsupportedError for an unknown engine name.
    """
    return _scan_chunks(_text_chunks(text), engine, source)


def scan_lines(lines: Iterable[str], engine: str | None = None, *, source: str = "log") -> LogScan:
    """Like `scan_log` over an iterable of lines (with or without '\\n'), in flat memory."""
    return _scan_chunks(_chunks(lines), engine, source)


def findings_by_severity(scan: LogScan, severity: str) -> Sequence[Finding]:
    """The findings of one severity (`info`, `warning`, `error`)."""
    if severity not in SEVERITIES:
        raise UnsupportedError(f"severity '{severity}' is not known; use info, warning or error")
    return [f for f in scan.findings if f.severity == severity]
