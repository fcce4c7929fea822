"""What did the eval Job's summary say? Its accuracy, long-context and divergence blocks as typed
records, read once (`AccuracyStatus.from_summary`) for the gates to judge and status to keep.

The Job writes snake_case keys; they are turned to camelCase once, here (`job_keys`), so the
records and the status they are kept in speak one spelling, `more` (the keys a record does not
name) included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kvgate.records.codec import MAX_DEPTH, camel, read_record
from kvgate.records.codec import key as _key

JsonValue = Any  # an open JSON value, kept verbatim

_JOB_KEYS: Final = (
    "Open: the eval Job's own summary keys this record does not name, camelCased (the Job's "
    "format, versioned with the eval image)."
)


def job_keys(value: object, depth: int = 0) -> object:
    """A JSON value the eval Job printed, every object key in camelCase (`looks_planned` ->
    `looksPlanned`), values unchanged: the one place the Job's spelling becomes the status's."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(value, Mapping):
        return {
            camel(k) if isinstance(k, str) else k: job_keys(v, depth + 1) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [job_keys(v, depth + 1) for v in value]
    return value


def progress_line(line: Mapping[str, Any]) -> dict[str, Any]:
    """The eval Job's progress line as status keeps it (`eval.progress`, camelCase keys)."""
    out = job_keys(line)
    return dict(out) if isinstance(out, Mapping) else {}


@dataclass(frozen=True, slots=True)
class ArmAccuracy:
    accuracy: float | None = None
    correct: int | None = None
    total: int | None = None
    wilson95: tuple[float, ...] = _key(default=())
    more: Mapping[str, JsonValue] = _key(default={}, rest=True, doc=_JOB_KEYS)


@dataclass(frozen=True, slots=True)
class PairedRecord:
    difference: float | None = None
    tango95: tuple[float, ...] = _key(default=())
    mcnemar_p: float | None = None
    control_only: int | None = None
    candidate_only: int | None = None
    both: int | None = None  # both arms right (the Job's key)
    neither: int | None = None  # both arms wrong
    lower_bound: float | None = None
    upper_bound: float | None = None
    more: Mapping[str, JsonValue] = _key(default={}, rest=True, doc=_JOB_KEYS)  # notes


@dataclass(frozen=True, slots=True)
class AdviceRecord:
    questions_needed: int | None = None
    discordance: float | None = None


@dataclass(frozen=True, slots=True)
class BoundsRecord:
    """One-sided bounds on candidate minus control, with their levels (the Job's own keys)."""

    lower: float | None = None
    upper: float | None = None
    lower_confidence: float | None = None
    upper_confidence: float | None = None
    look: int | None = None  # the 1-based look the gate stopped at
    look_adjusted: bool | None = None
    more: Mapping[str, JsonValue] = _key(default={}, rest=True, doc=_JOB_KEYS)  # sides, method


@dataclass(frozen=True, slots=True)
class LongContextBucketRecord:
    """One context length of the long-context task, as the eval Job judged it."""

    bucket: str | None = None
    context_length: int | None = None
    verdict: str | None = None
    reason: str | None = None
    items: int | None = None
    control: ArmAccuracy | None = None
    candidate: ArmAccuracy | None = None
    recovery: float | None = None
    paired: PairedRecord | None = None
    bounds: BoundsRecord | None = None
    more: Mapping[str, JsonValue] = _key(default={}, rest=True, doc=_JOB_KEYS)


@dataclass(frozen=True, slots=True)
class LongContextRecord:
    """The long-context block: per-bucket results, and the hub tokenizer with the commit it was
    read at (the spec's tokenizerRevision, or the one the eval Job resolved when unpinned)."""

    kind: str | None = None
    verdict: str | None = None
    error: str | None = None
    tasks: tuple[str, ...] = _key(default=())
    context_lengths: tuple[int, ...] = _key(default=())
    buckets: tuple[LongContextBucketRecord, ...] = _key(default=())
    tokenizer: str | None = None
    tokenizer_revision: str | None = None
    more: Mapping[str, JsonValue] = _key(default={}, rest=True, doc=_JOB_KEYS)


@dataclass(frozen=True, slots=True)
class TokenAgreement:
    """How closely one arm's next-token distributions follow the reference, over a bucket."""

    positions: int | None = None
    top1_agreement: float | None = None
    mean_kl: float | None = None
    p99_kl: float | None = None
    max_kl: float | None = None


@dataclass(frozen=True, slots=True)
class DivergenceBucketRecord:
    """One position bucket of the divergence screen: the A/A floor against the candidate."""

    bucket: str | None = None
    low: int | None = None
    high: int | None = None
    positions: int | None = None
    floor: TokenAgreement | None = None
    candidate: TokenAgreement | None = None
    kl_ratio: float | None = None
    kl_limit: float | None = None
    disagreement_limit: float | None = None
    flagged: bool | None = None
    reasons: tuple[str, ...] = _key(default=())


@dataclass(frozen=True, slots=True)
class DivergenceRecord:
    """The divergence screen's own summary (`kvgate diverge`)."""

    kind: str | None = None
    verdict: str | None = None
    error: str | None = None
    positions: int | None = None
    flagged_buckets: tuple[str, ...] = _key(default=())
    first_flagged: DivergenceBucketRecord | None = None
    buckets: tuple[DivergenceBucketRecord, ...] = _key(default=())
    more: Mapping[str, JsonValue] = _key(default={}, rest=True, doc=_JOB_KEYS)


@dataclass(frozen=True, slots=True)
class AccuracyStatus:
    """The eval Job's summary as the accuracy gate read it (`differencePp` for the printer column)."""

    verdict: str | None = None
    reason: str | None = None
    claim: str | None = None  # what an inconclusive verdict of a control below the floor says
    error: str | None = None
    task: str | None = None
    margin: float | None = None
    confidence: float | None = None
    questions_used: int | None = None
    questions_planned: int | None = None
    stopped_early: bool | None = None
    control: ArmAccuracy | None = None
    candidate: ArmAccuracy | None = None
    paired: PairedRecord | None = None
    difference_pp: float | None = None
    bounds: BoundsRecord | None = None  # the look-adjusted one-sided bounds the verdict rests on
    largest_loss_ruled_out: float | None = None
    smallest_loss_shown: float | None = None  # a fail: the candidate is worse by at least this
    advice: AdviceRecord | None = None
    long_context: LongContextRecord | None = None
    divergence: DivergenceRecord | None = None
    # The rest of the summary (the plan, its looks, bounds) as the Job wrote it.
    more: Mapping[str, JsonValue] = _key(default={}, rest=True, doc=_JOB_KEYS)

    @classmethod
    def from_summary(cls, summary: object) -> AccuracyStatus:
        """The eval Job's summary line, read once: what the gates judge and status keeps."""
        acc: AccuracyStatus = read_record(cls, job_keys(summary))
        diff = acc.paired.difference if acc.paired is not None else None
        return dataclasses.replace(
            acc,
            more={k: v for k, v in acc.more.items() if k != "kind"},
            difference_pp=acc.difference_pp if diff is None else round(diff * 100, 2),
        )
