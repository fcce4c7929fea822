"""kvgate's capacity formula per KV format against real vLLM 0.32 (CPU): every
`--kv-cache-dtype` of that version served on hack/tiny_model.py's Qwen3 (8 MiB pool,
max-model-len 2048, one server at a time: hack/real_kv_formats.py, excerpts in
tests/data/real-engine/kv-formats/, README there).

What the CPU build showed: it refuses none of its 19 names. Its attention backend (CPU_ATTN)
packs nothing, so per-token-head, NVFP4 and even the DeepSeek-MLA names are stored as 1-byte
elements (the FP8 pool), and TurboQuant/UltraQuant keep their boundary layers (the first and
last two) in BF16, which on a 4-layer model is every layer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvgate.checkpoint.capacity import parse_kv_layout, vllm_pool
from kvgate.evidence.logs import scan_log
from tiny_model import Shape, build_config

DATA = Path(__file__).resolve().parents[1] / "data" / "real-engine" / "kv-formats"
RESULTS: list[dict[str, Any]] = json.loads((DATA / "results.json").read_text())
POOL_BYTES = 8 * 1024 * 1024
# the checkpoint variants of hack/real_kv_formats.py (VARIANTS): the shape is what counts here
SHAPES: dict[str, dict[str, Any]] = {
    "none": {},
    "calibrated": {},
    "broken": {},
    "none-l6": {"layers": 6},
}


def skip_layers(entry: dict[str, Any]) -> list[str]:
    args = entry["extra_args"]
    if "--kv-cache-dtype-skip-layers" not in args:
        return []
    return args[args.index("--kv-cache-dtype-skip-layers") + 1 :]


@pytest.mark.parametrize("entry", RESULTS, ids=[e["case"] for e in RESULTS])
def test_logged_kv_tokens_match_the_formula(entry: dict[str, Any]) -> None:
    scan = scan_log((DATA / f"{entry['case']}.log").read_text())
    assert (scan.engine_version, entry["accepted"]) == ("0.32.0", True)
    assert scan.capacity.kv_tokens == entry["kv_tokens_metrics"]  # the log and /metrics agree
    assert entry["completion_status"] == 200
    config = build_config(
        Shape(**SHAPES[entry["checkpoint"]]), kv_scales="none", bos_token_id=0, eos_token_id=1
    )
    predicted = vllm_pool(
        parse_kv_layout(config),
        POOL_BYTES,
        entry["kv_cache_dtype"],
        max_model_len=2048,
        version=(0, 32, 0),
        block_size=128,  # vLLM's CPU platform (vllm/platforms/cpu.py:293)
        kernel_block=32,  # CPU_ATTN's (cpu_attn.py:65)
        skip_layers=skip_layers(entry),
        backend="CPU_ATTN",
    )
    assert predicted.kv_tokens == scan.capacity.kv_tokens


def test_the_packed_layouts_would_have_predicted_other_pools() -> None:
    """Without the backend (the GPU layouts: Triton's inline scales, FlashInfer's FP4) the
    formula says something else for the same servers: the backend is part of the answer."""
    layout = parse_kv_layout(
        build_config(Shape(), kv_scales="none", bos_token_id=0, eos_token_id=1)
    )

    def tokens(dtype: str, backend: str | None) -> int:
        return vllm_pool(
            layout, POOL_BYTES, dtype, max_model_len=2048, version=(0, 32, 0), block_size=128,
            backend=backend,
        ).kv_tokens  # fmt: skip

    assert (tokens("int8_per_token_head", None), tokens("int8_per_token_head", "CPU_ATTN")) == (
        7680,  # 2 x (64 + 64 + 8) bytes a layer: 1,088 a token, 60 blocks of 128
        8192,
    )
    assert (tokens("nvfp4", None), tokens("nvfp4", "CPU_ATTN")) == (14464, 8192)


def test_every_name_of_the_version_was_served() -> None:
    from kvgate.engines import versions as engine_versions

    served = {e["kv_cache_dtype"] for e in RESULTS}
    assert engine_versions.facts_for("vllm", "0.32.0").kv_cache_dtypes - served == {"auto"}
    # auto on this build and model: tests/data/real-engine/qwen3-bf16.log


def test_zero_scales_are_fatal_under_fp8_and_unused_per_token_head(tmp_path: Path) -> None:
    """The same broken checkpoint: fp8 died at the first request, int8_per_token_head served,
    which is what the scan's per-format findings say."""
    from kvgate.adapters.hub import read_local_checkpoint
    from kvgate.checkpoint.scales import format_findings
    from tiny_model import build

    fp8 = (DATA.parent / "qwen3-broken-fp8.log").read_text()
    per_head = (DATA / "broken-int8_per_token_head.log").read_text()
    assert "k_scale must be positive for FP8 path" in fp8
    assert "k_scale must be positive" not in per_head
    assert '"POST /v1/completions HTTP/1.1" 200' in per_head
    _, report = read_local_checkpoint(
        build(tmp_path / "b", corpus="words", kv_scales="broken")
    ).analyse()
    assert [f.code for f in format_findings(report, "vllm", "fp8")] == ["ScalesBroken"]
    assert [f.code for f in format_findings(report, "vllm", "int8_per_token_head")] == [
        "ScalesUnused"
    ]
