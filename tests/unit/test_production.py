"""kvgate.judge.verify: the verify window's checks of production against the preflight baseline."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.judge.verify import Baseline, regressions
from kvgate.judge.verify import baseline_from_preflight as baseline_of_kept
from kvgate.records.codec import read_record, write
from kvgate.records.status import PodCounters, PreflightStatus

NONE: dict[str, PodCounters] = {}


def baseline_from_preflight(series: dict[str, list[dict[str, Any]]]) -> Baseline:
    """The baseline of samples as status keeps them, read back as the operator reads them."""
    return baseline_of_kept(read_record(PreflightStatus, {"samples": series}).samples)


def test_the_queue_is_judged_against_the_worst_preflight_queue() -> None:
    assert regressions(Baseline(), {"a": 1000}, NONE, NONE, None) == []  # nothing to compare
    assert regressions(Baseline(waiting=30), {"a": 60, "b": 10}, NONE, NONE, None) == []
    got = regressions(Baseline(waiting=30), {"a": 61, "b": 10}, NONE, NONE, None)
    assert len(got) == 1 and "pod a has 61 requests waiting" in got[0]
    assert regressions(Baseline(waiting=0), {"a": 8}, NONE, NONE, None) == []
    assert regressions(Baseline(waiting=0), {"a": 9}, NONE, NONE, None) != []


def test_the_baseline_is_the_busiest_pod_over_the_preflight_window() -> None:
    series = {
        "a": [
            {"waiting": 3, "preemptions": 10, "ttft_sum": 1.0, "ttft_count": 10},
            {"waiting": 7, "preemptions": 14, "ttft_sum": 3.0, "ttft_count": 20},
            {"waiting": 5, "preemptions": 20, "ttft_sum": 5.0, "ttft_count": 30},
        ],
        "b": [
            {"waiting": 1, "preemptions": 0, "ttft_sum": 0.0, "ttft_count": 0},
            {"waiting": 2, "preemptions": 2, "ttft_sum": 6.0, "ttft_count": 10},
        ],
    }
    base = baseline_from_preflight(series)
    assert base.waiting == 7
    assert base.ttft_s == pytest.approx(0.6)  # b: 6 s over 10 first tokens (a: 0.2 s)


def test_a_restarted_pod_or_a_single_sample_gives_no_latency() -> None:
    series = {
        "a": [{"ttft_sum": 9.0, "ttft_count": 90}, {"ttft_sum": 1.0, "ttft_count": 3}],
        "b": [{"waiting": 4, "ttft_sum": 1.0, "ttft_count": 50}],
    }
    assert baseline_from_preflight(series) == Baseline(waiting=4, ttft_s=None)


def test_a_clearly_slower_first_token_is_a_regression() -> None:
    base = Baseline(ttft_s=0.5)  # bound: max(2 x 0.5, 0.5 + 0.25) = 1.0 s
    before = {"p": PodCounters(ttft_sum=10.0, ttft_count=100)}
    fine = PodCounters(ttft_sum=20.0, ttft_count=110)  # 10 requests, 1.0 s each
    slow = PodCounters(ttft_sum=20.5, ttft_count=110)
    few = PodCounters(ttft_sum=60.0, ttft_count=104)  # 4 requests: too few to judge
    assert regressions(base, {}, before, {"p": fine}, 5.0) == []
    got = regressions(base, {}, before, {"p": slow}, 5.0)
    assert len(got) == 1 and "mean TTFT 1050 ms over 10 requests" in got[0]
    assert regressions(base, {}, before, {"p": few}, 5.0) == []


def test_no_baseline_no_latency_judgement() -> None:
    before = {"p": PodCounters(ttft_sum=0.0, ttft_count=0)}
    now = {"p": PodCounters(ttft_sum=1000.0, ttft_count=100)}
    assert regressions(Baseline(), {}, before, now, 1.0) == []


def test_a_reset_counter_or_the_first_sample_is_not_judged() -> None:
    base = Baseline(ttft_s=0.1)
    before = {"p": PodCounters(ttft_sum=500.0, ttft_count=1000)}
    slow = PodCounters(ttft_sum=50.0, ttft_count=10)  # restarted pod: counters went down
    assert regressions(base, {}, before, {"p": slow}, 5.0) == []
    assert regressions(base, {}, {}, {"p": slow}, 5.0) == []
    assert regressions(base, {}, before, {"p": PodCounters(600.0, 1010)}, None) == []


def test_counters_round_trip_through_status() -> None:
    c = PodCounters(ttft_sum=1.5, ttft_count=None)
    assert write(c) == {"ttftSum": 1.5}
    assert read_record(PodCounters, write(c)) == c
    assert read_record(PodCounters, {"ttftCount": "3", "ttftSum": True}) == PodCounters()
