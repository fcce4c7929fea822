"""Which engine printed a log, from the shapes of its lines when no rule line decides.

A pasted excerpt or a short start may hold no line a rule reads (NCCL chatter, weight loading,
a traceback cut above its summary), or as many lines of each engine. The engines still give
themselves away: vLLM by its `LEVEL mm-dd HH:MM:SS [file.py:N]` header (without brackets up to
0.7), its process tags and its package paths; SGLang by its `[YYYY-mm-dd HH:MM:SS TPn]` header,
its ServerArgs repr and its `sglang/srt` paths. Only the head of the log is read: the startup.
"""

from __future__ import annotations

import re
from typing import Final

HEAD_CHARS: Final = 256 << 10

_SHAPES: Final = {
    "vllm": re.compile(
        # vllm/logger.py: `INFO 10-10 11:12:03 selector.py:227] ` (<= 0.7) or `[file.py:N] `
        r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
        r"(?:\[[\w.*-]{1,128}\.py:\d+\]|[\w.-]{1,128}\.py:\d+\]) "
        # process tags of vllm/utils decorate_logs / multiproc workers
        r"|\((?:VllmWorkerProcess|VllmWorker rank=\d+|EngineCore(?:_DP\d+|_\d+)?|APIServer|"
        r"Worker(?:_[A-Z]{2}\d+)*) pid=\d+\)"
        r'|/vllm/(?:v1|engine|executor|worker|entrypoints|model_executor|attention)/[^"\s]{0,256}\.py"'
        r"|\bMQLLMEngine\b"
    ),
    "sglang": re.compile(
        # sglang/srt/utils configure_logger: `[%(asctime)s{ DPn}{ TPn}] `, at a line's start or
        # after a wrapper's prefix (kubectl --prefix/--timestamps, journald)
        r"(?<!\S)\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[,.]\d+)?(?: [A-Z]{2}\d+)*\] "
        r"|\bserver_args=ServerArgs\("
        r'|/sglang/srt/[^"\s]{0,256}\.py"'
        # keys of the ServerArgs repr that vLLM's args do not have
        r"|\b(?:mem_fraction_static|schedule_conservativeness|watchdog_timeout)=",
    ),
}


def engine_by_shape(head: str) -> str | None:
    """The engine whose line shapes the head of a log holds more of, or None on a tie."""
    counts = {engine: len(shape.findall(head)) for engine, shape in _SHAPES.items()}
    (first, most), (_, second) = sorted(counts.items(), key=lambda kv: -kv[1])
    return first if most > second else None
