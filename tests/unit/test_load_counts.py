"""The load clients' token counts against the engine's counters (kvgate.load.counts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.load.config import LoadPlan, Stage
from kvgate.load.counts import ClientCounts, EngineCounters, check_counts, client_counts
from kvgate.load.report import StageJudgement, judge_reports
from kvgate.load.runner import read_report_files

DATA = Path(__file__).resolve().parents[1] / "data" / "load"
ZERO = EngineCounters(prompt_tokens=0.0, generation_tokens=0.0)
USAGE = "other traffic reached the arm, or the counter is not this engine's"


def counted(prompt: float, output: float, unfinished: int = 0) -> ClientCounts:
    return ClientCounts(prompt, output, unfinished, longest_prompt=600.0 if prompt else None)


def engine(prompt: float, generation: float) -> EngineCounters:
    return EngineCounters(prompt_tokens=prompt, generation_tokens=generation)


def test_counts_that_agree_pass() -> None:
    assert (
        check_counts(counted(51_200, 12_800), ZERO, engine(51_200, 12_800), output_tokens=128) == ()
    )


@pytest.mark.parametrize("factor", [0.991, 1.0099])
def test_within_one_percent_passes(factor: float) -> None:
    after = engine(51_200, 12_800 * factor)
    assert check_counts(counted(51_200, 12_800), ZERO, after, output_tokens=128) == ()


@pytest.mark.parametrize(
    ("engine_output", "shown"), [(38_912, "38,912"), (12_800 * 1.02, "13,056")]
)
def test_usage_that_is_not_the_counters_is_named_with_both_counts(
    engine_output: float, shown: str
) -> None:
    before = engine(1_000, 5_000)
    after = engine(1_000 + 51_200, 5_000 + engine_output)
    problems = check_counts(counted(51_200, 12_800), before, after, output_tokens=128)
    assert problems == (
        f"client counted 12,800 output tokens, the engine {shown} "
        f"(vllm:generation_tokens_total): {USAGE}",
    )


def test_the_counter_is_named_for_the_engine() -> None:
    problems = check_counts(
        counted(100, 100), ZERO, engine(100, 200), output_tokens=10, engine="sglang"
    )
    assert problems and "(sglang:generation_tokens_total)" in problems[0]


def test_other_traffic_on_the_arm_shows_in_the_prompt_counter() -> None:
    problems = check_counts(
        counted(51_200, 12_800), ZERO, engine(60_000, 12_800), output_tokens=128
    )
    assert problems == (
        "client counted 51,200 prompt tokens, the engine 60,000 (vllm:prompt_tokens_total): "
        f"{USAGE}",
    )


def test_unfinished_requests_may_add_up_to_their_max_tokens_each() -> None:
    # 4 requests cut at the stage's end: the engine decoded part of them, then aborted them
    client = counted(51_200, 12_800, unfinished=4)
    within = engine(51_200 + 4 * 600, 12_800 + 4 * 128)
    assert check_counts(client, ZERO, within, output_tokens=128) == ()
    beyond = engine(51_200, 12_800 * 1.01 + 4 * 128 + 2)
    (problem,) = check_counts(client, ZERO, beyond, output_tokens=128)
    assert "with up to 512 more from 4 unfinished requests" in problem
    # the engine never counts less than what finished
    (short,) = check_counts(client, ZERO, engine(51_200, 12_000), output_tokens=128)
    assert short.startswith("client counted 12,800 output tokens, the engine 12,000")


def test_unreadable_or_reset_counters_leave_the_counts_unchecked() -> None:
    client = counted(100, 100)
    unread = check_counts(client, None, engine(100, 100), output_tokens=10)
    assert len(unread) == 2 and all("could not be read" in p for p in unread)
    half = check_counts(client, ZERO, EngineCounters(100, None), output_tokens=10)
    assert half == (
        "vllm:generation_tokens_total could not be read before and after the run: the client's "
        "output token counts are unchecked",
    )
    (reset, *_) = check_counts(client, engine(500, 500), engine(100, 100), output_tokens=10)
    assert "went back (500 to 100): the engine restarted" in reset


def test_the_clients_counts_come_from_inference_perfs_own_reports() -> None:
    # inference-perf's recorded reports of a clean run against the simulator
    plan = LoadPlan(base_url="http://127.0.0.1:1", model_name="Qwen/Qwen3-8B",
                    tokenizer_dir="tok", report_dir=str(DATA / "ok"),
                    stages=(Stage(1, 4), Stage(4, 8)), prompt_tokens=128, output_tokens=32,
                    num_workers=1)  # fmt: skip
    stages = judge_reports(plan, read_report_files(DATA / "ok", plan))
    client = client_counts(stages, [4, 8])
    first, second = (s.result for s in stages)
    assert first is not None and second is not None
    assert client.prompt_tokens == first.prompt_tokens_total + second.prompt_tokens_total
    # the engine's usage, the units of tok/s and TPOT (use_server_output_tokens)
    assert client.output_tokens == first.output_tokens_total + second.output_tokens_total == 12 * 32
    assert (client.unfinished, client.longest_prompt) == (0, second.prompt_tokens_max)


def test_a_stage_without_a_report_counts_all_its_requests_unfinished() -> None:
    missing = StageJudgement(0, "error", ("no report",), None)
    assert client_counts((missing,), [16]) == ClientCounts(0.0, 0.0, 16, None)
