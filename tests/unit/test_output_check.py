"""A load gate that checks the output it measures (issue 39 item 5), with fixed figures:
inference-perf's per-request report read for repeated pieces and lengths (kvgate.load.output),
the rules that refuse a candidate (kvgate.judge.outputcheck), the throughput gate refusing a faster
candidate with its own reason, and the simulator's faults that make such a candidate."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from test_load_config import plan
from test_throughput import FIELD, GATE, LABELS

from kvgate.judge.outputcheck import output_problem, prefix_problem, refusal
from kvgate.judge.throughput import assess_throughput
from kvgate.load.config import inference_perf_config
from kvgate.load.output import read_output
from kvgate.reasons import Reason
from kvgate.records.loadresult import OutputFigures, PrefixProbe
from kvgate.sim import textgen
from kvgate.sim.config import GPUS, QWEN3_8B, parse_faults
from kvgate.sim.engine import Request, Scheduler
from kvgate.vocabulary import Outcome


def sse(pieces: list[str], completion_tokens: int | None) -> str:
    """A streamed completion as vLLM sends it: one chunk per piece, then the usage chunk."""
    lines = [
        "data: " + json.dumps({"id": "c", "choices": [{"index": 0, "text": p}]}) + "\n\n"
        for p in pieces
    ]
    if completion_tokens is not None:
        usage = {"prompt_tokens": 9, "completion_tokens": completion_tokens}
        lines.append("data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n")
    return "".join(lines) + "data: [DONE]\n\n"


def entry(pieces: list[str], completion_tokens: int | None, error: Any = None) -> dict[str, Any]:
    """One entry of per_request_lifecycle_metrics.json with the load Job's fields, as
    inference-perf 0.7.0 wrote it for the simulator (tests/integration/test_load_job.py)."""
    usage = None if completion_tokens is None else {"completion_tokens": completion_tokens}
    return {
        "start_time": 1.0,
        "end_time": 2.0,
        "info": {
            "request_metrics": {"text": {"input_tokens": 9}},
            "response_metrics": {"output_tokens": len(pieces), "server_usage": usage},
            "extra_info": {},  # inference-perf moves the raw body to `response`
        },
        "response": sse(pieces, completion_tokens),
        "error": error,
    }


SOUND = [" The", " cat", " sat", " on", " the", " mat", ".", " It"]
DOUBLED = [" The", " The", " sat", " sat", " the", " the", ".", "."]  # every second piece twice


def report(*entries: dict[str, Any]) -> str:
    return json.dumps(list(entries), indent=2)


def test_the_per_request_report_is_read_for_repeats_and_lengths() -> None:
    figures = read_output(report(entry(SOUND, 8), entry(DOUBLED, 8)), output_tokens=8)
    assert figures == OutputFigures(
        requests=2, pieces=16, repeated=4, wrong_length=0, example="".join(DOUBLED)
    )
    assert figures.repeated_share == pytest.approx(4 / 14)  # 14 pieces have one before them


def test_lengths_other_than_asked_and_more_pieces_than_counted_are_wrong() -> None:
    short = entry(SOUND[:6], 6)
    uncounted = entry(SOUND + SOUND, 8)  # 16 pieces streamed, the usage says 8
    no_usage = entry(SOUND, None)
    failed = entry([], None, error={"error_type": "ServerError", "error_msg": "500"})
    figures = read_output(report(entry(SOUND, 8), short, uncounted, no_usage, failed), 8)
    assert figures is not None
    assert (figures.requests, figures.wrong_length) == (4, 3)  # the failed one is not counted
    assert figures.example == "usage 6 for 8 tokens asked, 6 pieces: " + "".join(SOUND[:6])


@pytest.mark.parametrize("text", [None, "", "not json", "{}", '{"a": 1}', "[1, 2]"])
def test_a_missing_or_foreign_report_is_no_figures_or_none_counted(text: str | None) -> None:
    found = read_output(text, 8)
    assert found is None or found.requests == 0


def test_the_load_job_asks_for_the_responses_not_the_prompts() -> None:
    lifecycle = inference_perf_config(plan())["report"]["request_lifecycle"]
    assert lifecycle["per_request"] is True
    assert lifecycle["per_request_fields"] == {
        "request": False,
        "response": True,
        "info": True,
        "response_chunks": False,
        "computed_metrics": False,
    }


def figures(repeated: int, pieces: int = 1100, requests: int = 100) -> OutputFigures:
    return OutputFigures(requests=requests, pieces=pieces, repeated=repeated, wrong_length=0)


@pytest.mark.parametrize(
    ("control", "candidate", "refused"),
    [
        (figures(10), figures(110), False),  # 1% vs 11%: exactly 10 points over, allowed
        (figures(10), figures(111), True),  # 11.1%: over by more than 10 points
        (figures(0), figures(500), True),  # half the pieces doubled (the reported FP8 bug)
        (figures(600), figures(620), False),  # a model that loops on both arms alike
        (None, figures(500), True),  # the control's not read: judged against none
        (None, figures(50), False),
    ],
)
def test_repeats_are_judged_against_the_controls(
    control: OutputFigures | None, candidate: OutputFigures, refused: bool
) -> None:
    assert (output_problem(control, candidate) is not None) is refused


def test_the_degenerate_line_names_both_shares_and_an_example() -> None:
    doubled = replace(figures(500), example=" The The sat sat")
    assert output_problem(figures(10), doubled) == (
        "the candidate repeats the token before it in 50% of its output (500 of 1,100 pieces), "
        'the control 1% (e.g. " The The sat sat")'
    )
    wrong = replace(figures(0), wrong_length=3, example="usage 6 for 8 tokens asked")
    assert output_problem(figures(0), wrong) == (
        '3 of 100 candidate responses are not the length asked (e.g. "usage 6 for 8 tokens asked")'
    )
    assert output_problem(figures(0), None) is None  # an older load Job: no figures
    assert output_problem(figures(0), OutputFigures(requests=0)) is None


ON = PrefixProbe(queries=1024.0, hits=496.0, enabled=True)
OFF = PrefixProbe(queries=0.0, hits=0.0, enabled=False)


@pytest.mark.parametrize(
    ("control", "candidate", "refused"),
    [
        (ON, ON, False),
        (ON, OFF, True),
        (ON, PrefixProbe(queries=1024.0, hits=0.0), True),  # counting, hitting nothing
        (ON, PrefixProbe(queries=1024.0, hits=247.0), True),  # 24% of the control's 48%
        (ON, PrefixProbe(queries=1024.0, hits=248.0), False),  # exactly half: allowed
        (OFF, OFF, False),  # off on both: not the candidate's doing
        (PrefixProbe(queries=1024.0, hits=496.0), PrefixProbe(enabled=False), False),
        (ON, PrefixProbe(error="prefix probe: connection refused"), False),
        (None, OFF, False),
    ],
)
def test_prefix_caching_off_where_the_controls_is_on(
    control: PrefixProbe | None, candidate: PrefixProbe | None, refused: bool
) -> None:
    assert (prefix_problem(control, candidate) is not None) is refused


def test_a_faster_candidate_with_doubled_tokens_is_refused_whatever_its_gain() -> None:
    assert assess_throughput(GATE, FIELD, labels=LABELS).result.reason is Reason.THROUGHPUT_GAINED
    control = replace(FIELD.control, output=figures(3), prefix_cache=ON)
    doubled = replace(FIELD.candidate, output=figures(520), prefix_cache=ON)
    finding = assess_throughput(
        GATE, replace(FIELD, control=control, candidate=doubled), labels=LABELS
    )
    assert finding.result.outcome is Outcome.FAILED
    assert finding.result.reason is Reason.OUTPUT_DEGENERATE
    assert finding.result.message.startswith(
        "not counted as faster: the candidate repeats the token before it in 52% of its output"
    )
    assert finding.gain is None and finding.best_gain is None  # no gain is claimed


def test_a_faster_candidate_without_prefix_caching_is_refused() -> None:
    control = replace(FIELD.control, output=figures(3), prefix_cache=ON)
    cold = replace(FIELD.candidate, output=figures(3), prefix_cache=OFF)
    finding = assess_throughput(GATE, replace(FIELD, control=control, candidate=cold))
    assert (finding.result.outcome, finding.result.reason) == (
        Outcome.FAILED,
        Reason.PREFIX_CACHE_OFF,
    )
    assert finding.result.message == (
        "not counted as faster: cache_config_info says enable_prefix_caching False on the "
        "candidate, True on the control"
    )
    # both checks pass: the gain stands as before
    sound = replace(FIELD, control=control, candidate=replace(cold, prefix_cache=ON))
    assert assess_throughput(GATE, sound).result.reason is Reason.THROUGHPUT_GAINED
    # degenerate output outranks a lost prefix cache (both are reported one at a time)
    both = replace(FIELD, control=control, candidate=replace(cold, output=figures(600)))
    assert refusal(both.control, both.candidate)[0] is Reason.OUTPUT_DEGENERATE  # type: ignore[index]


def test_the_simulator_faults_parse_and_refuse_a_value() -> None:
    faults = parse_faults("duplicate-tokens,no-prefix-caching", GPUS["L4"])
    assert faults.duplicate_tokens and faults.no_prefix_caching
    plain = parse_faults("", GPUS["L4"])
    assert not (plain.duplicate_tokens or plain.no_prefix_caching)
    with pytest.raises(Exception, match="duplicate-tokens takes no value"):
        parse_faults("duplicate-tokens=2", GPUS["L4"])


def test_block_hashes_are_chained_over_whole_blocks() -> None:
    text = " ".join(f"w{i}" for i in range(40))  # 40 tokens: two whole blocks of 16
    same = textgen.block_hashes(text, 16)
    assert len(same) == 2 and same == textgen.block_hashes(text + " tail", 16)
    other = textgen.block_hashes("x " + text, 16)
    assert not set(other) & set(same)  # a different first token changes every block
    assert textgen.block_hashes("a b", 16) == ()


def scheduler(prefix_caching: bool) -> Scheduler:
    s = Scheduler(
        gpu=GPUS["L4"], model=QWEN3_8B, kv_bytes_per_token=QWEN3_8B.kv_bytes_per_token(2),
        capacity_tokens=100_000, block_size=16, max_num_seqs=8, speed=1e-4,
        prefix_caching=prefix_caching,
    )  # fmt: skip
    s.start()
    return s


@pytest.mark.parametrize("caching", [True, False])
def test_the_scheduler_counts_prefix_hits_by_whole_blocks(caching: bool) -> None:
    prompt = " ".join(f"w{i}" for i in range(40))
    blocks = textgen.block_hashes(prompt, 16)
    s = scheduler(caching)
    try:
        for _ in range(2):
            r = Request(prompt_tokens=40, pieces=[" x"], finish_reason="length")
            r.prefix_blocks = blocks
            s.submit(r)
            assert r.done.wait(30) and r.error is None
        stats = s.stats
        # vLLM counts queries only with caching on; the second send hits both whole blocks
        assert (stats.prefix_queries, stats.prefix_hits) == ((80, 32) if caching else (0, 0))
        assert stats.prompt_tokens == 80
    finally:
        s.stop()
