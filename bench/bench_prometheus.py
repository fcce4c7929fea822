"""Cost of reading the pool's history from Prometheus (`config.prometheusURL`).

    .venv/bin/python bench/bench_prometheus.py [--pods 4] [--seconds 20]

1. Parsing: a query_range answer for P pods x 7 pool series x 241 steps (an hour at 15 s, the
   largest window a spec is likely to ask) is built, and `parse_matrix` + the reduction to
   snapshots (`snapshots_from_series`) are timed, with the body size and peak memory traced.
2. A real `prometheus` (Debian's package, hack/prometheus.py) scraping `--pods` simulated vLLM
   engines under load every second; after `--seconds`, `pool_history` over that window is
   timed (median of 20) against scraping the same pods directly once each.
Nothing is asserted; figures move with load.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT / "hack"))

from kvgate.adapters import prometheus as adapter  # noqa: E402
from kvgate.adapters.http import scrape  # noqa: E402
from kvgate.evidence.metrics import parse_metrics  # noqa: E402
from kvgate.evidence.pool import pool_pressure  # noqa: E402
from prometheus import Prometheus, binary, free_port  # noqa: E402

NAMES = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:gpu_cache_usage_perc",
)


def synthetic(pods: int, steps: int = 241) -> tuple[str, dict[str, str]]:
    result = []
    ips = {f"web-{i}": f"10.0.{i // 250}.{i % 250 + 1}" for i in range(pods)}
    for ip in ips.values():
        for name in NAMES:
            labels = {"__name__": name, "instance": f"{ip}:8000", "job": "vllm", "engine": "0"}
            values = [[1_700_000_000 + 15 * t, str(0.5 + (t % 7) / 20)] for t in range(steps)]
            result.append({"metric": labels, "values": values})
    body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    return json.dumps(body), ips


def bench_parse(pods: int) -> None:
    body, ips = synthetic(pods)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        found = adapter.parse_matrix(body)
        adapter.snapshots_from_series("vllm", ips, found)
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    adapter.snapshots_from_series("vllm", ips, adapter.parse_matrix(body))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(
        f"parse+reduce {pods:>3} pods x 7 series x 241 steps: body {len(body) / 1e6:.2f} MB, "
        f"median {statistics.median(times) * 1000:.0f} ms, peak {peak / 1e6:.1f} MB"
    )


def bench_real(pods: int, seconds: float) -> None:
    if binary() is None:
        print("prometheus not installed: real-server figures skipped")
        return
    env = {
        **os.environ,
        "KVGATE_SIM_SPEED": "0.01",
        "KVGATE_SIM_LOAD": "concurrency=64,prompt=2000,output=400",
        "PYTHONPATH": str(ROOT / "operator"),
    }
    procs, targets, ips = [], [], {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for i in range(pods):
                host = f"127.0.0.{i + 2}"
                port = free_port(host)
                args = ["vllm", "serve", "Qwen/Qwen3-8B", "--max-model-len", "8192"]
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "kvgate.sim",
                            *args,
                            "--host",
                            host,
                            "--port",
                            str(port),
                        ],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
                targets.append(f"{host}:{port}")
                ips[f"web-{i}"] = host
            with Prometheus(Path(tmp) / "prom", targets) as prom:
                prom.wait_up(pods, timeout=60)
                time.sleep(seconds)
                times, verdicts = [], {}
                for _ in range(20):
                    start = time.perf_counter()
                    history = adapter.pool_history(
                        prom.url, "vllm", ips, window_s=seconds, step_s=1.0, now=time.time()
                    )
                    times.append(time.perf_counter() - start)
                    verdicts = {p: pool_pressure(s).pressured for p, s in history.items()}
                start = time.perf_counter()
                for target in targets:
                    parse_metrics(scrape(f"http://{target}/metrics"), "vllm")
                direct = time.perf_counter() - start
            steps = len(next(iter(history.values())))
            print(
                f"real prometheus, {pods} sims, {seconds:g} s window at 1 s ({steps} steps): "
                f"pool_history median {statistics.median(times) * 1000:.0f} ms "
                f"(max {max(times) * 1000:.0f} ms); one direct scrape of each pod "
                f"{direct * 1000:.0f} ms (a live window needs {seconds:g} s); verdicts {verdicts}"
            )
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    options = parser.parse_args()
    for pods in (8, 64):
        bench_parse(pods)
    httpx.Client()  # warm the import before timing
    bench_real(options.pods, options.seconds)


if __name__ == "__main__":
    main()
