"""kvgate.evaluation.long_context: buckets, RULER-shaped items that fit, per-bucket judging."""

from __future__ import annotations

import pytest

from kvgate.errors import SpecError
from kvgate.evaluation.long_context import (
    LongContextPlan,
    context_lengths,
    generate_items,
    judge,
    judge_bucket,
    process_results,
)
from kvgate.judge.stats import PairedCounts


def words(text: str) -> int:
    return len(text.split())


def test_buckets_are_powers_of_two_from_4k_up_to_max_model_len() -> None:
    assert context_lengths(40960) == [4096, 8192, 16384, 32768]
    assert context_lengths(4096) == [4096]
    with pytest.raises(SpecError):
        context_lengths(2048)


def test_items_fit_their_length_and_repeat_exactly() -> None:
    items = generate_items(["niah_single_1", "niah_multikey_3"], [1024, 2048], 3, words, 7)
    assert len(items) == 12
    for item in items:
        assert words(item["input"]) + 128 <= item["max_length"]
        assert words(item["input"]) + 128 > item["max_length"] - 40  # filled, not tiny
        assert item["outputs"][0] in item["input"]
        assert "What is the special magic" in item["input"]
    assert items == generate_items(["niah_single_1", "niah_multikey_3"], [1024, 2048], 3, words, 7)
    assert items != generate_items(["niah_single_1", "niah_multikey_3"], [1024, 2048], 3, words, 8)


def test_scoring_is_ruler_string_match_all() -> None:
    doc = {"outputs": ["4821937"]}
    assert process_results(doc, [" 4821937.\n"]) == {"score": 1.0}
    assert process_results(doc, [" 1112223."]) == {"score": 0.0}


def test_a_collapsed_bucket_fails_and_a_concordant_one_passes() -> None:
    plan = LongContextPlan(margin=0.1)
    collapsed = judge_bucket(16384, PairedCounts(1, 28, 0, 1), plan, buckets=3)
    assert (collapsed["verdict"], collapsed["reason"]) == ("fail", "worse_than_margin")
    sound = judge_bucket(4096, PairedCounts(48, 1, 1, 0), plan, buckets=3)
    assert (sound["verdict"], sound["reason"]) == ("pass", "noninferior")
    assert sound["recovery"] == 1.0 and sound["bounds"]["lower"] > -0.1


def test_below_the_recovery_floor_is_not_a_pass_even_within_the_margin() -> None:
    # 40 items: control 100%, candidate 90% -> recovery 0.90 < 0.95
    row = judge_bucket(4096, PairedCounts(36, 4, 0, 0), LongContextPlan(margin=0.3), buckets=1)
    assert row["bounds"]["lower"] > -0.3 and row["recovery"] == pytest.approx(0.9)
    assert row["verdict"] in ("fail", "inconclusive") and row["verdict"] != "pass"
    row = judge_bucket(4096, PairedCounts(150, 30, 0, 20), LongContextPlan(margin=0.3), 1)
    assert (row["verdict"], row["reason"]) == ("fail", "below_recovery_floor")


def test_few_items_are_inconclusive_and_the_worst_bucket_decides() -> None:
    plan = LongContextPlan(margin=0.1)
    verdict, reason, bucket, rows = judge(
        {4096: PairedCounts(10, 0, 0, 0), 8192: PairedCounts(1, 19, 0, 0)}, plan
    )
    assert [r["verdict"] for r in rows] == ["inconclusive", "fail"]
    assert (verdict, reason, bucket) == ("fail", "worse_than_margin", "8192")
