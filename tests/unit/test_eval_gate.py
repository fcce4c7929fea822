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
from kvgate.stats import PairedCounts, efficacy_boundaries, tango_statistic


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
    assert plan.harm_z == pytest.approx(1.6448536, abs=1e-6)


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
        ({"total": 100, "harm_z": -1.0}, "harm_z"),
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
    # final look, shown worse than control but not beyond the margin by the harm rule
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
        "mcnemar_p",
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
    assert line["pass_boundary"] == round(efficacy_boundaries([0.5, 1.0], 0.05)[0], 4)


def test_exit_codes() -> None:
    assert EXIT_CODES == {
        Verdict.PASS: 0,
        Verdict.FAIL: 1,
        Verdict.INCONCLUSIVE: 3,
        Verdict.ERROR: 4,
    }
