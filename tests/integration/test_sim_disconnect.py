"""kvgate.sim aborts a request whose client disconnects, as vLLM does: decoding stops and its KV
blocks are freed at once, streaming or not (else a load tool's timed-out stage, its requests
still decoding, would slow the next one)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

# a hang guard, not a timing: two 30 s waits after a simulator start, which a busy machine slows
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODEL = "Qwen/Qwen3-8B"
SERVE = ["vllm", "serve", MODEL, "--max-model-len", "8192"]
# real time: a 6000-token answer takes minutes, so it is mid-decode when its client leaves
REAL_TIME = {"KVGATE_SIM_SPEED": "1"}
LONG = {"model": MODEL, "prompt": "Tell me everything.", "max_tokens": 6000, "ignore_eos": True}


def engine_state(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("vllm:num_requests_running", "vllm:generation_tokens_total",
                               "vllm:kv_cache_usage_perc"):  # fmt: skip
                found[sample.name] = sample.value
            if (
                sample.name == "vllm:request_success_total"
                and sample.labels.get("finished_reason") == "abort"
            ):
                found["aborted"] = sample.value
    return found


def wait_for(url: str, running: float, timeout: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        state = engine_state(url)
        if state["vllm:num_requests_running"] == running or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


def assert_aborted(url: str, aborted_before: float) -> None:
    # a wait, not a timed assert: finishing the 6,000 tokens instead would take minutes, so 30 s
    # tells an abort from a finish even on a machine too busy for the abort to show in 2 s
    state = wait_for(url, running=0, timeout=30.0)
    assert state["vllm:num_requests_running"] == 0, "still decoding after its client left"
    assert state.get("vllm:kv_cache_usage_perc", 0.0) == 0.0  # its blocks freed
    assert state["aborted"] == aborted_before + 1
    time.sleep(0.5)
    later = engine_state(url)
    assert later["vllm:generation_tokens_total"] == state["vllm:generation_tokens_total"]


def test_a_dropped_stream_is_aborted(sim) -> None:
    engine = sim(SERVE, REAL_TIME)
    before = engine_state(engine.url).get("aborted", 0.0)
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", engine.url + "/v1/completions", json={**LONG, "stream": True}) as r,
    ):
        events = []
        # the iterator is held until the block ends: a dropped one is closed when the garbage
        # collector gets to it, and its close hangs up (at a random moment, under load)
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
            if len(events) >= 3:
                break
        assert [e["choices"][0]["finish_reason"] for e in events] == [None] * 3
        assert wait_for(engine.url, running=1)["vllm:num_requests_running"] == 1
        # leaving the block closes the connection mid-stream
    assert_aborted(engine.url, before)


def test_a_dropped_plain_request_is_aborted(sim) -> None:
    engine = sim(SERVE, REAL_TIME)
    before = engine_state(engine.url).get("aborted", 0.0)
    body = json.dumps(LONG).encode()
    with socket.create_connection((engine.host, engine.port), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert wait_for(engine.url, running=1)["vllm:num_requests_running"] == 1
        time.sleep(0.3)
        assert engine_state(engine.url)["vllm:generation_tokens_total"] > 0
    assert_aborted(engine.url, before)
