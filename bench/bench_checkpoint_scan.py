"""Bytes read to learn whether a checkpoint carries KV scales: local directory and hub.

Writes a 30-shard checkpoint with the tensor names of a 36-layer Qwen3-style model (tiny
weights, a few MB per shard) to a temp dir, serves it from the loopback hub of the tests,
scans it each way and prints bytes read or served against the bytes the safetensors headers
take (8-byte length + JSON). Goal: at most 1.05x. Figures only; nothing is asserted.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "tests" / "integration")]

from hubserver import FakeHub, header_bytes, write_checkpoint  # noqa: E402
from huggingface_hub import constants, get_local_safetensors_metadata  # noqa: E402
from huggingface_hub.utils import disable_progress_bars  # noqa: E402

from kvgate.adapters.hub import read_hub_checkpoint, read_local_checkpoint  # noqa: E402
from kvgate.checkpoint.scales import scan_scales  # noqa: E402

SHARDS = 30
LAYERS = 36
WEIGHT_SHAPE = (384, 384)  # fp16: 288 KiB per weight, ~3.7 MB per shard
GOAL = 1.05


def rchar() -> int:
    """Bytes this process has read through read()/pread() so far (Linux /proc)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def measured(call: Callable[[], Any]) -> tuple[Any, int, float]:
    """(result, bytes read by the call, seconds); the cost of reading /proc itself is taken off."""
    baseline = rchar()
    overhead = rchar() - baseline
    before, start = rchar(), time.perf_counter()
    result = call()
    return result, rchar() - before - overhead, time.perf_counter() - start


def row(label: str, read: int, headers: int, seconds: float, note: str = "") -> None:
    ratio = read / headers
    verdict = "meets" if ratio <= GOAL else "misses"
    print(
        f"  {label:<44} {read:>11,} B  {ratio:7.2f}x  {seconds * 1000:7.1f} ms  {verdict} {GOAL}x {note}"
    )


def main() -> None:
    disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-") as tmp:
        directory = Path(tmp) / "repo"
        config = json.loads((ROOT / "tests/data/configs/qwen3-8b.json").read_text())
        files = write_checkpoint(
            directory, layers=LAYERS, shards=SHARDS, config=config, weight_shape=WEIGHT_SHAPE
        )
        total = sum(p.stat().st_size for p in files)
        headers = sum(header_bytes(p) for p in files)
        index_bytes = (directory / "model.safetensors.index.json").stat().st_size
        config_bytes = (directory / "config.json").stat().st_size
        print(
            f"checkpoint: {SHARDS} shards, {total:,} bytes of safetensors, {headers:,} header bytes"
        )
        print(
            f"            (+ index {index_bytes:,} B, config.json {config_bytes:,} B, read by every path)"
        )

        print(
            "local directory (safetensors bytes via /proc/self/io rchar, index+config subtracted):"
        )
        local, read, seconds = measured(lambda: read_local_checkpoint(directory))
        row(
            "kvgate read_local_checkpoint (pread)",
            read - index_bytes - config_bytes,
            headers,
            seconds,
        )
        _, read, seconds = measured(lambda: get_local_safetensors_metadata(directory))
        row(
            "huggingface_hub get_local_safetensors_metadata",
            read - index_bytes,
            headers,
            seconds,
            "(buffered reads)",
        )

        report = scan_scales(local.tensors, config=local.config, source=local.source)
        print(
            f"  scan: {report.coverage}, {len(report.covered_layers)}/{LAYERS} layers, {len(local.tensors)} tensors"
        )

        os.environ.setdefault("HF_HOME", str(Path(tmp) / "hf-home"))
        constants.HF_HUB_CACHE = str(Path(tmp) / "hf-cache")
        constants.HF_HUB_OFFLINE = False
        with FakeHub() as hub:
            hub.add_repo("bench/qwen3-36l", directory)
            print("hub over HTTP (body bytes the loopback hub sent for .safetensors files):")
            for reader in ("ranges", "hfapi"):
                hub.reset_counts()
                start = time.perf_counter()
                read_hub_checkpoint("bench/qwen3-36l", endpoint=hub.endpoint, reader=reader)
                seconds = time.perf_counter() - start
                served = hub.bytes_served(".safetensors")
                other = sum(n for p, n in hub.served.items() if not p.endswith(".safetensors"))
                requests = len(hub.requests)
                label = (
                    "kvgate Range reads" if reader == "ranges" else "HfApi.get_safetensors_metadata"
                )
                row(label, served, headers, seconds, f"({requests} requests, +{other:,} B JSON)")


if __name__ == "__main__":
    main()
