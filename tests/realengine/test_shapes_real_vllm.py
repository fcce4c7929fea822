"""What kvgate says about a real vLLM 0.32 holds on a shape none of the other tests use.

A tiny Llama with 3 layers, 8 heads, 4 KV heads and head_dim 32 (1,536 bytes of BF16 KV a
token: 8 MiB is not a whole number of the CPU build's 128-token blocks, so the rounding shows),
served with BF16 and with FP8 KV. For each, kvgate's three readings must agree with the
engine's own numbers: the startup log (`scan_log`: version, dtype, backend, KV tokens, max
concurrency, ready), the /metrics (`parse_metrics`: dtype and pool tokens), and `preflight`'s
prediction from the checkpoint alone (with the CPU build's block size).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import real_vllm
from kvgate.logs import scan_log
from kvgate.metrics import parse_metrics

pytestmark = [pytest.mark.realengine, pytest.mark.timeout(1200)]

SHAPE: dict[str, Any] = {"arch": "llama", "layers": 3, "heads": 8, "kv_heads": 4, "head_dim": 32}
CPU_BLOCK = 128  # vllm/platforms/cpu.py: every non-MLA model on the CPU build


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def model(vllm_installed: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_model import build

    return build(
        tmp_path_factory.mktemp("shape") / "tiny-llama-l3-h8-kv4-d32", corpus="words", **SHAPE
    )


@pytest.fixture(scope="module")
def predicted(model: Path) -> dict[str, Any]:
    """`kvgate preflight` on the checkpoint alone, for the pool the servers get."""
    proc = subprocess.run(
        [
            sys.executable, "-m", "kvgate", "preflight", str(model), "--json",
            "--gpu-memory-gib", str(real_vllm.SMALL_POOL_BYTES / 2**30),
            "--max-model-len", str(real_vllm.MAX_MODEL_LEN),
            "--vllm-version", "0.32.0", "--block-size", str(CPU_BLOCK),
        ],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return dict(json.loads(proc.stdout))


@pytest.fixture(scope="module", params=["auto", "fp8"])
def served(
    request: pytest.FixtureRequest, model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, str]]:
    """(kv dtype, startup log, /metrics) of a real server, read while it runs."""
    dtype = str(request.param)
    log = tmp_path_factory.mktemp(f"shape-{dtype}") / "vllm.log"
    with real_vllm.serve(model, log, port=free_port(), kv_cache_dtype=dtype) as url:
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        yield dtype, log.read_text(errors="replace"), metrics


def test_kvgate_reads_the_real_engine_as_it_is(
    served: tuple[str, str, str], predicted: dict[str, Any]
) -> None:
    dtype, log, metrics = served
    key = "bf16" if dtype == "auto" else "fp8"
    expected = predicted["vllm_pool"][key]

    snapshot = parse_metrics(metrics, "vllm")
    info = snapshot.cache_config
    assert (info["cache_dtype"], int(info["block_size"])) == (dtype, CPU_BLOCK), info
    tokens = int(info["kv_cache_size_tokens"])
    assert snapshot.kv_capacity_tokens() == tokens == int(info["num_gpu_blocks"]) * CPU_BLOCK

    scan = scan_log(log)
    assert (scan.engine, scan.engine_version, scan.ready, scan.failed) == (
        "vllm",
        "0.32.0",
        True,
        False,
    )
    assert scan.kv_cache_dtype == dtype
    assert scan.attention_backend == "CPU_ATTN"  # from the platform: the engine logs none
    assert scan.capacity.kv_tokens == tokens
    # preflight's prediction from the checkpoint: the engine's own figures, rounding included
    assert expected["kv_tokens"] == tokens, (expected, tokens)
    assert expected["num_blocks"] == int(info["num_gpu_blocks"])
    assert scan.capacity.max_concurrency == pytest.approx(expected["max_concurrency"], abs=0.01)


def test_fp8_holds_what_preflight_says(predicted: dict[str, Any]) -> None:
    """Not exactly twice here: 8 MiB holds 42 blocks of BF16 and 85 of FP8."""
    pool = predicted["vllm_pool"]
    assert (pool["bf16"]["kv_tokens"], pool["fp8"]["kv_tokens"]) == (42 * 128, 85 * 128)
