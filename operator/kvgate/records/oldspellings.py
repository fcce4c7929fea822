"""Which older spellings of a status key does the reader still accept, who wrote them, and when
do they go? One list, the only place the status codec (`codec`) and the CRD's schema (`schema`)
take another spelling from.

The rule: a spelling is listed only when an operator built from main wrote it into a stored
status (there are no tagged releases, so "a release" is a commit on main). Each row names the
writer and the last commit that wrote it; every row goes in `REMOVED_IN`. Spellings that only a
reader guessed (the report's `kvDtype`, `gain`, `wilson`...) are not listed: nobody stored them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

REMOVED_IN: Final = "0.2.0"  # the release that stops reading every spelling below

# The last commit of the dict writer (status written as dicts, nested blocks as their producers'
# snake_case `to_dict`): the typed status (15f8581) writes camelCase since.
_DICT_WRITER: Final = "d77d297"
# The typed writer kept a few of the eval Job's snake_case keys until one spelling (issue 38).
_TYPED_WRITER: Final = "3dfa341"


@dataclass(frozen=True, slots=True)
class OldSpelling:
    """`spelling` of the field `field` of the status record `record` (class names, as the codec
    sees them), as `writer` stored it until `last_written`."""

    record: str
    field: str
    spelling: str
    writer: str
    last_written: str


def _snake(record: str, names: str, writer: str, last: str = _DICT_WRITER) -> list[OldSpelling]:
    """Rows for fields whose old spelling was their snake_case Python name."""
    return [OldSpelling(record, n, n, writer, last) for n in names.split()]


_SCAN = "logs.LogScan.to_dict in arms.<arm>.scan"
_POOL = "observe.pool_record in preflight.samples"
_PRESSURE = "metrics.PoolPressure.to_dict in preflight.pressure and pressureByPod"
_JOB = "the eval Job's summary, kept verbatim in accuracy"

OLD_SPELLINGS: Final[tuple[OldSpelling, ...]] = (
    *_snake("ScanRecord", "engine_version kv_cache_dtype attention_backend", _SCAN),
    *_snake("ScanRecord", "attention_backend_candidates", _SCAN),
    *_snake("CapacityRecord", "kv_tokens max_concurrency kv_memory_gib", _SCAN),
    *_snake("CapacityRecord", "max_model_len num_gpu_blocks", _SCAN),
    *_snake("PoolSample", "kv_usage ttft_sum ttft_count", _POOL),
    *_snake("PressureRecord", "pressured_samples min_fraction usage_threshold", _PRESSURE),
    *_snake("PressureRecord", "mean_usage max_usage mean_waiting", _PRESSURE),
    *_snake("AccuracyStatus", "questions_used questions_planned stopped_early", _JOB),
    *_snake("AccuracyStatus", "largest_loss_ruled_out smallest_loss_shown long_context", _JOB),
    # The Job still prints `n` (its edge, evalsummary.job_keys, reads it through this row): the
    # Job prints `total` before this row goes.
    OldSpelling("ArmAccuracy", "total", "n", _JOB, _DICT_WRITER),
    *_snake("PairedRecord", "mcnemar_p control_only candidate_only lower_bound upper_bound", _JOB),
    *_snake("AdviceRecord", "questions_needed", _JOB),
    *_snake("BoundsRecord", "lower_confidence upper_confidence look_adjusted", _JOB, _TYPED_WRITER),
    *_snake("LongContextRecord", "context_lengths", _JOB, _TYPED_WRITER),
    *_snake("LongContextBucketRecord", "context_length", _JOB),
    *_snake("TokenAgreement", "top1_agreement mean_kl p99_kl max_kl", _JOB),
    *_snake("DivergenceBucketRecord", "kl_ratio kl_limit disagreement_limit", _JOB),
    *_snake("DivergenceRecord", "flagged_buckets first_flagged", _JOB, _TYPED_WRITER),
    *_snake(
        "EvalProgress",
        "looks_planned",
        "the eval Job's progress line, kept verbatim in eval.progress",
        _TYPED_WRITER,
    ),
)


def spellings_of(record: str, field: str) -> tuple[str, ...]:
    """The old spellings of `record.field` the reader accepts (usually none)."""
    return tuple(o.spelling for o in OLD_SPELLINGS if (o.record, o.field) == (record, field))


# The copies of an arm's scan figures the dict writer kept beside the scan (`capacity.<arm>`,
# `arms.<arm>`, until d77d297): (section, its key, the scan key they fill). Read where the scan
# lacks them, never written again; removed in `REMOVED_IN` with the rest.
COPIES: Final = (
    ("capacity", "kvTokens", "capacity.kvTokens"),
    ("arms", "kvTokens", "capacity.kvTokens"),
    ("arms", "attentionBackend", "attentionBackend"),
)
