"""The typed evidence the gates take, read from the JSON the tests write (as status keeps it, or
as the eval Job and the scanner print it: either spelling reads)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kvgate.records.codec import read_record
from kvgate.records.evalsummary import AccuracyStatus
from kvgate.records.status import CacheTruth, ScanRecord

T = TypeVar("T")


def as_scan(raw: Any) -> ScanRecord | None:
    return None if raw is None else read_record(ScanRecord, raw)  # type: ignore[no-any-return]


def as_truth(raw: Any) -> CacheTruth | None:
    return None if raw is None else read_record(CacheTruth, raw)  # type: ignore[no-any-return]


def as_summary(raw: Any) -> AccuracyStatus | None:
    return None if raw is None else AccuracyStatus.from_summary(raw)


def arms_of(read: Callable[[Any], T], by_arm: Mapping[str, Any]) -> dict[str, T]:
    return {arm: read(raw) for arm, raw in by_arm.items()}
