"""Throughput of `kvgate.evidence.logs` on a 100 MB production-shaped log, and its worst lines.

    .venv/bin/python bench/bench_log_scan.py [--mb 100] [--repeat 3] [--profile]

The log is what `kubectl logs` of a busy vLLM 0.33 pod holds: the startup of the real
fixture tests/data/engine-source/vllm-0.33.0-fp8-flashinfer-ready.log, then request traffic
in the engine's own formats (read out of the 0.33.0 and uvicorn 0.35 wheels:
vllm/entrypoints/serve/utils/request_logger.py `Received request %s: params: %s, lora_request:
%s.` and `Generated response %s%s: output: %r, finish_reason: %s` with --enable-log-requests
/--enable-log-outputs, v1/engine/async_llm.py `Added request %s.`, v1/metrics/loggers.py's
10-second stats line, uvicorn's access line for completions, /metrics scrapes and kubelet
probes; outputs are GSM8K answers, so some hold words such as "error" or "cache"), and at the
end a restart that fails (the fixture vllm-0.15.0-fp8-flashinfer-jit-failed.log), so the
scanner has to find lines at both ends. Prints MB/s for `scan_log` (whole text) and
`scan_lines` (file iteration), the worst case where every line is a candidate, the slowest of
the hostile 1 MB lines (every rule's needle after 1 MB of partial matches), and the peak
memory traced while streaming. The goals are >= 100 MB/s and < 0.1 s per 1 MB line; nothing
here is asserted (bench/RESULTS-log-scan.md has the figures). Figures move with load.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "operator"))

from kvgate.evidence.logs import RULES, LogScan, scan_lines, scan_log  # noqa: E402

SOURCE = ROOT / "tests/data/engine-source"
STARTUP = SOURCE / "vllm-0.33.0-fp8-flashinfer-ready.log"
RESTART = SOURCE / "vllm-0.15.0-fp8-flashinfer-jit-failed.log"
GSM8K = Path("/work/shared/data/gsm8k/test.jsonl")
API = "(APIServer pid=1) "
PARAMS = (
    "SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, "
    "temperature=0.0, watermarking=None, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[], "
    "stop_token_ids=[], bad_words=[], thinking_token_budget=None, "
    "include_stop_str_in_output=False, ignore_eos=False, max_tokens={max_tokens}, min_tokens=0, "
    "logprobs=None, prompt_logprobs=None, skip_special_tokens=True, "
    "spaces_between_special_tokens=True, structured_outputs=None, extra_args=None)"
)


def _fixture(path: Path) -> list[str]:
    """A fixture's log lines without its `#:` provenance comments."""
    return [
        line for line in path.read_text().splitlines(keepends=True) if not line.startswith("#:")
    ]


def _outputs() -> list[str]:
    if GSM8K.exists():
        with GSM8K.open() as handle:
            return [json.loads(line)["answer"] for line in handle][:500]
    return [  # without the shared data set: answers of the same shape
        "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 18",
        "It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo the total is 2+1=<<2+1=3>>3\n#### 3",
    ]


class Traffic:
    """Request traffic of one busy pod, line by line, in the engines' own formats."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.outputs = _outputs()
        self.second = 0
        self.requests = 0

    def _stamp(self) -> str:
        s = self.second
        return f"11-29 {20 + s // 3600 % 4:02d}:{s // 60 % 60:02d}:{s % 60:02d}"

    def _peer(self) -> str:
        rng = self.rng
        return f"10.42.{rng.randrange(256)}.{rng.randrange(256)}:{rng.randrange(30000, 60000)}"

    def second_of_traffic(self) -> list[str]:
        """What one second prints: ~20 requests, and the periodic lines."""
        rng, stamp, lines = self.rng, self._stamp(), []
        for _ in range(rng.randrange(10, 30)):
            rid = f"chatcmpl-{rng.getrandbits(64):016x}"
            params = PARAMS.replace("{max_tokens}", str(rng.choice((256, 512, 1024))))
            lines.append(
                f"{API}INFO {stamp} [request_logger.py:66] Received request {rid}: "
                f"params: {params}, lora_request: None.\n"
            )
            lines.append(f"{API}INFO {stamp} [async_llm.py:587] Added request {rid}.\n")
            output = rng.choice(self.outputs)
            lines.append(
                f"{API}INFO {stamp} [request_logger.py:119] Generated response {rid}: "
                f"output: {output!r}, finish_reason: stop\n"
            )
            peer = self._peer()
            lines.append(f'{API}INFO:     {peer} - "POST /v1/chat/completions HTTP/1.1" 200\n')
            self.requests += 1
        if self.second % 10 == 0:
            lines.append(
                f'{API}INFO:     10.42.0.1:{rng.randrange(30000, 60000)} - "GET /health HTTP/1.1" 200\n'
            )
            lines.append(
                f"{API}INFO {stamp} [loggers.py:257] Engine 000: Avg prompt throughput: "
                f"{rng.uniform(0, 5000):.1f} tokens/s, Avg generation throughput: "
                f"{rng.uniform(0, 900):.1f} tokens/s, Running: {rng.randrange(64)} reqs, "
                f"Waiting: {rng.randrange(8)} reqs, GPU KV cache usage: "
                f"{rng.uniform(0, 100):.1f}%, Prefix cache hit rate: {rng.uniform(0, 50):.1f}%\n"
            )
        if self.second % 15 == 0:
            lines.append(f'{API}INFO:     {self._peer()} - "GET /metrics HTTP/1.1" 200\n')
        self.second += 1
        return lines


def build_log(path: Path, megabytes: int) -> int:
    target = megabytes * 1_000_000
    traffic = Traffic(20261129)
    with path.open("w", encoding="utf-8") as out:
        out.writelines(_fixture(STARTUP))
        while out.tell() < target:
            out.write("".join(line for _ in range(50) for line in traffic.second_of_traffic()))
        out.writelines(_fixture(RESTART))
    return path.stat().st_size


CPU = {"seconds": 0.0}  # CPU time of the last _best's best run: the figure load moves least


def _best(repeat: int, run: Callable[[], object]) -> float:
    """Best wall time of `repeat` runs (and its CPU time in CPU["seconds"])."""
    best = float("inf")
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        run()
        took = time.perf_counter() - start
        if took < best:
            best, CPU["seconds"] = took, time.process_time() - cpu
    return best


def _whole_text(path: Path, mb: float, repeat: int, profile: bool) -> LogScan:
    text = path.read_text(encoding="utf-8")
    scan = scan_log(text)
    took = _best(repeat, lambda: scan_log(text))
    print(
        f"scan_log:   best of {repeat}: {took:.2f} s = {mb / took:.0f} MB/s "
        f"(CPU {CPU['seconds']:.2f} s = {mb / CPU['seconds']:.0f} MB per CPU-second)"
    )
    print(f"  findings: {', '.join(f'{f.code}@{f.line}' for f in scan.findings)}")
    if profile:
        profiler = cProfile.Profile()
        profiler.runcall(scan_log, text)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
    return scan


def _worst_case(worst: str) -> None:
    took = _best(1, lambda: scan_log(worst))
    print(
        f"worst case (every line a candidate), {len(worst) / 1e6:.0f} MB: "
        f"{len(worst) / 1e6 / took:.0f} MB/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="log size in MB (100)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per entry point (3)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of scan_log")
    args = parser.parse_args()
    print(f"cpu count {os.cpu_count()}, load average {os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.log"
        size = build_log(path, args.mb)
        mb = size / 1e6
        with path.open(encoding="utf-8") as handle:
            print(f"log: {mb:.1f} MB, {sum(1 for _ in handle):,} lines")

        scan = _whole_text(path, mb, args.repeat, args.profile)

        def streamed() -> object:
            with path.open(encoding="utf-8", newline="") as handle:
                return scan_lines(handle)

        took = _best(args.repeat, streamed)
        print(
            f"scan_lines: best of {args.repeat}: {took:.2f} s = {mb / took:.0f} MB/s "
            f"(CPU {CPU['seconds']:.2f} s = {mb / CPU['seconds']:.0f} MB per CPU-second)"
        )
        print(f"  same result as scan_log: {streamed() == scan}")

        # Worst case: every line holds an anchor (the stats line carries "KV cache").
        stats = next(
            line for line in Traffic(1).second_of_traffic() if "Avg prompt throughput" in line
        ).replace("Avg prompt throughput", "Avg prompt rate")
        _worst_case(stats * (20_000_000 // len(stats)))

        # Hostile lines: 1 MB of repeated partial matches of each rule (quadratic before).
        prefixes = (
            "[2025-01-01 00:00:00 ",
            "INFO 01-01 00:00:00 [",
            "max_total_num_tokens=1,",
            "precluded higher-priority backend(s) ",
            "argument --kv-cache-dtype: invalid choice: x (choose from ",
        )
        slowest = (0.0, "")
        for rule in RULES:
            lines = [p * (1_000_000 // len(p)) + rule.needle for p in prefixes]
            lines.append((rule.needle + " ") * (1_000_000 // (len(rule.needle) + 1)))
            for line in lines:
                slowest = max(slowest, (_best(1, lambda line=line: scan_log(line)), rule.name))
        print(
            f"hostile 1 MB lines, {len(RULES)} rules x {len(prefixes) + 1}: slowest "
            f"{slowest[0] * 1000:.1f} ms ({slowest[1]})"
        )

        tracemalloc.start()
        streamed()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(f"scan_lines peak traced memory: {peak / 2**20:.1f} MiB (for a {mb:.0f} MB log)")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
