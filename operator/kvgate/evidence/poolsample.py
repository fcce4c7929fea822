"""What does status keep of one scrape of a production pod, and how is it read back?

A scrape is kept as a `status.PoolSample` (camelCase, nulls left out, whole floats as ints as the
apiserver stores them): the pool fields pool pressure reads, the TTFT totals (the verify window's
baseline) and the request-length totals (the load Job's workload). The preflight keeps them
typed between scrapes; they are read back with the status (`records.codec`, total, either
spelling: a status an earlier release wrote in snake_case reads the same).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence

from kvgate.evidence import metrics, pool
from kvgate.records.codec import record_of, whole
from kvgate.records.status import PoolSample, PreflightStatus, PressureRecord
from kvgate.records.timestamps import parse_time
from kvgate.spec.rollout import CapacityGate
from kvgate.vocabulary import GateMode


def record(snap: metrics.MetricSnapshot) -> PoolSample:
    """The status record of one scrape (whole floats as ints, as the apiserver stores them)."""
    ttft, prompt, output = snap.ttft, snap.prompt_lengths, snap.output_lengths
    sample: PoolSample = record_of(
        PoolSample,
        snap,
        ttft_sum=None if ttft is None else ttft.sum,
        ttft_count=None if ttft is None else ttft.count,
        prompt_len_sum=None if prompt is None else prompt.sum,
        prompt_len_count=None if prompt is None else prompt.count,
        output_len_sum=None if output is None else output.sum,
        output_len_count=None if output is None else output.count,
    )
    return dataclasses.replace(
        sample, **{f.name: whole(getattr(sample, f.name)) for f in dataclasses.fields(sample)}
    )


def round_due(gate: CapacityGate, pre: PreflightStatus, now: dt.datetime) -> bool:
    """Whether Preflight samples the pool now: the gate is on, samples are missing, and an
    interval (less a tenth: polls come a little early or late) has passed since the last round."""
    if gate.mode is GateMode.OFF or (pre.ticks or 0) >= gate.samples:
        return False
    last = parse_time(pre.last_sample_at)
    return last is None or (now - last).total_seconds() >= gate.interval_s * 0.9


def snapshot_of(sample: PoolSample) -> metrics.MetricSnapshot:
    """A kept sample as the pool fields of a snapshot (what pool pressure reads)."""
    return metrics.snapshot_from_pool_sample(
        {k: v for k in metrics.POOL_SAMPLE_FIELDS if (v := getattr(sample, k)) is not None}
    )


def pool_verdict(
    series: Mapping[str, Sequence[PoolSample]], usage_threshold: float
) -> tuple[bool | None, str, dict[str, PressureRecord]]:
    """The pool verdict over the samples kept in status (`pool.pool_pressure_across_replicas`)."""
    snapshots = {pod: [snapshot_of(s) for s in samples] for pod, samples in series.items()}
    pressured, detail, results = pool.pool_pressure_across_replicas(
        snapshots, usage_threshold=usage_threshold
    )
    return pressured, detail, {pod: r.status_record() for pod, r in results.items()}
