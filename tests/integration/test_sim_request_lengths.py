"""The simulator's request-length histograms, and kvgate's reading of them (issue 21).

vLLM: `vllm:request_prompt_tokens` / `vllm:request_generation_tokens`, labels model_name and
engine, bounds `build_1_2_5_buckets(max_model_len)` (vllm/v1/metrics/loggers.py). SGLang:
`sglang:prompt_tokens_histogram` / `sglang:generation_tokens_histogram`, label model_name, the
collector's default_bucket_prompt_tokens for both; before 0.5.11 only with
--collect-tokens-histogram, a no-op flag from 0.5.11 that 0.5.20 no longer accepts. The bound
lists below are copied from those wheels, not from the simulator.
"""

from __future__ import annotations

import math
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.adapters.http import scrape_snapshot
from kvgate.controller.sources import sample_pool, scrape_pod
from kvgate.judge.throughput import RequestLengths, production_lengths, request_lengths
from kvgate.records.codec import write
from kvgate.records.status import PoolSample, RolloutStatus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODEL = "Qwen/Qwen3-8B"
VLLM = ["vllm", "serve", MODEL]
SGLANG = ["sglang", "--model-path", MODEL, "--enable-metrics", "--skip-server-warmup"]

# Twelve requests: prompt words (the simulator's tokens) and generated tokens (ignore_eos).
# Some lengths sit exactly on a bound (10, 20, 100, 300, 2000): `le` includes its bound.
PROMPTS = [4, 9, 10, 11, 50, 120, 300, 800, 1500, 2000, 3000, 5200]
OUTPUTS = [1, 2, 3, 10, 16, 40, 64, 100, 128, 200, 256, 512]

VLLM_BOUNDS_8192 = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
VLLM_BOUNDS_40960 = [*VLLM_BOUNDS_8192, 10000, 20000]
# sglang/srt/metrics/collector.py (0.5.3), observability/metrics_collector.py (0.5.10)
SGLANG_BOUNDS_OLD = [100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12000, 15000, 20000, 22000, 25000, 30000, 35000, 40000, 66000, 99000, 132000, 300000, 600000, 900000, 1100000]  # fmt: skip
# sglang/srt/observability/metrics_collector.py (0.5.11-0.5.23)
SGLANG_BOUNDS = [100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500, 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000, 300000, 400000, 600000, 800000, 1000000, 1100000]  # fmt: skip


def _stored_lengths(status: object) -> RequestLengths:
    """The production lengths of a rollout's status as stored."""
    return production_lengths(RolloutStatus.from_dict(status).preflight)


def send_requests(engine) -> None:
    with httpx.Client(base_url=engine.url, timeout=60) as client:
        for words, tokens in zip(PROMPTS, OUTPUTS, strict=True):
            body = {"model": MODEL, "prompt": " w" * words, "max_tokens": tokens}
            response = client.post("/v1/completions", json={**body, "ignore_eos": True})
            assert response.status_code == 200, response.text
            usage = response.json()["usage"]
            assert (usage["prompt_tokens"], usage["completion_tokens"]) == (words, tokens)


def histogram(engine, name: str):
    text = httpx.get(engine.url + "/metrics", timeout=10).text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    return families.get(name)


def le_value(text: str) -> float:
    return math.inf if text == "+Inf" else float(text)


def assert_histogram(family, values: list[int], bounds: list[int], labels: dict[str, str]):
    """count N, sum of the values, and every cumulative bucket (bounds plus +Inf) right."""
    assert family is not None and family.type == "histogram"
    rows = {s.name.removeprefix(family.name): s for s in family.samples if "le" not in s.labels}
    assert rows["_count"].value == len(values)
    assert rows["_sum"].value == sum(values)
    assert rows["_count"].labels == labels
    buckets = [(le_value(s.labels["le"]), s.value) for s in family.samples if "le" in s.labels]
    assert [bound for bound, _ in buckets] == [*map(float, bounds), math.inf]
    for bound, cumulative in buckets:
        assert cumulative == sum(1 for v in values if v <= bound), bound


@pytest.mark.parametrize(
    ("version", "env", "max_model_len", "bounds"),
    [
        ("0.10.2", {}, "8192", VLLM_BOUNDS_8192),
        ("0.11.0", {}, "8192", VLLM_BOUNDS_8192),
        # H100: Qwen3-8B's own 40,960 tokens fit, so the series runs to 20,000
        ("0.33.0", {"KVGATE_SIM_GPU": "H100"}, None, VLLM_BOUNDS_40960),
    ],
)
def test_vllm_request_length_histograms(sim, version, env, max_model_len, bounds) -> None:
    # GIVEN a simulated vLLM
    args = [*VLLM, "--max-model-len", max_model_len] if max_model_len else VLLM
    engine = sim(args, {"KVGATE_SIM_ENGINE_VERSION": version, **env})
    # WHEN twelve requests of known lengths finish
    send_requests(engine)
    # THEN both histograms hold the twelve, on vLLM's 1-2-5 bounds up to max-model-len
    labels = {"model_name": MODEL, "engine": "0"}
    prompts = histogram(engine, "vllm:request_prompt_tokens")
    assert_histogram(prompts, PROMPTS, bounds, labels)
    assert prompts.documentation == "Number of prefill tokens processed."
    outputs = histogram(engine, "vllm:request_generation_tokens")
    assert_histogram(outputs, OUTPUTS, bounds, labels)
    assert outputs.documentation == "Number of generation tokens processed."


@pytest.mark.parametrize(
    ("version", "flag", "bounds"),
    [
        ("0.5.3", ["--collect-tokens-histogram"], SGLANG_BOUNDS_OLD),
        ("0.5.10", ["--collect-tokens-histogram"], SGLANG_BOUNDS_OLD),
        ("0.5.16", ["--collect-tokens-histogram"], SGLANG_BOUNDS),  # deprecated no-op
        ("0.5.23", [], SGLANG_BOUNDS),
    ],
)
def test_sglang_request_length_histograms(sim, version, flag, bounds) -> None:
    engine = sim([*SGLANG, *flag], {"KVGATE_SIM_ENGINE_VERSION": version})
    send_requests(engine)
    labels = {"model_name": MODEL}
    prompts = histogram(engine, "sglang:prompt_tokens_histogram")
    assert_histogram(prompts, PROMPTS, bounds, labels)
    assert prompts.documentation == "Histogram of prompt token length."
    outputs = histogram(engine, "sglang:generation_tokens_histogram")
    assert_histogram(outputs, OUTPUTS, bounds, labels)
    assert outputs.documentation == "Histogram of generation token length."
    # bounds of a million and more spelled as prometheus_client's Histogram writes them
    text = httpx.get(engine.url + "/metrics", timeout=10).text
    assert (
        'sglang:prompt_tokens_histogram_bucket{le="1.1e+06",model_name="Qwen/Qwen3-8B"} 12.0'
        in text
    )


def test_sglang_before_0_5_11_has_them_only_with_the_flag(sim) -> None:
    # GIVEN SGLang 0.5.10 with metrics but without --collect-tokens-histogram
    engine = sim(SGLANG, {"KVGATE_SIM_ENGINE_VERSION": "0.5.10"})
    send_requests(engine)
    # THEN no length histograms, and kvgate falls back to its fixed lengths, saying why
    assert histogram(engine, "sglang:prompt_tokens_histogram") is None
    assert histogram(engine, "sglang:generation_tokens_histogram") is None
    snap = scrape_snapshot(engine.url + "/metrics", engine="sglang")
    lengths = request_lengths(snap.prompt_lengths, snap.output_lengths)
    assert not lengths.derived
    assert "no prompt-length histogram" in lengths.message


def test_sglang_0_5_20_no_longer_takes_the_flag(sim) -> None:
    engine = sim(
        [*SGLANG, "--collect-tokens-histogram"],
        {"KVGATE_SIM_ENGINE_VERSION": "0.5.20"},
        ready=False,
    )
    assert engine.wait(30) == 2
    assert "unrecognized arguments: --collect-tokens-histogram" in engine.log()


@pytest.mark.parametrize(
    ("name", "args", "env"),
    [
        ("vllm", [*VLLM, "--max-model-len", "8192"], {"KVGATE_SIM_ENGINE_VERSION": "0.11.0"}),
        ("sglang", SGLANG, {"KVGATE_SIM_ENGINE_VERSION": "0.5.23"}),
    ],
)
def test_kvgate_derives_the_lengths_sent_from_a_live_sim(sim, name, args, env) -> None:
    # GIVEN a simulated production engine that served the twelve requests
    engine = sim(args, env)
    send_requests(engine)
    # WHEN kvgate reads its /metrics as the load gate does
    snap = scrape_snapshot(engine.url + "/metrics", engine=name)
    lengths = request_lengths(snap.prompt_lengths, snap.output_lengths)
    # THEN the load's lengths are the means of what was sent (1,083.67 and 111 tokens)
    assert (lengths.prompt_tokens, lengths.output_tokens) == (1084, 111)
    assert lengths.derived and "over 12 requests" in lengths.message
    # and the operator's preflight path (a pool sample in status, then the load's lengths)
    # gives the same means
    series: dict[str, list[PoolSample]] = {}
    assert sample_pool({"prod-0": engine.host}, series, lambda _: scrape_pod(
        engine.url + "/metrics", name, 10.0
    )) == []  # fmt: skip
    kept = {pod: [write(s) for s in samples] for pod, samples in series.items()}
    stored = _stored_lengths({"preflight": {"samples": kept}})
    assert (stored.prompt_tokens, stored.output_tokens, stored.derived) == (1084, 111, True)


def test_synthetic_production_load_shapes_the_lengths_kvgate_reads(sim) -> None:
    # GIVEN a simulated production pod serving synthetic traffic of 2,000 / 400 tokens
    engine = sim(
        [*VLLM, "--max-model-len", "8192"],
        {"KVGATE_SIM_LOAD": "concurrency=4,prompt=2000,output=400", "KVGATE_SIM_SPEED": "0.01"},
    )
    # WHEN at least ten of its requests have finished
    deadline = time.monotonic() + 120
    while True:
        snap = scrape_snapshot(engine.url + "/metrics", engine="vllm")
        if snap.prompt_lengths is not None and snap.prompt_lengths.count >= 10:
            break
        assert time.monotonic() < deadline, "fewer than 10 synthetic requests finished"
        time.sleep(0.5)
    # THEN kvgate's load would run production's shape
    lengths = request_lengths(snap.prompt_lengths, snap.output_lengths)
    assert (lengths.prompt_tokens, lengths.output_tokens, lengths.derived) == (2000, 400, True)
