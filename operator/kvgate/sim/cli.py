"""Command lines of `vllm serve` and `python -m sglang.launch_server`, as the engines parse them.

Flags the simulator acts on are parsed for real; other flags of the real engines are
accepted and only echoed (in vLLM's "non-default args" line or SGLang's server_args dump).
An unknown flag or an invalid choice fails like the engine: argparse usage, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

# --kv-cache-dtype choices by version (engines.md §1.4 and §8).
_VLLM_DTYPES_010 = ["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"]  # 0.10.2 config/cache.py:25
_VLLM_DTYPES_011 = ["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"]
_VLLM_DTYPES_012 = [*_VLLM_DTYPES_011, "fp8_ds_mla"]
_VLLM_DTYPES_020 = [
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
    "int8_per_token_head", "fp8_per_token_head", "nvfp4",
]  # fmt: skip
_VLLM_DTYPES_026 = [*_VLLM_DTYPES_020, "int4_per_token_head"]
VLLM_DTYPES_033 = [
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
    "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
    "turboquant_3bit_nc", "octave_k3v4", "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
]  # fmt: skip

_SGLANG_DTYPES_053 = ["auto", "fp8_e5m2", "fp8_e4m3"]
_SGLANG_DTYPES_0510 = ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]
_SGLANG_DTYPES_0523 = [
    "auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16",
]  # fmt: skip

_SGLANG_BACKENDS_053 = [
    "triton", "torch_native", "flex_attention", "nsa", "cutlass_mla", "fa3", "fa4", "flashinfer",
    "flashmla", "trtllm_mla", "trtllm_mha", "dual_chunk_flash_attn", "aiter", "wave",
    "intel_amx", "ascend",
]  # fmt: skip
_SGLANG_BACKENDS_0523 = [
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4", "compressed", "fa3",
    "fa4", "flashinfer", "llada2_cfg_flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla",
    "tokenspeed_mla", "trtllm_mha", "hpc_ops", "minicpm_flashattn", "minicpm_flashinfer",
    "aiter", "wave", "intel_amx", "ascend", "intel_xpu",
]  # fmt: skip

VLLM_BACKENDS = [
    "FLASH_ATTN", "TRITON_ATTN", "FLASHINFER", "FLASHINFER_MLA", "TRITON_MLA", "CUTLASS_MLA",
    "FLASHMLA", "FLASHMLA_SPARSE", "FLASH_ATTN_MLA", "FLEX_ATTENTION", "TREE_ATTN",
    "TORCH_SDPA", "NO_ATTENTION", "CPU_ATTN", "CUSTOM",
]  # fmt: skip


def vllm_kv_dtypes(version: tuple[int, ...]) -> list[str] | None:
    """argparse choices, or None when the config validator checks instead (0.33)."""
    if version >= (0, 33):
        return None
    if version >= (0, 26):
        return _VLLM_DTYPES_026
    if version >= (0, 20):
        return _VLLM_DTYPES_020
    if version >= (0, 12):
        return _VLLM_DTYPES_012
    if version >= (0, 11):
        return _VLLM_DTYPES_011
    return _VLLM_DTYPES_010


def sglang_kv_dtypes(version: tuple[int, ...]) -> list[str]:
    if version >= (0, 5, 23):
        return _SGLANG_DTYPES_0523
    if version >= (0, 5, 10):
        return _SGLANG_DTYPES_0510
    return _SGLANG_DTYPES_053


def sglang_backends(version: tuple[int, ...]) -> list[str]:
    if version >= (0, 5, 23):
        return _SGLANG_BACKENDS_0523
    if version >= (0, 5, 10):
        return [*_SGLANG_BACKENDS_053, "intel_xpu"]
    return _SGLANG_BACKENDS_053


@dataclass
class ServeArgs:
    """The parsed command line, engine-neutral where the simulator needs it."""

    engine: str  # "vllm" or "sglang"
    model: str
    served_model_name: str
    host: str | None
    port: int
    kv_cache_dtype: str
    attention_backend: str | None  # as given (vLLM upper-cased), None = automatic
    max_model_len: int | None
    gpu_memory_utilization: float  # vLLM; SGLang's mem_fraction_static (None -> by GPU size)
    mem_fraction_static: float | None
    max_num_seqs: int | None
    enable_metrics: bool
    disable_log_stats: bool
    access_log: bool
    skip_server_warmup: bool
    collect_tokens_histogram: bool = False  # SGLang before 0.5.20 (a no-op from 0.5.11)
    non_default: dict[str, Any] = field(default_factory=dict)
    all_args: dict[str, Any] = field(default_factory=dict)


class _EngineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _add_vllm_tolerated(parser: argparse.ArgumentParser, version: tuple[int, ...]) -> None:
    """Real vLLM flags the simulator accepts without acting on them."""
    bool_opt = argparse.BooleanOptionalAction
    valued: list[tuple[tuple[str, ...], Any, Any]] = [
        (("--tensor-parallel-size", "-tp"), int, 1),
        (("--pipeline-parallel-size", "-pp"), int, 1),
        (("--data-parallel-size", "-dp"), int, 1),
        (("--dtype",), str, "auto"),
        (("--seed",), int, None if version < (0, 12) else 0),
        (("--tokenizer",), str, None),
        (("--revision",), str, None),
        (("--download-dir",), str, None),
        (("--load-format",), str, "auto"),
        (("--quantization", "-q"), str, None),
        (("--max-num-batched-tokens",), int, None),
        (("--block-size",), int, None),
        (("--swap-space",), float, 4),
        (("--cpu-offload-gb",), float, 0),
        (("--api-key",), str, None),
        (("--chat-template",), str, None),
        (("--generation-config",), str, "auto"),
        (("--tool-call-parser",), str, None),
        (("--reasoning-parser",), str, None),
        (("--max-logprobs",), int, 20),
        (("--uvicorn-log-level",), str, "info"),
        (("--show-hidden-metrics-for-version",), str, None),
        (("--limit-mm-per-prompt",), str, None),
        (("--compilation-config", "-O"), str, None),
        (("--hf-overrides",), str, None),
        (("--kv-cache-memory-bytes",), str, None),
        (("--override-generation-config",), str, None),
        (("--allowed-origins",), str, None),
        (("--root-path",), str, None),
    ]
    for names, kind, default in valued:
        parser.add_argument(*names, type=kind, default=default)
    for name in (
        "--trust-remote-code", "--enforce-eager", "--disable-log-requests", "--enable-log-requests",
        "--enable-auto-tool-choice", "--enable-tokenizer-info-endpoint",
        "--enable-expert-parallel", "--disable-fastapi-docs", "--enable-prompt-tokens-details",
    ):  # fmt: skip
        parser.add_argument(name, action="store_true")
    for name in ("--enable-prefix-caching", "--enable-chunked-prefill"):
        parser.add_argument(name, action=bool_opt, default=None)
    if version < (0, 29):  # removed between 0.26 and 0.29 (engines.md §1.2)
        parser.add_argument("--calculate-kv-scales", action="store_true")


def parse_vllm(argv: Sequence[str], version: tuple[int, ...]) -> ServeArgs:
    """`vllm serve MODEL [flags]` (argv after `serve`), or api_server's `--model MODEL`."""
    parser = _EngineParser(prog="vllm serve", usage="vllm serve [model_tag] [options]")
    parser.add_argument("model_tag", nargs="?", default=None)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--disable-uvicorn-access-log", action="store_true")
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B")
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--max-model-len", type=_human_int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    dtypes = vllm_kv_dtypes(version)
    parser.add_argument("--kv-cache-dtype", default="auto", choices=dtypes)
    if version >= (0, 13):  # the flag is new in 0.13; before that only VLLM_ATTENTION_BACKEND
        parser.add_argument("--attention-backend", default=None, type=_vllm_backend)
    parser.add_argument("--disable-log-stats", action="store_true")
    _add_vllm_tolerated(parser, version)

    args = parser.parse_args(list(argv))
    defaults = vars(parser.parse_args([]))
    if args.model_tag is not None:
        args.model = args.model_tag
    values = vars(args)
    non_default = {k: v for k, v in values.items() if v != defaults.get(k)}
    if args.model_tag is not None:
        non_default["model"] = args.model  # vLLM copies model_tag into model
    if not 0 < args.gpu_memory_utilization <= 1:
        parser.error(
            f"argument --gpu-memory-utilization: must be in (0, 1], got {args.gpu_memory_utilization}"
        )
    served = args.served_model_name[0] if args.served_model_name else args.model
    return ServeArgs(
        engine="vllm",
        model=args.model,
        served_model_name=served,
        host=args.host,
        port=args.port,
        kv_cache_dtype=args.kv_cache_dtype,
        attention_backend=getattr(args, "attention_backend", None),
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        mem_fraction_static=None,
        max_num_seqs=args.max_num_seqs,
        enable_metrics=True,
        disable_log_stats=args.disable_log_stats,
        access_log=not args.disable_uvicorn_access_log,
        skip_server_warmup=True,
        non_default=non_default,
        all_args=values,
    )


def _human_int(text: str) -> int:
    """vLLM's human-readable sizes: 8192, 8k (x1000), 8K (x1024), 1m / 1M."""
    units = {"k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value: {text!r}") from None


def _vllm_backend(text: str) -> str:
    name = text.strip().upper()
    if name not in VLLM_BACKENDS:
        raise argparse.ArgumentTypeError(
            f"Invalid attention backend: '{text}'. Valid backends are: {VLLM_BACKENDS}"
        )
    return name


def parse_sglang(argv: Sequence[str], version: tuple[int, ...]) -> ServeArgs:
    """`python -m sglang.launch_server --model-path MODEL [flags]`."""
    parser = _EngineParser(prog="launch_server.py")
    parser.add_argument("--model-path", "--model", dest="model_path", required=True)
    parser.add_argument("--tokenizer-path", default=None)
    parser.add_argument("--host", default=None)  # None -> POD_IP or SGLang's 127.0.0.1
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--kv-cache-dtype", default="auto", choices=sglang_kv_dtypes(version))
    parser.add_argument("--attention-backend", default=None, choices=sglang_backends(version))
    parser.add_argument("--mem-fraction-static", type=float, default=None)
    parser.add_argument("--context-length", type=int, default=None)
    parser.add_argument("--max-running-requests", type=int, default=None)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--enable-metrics", action="store_true")
    parser.add_argument("--skip-server-warmup", action="store_true")
    if version < (0, 5, 20):  # deprecated in 0.5.11, gone in 0.5.20 (sim/metrics.py)
        parser.add_argument("--collect-tokens-histogram", action="store_true")
    for name, kind, default in (
        ("--tp-size", int, 1), ("--dp-size", int, 1), ("--dtype", str, "auto"),
        ("--quantization", str, None), ("--quantization-param-path", str, None),
        ("--chunked-prefill-size", int, None), ("--max-prefill-tokens", int, 16384),
        ("--log-level", str, "info"), ("--cuda-graph-max-bs", int, None),
        ("--random-seed", int, None), ("--api-key", str, None), ("--schedule-policy", str, "fcfs"),
        ("--page-size", int, 1), ("--reasoning-parser", str, None), ("--tool-call-parser", str, None),
        ("--decode-log-interval", int, 40), ("--watchdog-timeout", float, 300),
        ("--chat-template", str, None), ("--download-dir", str, None), ("--revision", str, None),
    ):  # fmt: skip
        parser.add_argument(name, type=kind, default=default)
    parser.add_argument("--tp", dest="tp_size", type=int)
    for name in (
        "--trust-remote-code", "--disable-cuda-graph", "--disable-radix-cache", "--log-requests",
        "--enable-cache-report", "--enable-torch-compile", "--enable-mixed-chunk",
    ):  # fmt: skip
        parser.add_argument(name, action="store_true")
    args = parser.parse_args(list(argv))
    defaults = vars(parser.parse_args(["--model-path", args.model_path]))
    values = vars(args)
    return ServeArgs(
        engine="sglang",
        model=args.model_path,
        served_model_name=args.served_model_name or args.model_path,
        host=args.host,
        port=args.port,
        kv_cache_dtype=args.kv_cache_dtype,
        attention_backend=args.attention_backend,
        max_model_len=args.context_length,
        gpu_memory_utilization=0.0,
        mem_fraction_static=args.mem_fraction_static,
        max_num_seqs=args.max_running_requests,
        enable_metrics=args.enable_metrics,
        disable_log_stats=False,
        access_log=True,
        skip_server_warmup=args.skip_server_warmup,
        collect_tokens_histogram=getattr(args, "collect_tokens_histogram", False),
        non_default={k: v for k, v in values.items() if v != defaults.get(k)},
        all_args=values,
    )
