"""kvgate.sim figures: start-up time, request rate, CPU under synthetic load. Prints, asserts nothing.

.venv/bin/python bench/bench_sim.py
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("KVGATE_GSM8K_DIR") or REPO.parent / "shared/data/gsm8k")
SERVE = [
    "vllm",
    "serve",
    "Qwen/Qwen3-8B",
    "--max-model-len",
    "8192",
    "--attention-backend",
    "TRITON_ATTN",
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str, float]:
    port = free_port()
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvgate.sim", *SERVE, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env},
    )
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url, time.monotonic() - began
        except httpx.HTTPError:
            time.sleep(0.02)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    rows = [json.loads(line) for line in (DATA / "test.jsonl").open()][:400]
    shots = [json.loads(line) for line in (DATA / "train.jsonl").open()][:5]

    def prompt(question: str) -> str:
        parts = [f"Question: {s['question']}\nAnswer: {s['answer']}" for s in shots]
        return "\n\n".join([*parts, f"Question: {question}\nAnswer:"])

    proc, url, startup = start({"KVGATE_SIM_SPEED": "0.001"})
    print(f"start-up to /health 200 (Python start, GSM8K index, logs): {startup:.2f} s")
    client = httpx.Client(limits=httpx.Limits(max_connections=32))

    def ask(row: dict[str, str]) -> None:
        body = {"prompt": prompt(row["question"]), "max_tokens": 256, "stop": ["Question:"]}
        client.post(url + "/v1/completions", json=body, timeout=60).raise_for_status()

    for concurrency in (1, 16):
        began = time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(ask, rows))
        rate = len(rows) / (time.monotonic() - began)
        print(
            f"5-shot GSM8K completions at KVGATE_SIM_SPEED=0.001, {concurrency:2d} in flight: {rate:.0f} req/s"
        )
    client.close()
    proc.terminate()
    proc.wait(timeout=10)

    for speed in ("1.0", "0.01", "0.001"):
        load = {
            "KVGATE_SIM_SPEED": speed,
            "KVGATE_SIM_LOAD": "concurrency=64,prompt=2000,output=400",
        }
        proc, url, _ = start(load)
        time.sleep(1.0)
        before = cpu_seconds(proc.pid)
        time.sleep(5.0)
        used = cpu_seconds(proc.pid) - before
        text = httpx.get(url + "/metrics").text
        tokens = next(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("vllm:generation_tokens_total")
        )
        print(
            f"synthetic load 64x(2000+400) at speed {speed}: {100 * used / 5:.1f}% of one core, {tokens:,.0f} tokens so far"
        )
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
