"""Same clock or no speed claim: the arms' DCGM clocks decide whether their TPOTs are compared.

Attacks: arms at different SM or memory clocks, a clock that throttles mid-window, clocks that
are unknown, junk clock series from Prometheus, and hostile status read back after a restart.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvgate.adapters.prometheus import Series, clock_query, clocks_from_series
from kvgate.errors import PrometheusError, SpecError
from kvgate.judge.gates import assess_speed, compare_clocks
from kvgate.records.codec import read_record, write
from kvgate.records.status import ClockReading, ClockRecord, ClocksRecord
from kvgate.spec.rollout import RolloutSpec, SpeedGate
from kvgate.vocabulary import Outcome

L4 = ClockRecord.of(sm=ClockReading(2040, 2040, 2040), mem=ClockReading(6251, 6251, 6251))
SLOW_SM = ClockRecord.of(sm=ClockReading(1410, 1410, 1410), mem=ClockReading(6251, 6251, 6251))
GATE = SpeedGate(max_tpot_regression=0.1, max_clock_difference=0.05)


def test_same_clocks_compare_and_the_claim_says_so() -> None:
    assert compare_clocks(L4, L4, 0.05) is None
    result = assess_speed(GATE, 0.020, 0.021, ClocksRecord(control=L4, candidate=L4))
    assert (result.outcome, result.reason) == (Outcome.SUCCESSFUL, "SpeedWithinLimit")
    assert result.message.endswith("at matched GPU clocks (2,040 MHz)")


def test_arms_at_different_sm_clocks_get_no_speed_claim() -> None:
    # GIVEN a candidate whose GPU ran at 1,410 MHz while the control's ran at 2,040 MHz
    clocks = ClocksRecord(control=L4, candidate=SLOW_SM)
    # WHEN the candidate looks 40% slower, or 40% faster
    for candidate_tpot in (0.028, 0.012):
        result = assess_speed(GATE, 0.020, candidate_tpot, clocks)
        # THEN neither is claimed: the gate is Inconclusive (blocks) and says why
        assert (result.outcome, result.reason) == (Outcome.INCONCLUSIVE, "ClocksDiffer")
        assert result.outcome.blocks
        assert result.message.startswith("no speed claim: the arms ran at different GPU clocks")
        assert "SM clock 1,410 MHz on the candidate vs 2,040 MHz on the control (31% apart" in (
            result.message
        )
        assert "not compared" in result.message


def test_memory_clock_difference_alone_is_enough() -> None:
    slow_mem = ClockRecord.of(sm=L4.sm, mem=ClockReading(5001, 5001, 5001))
    reason = compare_clocks(L4, slow_mem, 0.05)
    assert reason is not None and reason.startswith("memory clock 5,001 MHz on the candidate")


def test_within_tolerance_is_the_same_clock() -> None:
    near = ClockRecord.of(sm=ClockReading(1980, 1980, 1980), mem=L4.mem)  # 2.9% below 2,040
    assert compare_clocks(L4, near, 0.05) is None
    assert compare_clocks(L4, near, 0.02) is not None  # a tighter tolerance refuses it


def test_a_clock_that_throttled_mid_window_is_not_one_clock() -> None:
    # Equal means, but the candidate's SM clock spanned 1,500-2,200 MHz during the window.
    throttled = ClockRecord.of(sm=ClockReading(2040, 1500, 2200), mem=L4.mem)
    reason = compare_clocks(L4, throttled, 0.05)
    assert reason == (
        "the candidate's SM clock varied 1,500-2,200 MHz in the window (more than 5%)"
    )
    assert assess_speed(
        GATE, 0.02, 0.02, ClocksRecord(control=L4, candidate=throttled)
    ).outcome is (Outcome.INCONCLUSIVE)


def test_unknown_clocks_leave_the_claim_and_say_why() -> None:
    note = "no DCGM clock series for pod r-fp8-candidate in Prometheus"
    result = assess_speed(GATE, 0.020, 0.021, ClocksRecord(control=L4, note=note))
    assert result.outcome is Outcome.SUCCESSFUL
    assert result.message.endswith(f"(GPU clocks not compared: {note})")
    # No Prometheus configured: no clause at all, as before.
    plain = assess_speed(GATE, 0.020, 0.021, None)
    assert plain.message == "TPOT 21.0 ms vs 20.0 ms (+5%, limit +10%)"


def test_a_regression_at_matched_clocks_still_fails() -> None:
    result = assess_speed(GATE, 0.020, 0.025, ClocksRecord(control=L4, candidate=L4))
    assert (result.outcome, result.reason) == (Outcome.FAILED, "SpeedRegressed")


def test_status_round_trip_and_hostile_status() -> None:
    clocks = ClocksRecord(control=L4, candidate=SLOW_SM)
    assert read_record(ClocksRecord, write(clocks)) == clocks
    only_note = ClocksRecord(note="Prometheus: unreachable")
    assert read_record(ClocksRecord, write(only_note)) == only_note
    # Edited or corrupted status is unknown clocks, never a crash or an invented clock.
    for bad in (
        {"smMHz": "2040", "smRangeMHz": [1, 2]},
        {"smMHz": 2040.0, "smRangeMHz": [2100.0, 1900.0]},  # low above high
        {"smMHz": math.nan, "smRangeMHz": [1.0, 2.0]},
        {"smMHz": True, "smRangeMHz": [1, 2]},
        {"smMHz": 2040.0, "smRangeMHz": [1.0] * 10_000},
    ):
        read = read_record(ClockRecord, bad)
        assert (read.sm, read.mem, read.known) == (None, None, False), bad


@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
        max_leaves=20,
    )
)
def test_any_status_value_reads_as_clocks_or_none(raw: Any) -> None:
    parsed = read_record(ClocksRecord, raw)
    assert isinstance(parsed, ClocksRecord)
    for arm in (parsed.control, parsed.candidate):
        if arm is not None:  # a reading is checked or None, never a crash
            for reading in (arm.sm, arm.mem):
                assert reading is None or 0 < reading.low <= reading.high < 1e6


def test_the_spec_field_and_its_bounds() -> None:
    base = {"targetRef": {"name": "qwen"}}
    spec = RolloutSpec.from_dict({**base, "gates": {"speed": {"concurrency": [8]}}})
    assert spec.speed is not None and spec.speed.max_clock_difference == 0.05
    tight = {**base, "gates": {"speed": {"maxClockDifference": 0.01}}}
    assert RolloutSpec.from_dict(tight).speed.max_clock_difference == 0.01  # type: ignore[union-attr]
    with pytest.raises(ExceptionGroup) as info:
        RolloutSpec.from_dict({**base, "gates": {"speed": {"maxClockDifference": 1.5}}})
    errors = info.value.exceptions
    assert [str(e) for e in errors] == [
        "spec.gates.speed.maxClockDifference: 1.5 is outside [0, 1]; use a value in that range"
    ]
    assert all(isinstance(e, SpecError) for e in errors)


def _series(name: str, pod: str, *values: float, gpu: str = "0") -> Series:
    labels = {"__name__": name, "pod": pod, "namespace": "ns", "gpu": gpu}
    return Series(labels=labels, points=tuple((1000.0 + i, v) for i, v in enumerate(values)))


def test_clocks_from_series_every_gpu_and_point_counts() -> None:
    found = [
        _series("DCGM_FI_DEV_SM_CLOCK", "a", 2040, 2040, 1980),
        _series("DCGM_FI_DEV_SM_CLOCK", "a", 2040, gpu="1"),  # tensor parallel: a second GPU
        _series("DCGM_FI_DEV_MEM_CLOCK", "a", 6251, 6251),
        _series("DCGM_FI_DEV_SM_CLOCK", "other-pod", 100),  # not asked for: ignored
        _series("DCGM_FI_DEV_GPU_UTIL", "a", 99),  # not a clock: ignored
    ]
    clocks = clocks_from_series(["a", "b"], found)
    assert clocks["b"] is None  # no series: unknown
    a = clocks["a"]
    assert a is not None and a.sm == ClockReading(2025.0, 1980.0, 2040.0)
    assert a.mem == ClockReading(6251.0, 6251.0, 6251.0)


@pytest.mark.parametrize("junk", [0.0, -5.0, math.nan, math.inf, 1e9])
def test_junk_clock_values_are_a_prometheus_error(junk: float) -> None:
    with pytest.raises(PrometheusError, match="DCGM_FI_DEV_SM_CLOCK of pod a is"):
        clocks_from_series(["a"], [_series("DCGM_FI_DEV_SM_CLOCK", "a", 2040, junk)])


def test_clock_query_escapes_what_it_embeds() -> None:
    query = clock_query('n"s', ["r-fp8-control", "r.fp8+candidate"])
    names = '__name__=~"DCGM_FI_DEV_SM_CLOCK|DCGM_FI_DEV_MEM_CLOCK"'
    pods = '"r\\\\-fp8\\\\-control|r\\\\.fp8\\\\+candidate"'
    assert query == (
        f'{{{names},namespace="n\\"s",pod=~{pods}}} or '
        f'{{{names},exported_namespace="n\\"s",exported_pod=~{pods}}}'
    )


def test_a_scrape_without_honor_labels_is_read_by_exported_pod() -> None:
    # Prometheus renamed the exporter's pod label; `pod` is the exporter's own pod.
    series = _series("DCGM_FI_DEV_SM_CLOCK", "dcgm-exporter-x2k9", 1410)
    labels = {**series.labels, "exported_pod": "a", "exported_namespace": "ns"}
    clocks = clocks_from_series(["a"], [Series(labels=labels, points=series.points)])
    assert clocks["a"] is not None and clocks["a"].sm == ClockReading(1410, 1410, 1410)
