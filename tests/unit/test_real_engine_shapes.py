"""kvgate's reading of recorded real vLLM 0.32 (CPU) startups matches what it predicts from the
checkpoints that were served (tests/data/real-engine/README.md: built by hack/tiny_model.py with
the shapes below, served with an 8 MiB pool at max-model-len 2048). The live check of a shape
of its own is tests/realengine/test_shapes_real_vllm.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvgate.commands.preflight import PoolOptions, preflight
from kvgate.evidence.logs import scan_log
from tiny_model import build

REAL_ENGINE = Path(__file__).resolve().parents[1] / "data" / "real-engine"
POOL_BYTES = 8 * 1024 * 1024
CPU = PoolOptions(version=(0, 32, 0), block_size=128)

# log -> (the builder's shape, the dtype it was served with)
SERVED: dict[str, tuple[dict[str, Any], str]] = {
    "qwen3-bf16": ({}, "auto"),
    "qwen3-fp8": ({}, "fp8"),
    "llama-bf16": ({"arch": "llama"}, "auto"),
    "qwen3-l2-h8-kv4-d32-bf16": ({"layers": 2, "heads": 8, "kv_heads": 4, "head_dim": 32}, "auto"),
}


@pytest.mark.parametrize("name", sorted(SERVED))
def test_recorded_startup_matches_the_checkpoints_prediction(name: str, tmp_path: Path) -> None:
    shape, dtype = SERVED[name]
    model = build(tmp_path / name, corpus="words", **shape)
    summary = preflight(str(model), None, None, POOL_BYTES, 2048, CPU)
    expected = summary["vllm_pool"]["bf16" if dtype == "auto" else "fp8"]
    scan = scan_log((REAL_ENGINE / f"{name}.log").read_text())
    assert (scan.engine_version, scan.kv_cache_dtype, scan.attention_backend, scan.ready) == (
        "0.32.0",
        dtype,
        "CPU_ATTN",
        True,
    )
    assert scan.capacity.kv_tokens == expected["kv_tokens"]
    assert scan.capacity.max_concurrency == pytest.approx(expected["max_concurrency"], abs=0.01)


def test_the_gpu_block_size_would_have_mispredicted_a_cpu_pool(tmp_path: Path) -> None:
    """The shape of the live test: with vLLM's GPU block (16) the prediction is 80 tokens off."""
    model = build(tmp_path / "l3", corpus="words", arch="llama", layers=3, heads=8, kv_heads=4,
                  head_dim=32)  # fmt: skip
    cpu = preflight(str(model), None, None, POOL_BYTES, 2048, CPU)
    gpu = preflight(str(model), None, None, POOL_BYTES, 2048, PoolOptions(version=(0, 32, 0)))
    assert (cpu["vllm_pool"]["bf16"]["kv_tokens"], gpu["vllm_pool"]["bf16"]["kv_tokens"]) == (
        5376,
        5456,
    )
