"""Prometheus as the metrics source: a real `prometheus` scrapes simulated engines.

The adapter's PromQL history of each engine must lead `pool.pool_pressure` to the same
conclusion as scraping the engine directly (pool-bound under load, room when quiet); a
Prometheus that is down, errors, or answers with junk or a huge body is a PrometheusError (an
ExternalError: the operator's "unknown"), never a verdict.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from test_sim_request_lengths import send_requests

from kvgate.adapters import prometheus as adapter
from kvgate.controller.sources import pool_record
from kvgate.errors import ExternalError, PrometheusError
from kvgate.evidence.metrics import parse_metrics
from kvgate.evidence.pool import pool_pressure
from kvgate.judge.gates import assess_speed
from kvgate.judge.throughput import RequestLengths, production_lengths
from kvgate.records.codec import write
from kvgate.records.status import ClocksRecord, RolloutStatus
from kvgate.spec.rollout import SpeedGate
from kvgate.vocabulary import Outcome

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
import contextlib

from prometheus import Prometheus, binary, free_port

# The tools tier: a real Prometheus, ~80 s of the fast tier's ~470 s on 2 cores.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.tools,
    pytest.mark.skipif(binary() is None, reason="prometheus is not installed"),
]

VLLM = ["vllm", "serve", "Qwen/Qwen3-8B", "--max-model-len", "8192"]
SGLANG = ["sglang", "--model-path", "Qwen/Qwen3-8B", "--enable-metrics"]
BUSY = {"KVGATE_SIM_LOAD": "concurrency=64,prompt=2000,output=400", "KVGATE_SIM_SPEED": "0.01"}
QUIET = {"KVGATE_SIM_LOAD": "concurrency=2,prompt=500,output=200", "KVGATE_SIM_SPEED": "0.01"}
WINDOW_S, STEP_S = 6.0, 1.0


def _stored_lengths(status: object) -> RequestLengths:
    """The production lengths of a rollout's status as stored."""
    return production_lengths(RolloutStatus.from_dict(status).preflight)


def direct(url: str, engine: str, n: int = 7) -> bool | None:
    snaps = []
    for i in range(n):
        snaps.append(parse_metrics(httpx.get(url + "/metrics").text, engine, taken_at=float(i)))
        time.sleep(STEP_S)
    return pool_pressure(snaps).pressured


@pytest.mark.parametrize(("engine", "args"), [("vllm", VLLM), ("sglang", SGLANG)])
def test_history_from_prometheus_matches_a_direct_scrape(sim, tmp_path, engine, args) -> None:
    busy = sim(args, BUSY, host="127.0.0.2")
    quiet = sim(args, QUIET, host="127.0.0.3")
    pods = {"web-busy": busy.host, "web-quiet": quiet.host}
    targets = [f"{e.host}:{e.port}" for e in (busy, quiet)]
    with Prometheus(tmp_path / "prom", targets, scrape_interval="1s") as prom:
        prom.wait_up(2)
        expected = {"web-busy": direct(busy.url, engine), "web-quiet": direct(quiet.url, engine)}
        assert expected == {"web-busy": True, "web-quiet": False}
        history = adapter.pool_history(
            prom.url, engine, pods, window_s=WINDOW_S, step_s=STEP_S, now=time.time()
        )
    assert set(history) == set(pods)
    for pod, snaps in history.items():
        assert len(snaps) == WINDOW_S / STEP_S + 1, (pod, len(snaps))
        assert all(s.engine == engine and s.kv_usage is not None for s in snaps)
        # the step's TTFT totals come along (the verify window's baseline)
        assert all(s.ttft is not None and s.ttft.count >= 0 for s in snaps)
    judged = {pod: pool_pressure(snaps).pressured for pod, snaps in history.items()}
    assert judged == expected
    assert (
        history["web-busy"][-1].names["kv_usage"]
        == parse_metrics(httpx.get(busy.url + "/metrics").text, engine).names["kv_usage"]
    )


@pytest.mark.parametrize(
    ("engine", "args", "version"),
    [("vllm", VLLM, "0.11.0"), ("sglang", [*SGLANG, "--skip-server-warmup"], "0.5.23")],
)
def test_request_lengths_from_prometheus_match_a_direct_scrape(
    sim, tmp_path, engine, args, version
) -> None:
    # GIVEN a production engine that finished twelve requests of known lengths
    production = sim(args, {"KVGATE_SIM_ENGINE_VERSION": version}, host="127.0.0.2")
    send_requests(production)
    # WHEN preflight reads its history from a real Prometheus that scraped it, and (to compare)
    # its /metrics directly, each as status keeps a pool sample
    with Prometheus(tmp_path / "prom", [f"{production.host}:{production.port}"]) as prom:
        prom.wait_up(1)  # scraped once, after the requests finished
        history = adapter.pool_history(
            prom.url, engine, {"prod-0": production.host}, window_s=2, step_s=1, now=time.time()
        )["prod-0"]
    scraped = parse_metrics(httpx.get(production.url + "/metrics").text, engine)
    samples = [write(pool_record(s)) for s in history]
    via_prometheus = _stored_lengths(
        {"preflight": {"source": "prometheus", "samples": {"prod-0": samples}}}
    )
    via_scrape = _stored_lengths(
        {"preflight": {"samples": {"prod-0": [write(pool_record(scraped))]}}}
    )
    # THEN both give the load the means of what was sent (1,083.67 and 111 tokens)
    assert history and history[-1].prompt_lengths is not None
    assert history[-1].names["prompt_lengths"] == scraped.names["prompt_lengths"]
    shape = (via_prometheus.prompt_tokens, via_prometheus.output_tokens, via_prometheus.derived)
    assert shape == (via_scrape.prompt_tokens, via_scrape.output_tokens, True) == (1084, 111, True)
    assert via_prometheus.message.startswith(
        "production's request lengths from Prometheus over 12 requests"
    )


def test_arms_gpu_clocks_from_a_real_prometheus(sim, tmp_path) -> None:
    # GIVEN a control and an FP8 candidate whose (emulated) dcgm-exporters report their GPUs'
    # clocks, the candidate's SM clock held at 1,410 MHz, scraped by a real Prometheus
    ns = "team-a"
    arms = {
        "r-fp8-control": ("127.0.0.2", [], ""),
        "r-fp8-candidate": (
            "127.0.0.3",
            ["--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"],
            ",fp8-sm-clock=1410",
        ),
    }
    targets = []
    for pod, (ip, extra, clocks) in arms.items():
        port = free_port(ip)
        env = {**QUIET, "HOSTNAME": pod, "POD_NAMESPACE": ns}
        env["KVGATE_SIM_DCGM"] = f"port={port}{clocks}"
        sim([*VLLM, *extra], env, host=ip)
        targets.append(f"{ip}:{port}")
    start = time.time()
    with Prometheus(tmp_path / "prom", targets, scrape_interval="1s") as prom:
        prom.wait_up(2)
        time.sleep(3)  # a few scrapes into the window
        # WHEN the adapter reads both arms' clocks over the window
        clocks = adapter.gpu_clocks(prom.url, ns, list(arms), start=start, end=time.time())
        other_ns = adapter.gpu_clocks(prom.url, "team-b", list(arms), start=start, end=time.time())
    # THEN each arm has its own exporter's clocks, and the speed gate refuses to compare them
    control, candidate = clocks["r-fp8-control"], clocks["r-fp8-candidate"]
    assert control is not None and candidate is not None
    assert control.sm is not None and control.sm.mean == 2040.0 == control.sm.low
    assert candidate.sm is not None and candidate.sm.mean == 1410.0
    assert control.mem is not None and candidate.mem is not None
    assert control.mem.mean == candidate.mem.mean == 6251.0
    assert other_ns == {"r-fp8-control": None, "r-fp8-candidate": None}  # the namespace counts
    gate = SpeedGate(max_clock_difference=0.05)
    result = assess_speed(gate, 0.020, 0.022, ClocksRecord(control=control, candidate=candidate))
    assert (result.outcome, result.reason) == (Outcome.INCONCLUSIVE, "ClocksDiffer")


def test_a_pod_prometheus_does_not_scrape_is_unknown(sim, tmp_path) -> None:
    busy = sim(VLLM, BUSY, host="127.0.0.2")
    with Prometheus(tmp_path / "prom", [f"{busy.host}:{busy.port}"]) as prom:
        prom.wait_up(1)
        time.sleep(WINDOW_S)
        history = adapter.pool_history(
            prom.url,
            "vllm",
            {"web-0": busy.host, "web-1": "127.0.0.9"},
            window_s=WINDOW_S,
            step_s=STEP_S,
            now=time.time(),
        )
    assert history["web-1"] == []
    assert pool_pressure(history["web-1"]).pressured is None
    assert pool_pressure(history["web-0"]).pressured is True


def test_prometheus_down_is_an_external_error(tmp_path) -> None:
    prom = Prometheus(tmp_path / "prom", []).start()
    url = prom.url
    prom.stop()
    with pytest.raises(PrometheusError, match=r"127\.0\.0\.1") as info:
        adapter.pool_history(
            url, "vllm", {"web-0": "10.0.0.5"}, window_s=60, step_s=10, now=time.time(), timeout=2
        )
    assert isinstance(info.value, ExternalError)
    assert "query" not in str(info.value)  # the URL with the PromQL is not echoed


class _Fake(BaseHTTPRequestHandler):
    answers: ClassVar[dict[str, tuple[int, bytes]]] = {}

    def do_GET(self) -> None:
        status, body = self.answers[self.server.mode]  # type: ignore[attr-defined]
        if self.server.mode == "slow":  # type: ignore[attr-defined]
            time.sleep(3)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def fake() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _matrix(result: object) -> bytes:
    return json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": result}}
    ).encode()


_Fake.answers = {
    "http500": (500, b'{"status":"error","errorType":"internal","error":"boom"}'),
    "status-error": (200, b'{"status":"error","errorType":"bad_data","error":"parse error"}'),
    "junk": (200, b"<html>not prometheus</html>"),
    "vector": (
        200,
        json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode(),
    ),
    "huge": (
        200,
        b'{"status":"success","data":{"resultType":"matrix","result":[' + b" " * (9 << 20) + b"]}}",
    ),
    "nested": (200, b"[" * 100_000 + b"]" * 100_000),
    "nan": (
        200,
        _matrix(
            [
                {
                    "metric": {"__name__": "vllm:kv_cache_usage_perc", "instance": "10.0.0.5:8000"},
                    "values": [[1.0, "NaN"], [2.0, "0.5"], [3.0, "0.5"]],
                }
            ]
        ),
    ),
    "negative": (
        200,
        _matrix(
            [
                {
                    "metric": {
                        "__name__": "vllm:num_requests_waiting",
                        "instance": "10.0.0.5:8000",
                    },
                    "values": [[1.0, "-3"]],
                }
            ]
        ),
    ),
    "slow": (200, _matrix([])),
}


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("http500", "HTTP 500"),
        ("status-error", "parse error"),
        ("junk", "not JSON"),
        ("vector", "not a matrix"),
        ("huge", "larger than 8 MiB"),
        ("nested", "not JSON"),
        ("nan", "has value nan"),
        ("negative", "has value -3"),
        ("slow", "within 1 s"),
    ],
)
def test_a_bad_answer_is_a_prometheus_error(fake, mode, said) -> None:
    fake.mode = mode  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{fake.server_address[1]}"
    started = time.monotonic()
    with pytest.raises(PrometheusError) as info:
        adapter.pool_history(
            url, "vllm", {"web-0": "10.0.0.5"}, window_s=60, step_s=10, now=time.time(), timeout=1
        )
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert said in message and message.startswith(url)
    assert len(message) < 600 and "\n" not in message
