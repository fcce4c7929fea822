"""What an FP8 KV cache buys on a real engine: vLLM 0.32 (CPU build) with `--kv-cache-dtype auto`
(BF16, the model's dtype) and `fp8`, the same 8 MiB pool, bursts of concurrent long requests.
Prints the table; writes nothing into the repository (`--out FILE` writes the table there).

    make vllmenv
    .venv/bin/python bench/bench_real_engine.py [--concurrency 4,6,12,32] [--one-after-another]

The model is hack/tiny_model.py's default tiny Qwen3 (random weights, 2,048 bytes of BF16 KV a
token), built into a temp dir. The pool is `--kv-cache-memory-bytes 8388608`: 4,096 BF16 tokens
(32 blocks of 128), 8,192 FP8 ones (64 blocks). Each request is 128 random tokens of this
model's tokenizer and 512 new tokens with ignore_eos, so it ends up holding 640 tokens in 5
blocks: 6 such requests fit in BF16's pool at once, 12 in FP8's. The default levels: 4 (both
roomy), 6 (BF16 at its edge), 12 (BF16 2x over, FP8 at its edge), 32 (both over).
The client is inference-perf (hack/real_vllm.burst: one stage of N requests at N in flight,
the load Job's config); tok/s, TTFT and TPOT from its stage report, in the engine's tokens.
Engine figures come from /metrics (counter deltas over the burst, gauges sampled every 0.5 s).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))

import real_vllm  # noqa: E402
from tiny_model import build  # noqa: E402


def loadavg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="4,6,12,32", help="comma-separated levels")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument(
        "--one-after-another",
        action="store_true",
        help="start, measure and stop BF16, then FP8 (default: both start at once, the bursts "
        "take turns so that one arm is measured while the other idles)",
    )
    parser.add_argument("--out", type=Path, help="also write the table (Markdown) to this file")
    args = parser.parse_args()
    levels = tuple(int(c) for c in args.concurrency.split(","))
    if not real_vllm.installed():
        print(f"no real vLLM at {real_vllm.VLLM_VENV}: run `make vllmenv`", file=sys.stderr)
        return 2

    loads: list[str] = [loadavg()]
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-real-") as tmp:
        model = build(Path(tmp) / "tiny-qwen3", corpus="words")
        logs = Path(tmp) / "logs"
        logs.mkdir()

        def shown(dtype: str, b: real_vllm.Burst) -> None:
            loads.append(loadavg())
            print(
                f"  {dtype:4} c={b.concurrency:<3} {b.wall_s:5.1f}s {b.tok_s:6.0f} tok/s "
                f"preempted {b.preemptions:<3} peak waiting {b.peak_waiting:<3} "
                f"(load {loads[-1]})",
                flush=True,
            )

        try:
            results = real_vllm.compare(
                model,
                levels,
                logs,
                max_tokens=args.max_tokens,
                side_by_side=not args.one_after_another,
                on_burst=shown,
            )
        except Exception:
            for log in sorted(logs.glob("*.log")):
                print(f"--- {log.name} (last 20 lines)", file=sys.stderr)
                print(
                    "\n".join(log.read_text(errors="replace").splitlines()[-20:]), file=sys.stderr
                )
            raise
    wall = time.monotonic() - began
    version = subprocess.run(
        [str(real_vllm.VLLM_VENV / "bin" / "python"), "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    mode = "one after the other" if args.one_after_another else "side by side, bursts in turn"
    head = (
        f"vLLM {version} (CPU), tiny Qwen3, pool 8 MiB, inference-perf bursts, 128 random tokens "
        f"in / {args.max_tokens} out "
        f"(ignore_eos); servers {mode}; nproc {os.cpu_count()}; "
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}; load average (1/5/15 min) at start {loads[0]}, "
        f"after each burst {', '.join(x.split()[0] for x in loads[1:])}; wall {wall:.0f} s"
    )
    text = f"{head}\n\n{real_vllm.table(results)}\n"
    print()
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
