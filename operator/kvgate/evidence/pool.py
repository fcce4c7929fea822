"""Is the KV pool the limit? Pool pressure over a series of `/metrics` snapshots.

>>> pool_pressure([before, after]).pressured  # True / False / None (not enough evidence)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Final

from kvgate.errors import SpecError
from kvgate.evidence.metrics import MetricSnapshot, counter_increase
from kvgate.records.codec import record_of
from kvgate.records.status import PressureRecord

MIN_SAMPLES: Final = 3


@dataclass(frozen=True, slots=True)
class PoolPressure:
    """Is the KV pool the limit? `pressured` None means not enough evidence (fail closed)."""

    pressured: bool | None
    samples: int
    pressured_samples: int
    fraction: float | None
    max_usage: float | None
    mean_usage: float | None
    mean_waiting: float | None
    preemptions: float | None
    usage_threshold: float
    min_fraction: float
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "reasons": list(self.reasons)}

    def status_record(self) -> PressureRecord:
        """As status keeps it (`status.PressureRecord`)."""
        record: PressureRecord = record_of(PressureRecord, self)
        return record


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def pool_pressure(
    snapshots: Sequence[MetricSnapshot],
    *,
    usage_threshold: float = 0.9,
    min_fraction: float = 0.5,
) -> PoolPressure:
    """The pool is the limit when, in at least `min_fraction` of the samples, it was full:
    KV usage at or above `usage_threshold` with requests waiting, or a preemption since the
    previous sample. Engines preempt (vLLM) or retract (SGLang) only when the pool has no free
    block, so that counts whatever the usage gauge reads at the scrape: with prompts large
    next to the pool, usage dips below the threshold between admissions while users queue.

    Fewer than MIN_SAMPLES usable samples, no KV usage metric, no queue or preemption
    metric, or no traffic at all give `pressured=None`.
    """
    if not 0.0 < usage_threshold <= 1.0:
        raise SpecError("usage_threshold", f"{usage_threshold} is outside (0, 1]")
    if not 0.0 < min_fraction <= 1.0:
        raise SpecError("min_fraction", f"{min_fraction} is outside (0, 1]")
    engines = {s.engine for s in snapshots}
    if len(engines) > 1:
        raise SpecError("snapshots", f"scrapes of different engines ({', '.join(sorted(engines))})")

    usable = [s for s in snapshots if s.kv_usage is not None and not math.isnan(s.kv_usage)]
    usages = [s.kv_usage for s in usable if s.kv_usage is not None]
    waiting = [s.waiting for s in usable if s.waiting is not None]
    preempted_total = 0.0
    have_preemption_signal = False
    pressured_samples = 0
    previous: MetricSnapshot | None = None
    busy = False
    for snap in usable:
        grew = counter_increase(previous.preemptions, snap.preemptions) if previous else None
        preempted = bool(grew) or bool(snap.retracted)
        if grew is not None:
            preempted_total += grew
        if snap.preemptions is not None or snap.retracted is not None:
            have_preemption_signal = True
        queued = bool(snap.waiting)
        busy = busy or queued or preempted or bool(snap.running)
        full = snap.kv_usage is not None and snap.kv_usage >= usage_threshold
        if preempted or (full and queued):
            pressured_samples += 1
        previous = snap

    reasons: list[str] = []
    verdict: bool | None = None
    fraction = pressured_samples / len(usable) if usable else None
    if not usable:
        reasons.append(
            "no KV usage metric in any sample (vllm:kv_cache_usage_perc, sglang:token_usage)"
        )
    elif len(usable) < MIN_SAMPLES:
        reasons.append(f"only {len(usable)} usable sample(s); at least {MIN_SAMPLES} needed")
    elif not waiting and not have_preemption_signal:
        reasons.append(
            "no waiting-queue or preemption metric: cannot tell a full pool from a busy one"
        )
    elif not busy:
        reasons.append("no requests running or waiting in any sample: no load to judge the pool by")
    else:
        verdict = fraction is not None and fraction >= min_fraction
        reasons.append(
            f"{pressured_samples} of {len(usable)} samples had KV usage >= {_pct(usage_threshold)} "
            f"with requests waiting, or a preemption ({fraction:.0%}; needed {min_fraction:.0%})"
        )
        peak = max(usages)
        if not verdict and peak < usage_threshold:
            reasons.append(f"KV usage peaked at {_pct(peak)}, below {_pct(usage_threshold)}")
    return PoolPressure(
        pressured=verdict,
        samples=len(usable),
        pressured_samples=pressured_samples,
        fraction=fraction,
        max_usage=max(usages) if usages else None,
        mean_usage=_mean(usages),
        mean_waiting=_mean(waiting),
        preemptions=preempted_total if have_preemption_signal else None,
        usage_threshold=usage_threshold,
        min_fraction=min_fraction,
        reasons=tuple(reasons),
    )


def pool_pressure_across_replicas(
    series: Mapping[str, Sequence[MetricSnapshot]], *, usage_threshold: float = 0.9
) -> tuple[bool | None, str, dict[str, PoolPressure]]:
    """Judge each replica's pool, then the Deployment's: pressured if any replica's pool is the
    limit (its users queue); room only if every replica was judged and has room; else unknown.
    """
    results = {
        replica: pool_pressure(snaps, usage_threshold=usage_threshold)
        for replica, snaps in series.items()
    }
    verdicts = [r.pressured for r in results.values()]
    if True in verdicts:
        pressured: bool | None = True
    elif verdicts and None not in verdicts:
        pressured = False
    else:
        pressured = None
    detail = "; ".join(f"{replica}: {' '.join(r.reasons)}" for replica, r in results.items())
    return pressured, detail or "no samples", results


def _pct(share: float) -> str:
    """A share as the percentage the scrape output prints (first-hour-2 #21: "peaked at 0.25,
    below 0.9" beside "kv usage 93.6%")."""
    return f"{100 * share:.4g}%"
