"""What does status keep of one scrape of a production pod, and how is it read back?

A scrape is kept as a `status.PoolSample` (camelCase, nulls left out, whole floats as ints as the
apiserver stores them): the pool fields pool pressure reads, the TTFT totals (the verify window's
baseline) and the request-length totals (the load Job's workload). Reading is total and takes
either spelling, so a status an earlier release wrote (snake_case) reads the same.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from kvgate.evidence import metrics
from kvgate.records.codec import read_record, record_of, whole, write
from kvgate.records.status import PoolSample, PreflightStatus
from kvgate.records.timestamps import parse_time
from kvgate.spec.rollout import CapacityGate
from kvgate.vocabulary import GateMode


def record(snap: metrics.MetricSnapshot) -> dict[str, Any]:
    """The status record of one scrape."""
    ttft, prompt, output = snap.ttft, snap.prompt_lengths, snap.output_lengths
    sample = record_of(
        PoolSample,
        snap,
        ttft_sum=None if ttft is None else ttft.sum,
        ttft_count=None if ttft is None else ttft.count,
        prompt_len_sum=None if prompt is None else prompt.sum,
        prompt_len_count=None if prompt is None else prompt.count,
        output_len_sum=None if output is None else output.sum,
        output_len_count=None if output is None else output.count,
    )
    return write_sample(sample)


def write_sample(sample: PoolSample) -> dict[str, Any]:
    """A sample as status keeps it (whole floats as ints, as the apiserver stores them)."""
    return {k: whole(v) for k, v in write(sample).items()}


def round_due(gate: CapacityGate, pre: PreflightStatus, now: dt.datetime) -> bool:
    """Whether Preflight samples the pool now: the gate is on, samples are missing, and an
    interval (less a tenth: polls come a little early or late) has passed since the last round."""
    if gate.mode is GateMode.OFF or (pre.ticks or 0) >= gate.samples:
        return False
    last = parse_time(pre.last_sample_at)
    return last is None or (now - last).total_seconds() >= gate.interval_s * 0.9


def kept_series(pre: PreflightStatus) -> dict[str, list[dict[str, Any]]]:
    """The preflight's kept samples per pod, as status keeps them (what the pool sources read
    and extend, and the verify baseline reads)."""
    return {pod: [write_sample(s) for s in v] for pod, v in pre.samples.items()}


def sample_of(raw: object) -> PoolSample:
    """A kept sample, read whatever its spelling; anything unreadable reads as empty."""
    sample: PoolSample = read_record(PoolSample, raw)
    return sample


def snapshot_of(raw: object) -> metrics.MetricSnapshot:
    """A kept sample as the pool fields of a snapshot (what pool pressure reads)."""
    sample = sample_of(raw)
    return metrics.snapshot_from_pool_sample(
        {k: v for k in metrics.POOL_SAMPLE_FIELDS if (v := getattr(sample, k)) is not None}
    )
