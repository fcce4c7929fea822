"""KV pool size from GPU memory, the model and the KV dtype, the way the engines compute it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Final

from kvgate.sim.config import GIB, ModelProfile

BLOCK_SIZE = 16  # vLLM's default page size in tokens
NON_TORCH_GIB = 0.32  # CUDA context, NCCL and allocator slack outside torch
ACTIVATION_PEAK_GIB = 1.02  # profile run at max_num_batched_tokens for an 8B model
CUDA_GRAPH_GIB = 0.45  # counted against the budget from vLLM 0.21 (memory profiling of graphs)


# Dtypes the engines accept and the simulator models; others (nvfp4, fp8_per_token_head, ...)
# are valid engine choices but refused here rather than silently run as BF16.
# vLLM's integer per-(token, head) formats, by bytes per element: on TRITON_ATTN (the backend
# that packs them) a token's page per layer and KV head is K and V at that size plus one fp32
# scale each (triton_attn.py:283-295 in 0.32; kvgate.engines.kvformats). Scales are computed at write
# time, never read from the checkpoint.
PER_TOKEN_HEAD: Final = {"int8_per_token_head": 1.0, "int4_per_token_head": 0.5}
EMULATED_KV_DTYPES = frozenset(
    {"auto", "bfloat16", "bf16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", *PER_TOKEN_HEAD}
)


def not_emulated(engine: str, version: str, kv_cache_dtype: str) -> int:
    """One line on stderr; the exit status for a usage error."""
    print(
        f"kvgate.sim: --kv-cache-dtype {kv_cache_dtype} is valid for {engine} {version} but not "
        f"emulated (emulated: {', '.join(sorted(EMULATED_KV_DTYPES))})",
        file=sys.stderr,
    )
    return 2


def kv_dtype_bytes(kv_cache_dtype: str) -> int:
    """Bytes per element: FP8 variants are one byte, everything else BF16."""
    return 1 if kv_cache_dtype.startswith("fp8") else 2


def quantized_kv(kv_cache_dtype: str) -> bool:
    """A KV cache below 16 bits: the arm KVGATE_SIM_FP8_* and the FP8-only faults apply to."""
    return kv_dtype_bytes(kv_cache_dtype) == 1 or kv_cache_dtype in PER_TOKEN_HEAD


def kv_bytes_per_token(model: ModelProfile, kv_cache_dtype: str) -> int:
    """The bytes one token occupies in the pool, every layer's K and V (and their scales)."""
    element = PER_TOKEN_HEAD.get(kv_cache_dtype)
    if element is None:
        return model.kv_bytes_per_token(kv_dtype_bytes(kv_cache_dtype))
    return model.layers * model.kv_heads * (int(2 * model.head_dim * element) + 2 * 4)


@dataclass(frozen=True)
class KvPlan:
    """What the engine allocates for the KV cache."""

    total_gib: float
    requested_gib: float
    available_bytes: int  # memory left for KV after weights and activations
    bytes_per_token: int
    num_blocks: int
    tokens: int

    @property
    def available_gib(self) -> float:
        return self.available_bytes / GIB


def plan_vllm(
    model: ModelProfile,
    total_gib: float,
    gpu_memory_utilization: float,
    kv_cache_dtype: str,
    version: tuple[int, ...],
) -> KvPlan:
    """vLLM: util x total - weights - activation peak - non-torch, in whole blocks."""
    requested = total_gib * gpu_memory_utilization
    overhead = model.weights_gib + ACTIVATION_PEAK_GIB + NON_TORCH_GIB
    if version >= (0, 21):
        overhead += CUDA_GRAPH_GIB
    available = max(0, int((requested - overhead) * GIB))
    per_token = kv_bytes_per_token(model, kv_cache_dtype)
    blocks = available // (per_token * BLOCK_SIZE)
    return KvPlan(total_gib, requested, available, per_token, blocks, blocks * BLOCK_SIZE)


def plan_sglang(
    model: ModelProfile, total_gib: float, mem_fraction_static: float, kv_cache_dtype: str
) -> KvPlan:
    """SGLang: what is left of total x mem_fraction_static after the weights, per token."""
    requested = total_gib * mem_fraction_static
    available = max(0, int((requested - model.weights_gib - NON_TORCH_GIB) * GIB))
    per_token = kv_bytes_per_token(model, kv_cache_dtype)
    tokens = available // per_token
    return KvPlan(total_gib, requested, available, per_token, tokens, tokens)


def sglang_default_mem_fraction(total_gib: float) -> float:
    """SGLang 0.5 picks the static fraction from the GPU size (smaller GPUs keep more headroom)."""
    if total_gib < 20:
        return 0.80
    if total_gib < 35:
        return 0.85
    if total_gib < 60:
        return 0.87
    return 0.88
