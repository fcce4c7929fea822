"""Production's request lengths, read from its request-length histograms, shape the load Job's
workload (`throughput.request_lengths`); without them the load runs the fixed 512 / 128 and says so."""

from __future__ import annotations

import math

import pytest

from kvgate.evidence.metrics import Histogram, parse_metrics
from kvgate.judge.throughput import (
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    MAX_PROMPT_TOKENS,
    request_lengths,
)

# vLLM's bucket layout for request_prompt_tokens / request_generation_tokens (1-2-5 series)
VLLM_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_bucket{le="500.0",model_name="m"} 0
vllm:request_prompt_tokens_bucket{le="1000.0",model_name="m"} 0
vllm:request_prompt_tokens_bucket{le="2000.0",model_name="m"} 40
vllm:request_prompt_tokens_bucket{le="5000.0",model_name="m"} 40
vllm:request_prompt_tokens_bucket{le="+Inf",model_name="m"} 40
vllm:request_prompt_tokens_sum{model_name="m"} 72000
vllm:request_prompt_tokens_count{model_name="m"} 40
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{le="200.0",model_name="m"} 0
vllm:request_generation_tokens_bucket{le="500.0",model_name="m"} 40
vllm:request_generation_tokens_bucket{le="+Inf",model_name="m"} 40
vllm:request_generation_tokens_sum{model_name="m"} 16000
vllm:request_generation_tokens_count{model_name="m"} 40
"""

SGLANG_METRICS = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 2
# TYPE sglang:prompt_tokens_histogram histogram
sglang:prompt_tokens_histogram_bucket{le="1000.0",model_name="m",tp_rank="0"} 20
sglang:prompt_tokens_histogram_bucket{le="+Inf",model_name="m",tp_rank="0"} 20
sglang:prompt_tokens_histogram_sum{model_name="m",tp_rank="0"} 10000
sglang:prompt_tokens_histogram_count{model_name="m",tp_rank="0"} 20
# TYPE sglang:generation_tokens_histogram histogram
sglang:generation_tokens_histogram_bucket{le="100.0",model_name="m",tp_rank="0"} 20
sglang:generation_tokens_histogram_bucket{le="+Inf",model_name="m",tp_rank="0"} 20
sglang:generation_tokens_histogram_sum{model_name="m",tp_rank="0"} 1000
sglang:generation_tokens_histogram_count{model_name="m",tp_rank="0"} 20
"""


def hist(buckets: list[tuple[float, float]], total: float, count: float) -> Histogram:
    return Histogram(tuple(buckets), total, count)


def test_vllm_histograms_give_the_means_of_production_requests() -> None:
    # GIVEN a vLLM production whose 40 finished requests averaged 1,800 prompt / 400 output tokens
    snap = parse_metrics(VLLM_METRICS, "vllm")
    # WHEN the load's lengths are derived
    lengths = request_lengths(snap.prompt_lengths, snap.output_lengths)
    # THEN they are production's means, not the fixed defaults
    assert (lengths.prompt_tokens, lengths.output_tokens) == (1800, 400)
    assert lengths.derived
    assert "over 40 requests" in lengths.message and "prompt mean 1800" in lengths.message
    # every prompt sat in the (1000, 2000] bucket: its midpoint (1500) says nothing of the
    # spread, so none is claimed
    assert "std" not in lengths.message
    assert snap.names["prompt_lengths"] == "vllm:request_prompt_tokens"


def test_sglang_histograms_are_read_too() -> None:
    snap = parse_metrics(SGLANG_METRICS, "sglang")
    lengths = request_lengths(snap.prompt_lengths, snap.output_lengths)
    assert (lengths.prompt_tokens, lengths.output_tokens, lengths.derived) == (500, 50, True)


@pytest.mark.parametrize(
    ("prompt", "output", "why"),
    [
        (None, hist([(math.inf, 40)], 4000, 40), "no prompt-length histogram"),
        (hist([(math.inf, 40)], 4000, 40), None, "no output-length histogram"),
        (hist([(math.inf, 3)], 300, 3), hist([(math.inf, 3)], 30, 3), "3 requests"),
        (hist([(math.inf, 0)], 0, 0), hist([(math.inf, 0)], 0, 0), "0 requests"),
    ],
)
def test_missing_or_too_few_requests_fall_back_to_the_fixed_lengths_and_say_so(
    prompt: Histogram | None, output: Histogram | None, why: str
) -> None:
    lengths = request_lengths(prompt, output)
    assert (lengths.prompt_tokens, lengths.output_tokens) == (
        DEFAULT_PROMPT_TOKENS,
        DEFAULT_OUTPUT_TOKENS,
    )
    assert not lengths.derived
    assert why in lengths.message
    assert "fixed 512 prompt / 128 output tokens" in lengths.message


def test_an_engine_without_the_histograms_falls_back() -> None:
    snap = parse_metrics("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n")
    assert snap.prompt_lengths is None and snap.output_lengths is None
    assert not request_lengths(snap.prompt_lengths, snap.output_lengths).derived


def test_a_window_delta_reads_only_the_requests_in_the_window() -> None:
    # GIVEN cumulative histograms whose newer requests are longer than the early ones
    early = hist([(1000.0, 20), (math.inf, 20)], 10_000, 20)
    late = hist([(1000.0, 20), (4000.0, 40), (math.inf, 40)], 10_000 + 60_000, 40)
    out_early = hist([(math.inf, 20)], 2_000, 20)
    out_late = hist([(math.inf, 40)], 2_000 + 4_000, 40)
    # WHEN the window's delta is read
    lengths = request_lengths(late.since(early), out_late.since(out_early))
    # THEN the lengths are the window's requests only (3,000 in, 200 out)
    assert (lengths.prompt_tokens, lengths.output_tokens) == (3000, 200)


def test_lengths_are_bounded_and_at_least_one_token() -> None:
    huge = hist([(math.inf, 10)], 10 * 1e9, 10)
    tiny = hist([(1.0, 10), (math.inf, 10)], 1.0, 10)
    lengths = request_lengths(huge, tiny)
    assert lengths.prompt_tokens == MAX_PROMPT_TOKENS
    assert lengths.output_tokens == 1
