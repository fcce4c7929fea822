"""SGLang's startup, failure and shutdown output, by version (text from engines.md §1-§5)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from kvgate.sim.capacity import (
    EMULATED_KV_DTYPES,
    KvPlan,
    not_emulated,
    plan_sglang,
    sglang_default_mem_fraction,
)
from kvgate.sim.cli import ServeArgs
from kvgate.sim.config import GIB, SimEnv
from kvgate.sim.logfmt import SglangLog
from kvgate.sim.vllm import StartupFailed, flashinfer_version

TP = "TP0"
SITE = "/usr/local/lib/python3.12/dist-packages"
SCALE_WARNING_OLD = (
    "Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of 1.0. "
    "This may lead to less accurate results!"
)
SCALE_WARNING_NEW = (
    "Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of 1.0."
)

_TORCH_DTYPES = {"fp8_e4m3": "torch.float8_e4m3fn", "fp8_e5m2": "torch.float8_e5m2"}
_SGLANG_FLASHINFER = (((0, 5, 23), "0.7.2"), ((0, 5, 10), "0.6.7.post2"), ((0, 0), "0.4.0rc3"))


def torch_kv_dtype(kv_dtype: str) -> str:
    return _TORCH_DTYPES.get(kv_dtype, "torch.bfloat16")


def default_backend(sm: tuple[int, int], version: tuple[int, ...]) -> str:
    """Hopper gets fa3, SM100 trtllm_mha (0.5.10+), everything else flashinfer (engines.md §2.2)."""
    if sm[0] == 9:
        return "fa3"
    if sm[0] == 10 and version >= (0, 5, 10):
        return "trtllm_mha"
    return "flashinfer"


@dataclass
class SglangStartup:
    args: ServeArgs
    env: SimEnv
    log: SglangLog
    plan: KvPlan | None = None
    backend: str = "flashinfer"
    context_len: int = 0
    mem_fraction: float = 0.0
    max_running: int = 0

    @property
    def version(self) -> tuple[int, ...]:
        return self.env.version_tuple

    def _pause(self, share: float) -> None:
        if self.env.startup_delay:
            time.sleep(self.env.startup_delay * share)

    def _die(self, final: str) -> StartupFailed:
        """Scheduler hit an exception; the parent kills the process tree."""
        text = (
            "Traceback (most recent call last):\n"
            f'  File "{SITE}/sglang/srt/managers/scheduler.py", line 2715, in run_scheduler_process\n'
            "    scheduler = Scheduler(\n"
            f'  File "{SITE}/sglang/srt/model_executor/model_runner.py", line 1803, in init_device_graphs\n'
            "    self.graph_runner = graph_runners[self.device](self)\n"
            f"{final}"
        )
        self.log.line(f"Scheduler hit an exception: {text}", TP)
        self.log.line("Received sigquit from a child process. It usually means the child failed.")
        return StartupFailed(-9)

    def server_args_repr(self) -> str:
        a = self.args
        fields = {
            "model_path": a.model,
            "tokenizer_path": a.all_args.get("tokenizer_path") or a.model,
            "host": a.host,
            "port": a.port,
            "dtype": "auto",
            "kv_cache_dtype": a.kv_cache_dtype,
            "mem_fraction_static": self.mem_fraction,
            "max_running_requests": a.max_num_seqs,
            "context_length": a.max_model_len,
            "attention_backend": a.attention_backend,
            "served_model_name": a.served_model_name,
            "enable_metrics": a.enable_metrics,
            "tp_size": a.all_args.get("tp_size", 1),
            "quantization_param_path": a.all_args.get("quantization_param_path"),
            "skip_server_warmup": a.skip_server_warmup,
        }
        return "ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"

    def run(self) -> None:
        args, env, log, v = self.args, self.env, self.log, self.version
        kv = args.kv_cache_dtype
        if kv not in EMULATED_KV_DTYPES:
            raise StartupFailed(not_emulated("SGLang", env.version, kv))
        self.mem_fraction = args.mem_fraction_static or sglang_default_mem_fraction(
            env.gpu_memory_gib
        )
        log.line(f"server_args={self.server_args_repr()}")
        self.context_len = args.max_model_len or env.model.max_position_embeddings
        if args.attention_backend is None:
            self.backend = default_backend(env.gpu.sm, v)
            if v < (0, 5, 10):
                message = f"Attention backend not explicitly specified. Use {self.backend} backend by default."
            else:
                message = f"Attention backend not specified. Use {self.backend} backend by default."
            log.line(message, TP if v < (0, 5, 10) else "")
        else:
            self.backend = args.attention_backend
        if self.backend == "fa3" and kv == "fp8_e5m2":
            log.line(
                "FlashAttention3 only supports fp8_e4m3 if using FP8; Setting attention backend to triton."
            )
            self.backend = "triton"
        log.line("Init torch distributed begin.", TP)
        log.line("Init torch distributed ends. mem usage=0.00 GB", TP)
        # SGLang's "GB" is GiB (its GB constant is 1 << 30)
        avail = env.gpu_memory_gib - 0.3
        log.line(f"Load weight begin. avail mem={avail:.2f} GB", TP)
        self._pause(0.4)
        weights_gb = env.model.weights_gib
        log.line(
            f"Load weight end. type={env.model.architecture}, dtype=torch.bfloat16, "
            f"avail mem={avail - weights_gb:.2f} GB, mem usage={weights_gb:.2f} GB.",
            TP,
        )
        if kv == "fp8_e4m3" and not args.all_args.get("quantization_param_path"):
            # gated on --quantization-param-path only: checkpoint scales do not silence it
            log.line(SCALE_WARNING_OLD if v < (0, 5, 23) else SCALE_WARNING_NEW, TP)
        if kv.startswith("fp8") and v < (0, 5, 23):
            log.line(f"Using KV cache dtype: {torch_kv_dtype(kv)}", TP)
        if env.faults.oom_at_start:
            raise self._die(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total "
                f"capacity of {env.gpu_memory_gib:.2f} GiB of which 786.00 MiB is free."
            )
        plan = plan_sglang(env.model, env.gpu_memory_gib, self.mem_fraction, kv)
        self.plan = plan
        if plan.tokens <= 0:
            message = "Not enough memory. Please try to increase --mem-fraction-static."
            if v >= (0, 5, 3):
                message += f" Current value: mem_fraction_static={self.mem_fraction}"
            raise self._die(f"RuntimeError: {message}")
        half_gb = plan.tokens * plan.bytes_per_token / 2 / GIB
        if v < (0, 5, 23):
            log.line(
                f"KV Cache is allocated. #tokens: {plan.tokens}, K size: {half_gb:.2f} GB, V size: {half_gb:.2f} GB",
                TP,
            )
        else:
            log.line(
                f"KV Cache is allocated. dtype: {torch_kv_dtype(kv)}, #tokens: {plan.tokens}, "
                f"K size: {half_gb:.2f} GB, V size: {half_gb:.2f} GB",
                TP,
            )
        left = avail - weights_gb - 2 * half_gb
        log.line(f"Memory pool end. avail mem={left:.2f} GB", TP)
        if self.backend == "flashinfer" and kv.startswith("fp8") and env.faults.jit_build_fails:
            self._pause(0.3)
            raise self._die(_jit_final(v, env.gpu.arch, kv))
        log.line("Capture cuda graph begin. This can take up to several minutes.", TP)
        self._pause(0.4)
        log.line(
            f"Capture cuda graph end. Time elapsed: 11.84 s. mem usage=0.48 GB. avail mem={left - 0.48:.2f} GB.",
            TP,
        )
        self.max_running = args.max_num_seqs or min(4096, max(1, plan.tokens // 64))
        max_running = self.max_running
        summary = (
            f"max_total_num_tokens={plan.tokens}, chunked_prefill_size=2048, max_prefill_tokens=16384, "
            f"max_running_requests={max_running}, context_len={self.context_len}, "
            f"available_gpu_mem={left - 0.48:.2f} GB"
        )
        log.line(summary, TP)

    def listening_lines(self, url: str, pid: int) -> None:
        log = self.log
        log.uvicorn(f"Started server process [{pid}]")
        log.uvicorn("Waiting for application startup.")
        log.uvicorn("Application startup complete.")
        log.uvicorn(f"Uvicorn running on {url} (Press CTRL+C to quit)")

    def ready_line(self) -> None:
        self.log.line("The server is fired up and ready to roll!")


def _jit_final(version: tuple[int, ...], arch: str, kv_dtype: str) -> str:
    fi = next(pin for floor, pin in _SGLANG_FLASHINFER if version >= floor)
    cache = f"/root/.cache/flashinfer/{fi}/{arch}/cached_ops"
    kv = "e5m2" if "e5m2" in kv_dtype else "e4m3"
    module = (
        f"batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_{kv}_dtype_o_bf16_dtype_idx_i32_"
        "head_dim_qk_128_head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False"
    )
    return (
        f"RuntimeError: Ninja build failed. Ninja output:\nninja: Entering directory `{cache}'\n"
        f"FAILED: [code=127] {cache}/{module}/batch_prefill.cuda.o\n"
        "/bin/sh: 1: /usr/local/cuda/bin/nvcc: not found\n"
        "ninja: build stopped: subcommand failed."
    )


def shutdown_lines(log: SglangLog) -> None:
    log.uvicorn("Shutting down")
    log.uvicorn("Waiting for application shutdown.")
    log.uvicorn("Application shutdown complete.")


__all__ = ["SglangStartup", "flashinfer_version"]
