"""Throughput and memory of `kvgate.logs` on a 100 MB startup-plus-traffic log.

    .venv/bin/python bench/bench_log_scan.py [--mb 100]

Builds a vLLM log: the L4 FlashInfer startup from tests/data/logs, then request traffic
(uvicorn access lines, per-request lines, the 10-second stats line, a warning now and then)
and finally the crash, so the scanner has to find lines at both ends. Prints MB/s for
`scan_log` (whole text) and `scan_lines` (file iteration), and the peak memory traced while
streaming, and the worst case where every line is a candidate. The goal is >= 100 MB/s on
the realistic log; nothing here is asserted. Figures move with machine load: run it alone.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "operator"))

from kvgate.logs import RULES, scan_lines, scan_log  # noqa: E402

STARTUP = ROOT / "tests/data/logs/vllm-0.13-fp8-l4-flashinfer-jit-failed.txt"
API = "(APIServer pid=1) "


def _noise(rng: random.Random, second: int) -> str:
    roll = rng.random()
    stamp = f"11-29 20:{second // 60 % 60:02d}:{second % 60:02d}"
    ip = f"10.42.{rng.randrange(256)}.{rng.randrange(256)}:{rng.randrange(30000, 60000)}"
    if roll < 0.70:
        return f'{API}INFO:     {ip} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
    if roll < 0.85:
        rid = f"chatcmpl-{rng.getrandbits(64):016x}"
        return f"{API}INFO {stamp} [logger.py:40] Received request {rid}: prompt: None, params: SamplingParams(n=1, temperature=0.0, max_tokens=256), lora_request: None.\n"
    if roll < 0.97:
        return f"{API}INFO {stamp} [async_llm.py:261] Added request chatcmpl-{rng.getrandbits(64):016x}.\n"
    if roll < 0.999:
        usage = rng.uniform(0, 100)
        return (
            f"{API}INFO {stamp} [loggers.py:127] Engine 000: Avg prompt throughput: "
            f"{rng.uniform(0, 5000):.1f} tokens/s, Avg generation throughput: {rng.uniform(0, 900):.1f} "
            f"tokens/s, Running: {rng.randrange(64)} reqs, Waiting: {rng.randrange(8)} reqs, "
            f"GPU KV cache usage: {usage:.1f}%, Prefix cache hit rate: {rng.uniform(0, 50):.1f}%\n"
        )
    return f"{API}WARNING {stamp} [protocol.py:93] The following fields were present in the request but ignored: {{'stream_options'}}\n"


def build_log(path: Path, megabytes: int) -> int:
    startup = STARTUP.read_text().splitlines(keepends=True)
    crash_at = next(i for i, line in enumerate(startup) if "EngineCore failed to start" in line)
    rng = random.Random(20261129)
    target = megabytes * 1_000_000
    written = 0
    with path.open("w") as out:
        for line in startup[:crash_at]:
            out.write(line)
            written += len(line)
        second = 0
        batch: list[str] = []
        while written < target:
            line = _noise(rng, second)
            batch.append(line)
            written += len(line)
            if len(batch) == 4096:
                out.write("".join(batch))
                batch.clear()
                second += 1
        out.write("".join(batch))
        for line in startup[crash_at:]:
            out.write(line)
            written += len(line)
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="log size in MB (100)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per entry point (3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.log"
        size = build_log(path, args.mb)
        mb = size / 1e6
        print(
            f"log: {mb:.1f} MB, {sum(1 for _ in path.open()):,} lines, cpu count {os.cpu_count()}"
        )

        text = path.read_text()
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            scan = scan_log(text)
            best = min(best, time.perf_counter() - start)
        print(f"scan_log:   best of {args.repeat}: {best:.2f} s = {mb / best:.0f} MB/s")
        print(f"  findings: {', '.join(f'{f.code}@{f.line}' for f in scan.findings)}")
        del text

        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            with path.open(encoding="utf-8", newline="") as handle:
                streamed = scan_lines(handle)
            best = min(best, time.perf_counter() - start)
        print(f"scan_lines: best of {args.repeat}: {best:.2f} s = {mb / best:.0f} MB/s")
        print(f"  same result as scan_log: {streamed == scan}")

        # Worst case: every line holds an anchor ("GPU KV cache usage" in the stats line).
        rng = random.Random(1)
        stats = next(
            line for line in iter(lambda: _noise(rng, 0), None) if "Avg prompt throughput" in line
        )
        worst = stats * (20_000_000 // len(stats))
        start = time.perf_counter()
        scan_log(worst)
        took = time.perf_counter() - start
        print(
            f"worst case (every line a candidate), {len(worst) / 1e6:.0f} MB: {len(worst) / 1e6 / took:.0f} MB/s"
        )
        del worst

        # Hostile lines: 1 MB of repeated partial matches of each rule (quadratic before).
        prefixes = (
            "[2025-01-01 00:00:00 ",
            "INFO 01-01 00:00:00 [",
            "max_total_num_tokens=1,",
            "precluded higher-priority backend(s) ",
            "argument --kv-cache-dtype: invalid choice: x (choose from ",
        )
        worst_line = (0.0, "")
        for rule in RULES:
            lines = [p * (1_000_000 // len(p)) + rule.needle for p in prefixes]
            lines.append((rule.needle + " ") * (1_000_000 // (len(rule.needle) + 1)))
            for line in lines:
                start = time.perf_counter()
                scan_log(line)
                worst_line = max(worst_line, (time.perf_counter() - start, rule.name))
        print(
            f"hostile 1 MB lines, {len(RULES)} rules x {len(prefixes) + 1}: slowest "
            f"{worst_line[0] * 1000:.1f} ms ({worst_line[1]})"
        )

        tracemalloc.start()
        with path.open(encoding="utf-8", newline="") as handle:
            scan_lines(handle)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(f"scan_lines peak traced memory: {peak / 2**20:.1f} MiB (for a {mb:.0f} MB log)")


if __name__ == "__main__":
    main()
