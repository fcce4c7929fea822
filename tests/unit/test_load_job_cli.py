"""`kvgate load-job` without inference-perf: the sweep, the stage figures, the summary and exits.

The runs are replaced by judged report files (what `kvgate.load.runner.run_load` returns), so
the summary line, its nonce and the exit code are checked here; the tools tier runs the tool.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvgate.cli import main
from kvgate.commands import load_job
from kvgate.load import runner as load_runner
from kvgate.load.config import LoadPlan, Slo
from kvgate.load.counts import EngineCounters, client_counts
from kvgate.load.report import (
    Percentiles,
    StageJudgement,
    StageResult,
    judge_stage,
    stage_file,
)
from kvgate.load.runner import LoadRun, LoadToolMissing
from kvgate.records.loadresult import (
    SUMMARY_KIND,
    ArmLoad,
    LoadSummary,
    LoadVerdict,
    OutputFigures,
    PrefixProbe,
    StagePoint,
    StageStatus,
    overall,
)


def result(
    concurrency: int,
    requests: int,
    *,
    failures: int = 0,
    tok_s: float = 1500.0,
    goodput: float | None = None,
    prompt: float = 512.0,
) -> StageResult:
    return StageResult(
        stage=0, concurrency=concurrency, requests=requests, successes=requests - failures,
        failures=failures, failures_by_label=(("Connection Error", failures),) if failures else (),
        duration_s=10.0, output_tokens_per_s=tok_s, prompt_tokens_total=512.0 * requests,
        output_tokens_total=128.0 * requests,
        output_tokens_min=128.0 if requests > failures else None, fallback_prompt=0, fallback_output=0,
        token_count_mismatches=0, ttft_s=Percentiles(0.2, 0.9), tpot_s=Percentiles(0.021, 0.0305),
        itl_s=Percentiles(0.02, 0.03),
        goodput_percentage=goodput, prompt_tokens_min=prompt, prompt_tokens_max=prompt,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("production", "cap", "expected"),
    [
        (64, 128, (64, 1, 8, 32, 128)),
        (1, 128, (1, 8, 32, 64, 128)),
        (20, 32, (20, 1, 8, 32)),
        (8, 8, (8, 1)),
    ],
)
def test_the_sweep_runs_production_first_then_upward_to_the_cap(
    production: int, cap: int, expected: tuple[int, ...]
) -> None:
    assert load_job.sweep(production, cap) == expected


def test_the_sweep_refuses_a_cap_below_production() -> None:
    with pytest.raises(load_job.SpecError, match=r"^--max-concurrency: 32 is below"):
        load_job.sweep(64, 32)
    with pytest.raises(load_job.SpecError, match=r"^--stages: not a comma-separated list"):
        load_job.explicit_stages("1,x")


def test_a_measured_stage_keeps_its_figures_in_ms_and_an_error_stage_none() -> None:
    stage = load_job.Stage(32, 64)
    good = load_job.stage_point(stage, judge_stage(result(32, 64), 64, 128))
    assert good == StagePoint(
        concurrency=32, requests=64, status=StageStatus.MEASURED, successes=64, failures=0,
        output_tokens_per_s=1500.0, ttft_p50_ms=200.0, ttft_p99_ms=900.0, tpot_p50_ms=21.0,
        tpot_p99_ms=30.5, itl_p50_ms=20.0, itl_p99_ms=30.0,
    )  # fmt: skip
    bad = load_job.stage_point(stage, judge_stage(result(32, 64, failures=3), 64, 128))
    assert bad.status is StageStatus.ERROR and not bad.measured
    assert (bad.successes, bad.failures) == (61, 3)
    assert bad.output_tokens_per_s is None and bad.tpot_p99_ms is None
    assert bad.reasons == ("3 of 64 requests failed (Connection Error: 3)",)
    missing = load_job.stage_point(stage, StageJudgement(0, "error", ("no report x",), None))
    assert missing.successes is None and missing.reasons == ("no report x",)


def test_a_measured_stage_keeps_its_goodput_and_an_error_stage_none() -> None:
    # inference-perf counts goodput (the requests that met every SLO) only when it was given
    # SLOs; an error stage's figures, its goodput too, are never a measurement.
    stage = load_job.Stage(32, 64)
    good = load_job.stage_point(stage, judge_stage(result(32, 64, goodput=97.5), 64, 128))
    assert good.goodput_percent == 97.5
    none = load_job.stage_point(stage, judge_stage(result(32, 64), 64, 128))
    assert none.goodput_percent is None
    bad = load_job.stage_point(
        stage, judge_stage(result(32, 64, failures=3, goodput=90.0), 64, 128)
    )
    assert bad.goodput_percent is None
    summary = LoadSummary(kind=SUMMARY_KIND, candidate=ArmLoad(stages=(good,)))
    assert LoadSummary.from_dict(summary.to_dict()) == summary  # status keeps it


def arm(*statuses: StageStatus, error: str | None = None) -> ArmLoad:
    return ArmLoad(
        error=error,
        stages=tuple(
            StagePoint(concurrency=c, status=s)
            for c, s in zip((8, 32, 64)[: len(statuses)], statuses, strict=True)
        ),
    )


M, E = StageStatus.MEASURED, StageStatus.ERROR


def test_overall_verdict() -> None:
    assert overall(arm(M, M), arm(M, M)) is LoadVerdict.MEASURED
    # BF16 out of room at 64 while FP8 serves it: data for the gate, not a broken Job
    assert overall(arm(M, M, E), arm(M, M, M)) is LoadVerdict.PARTIAL
    assert overall(arm(E, E), arm(M, M)) is LoadVerdict.ERROR
    assert overall(arm(M, E, error="the arm did not answer"), arm(M, M)) is LoadVerdict.ERROR


def test_summary_round_trips_and_finds_stages() -> None:
    summary = LoadSummary(
        kind=SUMMARY_KIND, verdict=LoadVerdict.PARTIAL, production_concurrency=64,
        prompt_tokens=512, output_tokens=128, num_workers=1,
        control=arm(M, M, E), candidate=arm(M, M, M),
    )  # fmt: skip
    raw = json.loads(json.dumps(summary.to_dict()))
    assert LoadSummary.from_dict(raw) == summary
    assert raw["control"]["stages"][2] == {"concurrency": 64, "status": "error"}
    control = summary.arm("control")
    assert control is not None and control.at(64) == StagePoint(concurrency=64, status=E)
    assert control.at(128) is None and len(control.measured) == 2
    with pytest.raises(ValueError, match="arm 'eval' is not one of control, candidate"):
        summary.arm("eval")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["control", "stages", "status", "concurrency", "verdict", "x"])
            | st.text(max_size=4),
            inner,
            max_size=4,
        )
    ),
    max_leaves=30,
)


@given(JSON)
def test_from_dict_is_total(raw: Any) -> None:
    summary = LoadSummary.from_dict(raw)
    assert isinstance(summary, LoadSummary)
    assert LoadSummary.from_dict(summary.to_dict()) == summary


def test_from_dict_reads_a_wrong_type_as_unknown() -> None:
    summary = LoadSummary.from_dict(
        {
            "verdict": "great",
            "control": {"stages": [{"concurrency": "64", "status": "measured"}, 3]},
        }
    )
    assert summary.verdict is None
    assert summary.control == ArmLoad(stages=(StagePoint(status=M),))


# ---- the command, its runs replaced -------------------------------------------------------------

ARGV = [
    "load-job", "--control-url", "http://127.0.0.1:1", "--candidate-url", "http://127.0.0.1:2",
    "--model", "m", "--production-concurrency", "32", "--max-concurrency", "64",
    "--prompt-tokens", "512", "--output-tokens", "128",
]  # fmt: skip


@pytest.fixture
def tokenizer(tmp_path: Path) -> Path:
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    return tmp_path / "tok"


def engines_that_count(monkeypatch: pytest.MonkeyPatch) -> dict[str, EngineCounters]:
    """Each arm's engine token counters (0 before the run; `after`, filled by `engine_saw`,
    after it), read through the Job's own `_token_counters`."""
    after: dict[str, EngineCounters] = {}
    zero = EngineCounters(prompt_tokens=0.0, generation_tokens=0.0)
    monkeypatch.setattr(load_job, "_token_counters", lambda url: after.get(url, zero))
    return after


def engine_saw(
    after: dict[str, EngineCounters],
    plan: LoadPlan,
    stages: tuple[StageJudgement, ...],
    output_factor: float = 1.0,
) -> None:
    """The engine counted what the client did (times `output_factor`: another tokenizer)."""
    counted = client_counts(stages, [s.num_requests for s in plan.stages])
    after[plan.base_url] = EngineCounters(
        prompt_tokens=counted.prompt_tokens,
        generation_tokens=(counted.output_tokens or 0.0) * output_factor,
    )


def fake_runs(
    monkeypatch: pytest.MonkeyPatch,
    failing: dict[str, set[int]],
    reachable: bool = True,
    output_factor: dict[str, float] | None = None,
    prompt_factor: dict[str, float] | None = None,
) -> None:
    after = engines_that_count(monkeypatch)

    def run_load(plan: LoadPlan, work_dir: Path, *, timeout_s: float) -> LoadRun:
        arm = work_dir.name
        stages = tuple(
            judge_stage(
                result(s.concurrency, s.num_requests, failures=s.num_requests if s.concurrency in failing.get(arm, set()) else 0,
                       prompt=plan.prompt_tokens * (prompt_factor or {}).get(arm, 1.0)),
                s.num_requests,
                plan.output_tokens,
                prompt_bounds=plan.prompt_bounds(),
            )
            for s in plan.stages
        )  # fmt: skip
        engine_saw(after, plan, stages, (output_factor or {}).get(arm, 1.0))
        output = OutputFigures(requests=210, pieces=210 * 128, repeated=OUTPUT_REPEATS[arm])
        return LoadRun(0, stages, work_dir / "c.yaml", work_dir / "log", "", output)

    monkeypatch.setattr("kvgate.load.runner.run_load", run_load)
    monkeypatch.setattr(load_job, "_reachable", lambda url: reachable or url.endswith(":1"))
    monkeypatch.setattr(load_job, "_preemptions", lambda url: None)
    monkeypatch.setattr(load_job, "_engine_now", lambda url: None)
    monkeypatch.setattr(load_job, "_prefix_probe", lambda url, model: PROBES[url])
    monkeypatch.setenv("KVGATE_LOAD_NONCE", "n0nce")


# What each arm's responses held and its prefix probe found (per arm, by URL): carried as is
OUTPUT_REPEATS = {"control": 3, "candidate": 13_000}
PROBES = {
    "http://127.0.0.1:1": PrefixProbe(queries=200.0, hits=96.0, enabled=True),
    "http://127.0.0.1:2": PrefixProbe(queries=0.0, hits=0.0, enabled=False),
}


def summary_line(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["event"] == "started" and lines[0]["stages"] == [32, 1, 8, 64]
    last: dict[str, Any] = lines[-1]
    assert last["kind"] == SUMMARY_KIND and last["nonce"] == "n0nce"
    return last


def test_every_stage_measured_exits_0(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tokenizer: Path,
    tmp_path: Path,
) -> None:
    fake_runs(monkeypatch, {})
    code = main([*ARGV, "--tokenizer", str(tokenizer), "--work-dir", str(tmp_path / "w")])
    last = summary_line(capsys)
    assert code == 0 and last["verdict"] == "measured"
    summary = LoadSummary.from_dict(last)
    assert summary.candidate is not None
    assert [s.requests for s in summary.candidate.stages] == [64, 2, 16, 128]
    # each arm's output figures and prefix probe are in the summary the gate reads
    assert summary.control is not None and summary.control.output is not None
    assert (summary.control.output.repeated, summary.candidate.output.repeated) == (3, 13_000)  # type: ignore[union-attr]
    assert summary.control.prefix_cache == PROBES["http://127.0.0.1:1"]
    assert summary.candidate.prefix_cache == PROBES["http://127.0.0.1:2"]
    assert last["candidate"]["prefixCache"]["enabled"] is False


def test_an_arm_out_of_room_at_a_stage_is_partial_and_exits_3(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tokenizer: Path,
    tmp_path: Path,
) -> None:
    fake_runs(monkeypatch, {"control": {64}})
    code = main([*ARGV, "--tokenizer", str(tokenizer), "--work-dir", str(tmp_path / "w")])
    last = summary_line(capsys)
    assert code == 3 and last["verdict"] == "partial" and "error" not in last
    assert last["control"]["stages"][3]["status"] == "error"


def test_a_dead_arm_is_an_error_and_exits_4(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tokenizer: Path,
    tmp_path: Path,
) -> None:
    fake_runs(monkeypatch, {"candidate": {8, 64}}, reachable=False)
    code = main([*ARGV, "--tokenizer", str(tokenizer), "--work-dir", str(tmp_path / "w")])
    last = summary_line(capsys)
    assert code == 4 and last["verdict"] == "error"
    assert (
        last["error"] == "candidate: the arm did not answer after the run (2 of 4 stages measured)"
    )
    assert last["candidate"]["reachableAfter"] is False and last["candidate"]["exitCode"] == 0


def test_a_load_tokenizer_that_is_not_the_served_models_makes_every_stage_an_error(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tokenizer: Path,
    tmp_path: Path,
) -> None:
    # GIVEN the candidate's engine counting each 512-token prompt as 1,331 tokens (measured on
    # real vLLM: the word tokenizer's prompts reached a BPE model as 1,269 to 1,378 tokens)
    fake_runs(monkeypatch, {}, prompt_factor={"candidate": 2.6})
    # WHEN the Job runs
    code = main([*ARGV, "--tokenizer", str(tokenizer), "--work-dir", str(tmp_path / "w")])
    # THEN no candidate stage is a measurement, each naming both lengths; the control's are
    assert code == 4
    summary = LoadSummary.from_dict(summary_line(capsys))
    assert summary.verdict is LoadVerdict.ERROR
    assert summary.control is not None
    assert all(stage.status is StageStatus.MEASURED for stage in summary.control.stages)
    assert summary.candidate is not None
    assert [stage.status for stage in summary.candidate.stages] == [StageStatus.ERROR] * 4
    assert {stage.reasons for stage in summary.candidate.stages} == {
        (
            "prompts planned at 512 tokens reached the engine as 1,331 (its usage): the load "
            "tokenizer is not the served model's",
        )
    }


def test_usage_the_engines_counters_do_not_show_makes_the_run_an_error(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tokenizer: Path,
    tmp_path: Path,
) -> None:
    # GIVEN every stage measured, but the candidate's engine generated 1.3x the tokens its
    # responses' usage reported (other traffic on the arm, or a counter that is not its own)
    fake_runs(monkeypatch, {}, output_factor={"candidate": 1.3})
    # WHEN the Job runs
    code = main([*ARGV, "--tokenizer", str(tokenizer), "--work-dir", str(tmp_path / "w")])
    # THEN the run is an error naming both counts, never a measurement
    assert code == 4
    summary = LoadSummary.from_dict(summary_line(capsys))
    assert summary.verdict is LoadVerdict.ERROR
    assert summary.control is not None and summary.control.error is None
    assert summary.candidate is not None
    assert summary.candidate.error == (
        "client counted 26,880 output tokens, the engine 34,944 "
        "(vllm:generation_tokens_total): other traffic reached the arm, or the counter is not "
        "this engine's"
    )
    assert summary.error == f"candidate: {summary.candidate.error}"


def test_an_engine_whose_counters_cannot_be_read_leaves_the_run_unchecked_and_an_error(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tokenizer: Path,
    tmp_path: Path,
) -> None:
    fake_runs(monkeypatch, {})
    monkeypatch.setattr(load_job, "_token_counters", lambda url: None)
    code = main([*ARGV, "--tokenizer", str(tokenizer), "--work-dir", str(tmp_path / "w")])
    assert code == 4
    summary = LoadSummary.from_dict(summary_line(capsys))
    assert summary.control is not None and summary.control.error is not None
    assert "vllm:generation_tokens_total could not be read" in summary.control.error


def test_a_missing_tool_still_ends_in_a_summary(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tokenizer: Path,
    tmp_path: Path,
) -> None:
    def missing(*args: object, **kwargs: object) -> LoadRun:
        raise LoadToolMissing("/x/inference-perf: inference-perf not found (run `make loadenv`)")

    monkeypatch.setattr("kvgate.load.runner.run_load", missing)
    monkeypatch.setenv("KVGATE_LOAD_NONCE", "n0nce")
    code = main([*ARGV, "--tokenizer", str(tokenizer), "--work-dir", str(tmp_path / "w")])
    last = summary_line(capsys)
    assert code == 4 and last["verdict"] == "error"
    assert last["error"] == "/x/inference-perf: inference-perf not found (run `make loadenv`)"


def test_a_bug_in_the_run_still_ends_in_a_summary_with_its_traceback(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tokenizer: Path,
    tmp_path: Path,
) -> None:
    def broken(*args: object, **kwargs: object) -> LoadRun:
        raise RuntimeError("a bug in the runner")

    monkeypatch.setattr("kvgate.load.runner.run_load", broken)
    monkeypatch.setenv("KVGATE_LOAD_NONCE", "n0nce")
    code = main([*ARGV, "--tokenizer", str(tokenizer), "--work-dir", str(tmp_path / "w")])
    out, err = capsys.readouterr()
    last = json.loads(out.strip().splitlines()[-1])
    assert code == 70 and last["verdict"] == "error"
    assert last["error"].startswith("internal error:") and "RuntimeError" in last["error"]
    assert "Traceback" in err and "a bug in the runner" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-concurrency", "16"], "--max-concurrency: 16 is below --production-concurrency 32"),
        (["--rounds", "0"], "--rounds: must be > 0, got 0"),
        (["--stages", "8,0"], "--stages: give concurrency levels >= 1, got '8,0'"),
        (
            ["--tokenizer", "/nonexistent"],
            "--tokenizer: /nonexistent holds no tokenizer this Job can read; give",
        ),
        (["--slo-ttft-ms", "0"], "--slo-ttft-ms: must be > 0, got 0"),
        (["--slo-tpot-ms", "-5"], "--slo-tpot-ms: must be > 0, got -5"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    monkeypatch.delenv("KVGATE_GSM8K_DIR", raising=False)  # no word tokenizer to fall back on
    argv = [*ARGV, *extra] if "--tokenizer" in extra else [*ARGV, "--tokenizer", "/t", *extra]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def started_line(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    first: dict[str, Any] = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["event"] == "started"
    return first


def test_a_hub_models_tokenizer_is_read_from_the_cache_never_downloaded(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from hf_cache_layout import add_to_cache

    snapshot = add_to_cache(tmp_path / "hub", "org/served", {"tokenizer.json": b"{}"})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    fake_runs(monkeypatch, {})
    planned: list[str] = []
    run_load = load_runner.run_load

    def spy(plan: LoadPlan, work_dir: Path, *, timeout_s: float) -> LoadRun:
        planned.append(plan.tokenizer_dir)
        return run_load(plan, work_dir, timeout_s=timeout_s)

    monkeypatch.setattr("kvgate.load.runner.run_load", spy)
    argv = [*ARGV, "--tokenizer", "org/served", "--work-dir", str(tmp_path / "w")]
    assert main(argv) == 0
    assert started_line(capsys)["tokenizer"] == "the model's: org/served"
    assert planned == [str(snapshot)] * 2


def test_a_model_source_the_job_cannot_read_falls_back_to_the_word_tokenizer_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # the engines' counters, not the Job, then judge it (see the wrong-tokenizer test above)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    corpus = tmp_path / "train.jsonl"
    corpus.write_text(json.dumps({"question": "How many apples?", "answer": "Three."}) + "\n")
    fake_runs(monkeypatch, {})
    argv = [*ARGV, "--tokenizer", "org/absent", "--tokenizer-corpus", str(corpus),
            "--work-dir", str(tmp_path / "w")]  # fmt: skip
    assert main(argv) == 0
    assert started_line(capsys)["tokenizer"] == (
        "the word tokenizer that counts as kvgate.sim does (org/absent: no tokenizer this Job "
        "can read)"
    )


@pytest.mark.parametrize(
    ("control", "candidate", "expected"),
    [
        ([10.0, 1244.0], [3.0, 3.0], (1234.0, 0.0)),  # read before and after each run
        ([None, 5.0], [0.0, 0.0], (None, 0.0)),  # /metrics unreadable before the run
        ([900.0, 12.0], [0.0, 0.0], (None, 0.0)),  # the counter began again: a restart
    ],
)
def test_each_arms_preemptions_over_the_load_are_in_the_summary(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tokenizer: Path,
    tmp_path: Path,
    control: list[float | None],
    candidate: list[float | None],
    expected: tuple[float | None, float | None],
) -> None:
    fake_runs(monkeypatch, {})
    readings = {"http://127.0.0.1:1": list(control), "http://127.0.0.1:2": list(candidate)}
    monkeypatch.setattr(load_job, "_preemptions", lambda url: readings[url].pop(0))
    assert main([*ARGV, "--tokenizer", str(tokenizer), "--work-dir", str(tmp_path / "w")]) == 0
    last = summary_line(capsys)
    assert (last["control"].get("preemptions"), last["candidate"].get("preemptions")) == expected
    assert readings == {"http://127.0.0.1:1": [], "http://127.0.0.1:2": []}  # before and after


def _script(readings: list[tuple[float | None, float | None] | None]) -> Any:
    """A scrape that returns `readings` in turn (None: unreadable), then the last one."""
    left = list(readings)

    def scrape() -> load_job.EngineNow | None:
        now = left.pop(0) if len(left) > 1 else left[0]
        return None if now is None else load_job.EngineNow(preemptions=now[0], waiting=now[1])

    return scrape


def test_each_stage_gets_the_preemptions_and_the_deepest_queue_it_caused(tmp_path: Path) -> None:
    # GIVEN inference-perf's log as it grows, and the engine's counters at each scrape
    log = tmp_path / "inference-perf.log"
    log.write_bytes(b"")
    readings: list[tuple[float | None, float | None] | None] = []

    def scrape() -> load_job.EngineNow | None:
        now = readings.pop(0)
        return None if now is None else load_job.EngineNow(preemptions=now[0], waiting=now[1])

    def logged(line: str, *scrapes: tuple[float | None, float | None] | None) -> None:
        with log.open("ab") as f:
            f.write(line.encode())
        readings.extend(scrapes)
        watch.look()
        assert readings == []  # exactly the scrapes the watch was expected to make

    watch = load_job.EngineWatch(scrape, log)
    logged("")  # nothing running: no scrape
    logged("INFO Stage 0 - run started\n", (100.0, 0.0), (100.0, 0.0))  # start, then running
    logged("", (100.0, 0.0))
    logged("INFO Stage 0 - run completed\nINFO Stage 1 - run sta", (100.0, 0.0))
    logged("rted\n", (130.0, 40.0), (130.0, 40.0))  # a line split between two reads
    logged("", (190.0, 56.0))
    logged("INFO Stage 1 - run failed\nINFO Stage 2 - run started\n", (210.0, 12.0), None, None)
    logged("", None)
    logged(
        "INFO Stage 2 - run completed\nINFO Stage 3 - run started\n", None, (5.0, 3.0), (5.0, 3.0)
    )
    logged("", (5.0, 3.0))
    logged("INFO Stage 3 - run completed\n", (5.0, 3.0))
    # a stage whose start and end fall in one look, and one whose start was never seen
    logged("INFO Stage 4 - run started\nINFO Stage 4 - run completed\n", (5.0, 0.0), (9.0, 0.0))
    logged("INFO Stage 5 - run completed\n")
    assert watch.stages == {
        0: (0.0, 0.0),
        1: (80.0, 56.0),  # from when its start was read; a failed stage still counts
        2: (None, None),  # /metrics unreadable at its start and end
        3: (0.0, 3.0),
        4: (None, None),
    }
    point = watch.of(StagePoint(concurrency=64, status=StageStatus.ERROR), 1)
    assert (point.preemptions, point.max_waiting, point.status) == (80.0, 56.0, StageStatus.ERROR)
    assert watch.of(StagePoint(concurrency=8), 5) == StagePoint(concurrency=8)  # never started


def test_a_restarted_engine_gives_its_stage_no_count(tmp_path: Path) -> None:
    log = tmp_path / "log"
    counters = iter([900.0, 900.0, 12.0])
    watch = load_job.EngineWatch(lambda: load_job.EngineNow(next(counters), 0.0), log)
    log.write_text("Stage 0 - run started\n")
    watch.look()
    log.write_text("Stage 0 - run started\nStage 0 - run completed\n")
    watch.look()
    assert watch.stages == {0: (None, 0.0)}  # the counter began again: unknown, not negative


def test_a_missing_or_flooding_log_is_no_error(tmp_path: Path) -> None:
    watch = load_job.EngineWatch(lambda: None, tmp_path / "never-written")
    watch.look()
    assert watch.stages == {}
    flood = tmp_path / "flood"
    flood.write_bytes(b"x" * (3 << 20))  # 3 MiB without a newline
    watch = load_job.EngineWatch(lambda: None, flood)
    for _ in range(4):
        watch.look()
    assert len(watch._partial) <= 4096 and watch.stages == {}


def test_the_stages_engine_figures_reach_the_summary(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tokenizer: Path,
    tmp_path: Path,
) -> None:
    # GIVEN runs that leave each stage's report in turn, and engines whose counters move
    def run_load(plan: LoadPlan, work_dir: Path, *, timeout_s: float) -> LoadRun:
        work_dir.mkdir(parents=True, exist_ok=True)
        log = work_dir / "inference-perf.log"
        stages = []
        for number, s in enumerate(plan.stages):
            with log.open("a") as f:
                f.write(f"INFO Stage {number} - run started\n")
            time.sleep(0.1)
            stages.append(judge_stage(result(s.concurrency, s.num_requests), s.num_requests,
                                      plan.output_tokens))  # fmt: skip
            counters[plan.base_url] += s.concurrency if plan.base_url.endswith(":1") else 0
            time.sleep(0.1)
            with log.open("a") as f:
                f.write(f"INFO Stage {number} - run completed\n")
            time.sleep(0.1)
        engine_saw(after, plan, tuple(stages))
        # the reports only at the end, as inference-perf writes them
        reports = Path(plan.report_dir)
        reports.mkdir(parents=True, exist_ok=True)
        for number in range(len(plan.stages)):
            (reports / stage_file(number)).write_text("{}")
        return LoadRun(0, tuple(stages), work_dir / "c.yaml", log, "")

    counters = {"http://127.0.0.1:1": 0.0, "http://127.0.0.1:2": 0.0}
    after = engines_that_count(monkeypatch)
    monkeypatch.setattr("kvgate.load.runner.run_load", run_load)
    monkeypatch.setattr(load_job, "POLL_S", 0.01)
    monkeypatch.setattr(load_job, "_reachable", lambda url: True)
    monkeypatch.setattr(load_job, "_preemptions", lambda url: counters[url])
    monkeypatch.setattr(load_job, "_engine_now", lambda url: load_job.EngineNow(counters[url], 0.0))
    monkeypatch.setenv("KVGATE_LOAD_NONCE", "n0nce")
    assert main([*ARGV, "--tokenizer", str(tokenizer), "--work-dir", str(tmp_path / "w")]) == 0
    # THEN each stage carries what it did to each engine: BF16 (control) preempts, FP8 not
    summary = LoadSummary.from_dict(summary_line(capsys))
    assert summary.control is not None and summary.candidate is not None
    assert [s.preemptions for s in summary.control.stages] == [32, 1, 8, 64]
    assert [s.preemptions for s in summary.candidate.stages] == [0, 0, 0, 0]
    assert summary.control.preemptions == 105


def test_preemptions_are_read_from_the_engines_metrics() -> None:
    import httpx

    pages = {
        "http://a/metrics": httpx.Response(200, text="vllm:num_preemptions_total 17\n"
                                           "vllm:num_requests_waiting 3\n"),
        "http://b/metrics": httpx.Response(200, text="sglang:num_retracted_requests_total 4\n"
                                           "sglang:num_queue_reqs 0\n"),
        "http://c/metrics": httpx.Response(503, text="starting"),
        "http://d/metrics": httpx.Response(200, text="<html>not metrics</html>"),
    }  # fmt: skip

    def get(request: httpx.Request) -> httpx.Response:
        if str(request.url) not in pages:
            raise httpx.ConnectError("refused")
        return pages[str(request.url)]

    client = httpx.Client(transport=httpx.MockTransport(get))
    assert load_job._preemptions("http://a", client=client) == 17.0
    assert load_job._preemptions("http://b/", client=client) == 4.0
    for url in ("http://c", "http://d", "http://e"):
        assert load_job._preemptions(url, client=client) is None


def test_an_endless_metrics_body_is_cut_off_not_read() -> None:
    """A hostile or broken arm serving /metrics without end: the read stops at the scrape's
    bound (MAX_BODY_BYTES) and the count is unknown, never a hang or unbounded memory."""
    import httpx

    from kvgate.adapters.http import MAX_BODY_BYTES

    served = {"bytes": 0}

    def endless() -> Iterator[bytes]:
        chunk = b"vllm:num_preemptions_total 1\n" * 4096
        while served["bytes"] <= 4 * MAX_BODY_BYTES:
            served["bytes"] += len(chunk)
            yield chunk

    client = httpx.Client(
        transport=httpx.MockTransport(lambda request: httpx.Response(200, content=endless()))
    )
    assert load_job._preemptions("http://a", client=client) is None
    assert served["bytes"] <= MAX_BODY_BYTES + 2 * len(b"vllm:num_preemptions_total 1\n" * 4096)


@pytest.mark.parametrize(
    ("extra", "slo"),
    [
        ([], None),
        (["--slo-ttft-ms", "2000", "--slo-tpot-ms", "50"], Slo(ttft_s=2.0, tpot_s=0.05)),
        (["--slo-tpot-ms", "80"], Slo(ttft_s=None, tpot_s=0.08)),
    ],
)
def test_the_slos_reach_both_arms_plans_in_seconds(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tokenizer: Path,
    tmp_path: Path,
    extra: list[str],
    slo: Slo | None,
) -> None:
    fake_runs(monkeypatch, {})
    planned: dict[str, Slo | None] = {}
    run_load = load_runner.run_load

    def spy(plan: LoadPlan, work_dir: Path, *, timeout_s: float) -> LoadRun:
        planned[work_dir.name] = plan.slo
        return run_load(plan, work_dir, timeout_s=timeout_s)

    monkeypatch.setattr("kvgate.load.runner.run_load", spy)
    argv = [*ARGV, "--tokenizer", str(tokenizer), "--work-dir", str(tmp_path / "w"), *extra]
    assert main(argv) == 0
    assert planned == {"control": slo, "candidate": slo}
