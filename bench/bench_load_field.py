"""inference-perf against the simulator's field-report profile, both KV dtypes, 8/32/64 concurrent.

Prints the measured figures next to the field report's (BF16: 1,558 tok/s at 32 concurrent,
cannot serve 64; FP8: 2,192 tok/s at 64; FP8 a few percent slower per token). Asserts nothing.

    make loadenv
    KVGATE_GSM8K_DIR=../shared/data/gsm8k .venv/bin/python bench/bench_load_field.py [--speed 1.0]

The workload is the report's (~21k tokens of context per request): 20,000-token prompts,
1,000 tokens out, one round of `c` requests per stage; a 30 s client timeout (engine seconds).
Figures are engine-time: inference-perf's wall-clock figures x the simulator's speed.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))

from kvgate.load.config import LoadPlan, Stage  # noqa: E402
from kvgate.load.report import StageJudgement  # noqa: E402
from kvgate.load.runner import default_inference_perf, run_load  # noqa: E402
from kvgate.load.tokenizer import build_word_tokenizer  # noqa: E402

DATA = Path(os.environ.get("KVGATE_GSM8K_DIR") or REPO.parent / "shared/data/gsm8k")
PROMPT, OUTPUT = 20000, 1000
CONCURRENCY = (8, 32, 64)
CLIENT_TIMEOUT_S = 30.0
REPORT = {("bf16", 32): 1558.0, ("fp8", 64): 2192.0}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_engine(dtype: str, speed: float, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    args = ["vllm", "serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", str(port)]
    if dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8"]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "operator"),
        "KVGATE_SIM_GPU": "FIELD",
        "KVGATE_SIM_SPEED": str(speed),
        "KVGATE_SIM_DCGM": "off",
        "KVGATE_GSM8K_DIR": str(DATA),
    }
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvgate.sim", *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"engine {dtype} not healthy in 60 s; log: {log}")


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(
        float(m.group(1))
        for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    )


def pool_tokens(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=5).text
    found = re.search(r'kv_cache_size_tokens="(\d+)"', text) or re.search(
        r'num_gpu_blocks="(\d+)"', text
    )
    return int(found.group(1)) if found else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--speed", type=float, default=1.0, help="KVGATE_SIM_SPEED (1.0: real time)"
    )
    parser.add_argument("--workers", type=int, default=2, help="inference-perf load.num_workers")
    options = parser.parse_args()
    binary = default_inference_perf()
    if not binary.is_file():
        raise SystemExit(f"{binary} missing: run `make loadenv`")
    speed = options.speed
    rows: dict[tuple[str, int], tuple[StageJudgement, float, float]] = {}
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        work = Path(tmp)
        tokenizer = build_word_tokenizer(DATA / "train.jsonl", work / "simword")
        for dtype in ("bf16", "fp8"):
            proc, url = start_engine(dtype, speed, work / f"engine-{dtype}.log")
            try:
                print(
                    f"{dtype}: pool {pool_tokens(url):,} (from /metrics cache_config_info)",
                    flush=True,
                )
                for c in CONCURRENCY:
                    before = metric(url, "vllm:num_preemptions_total")
                    plan = LoadPlan(
                        base_url=url,
                        model_name="Qwen/Qwen3-8B",
                        tokenizer_dir=str(tokenizer),
                        report_dir=str(work / f"{dtype}-{c}" / "reports"),
                        stages=(Stage(c, c),),
                        prompt_tokens=PROMPT,
                        output_tokens=OUTPUT,
                        num_workers=options.workers,
                        request_timeout_s=CLIENT_TIMEOUT_S * speed,
                        stage_grace_s=10.0,
                        interval_s=0.5,
                    )
                    t0 = time.monotonic()
                    run = run_load(plan, work / f"{dtype}-{c}", timeout_s=600)
                    (stage,) = run.stages
                    preempted = metric(url, "vllm:num_preemptions_total") - before
                    rows[(dtype, c)] = (stage, preempted, time.monotonic() - t0)
                    print(f"  c={c}: {stage.status} in {time.monotonic() - t0:.0f} s", flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    print(
        f"\ninference-perf {binary}; SIM_SPEED={speed:g}; {PROMPT} in / {OUTPUT} out; figures x speed"
    )
    print(
        "| arm | c | status | out tok/s | TTFT p50 / p99 (s) | TPOT p50 (ms) | preemptions | report | note |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (dtype, c), (stage, preempted, _) in rows.items():
        r = stage.result
        tok = f"{r.output_tokens_per_s * speed:,.0f}" if r else "-"
        ttft = f"{r.ttft_s.p50 / speed:.1f} / {r.ttft_s.p99 / speed:.1f}" if r and r.ttft_s else "-"
        tpot = f"{r.tpot_s.p50 / speed * 1e3:.2f}" if r and r.tpot_s else "-"
        want = REPORT.get((dtype, c))
        vs = (
            f"{want:,.0f} ({(r.output_tokens_per_s * speed / want - 1) * 100:+.1f}%)"
            if want and r
            else ""
        )
        note = "; ".join(stage.reasons)[:90]
        print(
            f"| {dtype} | {c} | {stage.status} | {tok} | {ttft} | {tpot} | {preempted:.0f} | {vs} | {note} |"
        )
    for c in (8, 32):
        b, f = rows[("bf16", c)][0].measured, rows[("fp8", c)][0].measured
        if b and f and b.tpot_s and f.tpot_s:
            print(f"FP8 vs BF16 TPOT p50 at {c}: {(f.tpot_s.p50 / b.tpot_s.p50 - 1) * 100:+.1f}%")
    best_bf16 = max(
        (
            s.measured.output_tokens_per_s
            for (d, _), (s, _, _) in rows.items()
            if d == "bf16" and s.measured
        ),
        default=0.0,
    )
    fp8_64 = rows[("fp8", 64)][0].measured
    if best_bf16 and fp8_64:
        gain = fp8_64.output_tokens_per_s / best_bf16 - 1
        print(f"FP8 at 64 vs best BF16: {gain * 100:+.0f}% (report: +41%)")
    print(f"wall {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
