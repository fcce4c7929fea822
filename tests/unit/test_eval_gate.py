"""kvgate.evaluation.gate: planning looks, deciding a look, the summary contract."""

from __future__ import annotations

import pytest

from kvgate.errors import SpecError
from kvgate.evaluation.gate import (
    EXIT_CODES,
    PROGRESS_KIND,
    SUMMARY_KIND,
    Verdict,
    assess_look,
    build_summary,
    plan_gate,
    progress_line,
)
from kvgate.judge.stats import (
    PairedCounts,
    score_limit,
    sequential_boundaries,
    tango_interval,
    tango_statistic,
)


def test_fixed_plan_has_one_look_at_the_one_sided_z() -> None:
    plan = plan_gate(500, margin=0.02, confidence=0.95)
    assert plan.looks == (500,)
    assert plan.boundaries[0] == pytest.approx(1.6448536, abs=1e-6)
    assert not plan.sequential


def test_sequential_plan_looks_and_boundaries() -> None:
    plan = plan_gate(1319, chunk=500, margin=0.02, confidence=0.95)
    assert plan.looks == (500, 1000, 1319)
    # The published K=3 design at 500/1000/1319, one-sided 0.05.
    assert tuple(round(b, 3) for b in plan.boundaries) == (2.977, 1.979, 1.719)
    # Fail boundaries: power-family spending of 2.5% (power 0.25), a separate claim.
    assert plan.fail_boundaries == pytest.approx(
        sequential_boundaries(plan.fractions, 0.025, "power:0.25"), abs=1e-9
    )
    assert plan.fail_confidence == 0.975


def test_chunk_at_least_total_is_a_single_look() -> None:
    assert plan_gate(100, chunk=100).looks == (100,)
    assert plan_gate(100, chunk=250).looks == (100,)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"total": 0}, "limit"),
        ({"total": 100, "chunk": 0}, "chunk"),
        ({"total": 100, "margin": 0.0}, "margin"),
        ({"total": 100, "margin": -0.02}, "margin"),
        ({"total": 100, "confidence": 0.4}, "confidence"),
        ({"total": 100, "fail_confidence": 0.3}, "fail_confidence"),
        ({"total": 100, "fail_spending": "pocock"}, "spending"),
    ],
)
def test_plan_rejects_bad_values(kwargs: dict, field: str) -> None:
    total = kwargs.pop("total")
    with pytest.raises(SpecError) as err:
        plan_gate(total, **kwargs)
    assert err.value.field == field


# (plan looks, look index, counts a,b,c,d, expected verdict)
DECISIONS = [
    # equal arms, enough questions: T(-0.02) = sqrt(n*0.02/0.98) = 3.19 at n=500 > 1.645
    ((500,), 0, (460, 0, 0, 40), Verdict.PASS),
    # too few questions to show anything at the final look
    ((50,), 0, (45, 0, 0, 5), Verdict.INCONCLUSIVE),
    # broken candidate: every right answer lost
    ((50, 100), 0, (0, 46, 0, 4), Verdict.FAIL),
    # interim, inconclusive so far: continue
    ((50, 100), 0, (45, 1, 1, 3), None),
    # final look, shown worse than control (McNemar z = -3.16 ≤ -1.96) but not beyond the margin
    ((1000,), 0, (880, 30, 10, 80), Verdict.FAIL),
    # final look, a small loss the data can neither show nor rule out
    ((200,), 0, (180, 4, 2, 14), Verdict.INCONCLUSIVE),
]


@pytest.mark.parametrize(("looks", "k", "cells", "verdict"), DECISIONS)
def test_assess_look(looks: tuple, k: int, cells: tuple, verdict: Verdict | None) -> None:
    plan = plan_gate(looks[-1], chunk=looks[0] if len(looks) > 1 else None)
    assert plan.looks == looks
    counts = PairedCounts(*cells)
    result = assess_look(plan, k, counts)
    assert result.verdict == verdict
    assert result.statistic == pytest.approx(tango_statistic(counts, -0.02))
    assert result.questions == counts.n
    assert result.fail_statistic == pytest.approx(tango_statistic(counts, 0.0))


def test_pass_needs_the_sequential_boundary_not_the_fixed_one() -> None:
    # T ≈ 2.0 passes a fixed test but not the first of three OBF looks (boundary 2.977).
    plan = plan_gate(1319, chunk=500)
    counts = PairedCounts(480, 5, 5, 10)
    t = tango_statistic(counts, -0.02)
    assert 1.645 < t < plan.boundaries[0]
    assert assess_look(plan, 0, counts).verdict is None


def test_assess_look_checks_question_count() -> None:
    plan = plan_gate(100, chunk=50)
    with pytest.raises(SpecError, match="look 1 needs 50 paired questions, got 40"):
        assess_look(plan, 0, PairedCounts(40, 0, 0, 0))


def test_summary_has_contract_keys() -> None:
    plan = plan_gate(200, chunk=100)
    counts = PairedCounts(180, 3, 2, 15)
    summary = build_summary(
        plan=plan, task="gsm8k", verdict=Verdict.INCONCLUSIVE, counts=counts, looks_taken=2
    )
    contract = {
        "kind",
        "verdict",
        "error",
        "task",
        "margin",
        "confidence",
        "questions_used",
        "stopped_early",
        "looks",
        "control",
        "candidate",
        "paired",
        "largest_loss_ruled_out",
        "advice",
    }
    assert contract <= set(summary)
    assert summary["kind"] == SUMMARY_KIND
    assert summary["verdict"] == "inconclusive"
    assert summary["questions_used"] == 200 and summary["stopped_early"] is False
    assert set(summary["control"]) == {"correct", "n", "accuracy", "wilson95"}
    assert summary["control"]["correct"] == 183 and summary["candidate"]["correct"] == 182
    assert set(summary["paired"]) == {
        "both",
        "control_only",
        "candidate_only",
        "neither",
        "difference",
        "tango95",
        "tango95_sided",
        "mcnemar_p",
        "mcnemar_p_sided",
        "lower_bound",
        "upper_bound",
    }
    assert summary["paired"]["difference"] == pytest.approx(-0.005)
    assert summary["advice"]["questions_needed"] > 200


def test_error_summary_without_answers() -> None:
    plan = plan_gate(200, chunk=100)
    summary = build_summary(
        plan=plan,
        task="gsm8k",
        verdict=Verdict.ERROR,
        counts=None,
        looks_taken=0,
        error="candidate endpoint unreachable",
    )
    assert summary["verdict"] == "error"
    assert summary["error"] == "candidate endpoint unreachable"
    assert summary["control"] is None and summary["paired"] is None
    assert summary["stopped_early"] is False
    assert summary["advice"] == {"questions_needed": None}


def test_progress_line() -> None:
    plan = plan_gate(100, chunk=50)
    counts = PairedCounts(45, 1, 1, 3)
    line = progress_line(plan, assess_look(plan, 0, counts), counts)
    assert line["kind"] == PROGRESS_KIND
    assert line["look"] == 1 and line["looks_planned"] == 2
    assert line["verdict"] is None
    assert line["pass_boundary"] == round(sequential_boundaries([0.5, 1.0], 0.05)[0], 4)


def test_exit_codes() -> None:
    assert EXIT_CODES == {
        Verdict.PASS: 0,
        Verdict.FAIL: 1,
        Verdict.INCONCLUSIVE: 3,
        Verdict.ERROR: 4,
    }


# --------------------------------------------------------------------------- claims agree


DEFAULT = plan_gate(1319, chunk=50)


def _summary(plan, look: int, cells: tuple[int, int, int, int]) -> dict:
    counts = PairedCounts(*cells)
    verdict = assess_look(plan, look, counts).verdict
    assert verdict is not None
    return build_summary(
        plan=plan, task="gsm8k", verdict=verdict, counts=counts, looks_taken=look + 1
    )


def _consistent(summary: dict) -> None:
    """Every field says what the verdict says."""
    margin, alpha = summary["margin"], 1 - summary["confidence"]
    lower, upper = summary["bounds"]["lower"], summary["bounds"]["upper"]
    assert summary["paired"]["lower_bound"] == lower and summary["paired"]["upper_bound"] == upper
    assert summary["largest_loss_ruled_out"] == pytest.approx(max(0.0, -lower))
    assert summary["smallest_loss_shown"] == pytest.approx(max(0.0, -upper))
    assert lower <= summary["paired"]["difference"] <= upper
    passed = summary["verdict"] == "pass"
    assert passed == (summary["largest_loss_ruled_out"] <= margin)
    assert passed == (summary["noninferiority_p"] <= alpha)
    if summary["verdict"] == "fail":
        assert summary["smallest_loss_shown"] > 0
        assert (summary["reason"] == "worse_than_margin") == (
            summary["smallest_loss_shown"] > margin
        )
    elif summary["verdict"] == "inconclusive":
        assert summary["smallest_loss_shown"] == 0
    if summary["smallest_loss_shown"] > 0:
        assert "worse than control" in summary["claim"]
    assert summary["claim"]


def test_pass_at_700_reports_the_look_adjusted_bound() -> None:
    # A pass at n=700 (look 14) that the single-look bound described as "losses above 1.21 pp
    # ruled out": the bound that accounts for 14 looks sits at the pass boundary e_14.
    cells = (596, 4, 0, 100)
    counts = PairedCounts(*cells)
    assert -tango_interval(counts, 0.90)[0] < 0.013  # the old, single-look figure: 1.27 pp
    summary = _summary(DEFAULT, 13, cells)
    assert summary["verdict"] == "pass" and summary["stopped_early"]
    lower = score_limit(counts, DEFAULT.boundaries[13])
    assert summary["bounds"]["lower"] == pytest.approx(lower)
    assert 0.018 < summary["largest_loss_ruled_out"] <= 0.02  # 1.89 pp
    _consistent(summary)


def test_one_sided_bound_is_its_own_field_next_to_the_labelled_two_sided_interval() -> None:
    # A pass whose two-sided 95% interval reaches below minus the margin ("rules out a loss
    # larger than 1.9 pp" next to "95% CI [-2.2, ...]"): the decision's bound is the one-sided
    # one, shown as its own field, and the two-sided interval says what it is.
    plan = plan_gate(1319)
    cells = (1202, 17, 0, 100)
    summary = _summary(plan, 0, cells)
    assert summary["verdict"] == "pass"
    low95 = summary["paired"]["tango95"][0]
    assert low95 < -0.02 < summary["bounds"]["lower"]
    assert summary["paired"]["tango95_sided"].startswith("two-sided")
    assert summary["bounds"]["sided"] == "one-sided"
    assert summary["bounds"]["lower_confidence"] == 0.95
    _consistent(summary)


def test_fail_does_not_report_noninferiority() -> None:
    # The old summary: FAIL at the last look (McNemar) next to non-inferiority p = 0.03 and
    # "largest loss 1.91 pp" < margin. Now a fail near the margin has p > α and a bound > margin.
    plan = plan_gate(1319, chunk=50)
    cells = (1202, 17, 0, 100)
    counts = PairedCounts(*cells)
    summary = _summary(plan, len(plan.looks) - 1, cells)
    assert tango_statistic(counts, -0.02) > 1.645  # the single-look test would say non-inferior
    assert summary["verdict"] == "fail" and summary["reason"] == "worse_than_control"
    assert summary["noninferiority_p"] > 0.05
    assert summary["largest_loss_ruled_out"] > 0.02
    _consistent(summary)


def test_inconclusive_does_not_report_p_below_alpha() -> None:
    # T(-margin) between the fixed z (1.645) and the last sequential boundary (1.878).
    cells = (1188, 23, 8, 100)
    counts = PairedCounts(*cells)
    t = tango_statistic(counts, -0.02)
    assert 1.645 < t < DEFAULT.boundaries[-1]
    summary = _summary(DEFAULT, len(DEFAULT.looks) - 1, cells)
    assert summary["verdict"] == "inconclusive" and summary["reason"] == "not_shown"
    assert summary["noninferiority_p"] > 0.05
    _consistent(summary)


def test_fail_worse_than_margin_says_so() -> None:
    summary = _summary(DEFAULT, 0, (0, 46, 0, 4))
    assert summary["verdict"] == "fail" and summary["reason"] == "worse_than_margin"
    assert summary["smallest_loss_shown"] > 0.02
    assert "more than the 2 pp margin" in summary["claim"]
    _consistent(summary)


@pytest.mark.parametrize(
    ("look", "cells"),
    [
        (5, (190, 0, 10, 100)),
        (3, (90, 10, 0, 100)),
        (26, (1200, 8, 9, 102)),
        (13, (596, 4, 0, 100)),
    ],
)
def test_summaries_are_consistent(look: int, cells: tuple) -> None:
    _consistent(_summary(DEFAULT, look, cells))


def test_summary_refuses_a_verdict_the_counts_do_not_give() -> None:
    with pytest.raises(SpecError):
        build_summary(
            plan=DEFAULT,
            task="gsm8k",
            verdict=Verdict.PASS,
            counts=PairedCounts(0, 46, 0, 4),
            looks_taken=1,
        )


def test_a_fail_within_the_margin_is_not_worded_as_reassurance() -> None:
    """first-hour-2 N13: "worse than control; a loss beyond the 2 pp margin is not shown" read
    as reassurance for a candidate shown worse."""
    from kvgate.evaluation.gate import Bounds, claim, plan_gate

    plan = plan_gate(500, margin=0.02)
    bounds = Bounds(look=0, lower=-0.03, upper=-0.0034, noninferiority_p=0.9)
    text = claim(plan, "worse_than_control", bounds)
    assert text is not None
    assert "worse than control by at least 0.34 pp" in text
    assert "whether the loss exceeds the 2 pp margin is not known" in text
    assert "not shown" not in text
