"""The throughput gate with the field report's numbers (and the cases around them).

The field report: with a BF16 cache the service made 1,558 tok/s at 32 concurrent and ran out of
memory at 64; with FP8 it made 2,192 tok/s at 64, 41% above BF16's best, a few percent slower
per token wherever both could run.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvgate.judge.throughput import (
    assess_throughput,
    production_concurrency,
)
from kvgate.reasons import Reason
from kvgate.records.loadresult import ArmLoad, LoadSummary, LoadVerdict, StagePoint, StageStatus
from kvgate.records.status import (
    ClockReading,
    ClockRecord,
    ClocksRecord,
    LoadStatus,
    PoolSample,
    PreflightStatus,
    RolloutStatus,
)
from kvgate.spec.rollout import ThroughputGainGate
from kvgate.vocabulary import Outcome

GATE = ThroughputGainGate()
OOM = "40 of 128 requests failed (Server Error: 40)"


def ok(concurrency: int, tok_s: float, tpot_ms: float, ttft_p99_ms: float = 900.0) -> StagePoint:
    return StagePoint(
        concurrency=concurrency, requests=2 * concurrency, status=StageStatus.MEASURED,
        successes=2 * concurrency, failures=0, output_tokens_per_s=tok_s, ttft_p50_ms=300.0,
        ttft_p99_ms=ttft_p99_ms, tpot_p50_ms=tpot_ms, tpot_p99_ms=tpot_ms * 1.4,
    )  # fmt: skip


def failed(concurrency: int, reason: str = OOM) -> StagePoint:
    return StagePoint(
        concurrency=concurrency, requests=2 * concurrency, status=StageStatus.ERROR,
        successes=88, failures=40, reasons=(reason,),
    )  # fmt: skip


# Stages in the order the load Job runs them: production's 64 first, then the sweep.
BF16 = ArmLoad(
    url="http://control:8000", exit_code=0, reachable_after=True,
    stages=(failed(64), ok(1, 61.0, 16.4), ok(8, 410.0, 19.5), ok(32, 1558.0, 20.5), failed(128)),
)  # fmt: skip
FP8 = ArmLoad(
    url="http://candidate:8000", exit_code=0, reachable_after=True,
    stages=(ok(64, 2192.0, 29.2), ok(1, 59.0, 16.9), ok(8, 398.0, 20.1), ok(32, 1512.0, 21.1),
            failed(128)),
)  # fmt: skip
FIELD = LoadSummary(
    kind="kvgate.load/summary", verdict=LoadVerdict.PARTIAL, production_concurrency=64,
    prompt_tokens=20000, output_tokens=1000, num_workers=2, control=BF16, candidate=FP8,
)  # fmt: skip
LABELS = ("BF16", "FP8")


def test_the_field_report_is_a_gain_at_production_load() -> None:
    finding = assess_throughput(GATE, FIELD, labels=LABELS)
    assert finding.result.outcome is Outcome.SUCCESSFUL
    assert finding.result.reason is Reason.THROUGHPUT_GAINED
    assert finding.result.message == (
        "at production load 64: FP8 2,192 tok/s, BF16 does not serve it "
        f"({OOM}); BF16's best 1,558 tok/s at 32, +41%; TPOT +3% at 32 concurrent"
    )
    assert finding.gain == pytest.approx(2192 / 1558, abs=1e-4)
    assert finding.best_gain == pytest.approx(2192 / 1558, abs=1e-4)


def test_both_serving_production_load_alike_is_not_needed() -> None:
    at32 = replace(FIELD, production_concurrency=32)
    finding = assess_throughput(GATE, at32, labels=LABELS)
    assert finding.result.outcome is Outcome.NOT_NEEDED
    assert finding.result.reason is Reason.THROUGHPUT_NOT_NEEDED
    assert finding.result.message.startswith(
        "at production load 32: 1,512 tok/s vs 1,558 tok/s, -3% (at least 1.3x asked); "
        "TPOT +3% at 32 concurrent; best stages 1.41x: both arms serve production's load"
    )
    assert finding.gain == pytest.approx(1512 / 1558, abs=1e-4)


def test_both_serving_with_a_gain_above_the_ratio_is_a_gain() -> None:
    faster = replace(FP8, stages=(ok(32, 2100.0, 21.0),))
    control = replace(BF16, stages=(ok(32, 1558.0, 20.5),))
    summary = replace(FIELD, production_concurrency=32, control=control, candidate=faster)
    finding = assess_throughput(GATE, summary)
    assert finding.result.outcome is Outcome.SUCCESSFUL
    assert finding.result.message == (
        "at production load 32: 2,100 tok/s vs 1,558 tok/s, +35% (at least 1.3x asked); "
        "TPOT +2% at 32 concurrent; best stages 1.35x"
    )


def test_a_candidate_that_does_not_serve_production_load_fails() -> None:
    swapped = replace(FIELD, control=FP8, candidate=BF16)
    finding = assess_throughput(GATE, swapped, labels=("FP8", "BF16"))
    assert finding.result.outcome is Outcome.FAILED
    assert finding.result.reason is Reason.THROUGHPUT_NOT_GAINED
    assert finding.result.message == (
        f"at production load 64: BF16 does not serve it ({OOM}), FP8 makes 2,192 tok/s; "
        "TPOT -3% at 32 concurrent"
    )


def test_neither_serving_is_a_bottleneck_the_candidate_does_not_relieve() -> None:
    finding = assess_throughput(GATE, replace(FIELD, production_concurrency=128))
    assert finding.result.outcome is Outcome.FAILED
    assert finding.result.message == (
        f"at production load 128: neither arm serves it (control: {OOM}; candidate: {OOM}): "
        "the candidate does not relieve the bottleneck"
    )
    assert finding.gain is None


def test_a_stage_that_misses_an_slo_is_not_served() -> None:
    slo = ThroughputGainGate(tpot_p99_ms=40.0)  # FP8's p99 at 64 is 29.2 x 1.4 = 40.9 ms
    finding = assess_throughput(slo, FIELD, labels=LABELS)
    assert finding.result.outcome is Outcome.FAILED
    assert "FP8: TPOT p99 41 ms over the SLO 40 ms" in finding.result.message


def test_arms_at_different_clocks_make_no_throughput_claim() -> None:
    l4 = ClockRecord.of(sm=ClockReading(2040, 2040, 2040), mem=ClockReading(6251, 6251, 6251))
    slow = ClockRecord.of(sm=ClockReading(1410, 1410, 1410), mem=l4.mem)
    finding = assess_throughput(GATE, FIELD, ClocksRecord(control=l4, candidate=slow))
    assert finding.result.outcome is Outcome.INCONCLUSIVE
    assert finding.result.reason is Reason.CLOCKS_DIFFER
    assert finding.result.message.startswith(
        "no throughput claim: the arms ran at different GPU clocks: SM clock 1,410 MHz on the "
        "candidate vs 2,040 MHz on the control"
    )
    assert finding.gain is None and finding.best_gain is None
    same = assess_throughput(GATE, FIELD, ClocksRecord(control=l4, candidate=l4))
    assert same.result.outcome is Outcome.SUCCESSFUL


def test_off_and_broken_runs_claim_nothing() -> None:
    off = assess_throughput(None, FIELD)
    assert (off.result.outcome, off.result.reason) == (Outcome.SKIPPED, Reason.GATE_OFF)
    broken = replace(
        FIELD,
        verdict=LoadVerdict.ERROR,
        error="candidate: the arm did not answer after the run (1 of 5 stages measured)",
        candidate=replace(FP8, reachable_after=False, error="the arm did not answer"),
    )
    finding = assess_throughput(GATE, broken)
    assert (finding.result.outcome, finding.result.reason) == (
        Outcome.ERROR,
        Reason.THROUGHPUT_UNKNOWN,
    )
    assert finding.result.message == (
        "no throughput: the load run failed: candidate: the arm did not answer after the run "
        "(1 of 5 stages measured)"
    )
    none = assess_throughput(GATE, None)
    assert none.result.message == "no throughput: no load summary"
    stale = assess_throughput(GATE, FIELD, production_concurrency=32)
    assert (stale.result.outcome, stale.result.message) == (
        Outcome.ERROR,
        "no throughput: the load ran for production concurrency 64, production is at 32",
    )
    assert assess_throughput(GATE, FIELD, production_concurrency=64).result.outcome is (
        Outcome.SUCCESSFUL
    )


def test_the_status_keeps_the_load_once_and_round_trips() -> None:
    finding = assess_throughput(GATE, FIELD)
    status = RolloutStatus(
        load=LoadStatus(
            attempt=1, throughput_gain=finding.gain, best_gain=finding.best_gain, summary=FIELD
        )
    )
    raw = status.to_dict()
    assert raw["load"]["throughputGain"] == pytest.approx(1.4069, abs=1e-4)
    assert raw["load"]["summary"]["candidate"]["stages"][0]["outputTokensPerS"] == 2192.0
    assert RolloutStatus.from_dict(raw) == status


def test_production_concurrency_is_the_busiest_pods_mean_running_plus_waiting() -> None:
    pre = PreflightStatus(
        samples={
            "a": (PoolSample(running=30.0, waiting=2.0), PoolSample(running=34.0, waiting=6.0)),
            "b": (PoolSample(running=8.0, waiting=0.0),),
            "c": (PoolSample(kv_usage=0.9),),  # no request figures: left out
        }
    )
    assert production_concurrency(pre) == 36  # pod a: (32 + 40) / 2
    assert production_concurrency(None) == 1
    assert production_concurrency(PreflightStatus()) == 1
    assert production_concurrency(PreflightStatus(samples={"c": (PoolSample(kv_usage=0.9),)})) == 1
    # from a stored status: the same figures, and anything else reads as 1
    stored = {"preflight": {"samples": {"a": [{"running": 3.0, "waiting": 1.0}]}}}
    assert production_concurrency(RolloutStatus.from_dict(stored).preflight) == 4
    assert production_concurrency(RolloutStatus.from_dict({"preflight": "junk"}).preflight) == 1


def test_the_line_says_how_often_each_engine_preempted_during_the_load() -> None:
    preempting = replace(
        FIELD,
        control=replace(BF16, preemptions=1234.0),
        candidate=replace(FP8, preemptions=0.0),
    )
    message = assess_throughput(GATE, preempting, labels=LABELS).result.message
    assert message.endswith(
        "; TPOT +3% at 32 concurrent; preemptions during the load: BF16 1,234, FP8 0"
    )
    # one count unknown (not exported, unreadable, a reset counter): nothing is said
    half = replace(preempting, candidate=replace(FP8, preemptions=None))
    assert "preemptions" not in assess_throughput(GATE, half, labels=LABELS).result.message


def test_the_line_says_how_often_each_engine_preempted_at_production_load() -> None:
    # GIVEN the load Job's per-stage counts: BF16 preempts at 64 (where it cannot hold the
    # requests), FP8 does not; over the whole load they differ less
    def counted(arm: ArmLoad, at_64: float, whole: float) -> ArmLoad:
        stages = tuple(
            replace(s, preemptions=at_64 if s.concurrency == 64 else 0.0) for s in arm.stages
        )
        return replace(arm, stages=stages, preemptions=whole)

    summary = replace(FIELD, control=counted(BF16, 412.0, 500.0), candidate=counted(FP8, 0.0, 90.0))
    message = assess_throughput(GATE, summary, labels=LABELS).result.message
    assert message.endswith("; preemptions at 64 concurrent: BF16 412, FP8 0")
    # an error stage's count is still the engine's evidence; one arm's stage unknown: the
    # whole load's counts are said instead
    unknown = replace(summary, candidate=replace(FP8, preemptions=90.0))
    assert assess_throughput(GATE, unknown, labels=LABELS).result.message.endswith(
        "; preemptions during the load: BF16 500, FP8 90"
    )


def test_the_line_says_how_many_requests_met_the_slos_at_production_load() -> None:
    # GIVEN SLOs in the spec (the load Job passed them on: inference-perf counted goodput)
    slo = replace(GATE, ttft_p99_ms=5000.0, tpot_p99_ms=60.0)
    with_goodput = replace(
        FIELD,
        production_concurrency=32,
        control=replace(BF16, stages=(replace(ok(32, 1558.0, 20.5), goodput_percent=41.0),)),
        candidate=replace(FP8, stages=(replace(ok(32, 2100.0, 21.1), goodput_percent=97.66),)),
    )
    finding = assess_throughput(slo, with_goodput, labels=LABELS)
    # THEN the one line says it per arm, next to the gain
    assert finding.result.message.startswith(
        "at production load 32: 2,100 tok/s vs 1,558 tok/s, +35% (at least 1.3x asked); "
        "requests within the SLOs: BF16 41%, FP8 98%; TPOT +3% at 32 concurrent"
    ), finding.result.message
    # AND without SLOs (no goodput counted) the line has no such clause
    plain = assess_throughput(GATE, FIELD, labels=LABELS)
    assert "within the SLOs" not in plain.result.message
