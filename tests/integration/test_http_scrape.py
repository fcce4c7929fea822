"""kvgate.adapters.http against loopback servers: a /metrics whose counters move, errors, and
kvgate.sim (its /metrics parsed and its startup log scanned by kvgate's own readers)."""

from __future__ import annotations

import io
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise

import httpx
import pytest

from kvgate.adapters.http import scrape, scrape_series, scrape_snapshot
from kvgate.cli import main
from kvgate.commands import scrape as scrape_command
from kvgate.errors import ScrapeError
from kvgate.evidence.logs import scan_log
from kvgate.evidence.metrics import delta
from kvgate.evidence.pool import pool_pressure

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class MovingMetrics:
    """A vLLM-like /metrics: every scrape adds 500 tokens, one preemption and 10 ITL samples."""

    def __init__(self) -> None:
        self.scrapes = 0
        self.lock = threading.Lock()

    def render(self) -> str:
        with self.lock:
            self.scrapes += 1
            n = self.scrapes
        return f"""\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 0.96
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} 48.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} {n % 3}.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="m"}} {n}.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="m"}} {500 * n}.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.05",model_name="m"}} {5 * n}.0
vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.1",model_name="m"}} {10 * n}.0
vllm:inter_token_latency_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {10 * n}.0
vllm:inter_token_latency_seconds_sum{{engine="0",model_name="m"}} {0.6 * n}
vllm:inter_token_latency_seconds_count{{engine="0",model_name="m"}} {10 * n}.0
"""


@pytest.fixture
def server() -> Iterator[tuple[str, MovingMetrics]]:
    metrics = MovingMetrics()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/slow":
                time.sleep(1.0)
            if self.path in {"/metrics", "/slow"}:
                body = metrics.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
            else:
                body = b"not found\n"
                self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # keep pytest output clean
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", metrics
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def test_scrape_reads_the_body(server: tuple[str, MovingMetrics]) -> None:
    url, metrics = server
    assert "vllm:kv_cache_usage_perc" in scrape(url + "/metrics")
    assert metrics.scrapes == 1


def test_series_sees_the_counters_move(server: tuple[str, MovingMetrics]) -> None:
    url, metrics = server
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(seconds)

    series = scrape_series(url + "/metrics", 0.05, 4, sleep)
    assert (len(series), sleeps, metrics.scrapes) == (4, [0.05, 0.05, 0.05], 4)
    stamps = [s.taken_at for s in series]
    assert all(a is not None and b is not None and b > a for a, b in pairwise(stamps))
    window = delta(series[0], series[-1])
    assert window.generation_tokens == 1500.0
    assert window.preemptions == 3.0
    assert window.seconds is not None and window.seconds >= 0.15
    assert window.generation_token_rate == pytest.approx(1500.0 / window.seconds)
    assert window.itl is not None and window.itl.count == 30.0
    assert window.itl.mean == pytest.approx(0.06)
    pressure = pool_pressure(series)
    # at 96 % usage the first scrape has a queue (1 waiting), every later one a preemption
    assert (pressure.pressured, pressure.pressured_samples, pressure.preemptions) == (True, 4, 3.0)


def test_injected_client_is_reused_and_left_open(server: tuple[str, MovingMetrics]) -> None:
    url, _ = server
    with httpx.Client() as client:
        scrape_series(url + "/metrics", 0.0, 2, client=client)
        assert not client.is_closed
        assert scrape_snapshot(url + "/metrics", client=client).engine == "vllm"


def test_not_found(server: tuple[str, MovingMetrics]) -> None:
    url, _ = server
    with pytest.raises(ScrapeError) as info:
        scrape(url + "/nothing")
    assert str(info.value) == f"{url}/nothing: HTTP 404 Not Found"
    assert info.value.url == url + "/nothing"
    assert isinstance(info.value.__cause__, httpx.HTTPStatusError)


def test_timeout(server: tuple[str, MovingMetrics]) -> None:
    url, _ = server
    with pytest.raises(ScrapeError) as info:
        scrape(url + "/slow", timeout=0.2)
    assert str(info.value) == f"{url}/slow: no complete answer within 0.2 s"
    assert isinstance(info.value.__cause__, httpx.HTTPError)


def test_closed_port() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/metrics"
    with pytest.raises(ScrapeError) as info:
        scrape(url)
    assert str(info.value).startswith(f"{url}: ConnectError: ")


def test_cli_scrape(server: tuple[str, MovingMetrics], capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = server
    code = main(["scrape", url + "/metrics", "--samples", "3", "--interval", "0.01", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["pool_pressure"]["pressured"] is True
    assert data["window"]["generation_tokens"] == 1000.0


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_cli_scrape_defaults_answer_and_show_progress_on_a_terminal(
    server: tuple[str, MovingMetrics],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`kvgate scrape URL` as the README types it: enough samples for the verdict, and on a
    terminal one stderr line per sample. The waits are recorded, not slept: the server's
    counters move per scrape, not per second."""
    url, metrics = server
    sleeps: list[float] = []
    monkeypatch.setattr(scrape_command, "SLEEP", sleeps.append)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = main(["scrape", url + "/metrics"])
    out = capsys.readouterr().out
    n = scrape_command.DEFAULT_SAMPLES
    assert (code, metrics.scrapes, sleeps) == (0, n, [scrape_command.DEFAULT_INTERVAL] * (n - 1))
    assert "pool: pressured" in out.splitlines()
    waiting = [f"{i % 3}" for i in range(1, n + 1)]
    assert terminal.getvalue().splitlines() == [
        f"sample {i}/{n}: kv usage 96.0%, waiting {waiting[i - 1]}"
        + (f" (next in {scrape_command.DEFAULT_INTERVAL:g} s)" if i < n else "")
        for i in range(1, n + 1)
    ]


# -- against the simulator: kvgate's readers on the simulator's output ---------------------


def test_sim_vllm_fp8_metrics_and_log(sim: Callable[..., object]) -> None:
    engine = sim(
        ["vllm", "serve", "Qwen/Qwen3-8B", "--max-model-len", "8192", "--kv-cache-dtype", "fp8"],
        {"KVGATE_SIM_ENGINE_VERSION": "0.13.0", "KVGATE_SIM_FAULTS": "no-jit-build-fails"},
    )
    snapshot = scrape_snapshot(engine.url + "/metrics")  # type: ignore[attr-defined]
    assert snapshot.engine == "vllm"
    assert snapshot.kv_cache_dtype == "fp8"
    assert snapshot.kv_usage is not None and 0.0 <= snapshot.kv_usage <= 1.0
    scan = scan_log(engine.log())  # type: ignore[attr-defined]
    assert (scan.engine, scan.engine_version, scan.kv_cache_dtype) == ("vllm", "0.13.0", "fp8")
    assert scan.ready and not scan.failed
    assert scan.capacity.kv_tokens == snapshot.kv_capacity_tokens


def test_sim_vllm_l4_jit_failure_log(sim: Callable[..., object]) -> None:
    engine = sim(
        ["vllm", "serve", "Qwen/Qwen3-8B", "--max-model-len", "8192", "--kv-cache-dtype", "fp8"],
        {"KVGATE_SIM_ENGINE_VERSION": "0.13.0"},
        ready=False,
    )
    engine.wait(60)  # type: ignore[attr-defined]
    scan = scan_log(engine.log())  # type: ignore[attr-defined]
    assert scan.failed and not scan.ready
    assert "attention-build-failed" in scan.codes()
    assert scan.attention_backend == "FLASHINFER"


def test_sim_sglang_metrics_and_log(sim: Callable[..., object]) -> None:
    engine = sim(
        [
            "sglang",
            "--model-path",
            "Qwen/Qwen3-8B",
            "--kv-cache-dtype",
            "fp8_e4m3",
            "--enable-metrics",
        ],
        {"KVGATE_SIM_FAULTS": "no-jit-build-fails"},
    )
    snapshot = scrape_snapshot(engine.url + "/metrics", engine="sglang")  # type: ignore[attr-defined]
    assert snapshot.names["kv_usage"] == "sglang:token_usage"
    scan = scan_log(engine.log())  # type: ignore[attr-defined]
    assert (scan.engine, scan.kv_cache_dtype) == ("sglang", "fp8_e4m3")
    assert scan.ready and not scan.failed
