"""kvgate.evidence.poolsample: what status keeps of a scrape of a production pod, and reading it back."""

from __future__ import annotations

from typing import Any

import pytest
from test_crd_status_schema import assert_kept

from kvgate.evidence import poolsample
from kvgate.evidence.metrics import Histogram, MetricSnapshot
from kvgate.evidence.pool import pool_pressure
from kvgate.judge.verify import baseline_from_preflight
from kvgate.records.codec import read_record, write
from kvgate.records.status import PoolSample, PreflightStatus


def scrape(engine: str = "sglang", **values: Any) -> MetricSnapshot:
    base: dict[str, Any] = {
        "engine": engine, "kv_usage": 0.95, "running": 12.0, "waiting": 3.0, "retracted": None,
        "preemptions": None, "generation_tokens": None, "prompt_tokens": None,
        "max_total_tokens": None, "ttft": None, "itl": None, "tpot": None, "cache_config": {},
        "names": {},
    }  # fmt: skip
    return MetricSnapshot(**{**base, **values})


def read_back(*kept: object) -> tuple[PoolSample, ...]:
    """Kept samples as the operator reads them back: with the status (`records.codec`)."""
    samples: tuple[PoolSample, ...] = read_record(
        PreflightStatus, {"samples": {"a": list(kept)}}
    ).samples["a"]
    return samples


def test_a_scrape_is_kept_camel_case_whole_floats_as_ints_and_nulls_left_out() -> None:
    snap = scrape(
        retracted=2.0,
        ttft=Histogram((), 6.5, 40.0),
        prompt_lengths=Histogram((), 80_000.0, 40.0),
        output_lengths=Histogram((), 16_000.0, 40.0),
    )
    kept = write(poolsample.record(snap))
    assert kept == {
        "engine": "sglang", "kvUsage": 0.95, "running": 12, "waiting": 3, "retracted": 2,
        "ttftSum": 6.5, "ttftCount": 40, "promptLenSum": 80_000, "promptLenCount": 40,
        "outputLenSum": 16_000, "outputLenCount": 40,
    }  # fmt: skip
    assert all(isinstance(v, int) for k, v in kept.items() if k.endswith("Count"))
    # nothing of it is pruned by the CRD's schema (SGLang's retractions were, before)
    assert_kept({"preflight": {"samples": {"prod-0": [kept]}}})


def test_either_spelling_reads_back_the_same() -> None:
    camel = write(poolsample.record(scrape(retracted=2.0, ttft=Histogram((), 6.5, 40.0))))
    snake = {"engine": "sglang", "kv_usage": 0.95, "running": 12, "waiting": 3, "retracted": 2,
             "ttft_sum": 6.5, "ttft_count": 40}  # fmt: skip
    assert read_back(camel) == read_back(snake)
    assert read_back(camel)[0] == poolsample.record(
        scrape(retracted=2.0, ttft=Histogram((), 6.5, 40.0))
    )
    assert poolsample.snapshot_of(read_back(camel)[0]) == poolsample.snapshot_of(
        read_back(snake)[0]
    )


@pytest.mark.parametrize("hostile", [None, 7, "x", [1], {"kvUsage": "high"}, {"waiting": True}])
def test_anything_unreadable_reads_as_unknown(hostile: object) -> None:
    kept = read_back(hostile)  # an entry that is no object is dropped; a junk field is None
    assert len(kept) <= 1 and all(s.kv_usage is None and s.waiting is None for s in kept)
    assert all(poolsample.snapshot_of(s).kv_usage is None for s in kept)
    assert poolsample.pool_verdict({"a": list(kept)}, 0.9)[0] is None  # unknown, never a verdict


def test_retractions_kept_between_scrapes_still_count_as_pressure() -> None:
    # SGLang at a pool with room for more, but retracting: each sample was a preemption
    snaps = [scrape(kv_usage=0.5, waiting=0.0, retracted=1.0) for _ in range(3)]
    kept = [poolsample.record(s) for s in snaps]
    rebuilt = [poolsample.snapshot_of(k) for k in kept]
    assert pool_pressure(rebuilt).to_dict() == pool_pressure(snaps).to_dict()
    assert pool_pressure(rebuilt).pressured is True
    pressured, _detail, by_pod = poolsample.pool_verdict({"prod-0": kept}, 0.9)
    assert pressured is True
    assert by_pod["prod-0"].pressured_samples == 3 and by_pod["prod-0"].max_usage == 0.5
    kept_pressure = write(by_pod)
    assert_kept(
        {"preflight": {"pressure": kept_pressure["prod-0"], "pressureByPod": kept_pressure}}
    )


def test_the_verify_baseline_reads_kept_samples_of_either_spelling() -> None:
    camel = [
        poolsample.record(scrape(engine="vllm", waiting=w, ttft=Histogram((), t, n)))
        for w, t, n in ((3.0, 1.0, 10.0), (7.0, 3.0, 20.0))
    ]
    snake = read_back({"waiting": 3, "ttft_sum": 1.0, "ttft_count": 10},
                      {"waiting": 7, "ttft_sum": 3.0, "ttft_count": 20})  # fmt: skip
    assert read_back(*map(write, camel)) == tuple(camel)  # kept and read back unchanged
    assert baseline_from_preflight({"a": camel}) == baseline_from_preflight({"a": snake})
    assert baseline_from_preflight({"a": camel}).waiting == 7
    assert baseline_from_preflight({"a": camel}).ttft_s == pytest.approx(0.2)


def test_a_record_filled_from_a_result_names_every_field_or_fails() -> None:
    from dataclasses import dataclass

    from kvgate.records.codec import read_record, record_of, write
    from kvgate.records.status import PressureRecord

    @dataclass
    class Renamed:  # a result whose field was renamed on one side
        pressured: bool = True

    with pytest.raises(AttributeError, match="samples"):
        record_of(PressureRecord, Renamed())
    # every field the status record has is filled, none left at its default by omission
    snap = scrape(retracted=2.0, ttft=Histogram((), 6.5, 40.0))
    assert read_back(write(poolsample.record(snap)))[0].retracted == 2
    pressure = pool_pressure([snap, snap, snap])
    kept = read_record(PressureRecord, write(pressure.status_record()))
    for name, value in pressure.to_dict().items():
        assert getattr(kept, name) == (tuple(value) if isinstance(value, list) else value), name


def test_a_pool_round_is_due_while_samples_are_missing_and_an_interval_has_passed() -> None:
    import datetime as dt

    from kvgate.records.status import PreflightStatus
    from kvgate.records.timestamps import iso
    from kvgate.spec.rollout import CapacityGate
    from kvgate.vocabulary import GateMode

    now = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)
    gate = CapacityGate(samples=3, window_s=60)  # a sample every 30 s
    ago = lambda s: iso(now - dt.timedelta(seconds=s))  # noqa: E731
    # the first round, and one a little early (polls jitter), are due
    assert poolsample.round_due(gate, PreflightStatus(), now)
    assert poolsample.round_due(gate, PreflightStatus(ticks=1, last_sample_at=ago(27)), now)
    # too early, every sample taken, or the gate off: not due (no pod LIST)
    assert not poolsample.round_due(gate, PreflightStatus(ticks=1, last_sample_at=ago(26)), now)
    assert not poolsample.round_due(gate, PreflightStatus(ticks=3, last_sample_at=ago(60)), now)
    off = CapacityGate(mode=GateMode.OFF, samples=3, window_s=60)
    assert not poolsample.round_due(off, PreflightStatus(), now)
