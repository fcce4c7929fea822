"""kvgate.evidence.logs over vLLM 0.6-0.8 lines rendered from the published wheels' own strings.

tests/data/engine-source-old/*.log come from tests/old_wordings_from_wheels.py (each line is
preceded by `#: <wheel> <path>:<line>`): the older wordings the field corpus met (issue 23).
"""

from __future__ import annotations

from pathlib import Path

from kvgate.evidence.logs import LogScan, scan_log

DATA = Path(__file__).parents[1] / "data" / "engine-source-old"


def scan(name: str) -> LogScan:
    text = "".join(
        line
        for line in (DATA / f"{name}.log").read_text().splitlines(True)
        if not line.startswith("#:")
    )
    return scan_log(text)


def test_vllm_0_6_fp8_falls_back_from_flash_attention_2_to_xformers() -> None:
    result = scan("vllm-0.6.3-fp8-fa2-xformers")
    assert (result.engine, result.engine_version) == ("vllm", "0.6.3.post1")
    assert (result.kv_cache_dtype, result.attention_backend) == ("fp8", "XFORMERS")
    fallback = result.finding("attention-backend-fallback")
    assert fallback is not None and "FlashAttention-2" in fallback.text
    # 2654 blocks x 16 / 8192 prints 5.18x; no other block size does (vllm 0.6 gpu_executor)
    assert (result.capacity.kv_tokens, result.capacity.max_concurrency) == (2654 * 16, 5.18)
    assert {"fp8-kv-enabled", "attention-backend", "kv-capacity"} <= set(result.codes())
    assert not result.failed


def test_vllm_0_7_v1_blocks_and_a_crash_while_building_the_engine_core() -> None:
    result = scan("vllm-0.7.3-v1-blocks-enginecore-start-crash")
    assert (result.engine, result.engine_version) == ("vllm", "0.7.3")
    assert (result.capacity.num_gpu_blocks, result.capacity.max_concurrency) == (1381, 10.79)
    assert result.failed
    assert {"engine-start-failed", "insufficient-kv-memory"} <= set(result.codes())


def test_vllm_0_8_v1_flash_attention_refuses_fp8() -> None:
    result = scan("vllm-0.8.0-v1-flash-attn-fp8-refused")
    assert (result.engine, result.engine_version) == ("vllm", "0.8.0")
    assert result.failed and "fp8-unsupported" in result.codes()


def test_every_old_fixture_is_tested() -> None:
    assert {p.stem for p in DATA.glob("*.log")} == {
        "vllm-0.6.3-fp8-fa2-xformers",
        "vllm-0.7.3-v1-blocks-enginecore-start-crash",
        "vllm-0.8.0-v1-flash-attn-fp8-refused",
    }


def test_the_remedy_below_010_is_v0s_xformers() -> None:
    """vLLM 0.6-0.9 have no Triton backend for FP8 KV: the remedy is the XFormers backend V0
    itself falls back to (kvgate.engines.versions, read from the 0.6.0-0.9.0 wheels); it was
    "no remedy" before those wheels were read. Older than 0.6 still gets none."""
    from kvgate.engines import versions as engine_versions

    xformers = ((), {"VLLM_ATTENTION_BACKEND": "XFORMERS", "VLLM_USE_FLASHINFER_SAMPLER": "0"})
    for version in ("0.6.3.post1", "0.7.3", "0.8.0", "0.9.2"):
        assert engine_versions.remedy_for("vllm", version, "attention-build-failed") == xformers
    assert engine_versions.remedy_for("vllm", "0.5.4", "attention-build-failed") is None
    hint = scan("vllm-0.8.0-v1-flash-attn-fp8-refused").finding("fp8-unsupported")
    assert hint is not None
    assert hint.hint.startswith(
        "This GPU/backend cannot store an FP8 KV cache: set VLLM_ATTENTION_BACKEND=XFORMERS and "
        "VLLM_USE_FLASHINFER_SAMPLER=0"
    )
