"""kvgate.sim /metrics, parsed with prometheus_client's text parser, and behaviour under load."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODEL = "Qwen/Qwen3-8B"
SERVE = ["vllm", "serve", MODEL, "--max-model-len", "8192", "--attention-backend", "TRITON_ATTN"]


def scrape(engine) -> dict[str, object]:
    response = httpx.get(engine.url + "/metrics", timeout=10)
    assert response.status_code == 200
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def value(families, name: str, **labels: str) -> float:
    family = families[name]
    samples = [s for s in family.samples if s.name == name or s.name == name + "_total"]
    samples = [s for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(samples) == 1, (name, labels, family.samples)
    return samples[0].value


# (family name as the parser reports it, type); counters lose `_total` in the parser
VLLM_COMMON = [
    ("vllm:num_requests_running", "gauge"),
    ("vllm:num_requests_waiting", "gauge"),
    ("vllm:kv_cache_usage_perc", "gauge"),
    ("vllm:num_preemptions", "counter"),
    ("vllm:prompt_tokens", "counter"),
    ("vllm:generation_tokens", "counter"),
    ("vllm:request_success", "counter"),
    ("vllm:time_to_first_token_seconds", "histogram"),
    ("vllm:inter_token_latency_seconds", "histogram"),
    ("vllm:e2e_request_latency_seconds", "histogram"),
    ("vllm:cache_config_info", "gauge"),
]


@pytest.mark.parametrize(
    ("version", "tpot_present", "waiting_by_reason"),
    [
        ("0.11.0", True, False),
        ("0.13.0", False, False),
        ("0.16.0", False, False),
        ("0.33.0", False, True),
    ],
)
def test_vllm_families_per_version(sim, version, tpot_present, waiting_by_reason) -> None:
    env = {"KVGATE_SIM_ENGINE_VERSION": version}
    args = SERVE if version >= "0.13" else SERVE[:-2]
    engine = sim(
        [*args, "--kv-cache-dtype", "fp8"], {**env, "VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}
    )
    httpx.post(
        engine.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 8}, timeout=30
    )
    families = scrape(engine)
    for name, kind in VLLM_COMMON:
        assert families[name].type == kind, name
    assert ("vllm:time_per_output_token_seconds" in families) is tpot_present
    assert ("vllm:num_requests_waiting_by_reason" in families) is waiting_by_reason
    assert "vllm:gpu_cache_usage_perc" not in families  # removed in 0.12, hidden in 0.11
    labels = families["vllm:num_requests_running"].samples[0].labels
    assert labels == {"model_name": MODEL, "engine": "0"}
    info = families["vllm:cache_config_info"].samples[0].labels
    assert info["cache_dtype"] == "fp8" and info["block_size"] == "16"
    tokens = int(info["num_gpu_blocks"]) * 16
    assert f"GPU KV cache size: {tokens:,} tokens" in engine.log()
    assert value(families, "vllm:generation_tokens", model_name=MODEL) == 8
    assert value(families, "vllm:request_success", finished_reason="length") == 1
    ttft = families["vllm:time_to_first_token_seconds"]
    assert [s.value for s in ttft.samples if s.name.endswith("_count")] == [1.0]


def test_vllm_010_families(sim) -> None:
    # vllm-0.10.2 vllm/v1/metrics/loggers.py: the names deprecated in 0.9 are still registered
    engine = sim(
        [*SERVE[:-2], "--kv-cache-dtype", "fp8"],
        {"KVGATE_SIM_ENGINE_VERSION": "0.10.2", "VLLM_ATTENTION_BACKEND": "TRITON_ATTN_VLLM_V1"},
    )
    httpx.post(
        engine.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 8}, timeout=30
    )
    families = scrape(engine)
    for name, kind in VLLM_COMMON:
        assert families[name].type == kind, name
    assert families["vllm:gpu_cache_usage_perc"].type == "gauge"
    assert value(families, "vllm:gpu_cache_usage_perc") == value(
        families, "vllm:kv_cache_usage_perc"
    )
    assert families["vllm:gpu_prefix_cache_queries"].type == "counter"
    assert value(families, "vllm:gpu_prefix_cache_queries") == value(
        families, "vllm:prefix_cache_queries"
    ) > 0  # fmt: skip
    assert families["vllm:gpu_prefix_cache_hits"].type == "counter"
    assert "vllm:time_per_output_token_seconds" in families
    assert "vllm:request_time_per_output_token_seconds" not in families  # added after 0.10.2
    info = families["vllm:cache_config_info"].samples[0].labels
    assert (info["cache_dtype"], info["prefix_caching_hash_algo"]) == ("fp8", "sha256")
    assert info["calculate_kv_scales"] == "False"
    response = httpx.get(engine.url + "/metrics", timeout=10).text
    assert (
        "# HELP vllm:gpu_prefix_cache_queries_total GPU prefix cache queries, in terms of number of queriedtokens. DEPRECATED"
        in response
    )


def test_tpot_histogram_can_be_shown_in_012_to_014(sim) -> None:
    engine = sim(
        [*SERVE, "--show-hidden-metrics-for-version", "0.11"],
        {"KVGATE_SIM_ENGINE_VERSION": "0.14.0"},
    )
    assert "vllm:time_per_output_token_seconds" in scrape(engine)


def test_fp8_reads_half_the_kv_and_pays_for_dequantizing_it(sim) -> None:
    """Inter-token latency follows the bytes of KV read per step; FP8 reads half but
    dequantizes what it reads, which costs a little more than it saves (the field report)."""
    load = {"KVGATE_SIM_LOAD": "concurrency=8,prompt=2000,output=400", "KVGATE_SIM_SPEED": "0.01"}
    bf16 = sim(SERVE, load)
    fp8 = sim([*SERVE, "--kv-cache-dtype", "fp8"], load)
    time.sleep(2.0)
    means = []
    for engine in (bf16, fp8):
        itl = scrape(engine)["vllm:inter_token_latency_seconds"]
        total = next(s.value for s in itl.samples if s.name.endswith("_sum"))
        count = next(s.value for s in itl.samples if s.name.endswith("_count"))
        assert count > 100
        means.append(total / count)
    # an L4 reads ~16 GiB of weights per step (~70 ms); 8 x 2,000+ tokens of BF16 KV add ~10%,
    # FP8 half that plus its dequantization: a few percent slower per token
    assert 0.05 < means[0] < means[1] < means[0] * 1.05 < 0.1


def test_synthetic_load_fills_the_pool_and_queues(sim) -> None:
    # GIVEN production traffic beyond what the BF16 pool holds (64 x 2,400 tokens vs ~20k)
    engine = sim(
        SERVE,
        {"KVGATE_SIM_LOAD": "concurrency=64,prompt=2000,output=400", "KVGATE_SIM_SPEED": "0.01"},
    )
    time.sleep(1.0)
    first = scrape(engine)
    time.sleep(2.0)
    second = scrape(engine)
    running = value(second, "vllm:num_requests_running")
    waiting = value(second, "vllm:num_requests_waiting")
    assert running + waiting == 64
    assert 0 < running < 20 and waiting > 40
    assert value(second, "vllm:kv_cache_usage_perc") > 0.7
    assert value(second, "vllm:generation_tokens") > value(first, "vllm:generation_tokens")
    assert value(second, "vllm:num_preemptions") >= value(first, "vllm:num_preemptions")
    # a user request still gets served, after queueing
    response = httpx.post(
        engine.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 4}, timeout=60
    )
    assert response.status_code == 200


def test_a_pod_no_service_selects_gets_no_production_traffic(sim) -> None:
    # GIVEN production's traffic in the env, copied into a canary whose labels (kvgate's) lack
    # the one production's Service selects: the downward API gives an empty value
    load = "concurrency=64,prompt=2000,output=400"
    canary = sim(
        SERVE,
        {"KVGATE_SIM_LOAD": load, "KVGATE_SIM_SPEED": "0.01", "KVGATE_SIM_SERVICE_LABEL": ""},
    )
    production = sim(
        SERVE,
        {"KVGATE_SIM_LOAD": load, "KVGATE_SIM_SPEED": "0.01", "KVGATE_SIM_SERVICE_LABEL": "vllm"},
    )
    time.sleep(1.5)
    # THEN the canary serves nothing but what is sent to it; production is under its load
    idle, busy = scrape(canary), scrape(production)
    assert value(idle, "vllm:num_requests_running") + value(idle, "vllm:num_requests_waiting") == 0
    assert value(idle, "vllm:kv_cache_usage_perc") == 0
    assert value(busy, "vllm:num_requests_running") + value(busy, "vllm:num_requests_waiting") == 64
    response = httpx.post(
        canary.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 4}, timeout=60
    )
    assert response.status_code == 200


def test_requests_beyond_capacity_wait_and_get_preempted(sim) -> None:
    # GIVEN a pool of ~2,600 tokens and 12 requests of ~600 + 400 tokens each: any three that
    # run together outgrow the pool, however the requests' arrivals spread on a busy machine
    # (with 300 output tokens it took four at once, which a starved client could miss)
    engine = sim(
        ["vllm", "serve", MODEL, "--max-model-len", "2048", "--gpu-memory-utilization", "0.79",
         "--attention-backend", "TRITON_ATTN"],
        {"KVGATE_SIM_SPEED": "0.02"},
    )  # fmt: skip
    prompt = "word " * 600
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 400, "ignore_eos": True}
    peak_waiting, peak_usage = 0.0, 0.0
    with ThreadPoolExecutor(12) as pool:
        futures = [
            pool.submit(httpx.post, engine.url + "/v1/completions", json=body, timeout=120)
            for _ in range(12)
        ]
        while not all(f.done() for f in futures):
            families = scrape(engine)
            peak_waiting = max(peak_waiting, value(families, "vllm:num_requests_waiting"))
            peak_usage = max(peak_usage, value(families, "vllm:kv_cache_usage_perc"))
            time.sleep(0.05)
        results = [f.result() for f in futures]
    assert all(r.status_code == 200 for r in results)
    assert all(r.json()["usage"]["completion_tokens"] == 400 for r in results)
    assert peak_waiting >= 6
    assert peak_usage > 0.6
    families = scrape(engine)
    assert value(families, "vllm:num_preemptions") > 0
    assert value(families, "vllm:num_requests_waiting") == 0
    assert value(families, "vllm:request_success", finished_reason="length") == 12
    queue = families["vllm:request_queue_time_seconds"]
    assert next(s.value for s in queue.samples if s.name.endswith("_sum")) > 0
