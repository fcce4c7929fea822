"""kvgate.evaluation.job.run_gate (the look loop) with a scripted runner (no lm-eval, no sockets)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from kvgate.errors import EvalError
from kvgate.evaluation.gate import plan_gate
from kvgate.evaluation.job import run_gate
from kvgate.evaluation.records import ArmAnswer, QuestionRecord

Rule = Callable[[int], bool]


class ScriptedRunner:
    """Answers by rule per arm; can fail on the n-th call of one arm."""

    def __init__(
        self, control: Rule, candidate: Rule, fail_arm: str | None = None, fail_call: int = 0
    ) -> None:
        self.rules = {"control": control, "candidate": candidate}
        self.fail_arm, self.fail_call = fail_arm, fail_call
        self.calls: list[tuple[str, list[int]]] = []

    def run(self, arm_name: str, doc_ids: Sequence[int]) -> dict[int, ArmAnswer]:
        self.calls.append((arm_name, list(doc_ids)))
        if arm_name == self.fail_arm and sum(a == arm_name for a, _ in self.calls) > self.fail_call:
            raise EvalError(
                f"{arm_name} endpoint http://x/v1/completions failed: connection refused"
            )
        rule = self.rules[arm_name]
        return {
            d: ArmAnswer(
                d,
                f"d{d}",
                f"p{d}",
                {"strict-match": rule(d), "flexible-extract": rule(d)},
                {"strict-match": "1", "flexible-extract": "1"},
            )
            for d in doc_ids
        }


def _base(d: int) -> bool:
    return d % 12 != 0  # ~91.7% right


def _run(
    runner: ScriptedRunner, total: int, chunk: int | None, parallel: bool = True
) -> tuple[dict, list, list]:
    emitted: list[dict[str, Any]] = []
    kept: list[QuestionRecord] = []
    plan = plan_gate(total, chunk=chunk)
    summary = run_gate(
        plan,
        runner,
        task="gsm8k",
        filt="strict-match",
        emit=emitted.append,
        keep=kept.append,
        parallel=parallel,
    )
    return summary, emitted, kept


@pytest.mark.parametrize("parallel", [True, False])
def test_equal_arms_pass(parallel: bool) -> None:
    runner = ScriptedRunner(_base, _base)
    summary, emitted, kept = _run(runner, 400, 100, parallel)
    assert summary["verdict"] == "pass"
    assert summary["paired"]["control_only"] == summary["paired"]["candidate_only"] == 0
    assert len(emitted) == summary["looks"]
    assert [r.doc_id for r in kept] == list(range(summary["questions_used"]))
    # Both arms saw the same doc ids at every look.
    by_arm = {arm: [ids for a, ids in runner.calls if a == arm] for arm in ("control", "candidate")}
    assert by_arm["control"] == by_arm["candidate"]
    assert len(by_arm["control"]) == summary["looks"]


def test_serial_arms_alternate_which_goes_first() -> None:
    runner = ScriptedRunner(_base, _base)
    _run(runner, 400, 100, parallel=False)
    assert [a for a, _ in runner.calls[:4]] == ["control", "candidate", "candidate", "control"]


def test_ten_percent_flips_fail() -> None:
    runner = ScriptedRunner(_base, lambda d: _base(d) != (d % 10 == 3))
    summary, _, _ = _run(runner, 400, 100)
    assert summary["verdict"] == "fail"
    assert summary["paired"]["control_only"] > summary["paired"]["candidate_only"]


def test_garbage_candidate_fails_at_the_first_look() -> None:
    summary, emitted, _ = _run(ScriptedRunner(_base, lambda d: False), 1319, 50)
    assert summary["verdict"] == "fail"
    assert summary["looks"] == 1 and summary["questions_used"] == 50
    assert summary["stopped_early"] is True
    assert emitted[0]["verdict"] == "fail"


def test_crash_mid_run_is_an_error_not_a_failure() -> None:
    runner = ScriptedRunner(_base, _base, fail_arm="candidate", fail_call=1)
    summary, emitted, kept = _run(runner, 400, 100)
    assert summary["verdict"] == "error"
    assert "connection refused" in summary["error"]
    assert summary["looks"] == 1 and len(emitted) == 1
    # What was paired before the crash is kept and reported.
    assert summary["questions_used"] == 100 and len(kept) == 100
    assert summary["stopped_early"] is False


def test_error_before_any_answer() -> None:
    runner = ScriptedRunner(_base, _base, fail_arm="control", fail_call=0)
    summary, emitted, kept = _run(runner, 200, None)
    assert summary["verdict"] == "error"
    assert summary["questions_used"] == 0 and summary["control"] is None
    assert emitted == [] and kept == []


@pytest.mark.parametrize(("chunk", "looks"), [(None, 1), (100, 3)])
def test_inconclusive_runs_every_look(chunk: int | None, looks: int) -> None:
    # 4 losses, 0 wins in 300 questions: McNemar's z = -2.0 is past the one-look fail boundary
    # (-1.96) but the exact one-sided p is 0.0625 > 2.5%: neither non-inferior nor shown worse.
    summary, emitted, _ = _run(
        ScriptedRunner(_base, lambda d: _base(d) and d % 97 != 5), 300, chunk
    )
    assert summary["verdict"] == "inconclusive"
    assert summary["looks"] == looks == len(emitted)
    assert summary["questions_used"] == 300
    assert summary["reason"] == "not_shown"
    assert summary["smallest_loss_shown"] == 0.0
    assert summary["noninferiority_p"] > 0.05


def test_garbage_candidate_is_shown_worse_than_the_margin() -> None:
    summary, emitted, _ = _run(ScriptedRunner(_base, lambda d: False), 1319, 50)
    assert summary["reason"] == "worse_than_margin"
    assert summary["smallest_loss_shown"] > summary["margin"]
    assert summary["bounds"]["upper"] < -summary["margin"]
    assert emitted[0]["reason"] == "worse_than_margin"
    assert emitted[0]["fail_statistic"] <= emitted[0]["fail_boundary"] < 0


def test_early_pass_reports_bounds_adjusted_for_the_looks() -> None:
    # Equal arms pass early; the bound printed is the repeated confidence bound at the stopping
    # look, so it sits between the single-look bound and the margin.
    summary, emitted, _ = _run(ScriptedRunner(_base, _base), 1319, 50)
    assert summary["verdict"] == "pass" and summary["stopped_early"]
    assert summary["bounds"]["look_adjusted"] is True
    assert summary["bounds"]["look"] == summary["looks"] == len(emitted)
    assert summary["largest_loss_ruled_out"] <= summary["margin"]
    assert summary["noninferiority_p"] <= 1 - summary["confidence"]
    assert summary["claim"].startswith("candidate minus control ≥")
    assert emitted[-1]["verdict"] == "pass" and emitted[-1]["reason"] == "noninferior"
