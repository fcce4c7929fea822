"""inference-perf's own report files (recorded, tests/data/load/README.md) parsed and judged.

inference-perf exited 0 for every one of these runs: the judge, not the exit code, tells a
measurement from a broken run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.load.config import LoadPlan, Stage
from kvgate.load.report import (
    ReportError,
    judge_reports,
    parse_stage,
    stage_file,
    validation_errors,
)
from kvgate.load.runner import read_report_files

DATA = Path(__file__).resolve().parents[1] / "data" / "load"


def plan(
    stages: tuple[Stage, ...], output: int, report_dir: Path, prompt: tuple[int, int] = (256, 32)
) -> LoadPlan:
    """A plan as the recorded runs were made (tests/data/load/README.md: ok/ asked for prompts
    of normal(256, 32), crash/ for 128)."""
    return LoadPlan(
        base_url="http://127.0.0.1:1",
        model_name="Qwen/Qwen3-8B",
        tokenizer_dir="tok",
        report_dir=str(report_dir),
        stages=stages,
        prompt_tokens=prompt[0],
        prompt_std_tokens=prompt[1],
        output_tokens=output,
        num_workers=1,
    )


OK = plan((Stage(1, 4), Stage(4, 8)), 32, DATA / "ok")
UNREACHABLE = plan((Stage(2, 4),), 16, DATA / "unreachable")
CRASH = plan((Stage(1, 4), Stage(4, 12), Stage(4, 8)), 64, DATA / "crash", prompt=(128, 0))


def judged(p: LoadPlan) -> tuple:  # type: ignore[type-arg]
    return judge_reports(p, read_report_files(Path(p.report_dir), p))


def test_a_clean_run_is_measured_with_the_tools_figures() -> None:
    first, second = judged(OK)
    assert (first.status, second.status) == ("measured", "measured")
    assert first.reasons == second.reasons == ()
    result = second.measured
    assert result is not None
    assert (result.concurrency, result.requests, result.successes, result.failures) == (4, 8, 8, 0)
    assert result.output_tokens_per_s == pytest.approx(264.2400506410908)
    assert result.prompt_tokens_total == 1969.0
    assert result.output_tokens_total == 256.0 and result.output_tokens_min == 32.0
    assert result.ttft_s is not None and result.tpot_s is not None and result.itl_s is not None
    assert result.ttft_s.p50 == pytest.approx(0.002216663499950755)
    assert result.ttft_s.p99 == pytest.approx(0.006428050580028638)
    assert result.tpot_s.p50 == pytest.approx(0.0006922449032271611)
    assert result.itl_s.p99 == pytest.approx(0.002766614189997654)
    assert result.goodput_percentage == 100.0
    assert result.fallback_output == result.token_count_mismatches == 0


def test_an_unreachable_arm_is_an_error_never_a_measurement() -> None:
    (stage,) = judged(UNREACHABLE)
    assert stage.status == "error" and stage.measured is None
    assert "4 of 4 requests failed (Connection Error: 4)" in stage.reasons
    assert "no request succeeded" in stage.reasons
    assert stage.result is not None and stage.result.ttft_s is None


def test_an_engine_dying_mid_run_makes_its_stages_errors_cut_off_streams_included() -> None:
    before, during, after = judged(CRASH)
    assert before.status == "measured"
    assert during.status == after.status == "error"
    assert during.result is not None
    # inference-perf counted 6 successes, 2 of them streams the engine cut off
    assert (during.result.successes, during.result.fallback_output) == (6, 2)
    assert during.reasons == (
        "6 of 12 requests failed (Connection Error: 6)",
        "2 responses without usage (the client counted the tokens itself: a cut-off stream) "
        "and 2 prompts",
        "short outputs: min 34 of 64 tokens",
    )
    assert after.reasons[0] == "8 of 8 requests failed (Connection Error: 8)"


def test_a_cut_off_stream_alone_is_an_error(tmp_path: Path) -> None:
    data = json.loads((DATA / "ok" / stage_file(1)).read_text())
    data["successes"]["client_fallback_requests"]["output"] = 1
    data["successes"]["output_tokens"]["min"] = 31.0
    (tmp_path / stage_file(0)).write_text(json.dumps(data))
    (stage,) = judged(plan((Stage(4, 8),), 32, tmp_path))
    assert stage.status == "error"
    assert stage.reasons[-1] == "short outputs: min 31 of 32 tokens"


@pytest.mark.parametrize(
    ("prompt", "reason"),
    [
        # the engine counted the recorded 194-286-token prompts against a plan of exactly 128:
        # a load tokenizer that is not the served model's makes prompts of other lengths
        ((128, 0), "prompts planned at 128 tokens reached the engine as 194 to 286 (its usage): "
                   "the load tokenizer is not the served model's"),
        ((256, 16), "prompts planned at 224 to 288 tokens reached the engine as 194 to 286 (its "
                    "usage): the load tokenizer is not the served model's"),
    ],
)  # fmt: skip
def test_prompts_the_engine_counted_otherwise_than_planned_make_the_stage_an_error(
    prompt: tuple[int, int], reason: str
) -> None:
    _, second = judged(plan((Stage(1, 4), Stage(4, 8)), 32, DATA / "ok", prompt=prompt))
    assert second.status == "error" and second.reasons == (reason,)


def test_prompts_within_one_percent_of_the_plan_are_measured() -> None:
    # the shortest recorded prompt, 194, is within 1% of a plan whose shortest is 195 (241 - 2 x 23)
    _, second = judged(plan((Stage(1, 4), Stage(4, 8)), 32, DATA / "ok", prompt=(241, 23)))
    assert second.status == "measured"


def test_a_missing_report_and_fewer_requests_than_planned_are_errors(tmp_path: Path) -> None:
    (tmp_path / stage_file(0)).write_text((DATA / "ok" / stage_file(1)).read_text())
    first, second = judged(plan((Stage(4, 10), Stage(8, 16)), 32, tmp_path))
    assert first.status == "error" and first.reasons == ("8 of 10 planned requests ran",)
    assert second.status == "error" and second.reasons == (
        "no report stage_1_lifecycle_metrics.json",
    )
    assert second.result is None


def test_the_tools_own_validation_errors_make_the_stage_an_error(tmp_path: Path) -> None:
    (tmp_path / stage_file(0)).write_text((DATA / "ok" / stage_file(1)).read_text())
    (tmp_path / "validation.json").write_text(
        json.dumps({"reports": {stage_file(0): {"errors": [{"message": "counts disagree"}]}}})
    )
    (stage,) = judged(plan((Stage(4, 8),), 32, tmp_path))
    assert stage.reasons == ("inference-perf's validation: counts disagree",)
    # the recorded runs' validation.json carries warnings only
    assert validation_errors((DATA / "crash" / "validation.json").read_text()) == {}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("failures"), "stage_0_lifecycle_metrics.json: no field failures.by_label"),
        (
            lambda d: d["successes"].update(count="8"),
            "stage_0_lifecycle_metrics.json: successes.count is not a number ('8')",
        ),
        (
            lambda d: d["load_summary"].update(count=-1),
            "stage_0_lifecycle_metrics.json: load_summary.count is not a count (-1.0)",
        ),
    ],
)
def test_a_report_not_shaped_like_the_tools_is_one_line(edit, message: str) -> None:  # type: ignore[no-untyped-def]
    data = json.loads((DATA / "ok" / stage_file(1)).read_text())
    edit(data)
    with pytest.raises(ReportError) as caught:
        parse_stage(json.dumps(data), 0)
    assert str(caught.value) == message
    (judgement,) = judge_reports(
        plan((Stage(4, 8),), 32, Path("unused")), {stage_file(0): json.dumps(data)}
    )
    assert (judgement.status, judgement.reasons) == ("error", (message,))
    with pytest.raises(ReportError, match="not JSON"):
        parse_stage("{", 0)
