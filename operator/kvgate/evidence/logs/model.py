"""Results of a log scan: findings, capacity, the scan; the events rules produce."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kvgate.records.codec import read_record, record_of
from kvgate.records.status import CapacityRecord, FindingRecord, ScanRecord

ENGINES: Final = ("vllm", "sglang")
SEVERITIES: Final = ("info", "warning", "error")

# Finding codes, in the order a startup prints them.
CODES: Final = (
    "fp8-kv-enabled",
    "kv-scale-default",
    "kv-scale-dropped",
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
ERROR_CODES: Final = frozenset(
    {
        "attention-build-failed",
        "fp8-unsupported",
        "engine-start-failed",
        "out-of-memory",
        "insufficient-kv-memory",
        "invalid-kv-cache-dtype",
    }
)
# What each crash signature means, in words a headline can lead with (the hint says what to do).
CAUSES: Final = {
    "attention-build-failed": "the attention backend could not JIT-compile its FP8 KV kernels "
    "(FlashInfer without nvcc/ninja in the image: the L4 trap)",
    "fp8-unsupported": "this GPU and attention backend cannot store an FP8 KV cache",
    "out-of-memory": "the GPU ran out of memory",
    "insufficient-kv-memory": "too little GPU memory was left for the KV cache",
    "invalid-kv-cache-dtype": "the engine does not accept this --kv-cache-dtype",
}

CHUNK_CHARS: Final = 4 << 20
MAX_TEXT: Final = 400
# Rules look at the first MAX_LINE characters of a line: real startup lines are a few KiB at
# most (SGLang's ServerArgs line is the longest), and the cap bounds each line's cost whatever
# a pod prints. The patterns are linear as well (tests/unit/test_logs.py checks 1 MB lines).
MAX_LINE: Final = 64 << 10
# Repeated matches of one rule beyond this only raise its count (a crash loop, a noisy warning).
MAX_EVENTS_PER_RULE: Final = 200


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

    @classmethod
    def from_dict(cls, data: object) -> LogScan:
        """A scan back from status (`status_record`, or the snake_case `to_dict` earlier releases
        kept there; any spelling `status.ScanRecord` reads); odd values become None.

        The findings are rebuilt as status keeps them (at most 20, lines cut).
        """
        return cls.of(read_record(ScanRecord, data))

    @classmethod
    def of(cls, record: ScanRecord) -> LogScan:
        """A scan as status keeps it (`status_record`), back in the scanner's form."""
        capacity = record.capacity or CapacityRecord()
        plain = {
            "engine": record.engine,
            "engine_version": record.engine_version,
            "kv_cache_dtype": record.kv_cache_dtype,
            "attention_backend": record.attention_backend,
            "attention_backend_candidates": record.attention_backend_candidates,
            "ready": record.ready,
            "failed": record.failed,
            "lines": record.lines,
        }
        cap = {
            "kv_tokens": capacity.kv_tokens,
            "max_concurrency": capacity.max_concurrency,
            "kv_memory_gib": capacity.kv_memory_gib,
            "max_model_len": capacity.max_model_len,
            "num_gpu_blocks": capacity.num_gpu_blocks,
        }
        findings = tuple(
            Finding(
                code=f.code,
                severity=f.severity or "info",
                line=f.line or 0,
                text=f.text or "",
                hint=f.hint or "",
                count=f.count or 1,
            )
            for f in record.findings
            if f.code
        )
        return cls._checked(plain, cap, findings)

    @classmethod
    def _checked(
        cls, data: Mapping[str, Any], cap: Mapping[str, Any], findings: tuple[Finding, ...]
    ) -> LogScan:

        def text(value: object) -> str | None:
            return value if isinstance(value, str) and value else None

        def count(value: object) -> int | None:
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                return int(value)
            return None

        def amount(value: object) -> float | None:
            # a positive finite quantity: vLLM logs a concurrency below one ("0.45x") when one
            # request of max_model_len does not fit, and that is a figure, not an unknown
            if isinstance(value, int | float) and not isinstance(value, bool):
                number = float(value)
                return number if math.isfinite(number) and number > 0 else None
            return None

        return cls(
            engine=text(data.get("engine")),
            engine_version=text(data.get("engine_version")),
            kv_cache_dtype=text(data.get("kv_cache_dtype")),
            attention_backend=text(data.get("attention_backend")),
            attention_backend_candidates=tuple(
                c for c in (data.get("attention_backend_candidates") or ()) if isinstance(c, str)
            ),
            capacity=Capacity(
                kv_tokens=count(cap.get("kv_tokens")),
                max_concurrency=amount(cap.get("max_concurrency")),
                kv_memory_gib=amount(cap.get("kv_memory_gib")),
                max_model_len=count(cap.get("max_model_len")),
                num_gpu_blocks=count(cap.get("num_gpu_blocks")),
            ),
            ready=data.get("ready") is True,
            failed=data.get("failed") is True,
            findings=findings,
            lines=count(data.get("lines")) or 0,
        )

    def status_record(self) -> ScanRecord:
        """The scan as status keeps it (`status.ScanRecord`)."""
        record: ScanRecord = record_of(
            ScanRecord,
            self,
            capacity=record_of(CapacityRecord, self.capacity),
            findings=tuple(record_of(FindingRecord, f, hint=f.hint or None) for f in self.findings),
            tail=(),  # a crashed arm's last lines: the controller adds them from the pod log
        )
        return record

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


@dataclass(frozen=True, slots=True)
class Event:
    """One rule matching one line: the rule's name, its engine, the line and the groups."""

    rule: str
    engine: str | None
    line: int
    groups: tuple[str | None, ...]
    text: str
