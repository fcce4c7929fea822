"""Log line formats of vLLM, SGLang and uvicorn (engines.md §0), written unbuffered.

Lines are written whole and flushed at once so a reader (kubectl logs, a test) sees each
line as soon as the engine would print it.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from typing import TextIO

_LOCK = threading.Lock()


def _write(stream: TextIO, text: str) -> None:
    with _LOCK:
        try:
            stream.write(text if text.endswith("\n") else text + "\n")
            stream.flush()
        except (BrokenPipeError, ValueError):  # reader went away; the engine keeps serving
            pass


def uvicorn_prefix(level: str) -> str:
    """uvicorn's `%(levelprefix)s`: 'INFO:' padded so messages line up."""
    return f"{level}:" + " " * (8 - len(level))


# What a reworded build (KVGATE_SIM_FAULTS=reworded-log) says instead of a line that names the
# KV dtype, the attention backend or the KV cache size: the facts are in its /metrics only.
_FACT_LINE = re.compile(r"(?i)kv.?cache|fp8|backend|concurrency|gpu blocks|attention")
REWORDED = "engine settings applied (this build logs no details)"


class VllmLog:
    """`(APIServer pid=1) INFO 11-29 19:45:00 [file.py:123] message`."""

    def __init__(
        self,
        api_pid: int,
        core_pid: int,
        out: TextIO | None = None,
        core_name: str = "EngineCore_DP0",
        reword: bool = False,
    ) -> None:
        self.api_pid = api_pid
        self.core_pid = core_pid
        self.core_name = core_name  # the engine-core process tag differs between releases
        self._out = out
        self.reword = reword

    @property
    def out(self) -> TextIO:
        return self._out or sys.stdout

    def _tag(self, proc: str) -> str:
        if proc == "APIServer":
            return f"(APIServer pid={self.api_pid}) "
        return f"({self.core_name} pid={self.core_pid}) "

    def line(self, proc: str, level: str, where: str, message: str) -> None:
        if self.reword and _FACT_LINE.search(message):
            message = REWORDED
        stamp = time.strftime("%m-%d %H:%M:%S")
        _write(self.out, f"{self._tag(proc)}{level} {stamp} [{where}] {message}")

    def info(self, proc: str, where: str, message: str) -> None:
        self.line(proc, "INFO", where, message)

    def warning(self, proc: str, where: str, message: str) -> None:
        self.line(proc, "WARNING", where, message)

    def error(self, proc: str, where: str, message: str) -> None:
        self.line(proc, "ERROR", where, message)

    def raw(self, proc: str, text: str, stream: TextIO | None = None) -> None:
        """Multi-line text (tracebacks) as decorate_logs prints it: every line tagged."""
        tag = self._tag(proc)
        _write(stream or self.out, "\n".join(tag + row for row in text.rstrip("\n").split("\n")))

    def uvicorn(self, message: str, level: str = "INFO", stream: TextIO | None = None) -> None:
        _write(stream or sys.stderr, f"{self._tag('APIServer')}{uvicorn_prefix(level)} {message}")

    def access(self, client: str, request_line: str, status: int, phrase: str) -> None:
        _write(
            self.out,
            f'{self._tag("APIServer")}{uvicorn_prefix("INFO")} {client} - "{request_line}" {status} {phrase}',
        )


class SglangLog:
    """`[2026-11-29 19:45:00 TP0] message` (no level name); uvicorn lines with the same stamp."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out

    @property
    def out(self) -> TextIO:
        return self._out or sys.stdout

    def line(self, message: str, rank: str = "") -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        prefix = f" {rank}" if rank else ""
        _write(self.out, f"[{stamp}{prefix}] {message}")

    def raw(self, text: str, stream: TextIO | None = None) -> None:
        _write(stream or self.out, text.rstrip("\n"))

    def uvicorn(self, message: str, level: str = "INFO", stream: TextIO | None = None) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        _write(stream or self.out, f"[{stamp}] {uvicorn_prefix(level)} {message}")

    def access(self, client: str, request_line: str, status: int, phrase: str) -> None:
        self.uvicorn(f'{client} - "{request_line}" {status} {phrase}')
