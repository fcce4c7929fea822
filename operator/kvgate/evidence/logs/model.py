"""Results of a log scan: findings, capacity, the scan; the events rules produce."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

from kvgate.records.codec import record_of
from kvgate.records.status import CapacityRecord, FindingRecord, ScanRecord

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
# What each crash signature means, in words a headline can lead with (the hint says what to do).
CAUSES: Final = {
    "attention-build-failed": "the attention backend could not JIT-compile its FP8 KV kernels "
    "(FlashInfer without nvcc/ninja in the image: the L4 trap)",
    "fp8-unsupported": "this GPU and attention backend cannot store an FP8 KV cache",
    "out-of-memory": "the GPU ran out of memory",
    "insufficient-kv-memory": "too little GPU memory was left for the KV cache",
    "invalid-kv-cache-dtype": "the engine does not accept this --kv-cache-dtype",
}
# engine-start-failed has no cause of its own: the fold's root cause hint names it
ERROR_CODES: Final = frozenset({*CAUSES, "engine-start-failed"})

CHUNK_CHARS: Final = 4 << 20
MAX_TEXT: Final = 400
# Rules look at the first MAX_LINE characters of a line: real startup lines are a few KiB at
# most (SGLang's ServerArgs line is the longest), and the cap bounds each line's cost whatever
# a pod prints. The patterns are linear as well (tests/unit/test_logs.py checks 1 MB lines).
MAX_LINE: Final = 64 << 10
# Matches of one rule past this are dropped (a crash loop): they vote, a finding counts none.
MAX_EVENTS_PER_RULE: Final = 200


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
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class LogScan:
    """What a startup log says about the KV cache, the attention backend and the outcome."""

    engine: str | None
    engine_version: str | None
    kv_cache_dtype: str | None
    attention_backend: str | None
    attention_backend_candidates: tuple[str, ...]
    capacity: CapacityRecord  # status's own record: the log's figures, None where it is silent
    ready: bool
    failed: bool
    findings: tuple[Finding, ...]
    lines: int

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def finding(self, code: str) -> Finding | None:
        return next((f for f in self.findings if f.code == code), None)

    def status_record(self) -> ScanRecord:
        """The scan as status keeps it (`status.ScanRecord`)."""
        record: ScanRecord = record_of(
            ScanRecord,
            self,
            findings=tuple(record_of(FindingRecord, f, hint=f.hint or None) for f in self.findings),
            tail=(),  # a crashed arm's last lines: the controller adds them from the pod log
        )
        return record

    def to_dict(self) -> dict[str, object]:
        return {
            **dataclasses.asdict(self),  # the field order; the tuples below as lists
            "attention_backend_candidates": list(self.attention_backend_candidates),
            "findings": [f.to_dict() for f in self.findings],
        }


@dataclass(frozen=True, slots=True)
class Event:
    """One rule matching one line: the rule's name, its engine, the line and the groups."""

    rule: str
    engine: str | None
    line: int
    groups: tuple[str | None, ...]
    text: str
