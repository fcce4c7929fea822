"""`kvgate preflight MODEL`: KV capacity per dtype and whether the checkpoint has KV scales."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kvgate.checkpoint.advice import fp8_guidance
from kvgate.checkpoint.capacity import (
    GIB,
    KVLayout,
    gib_to_bytes,
    parse_kv_layout,
    vllm_pool,
)
from kvgate.checkpoint.formats import format_capacity
from kvgate.checkpoint.scales import ScaleReport, format_findings, unknown_scales
from kvgate.commands.exit_codes import EXIT_GATE_FAILED, EXIT_OK
from kvgate.config import hf_hub_cache, offline_requested
from kvgate.engines import kvformats
from kvgate.engines import versions as engine_versions
from kvgate.errors import HubError, KvgateError, ParseError, SpecError
from kvgate.inputs import finite_float, seconds

DTYPES = ("bf16", "fp8")
EXAMPLES: Final = (
    "kvgate preflight Qwen/Qwen3-8B --gpu-memory-gib 20 --max-model-len 32768",
    "kvgate preflight ./models/Qwen3-8B/config.json --json",
)


# The pool figures follow the newest vLLM whose wheel was read unless --vllm-version says
# otherwise (the examples and the simulator run it too).
NEWEST_VLLM_READ: Final = engine_versions.NEWEST[engine_versions.VLLM]


@dataclass(frozen=True, slots=True)
class PoolOptions:
    """How the engine would size its pool: the vLLM version and its batched-token budget."""

    version: tuple[int, ...] = NEWEST_VLLM_READ
    max_num_batched_tokens: int = 2048
    # vLLM's default on GPUs (vllm/config/cache.py DEFAULT_BLOCK_SIZE); its CPU platform uses 128
    # for every non-MLA model (vllm/platforms/cpu.py, check_and_update_config, 0.32.0).
    block_size: int = 16
    # The attention backend, which owns a format's page layout (None: the one that packs it;
    # CPU_ATTN stores per-token-head and nvfp4 names as plain 1-byte elements), and its
    # smallest kernel block (CPU_ATTN 32), which sizes blocks when layers are skipped.
    attention_backend: str | None = None
    kernel_block: int | None = None


_DEFAULT_POOL: Final = PoolOptions()
DEFAULT_HUB_TIMEOUT_S: Final = 30.0  # = adapters.hub.DEFAULT_HUB_DEADLINE_S (not imported: lazy)
MAX_TOKEN_LENGTH: Final = 512
# A name shown back in messages: SNAKE_CASE with at least one underscore (HF_TOKEN). A pasted
# token can be upper case and digits alone (a hypothesis test found 'A0000000000000000000').
_ENV_NAME: Final = re.compile(r"(?=.{3,64}$)[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", metavar="MODEL", help="model directory, hub repo id (org/name) or a config.json"
    )
    parser.add_argument("--revision", help="hub branch, tag or commit (default: main)")
    parser.add_argument(
        "--token-env",
        metavar="VAR",
        help="environment variable holding the hub token (default: huggingface_hub's lookup)",
    )
    parser.add_argument(
        "--timeout",
        type=seconds(),
        default=DEFAULT_HUB_TIMEOUT_S,
        metavar="S",
        help="how long the whole hub read may take, however slowly the hub answers "
        "(seconds or a duration: 30, 30s, 2m)",
    )
    parser.add_argument(
        "--gpu-memory-gib",
        type=finite_float(),
        metavar="G",
        help="memory left for the KV cache, in GiB (vLLM's 'Available KV cache memory'); "
        "adds pool tokens per dtype",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        metavar="N",
        help="with --gpu-memory-gib: also size the pool as vLLM's hybrid allocator does "
        "(KV tokens it logs, max concurrency at N tokens, sliding-window layers at their window)",
    )
    parser.add_argument(
        "--vllm-version",
        default=".".join(map(str, NEWEST_VLLM_READ)),
        metavar="V",
        help="with --max-model-len: the vLLM version whose accounting to follow (grouping changed "
        "in 0.18, the logged KV size in 0.21, sliding-window sizing in 0.26)",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=_DEFAULT_POOL.max_num_batched_tokens,
        metavar="N",
        help="with --max-model-len: the engine's --max-num-batched-tokens; a sliding-window layer "
        "holds its window plus this many tokens per request",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=_DEFAULT_POOL.block_size,
        metavar="N",
        help="with --gpu-memory-gib: the engine's KV block size; the pool is a whole number of "
        "blocks (vLLM: 16 on GPUs, 128 on its CPU build)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        action="append",
        default=[],
        metavar="FORMAT",
        help="also size this vLLM KV format (repeatable; e.g. fp8_per_token_head, nvfp4): "
        "bytes per token with its scale sidecars, pool tokens, gain over auto",
    )
    parser.add_argument(
        "--kv-cache-dtype-skip-layers",
        nargs="+",
        default=[],
        metavar="LAYER",
        help="layers the formats of --kv-cache-dtype leave in 16 bits (indices or sliding_window)",
    )
    parser.add_argument(
        "--attention-backend",
        metavar="NAME",
        help="the backend whose page layout to follow for --kv-cache-dtype (e.g. CPU_ATTN)",
    )
    parser.add_argument(
        "--typical-context",
        type=int,
        metavar="N",
        help="prompt plus output tokens of a typical request: checked against vLLM's FP8 "
        "decode break-even (about 7k tokens)",
    )
    parser.add_argument(
        "--ttft-objective",
        action="store_true",
        help="production has a TTFT objective (head_dim 256 prefill costs more under FP8)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    try:
        memory = gib_to_bytes(args.gpu_memory_gib) if args.gpu_memory_gib is not None else None
    except SpecError as exc:  # named as the user typed it (first-hour-2 N17)
        raise SpecError("--gpu-memory-gib", str(exc).split(": ", 1)[-1]) from None
    if args.max_model_len is not None and args.max_model_len < 1:
        raise SpecError("--max-model-len", f"{args.max_model_len} is below 1; use a token count")
    if args.max_model_len is not None and memory is None:  # it was silently ignored
        raise SpecError(
            "--max-model-len",
            "needs --gpu-memory-gib (the memory left for the KV cache), which sizes the pool",
        )
    if args.max_num_batched_tokens < 1:
        raise SpecError(
            "--max-num-batched-tokens", f"{args.max_num_batched_tokens} is below 1; use a count"
        )
    try:
        version = engine_versions.parse(args.vllm_version)
    except ValueError as exc:
        raise SpecError("--vllm-version", str(exc)) from None
    if not 0 < args.timeout <= 3600:
        raise SpecError("--timeout", f"{args.timeout:g} is not in (0, 3600] seconds")
    if args.typical_context is not None and args.typical_context < 1:
        raise SpecError("--typical-context", f"{args.typical_context} is below 1; use tokens")
    if not 1 <= args.block_size <= 4096:
        raise SpecError("--block-size", f"{args.block_size} is not in [1, 4096] tokens")
    for name in args.kv_cache_dtype:
        try:
            kvformats.lookup(engine_versions.VLLM, name)
        except SpecError as exc:
            raise SpecError("--kv-cache-dtype", str(exc).split(": ", 1)[1]) from None
    backend = args.attention_backend.upper() if args.attention_backend else None
    pool = PoolOptions(
        version,
        args.max_num_batched_tokens,
        args.block_size,
        attention_backend=backend,
        kernel_block=32 if backend == "CPU_ATTN" else None,  # cpu_attn.py:65-66, 0.32
    )
    result = preflight(
        args.model,
        args.revision,
        _token(args.token_env),
        memory,
        args.max_model_len,
        pool,
        timeout_s=args.timeout,
        formats=tuple(args.kv_cache_dtype),
        skip_layers=tuple(args.kv_cache_dtype_skip_layers),
        typical_context=args.typical_context,
        ttft_objective=args.ttft_objective,
    )
    print(json.dumps(result, sort_keys=True) if args.json else render_text(result))
    # The operator ends such a rollout Failed/ControlRunsFP8 (a control under `auto` would run
    # FP8 too): a script that gates on this command must stop here as well.
    return EXIT_GATE_FAILED if result["scales"].get("forces_fp8_kv") else EXIT_OK


def preflight(
    target: str,
    revision: str | None,
    token: str | None,
    memory_bytes: int | None,
    max_model_len: int | None,
    pool: PoolOptions,
    *,
    timeout_s: float = DEFAULT_HUB_TIMEOUT_S,
    formats: Sequence[str] = (),
    skip_layers: Sequence[str] = (),
    typical_context: int | None = None,
    ttft_objective: bool = False,
) -> dict[str, Any]:
    """Read what `target` names and return the preflight summary as plain data; `formats`
    adds a `formats` section (kvgate.checkpoint.formats) for each named vLLM KV format, and
    `fp8_guidance` holds vLLM's own reasons to avoid FP8 that apply (kvgate.checkpoint.advice)."""
    from kvgate.adapters import hub

    try:
        path = Path(target)
        read: dict[str, Any] | None = None
        cached: Any = None
        if not path.exists() and hub.looks_like_repo_id(target) and not target.endswith(".json"):
            cached = _hub_or_cache(hub, target, revision, token, timeout_s, os.environ)
            if isinstance(cached, Path):  # only config.json is cached: capacity, scales unknown
                path = cached
        scanned_dir = None
        if path.is_dir() and (path / hub.CONFIG_FILE).is_file() and not _has_safetensors(path):
            scanned_dir, path = path, path / hub.CONFIG_FILE  # e.g. a .bin: scales unknown
        if path.is_file() and path.suffix != ".safetensors":
            config = hub.read_json_file(path)
            layout = parse_kv_layout(config, source=str(path))
            scales = unknown_scales(config, source=str(path))
            if scanned_dir is not None:  # it was scanned: say what it lacks (first-hour-2 N17)
                why = (
                    f"{scanned_dir} has no *.safetensors (a .bin checkpoint, or config.json "
                    "alone): whether it carries k/v scales is unknown"
                )
                scales = dataclasses.replace(scales, findings=tuple(
                    dataclasses.replace(f, message=why) if f.code == "ScalesUnknown" else f
                    for f in scales.findings))  # fmt: skip
            source, commit = str(path), None
        else:
            if cached is not None:
                headers = cached
            elif path.exists():
                headers = hub.read_local_checkpoint(path)
            else:
                raise ParseError(
                    target, "no such file or directory, and not a hub repo id like org/name"
                )
            layout, scales = headers.analyse()
            source, commit, read = headers.source, headers.commit, headers.to_dict()
        summary = _summary(
            source, revision, commit, layout, scales, memory_bytes, read, block_size=pool.block_size
        )
        if memory_bytes is not None and max_model_len is not None and layout.attention != "mla":
            summary["vllm_pool"] = {
                d: vllm_pool(
                    layout,
                    memory_bytes,
                    d,
                    max_model_len=max_model_len,
                    max_num_batched_tokens=pool.max_num_batched_tokens,
                    version=pool.version,
                    block_size=pool.block_size,
                ).to_dict()
                for d in DTYPES
            }
            summary["vllm_pool_max_model_len"] = max_model_len
            summary["vllm_pool_version"] = ".".join(map(str, pool.version))
        elif memory_bytes is not None and max_model_len is not None:
            summary["notes"].append(
                "no vLLM pool figures: kvgate does not model vLLM's MLA pool (--max-model-len ignored)"
            )
        summary["advice"] = advice(summary)
        guidance = fp8_guidance(
            head_dim=layout.head_dim,
            sliding_window_layers=layout.sliding_window_layers,
            kv_layers=layout.kv_layers,
            typical_context=typical_context,
            ttft_objective=ttft_objective,
            skip_layers=tuple(skip_layers),
        )
        summary["fp8_guidance"] = [g.to_dict() for g in guidance]
        if formats:  # per format: its capacity row and what the checkpoint's scales mean for it
            summary["formats"] = {
                name: {
                    **format_capacity(
                        layout,
                        name,
                        version=pool.version,
                        skip_layers=skip_layers,
                        backend=pool.attention_backend,
                        memory_bytes=memory_bytes,
                        max_model_len=max_model_len,
                        max_num_batched_tokens=pool.max_num_batched_tokens,
                        block_size=pool.block_size,
                        kernel_block=pool.kernel_block,
                    ),
                    "scale_findings": [f.to_dict() for f in format_findings(scales, "vllm", name)],
                }
                for name in formats
            }
        return summary
    except (OSError, ValueError) as exc:  # NUL bytes, names too long, unreadable directories
        if isinstance(exc, KvgateError):
            raise
        raise ParseError(target[:200], f"cannot be read ({type(exc).__name__})") from None


OFFLINE_NEXT_STEP: Final = (
    "pass a local checkpoint directory or its config.json as MODEL, or set HF_HOME "
    "(or HF_HUB_CACHE) to a Hugging Face cache that has the model"
)


def _hub_or_cache(
    hub: Any,
    repo_id: str,
    revision: str | None,
    token: str | None,
    timeout_s: float,
    environ: Mapping[str, str],
) -> Any:
    """The hub's headers; offline, or when the hub cannot be reached, the local HF cache's.

    Returns what `hub.read_hub_checkpoint` or `hub.read_cached_checkpoint` returns (headers,
    or a cached config.json's path); raises HubError with the next step when neither serves.
    """
    cache = hf_hub_cache(environ)
    if offline_requested(environ):
        why = (
            f"{repo_id}@{revision or 'main'}: HF_HUB_OFFLINE is set and the Hugging Face cache "
            f"{cache} does not have the model's config.json; "
        )
    else:
        try:
            return hub.read_hub_checkpoint(
                repo_id, revision=revision, token=token, deadline_s=timeout_s
            )
        except HubError as exc:
            if not exc.unreachable:
                raise
            why = f"{exc}; the Hugging Face cache {cache} does not have it either; offline? "
    cached = hub.read_cached_checkpoint(repo_id, revision=revision, cache_dir=cache)
    if cached is None:
        raise HubError(why + OFFLINE_NEXT_STEP, unreachable=True)
    return cached


def _summary(
    source: str,
    revision: str | None,
    commit: str | None,
    layout: KVLayout,
    scales: ScaleReport,
    memory_bytes: int | None,
    read: dict[str, Any] | None,
    block_size: int,
) -> dict[str, Any]:
    return {
        "kind": "kvgate.preflight",
        "source": source,
        "revision": revision,
        "commit": commit,
        "architecture": layout.architecture,
        "attention": layout.attention,
        "num_layers": layout.num_layers,
        "kv_layers": layout.kv_layers,
        "kv_heads": layout.kv_heads,
        "head_dim": layout.head_dim,
        "tensors_per_layer": layout.tensors_per_layer,
        "sliding_window_layers": layout.sliding_window_layers,
        "kv_bytes_per_token": {d: layout.bytes_per_token(d) for d in DTYPES},
        "tokens_per_gib": {d: round(layout.tokens_per_gib(d), 1) for d in DTYPES},
        "pool_memory_gib": None if memory_bytes is None else memory_bytes / GIB,
        "pool_tokens": None
        if memory_bytes is None
        else {d: layout.pool_tokens(memory_bytes, d, block_size) for d in DTYPES},
        "capacity_gain": layout.bytes_per_token("bf16") / layout.bytes_per_token("fp8"),
        "notes": list(dict.fromkeys(layout.notes)),  # a note said once, however many fields
        "scales": scales.to_dict(),
        "read": read,
    }


LLM_COMPRESSOR_RECIPE: Final = (
    "QuantizationModifier: {kv_cache_scheme: {num_bits: 8, type: float, strategy: tensor, "
    "dynamic: false, symmetric: true}}"
)


def advice(result: Mapping[str, Any]) -> list[str]:
    """Where the KV scales come from and what to do about it, from a preflight summary."""
    scales = result["scales"]
    out: list[str] = []
    per_layer = scales.get("per_layer") or []
    names = [str(s.get("k") or "") for s in per_layer if s.get("k")]
    if scales.get("forces_fp8_kv"):
        out.append(
            "the checkpoint config switches --kv-cache-dtype auto to FP8 (" +
            "; ".join(scales["forces_fp8_kv"]) + "): production may run FP8 KV already; pin "
            "--kv-cache-dtype bfloat16 on the control before comparing"
        )  # fmt: skip
    if scales["coverage"] in ("all", "partial"):
        kind = (
            "compressed-tensors output_scale tensors"
            if any("output_scale" in n for n in names)
            else "ModelOpt/vLLM k_scale tensors"
        )
        out.append(f"scales from the checkpoint: {kind} ({scales['coverage']} coverage)")
        if scales["coverage"] == "partial":
            out.append("layers without k/v scales run at scale 1.0: calibrate them all")
    elif scales["coverage"] == "none":
        out.append(
            "no k/v scales: an FP8 KV cache runs at scale 1.0 (expect more loss on outlier-heavy "
            f"models); calibrate with llm-compressor, recipe: {LLM_COMPRESSOR_RECIPE}"
        )
    else:
        out.append("scales unknown (config only): scan the model directory or hub repo")
    if scales.get("kv_cache_scheme") and scales["coverage"] in ("none", "partial"):
        out.append("kv_cache_scheme is declared but not every layer has its scale tensors")
    if result.get("sliding_window_layers"):
        out.append(
            f"{result['sliding_window_layers']} sliding-window layers: vLLM up to 0.20 logs them "
            "as full in its KV tokens (0.21+ logs the tokens it serves) but frees their blocks "
            "past the window; see the vLLM pool figures (--gpu-memory-gib with --max-model-len)"
        )
    return out


def render_text(result: dict[str, Any]) -> str:
    """A short table for people."""
    rows = [
        f"model      {result['source']}"
        + (f" (commit {result['commit'][:12]})" if result.get("commit") else ""),
        f"layout     {result['architecture']}, {result['attention']}: {result['kv_layers']} of "
        f"{result['num_layers']} layers hold KV, " + _per_layer(result),
        "",
    ]
    pool = result["pool_tokens"]
    header = f"{'dtype':<6} {'bytes/token':>12} {'tokens/GiB':>11}"
    if pool is not None:
        header += f" {'pool tokens (' + format(result['pool_memory_gib'], 'g') + ' GiB)':>24}"
    rows.append(header)
    for dtype in DTYPES:
        row = (
            f"{dtype:<6} {result['kv_bytes_per_token'][dtype]:>12,} "
            f"{round(result['tokens_per_gib'][dtype]):>11,}"
        )
        if pool is not None:
            row += f" {pool[dtype]:>24,}"
        rows.append(row)
    bf16, fp8 = result["tokens_per_gib"]["bf16"], result["tokens_per_gib"]["fp8"]
    if bf16:
        rows.append(f"FP8 holds {fp8 / bf16:.2f}x the tokens of BF16 in the same memory")
    vpool = result.get("vllm_pool")
    if vpool:
        rows.append("")
        rows.append(
            f"vLLM {result['vllm_pool_version']} pool at max-model-len "
            f"{result['vllm_pool_max_model_len']:,}: "
            "logged KV tokens, max concurrency, tokens served with sliding layers at their window"
        )
        for dtype in DTYPES:
            p = vpool[dtype]
            rows.append(
                f"{dtype:<6} {p['kv_tokens']:>12,} {p['max_concurrency']:>8.2f}x "
                f"{p['window_tokens']:>12,}  ({_count(p['groups'], 'group')} of "
                f"{_count(p['group_size'], 'layer')})"
            )
    rows.extend(_format_rows(result.get("formats") or {}))
    scales = result["scales"]
    rows.append("")
    if scales["coverage"] == "unknown":
        rows.append("scales     unknown (config.json only)")
    else:
        layers = scales["layers"]
        rows.append(
            f"scales     {scales['coverage']}: k {scales['k']}, v {scales['v']}, q {scales['q']} "
            f"of {layers['expected']} attention layers; weight scales "
            f"{scales['weight_scales']['count']}"
        )
    # ControlRunsFP8 says what KVCacheSchemeSet and the first advice line say, and the fix:
    # the text states it once, and that it is why the exit is 1 (first-hour-2 #15)
    blocking = any(f["code"] == "ControlRunsFP8" for f in scales["findings"])
    rows.extend(
        f"  {f['code']}: {f['message']}"
        for f in scales["findings"]
        if not (blocking and f["code"] == "KVCacheSchemeSet")
    )
    lines = result["advice"]
    same = "the checkpoint config switches --kv-cache-dtype auto to FP8"
    rows.extend(f"advice     {line}" for line in lines if not (blocking and line.startswith(same)))
    if blocking:
        rows.append(
            "result     exit 1: ControlRunsFP8 blocks a rollout of this checkpoint (the operator "
            "ends one Failed/ControlRunsFP8) until the control's dtype is pinned"
        )
    rows.extend(
        f"vllm says  {g['message']} ({g['source']})" for g in result.get("fp8_guidance") or ()
    )
    rows.extend(f"note       {note}" for note in result["notes"])
    read = result.get("read")
    if read:
        headers = _count(len(read["files"]), "safetensors header")
        extra = read["bytes_read"] - read["header_bytes"]
        rows.append(
            f"read       {headers}: {read['bytes_read']:,} bytes"
            + (f" ({extra:,} beyond the headers)" if extra > 0 else "")
        )
    return "\n".join(rows)


def _has_safetensors(directory: Path) -> bool:
    return any(directory.glob("*.safetensors")) or any(directory.glob("*.safetensors.index.json"))


def _per_layer(result: dict[str, Any]) -> str:
    if result["tensors_per_layer"] == 1:
        return f"one latent of {result['head_dim']} values per layer"
    return f"K and V of {result['kv_heads']} heads x {result['head_dim']} per layer"


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _token(variable: str | None) -> str | None:
    """The hub token from the variable --token-env names; no message shows any of it.

    The name is shown only when it reads as a variable name (SNAKE_CASE, as HF_TOKEN): a
    token pasted as the option's value (`--token-env hf_...`) must not be printed back either.
    """
    if variable is None:
        return None
    shown = (
        f"environment variable '{variable}'"
        if _ENV_NAME.fullmatch(variable)
        else (
            "the environment variable --token-env names (not shown: variable names are "
            "SNAKE_CASE, as HF_TOKEN; is it a token?)"
        )
    )
    token = os.environ.get(variable) if "\x00" not in variable and "=" not in variable else None
    if not token:
        raise SpecError("--token-env", f"{shown} is not set or empty")
    if len(token) > MAX_TOKEN_LENGTH:
        raise SpecError(
            "--token-env",
            f"{shown} holds {len(token)} characters; a hub token is one line of "
            f"at most {MAX_TOKEN_LENGTH}",
        )
    if any(c.isspace() or not c.isprintable() for c in token):
        raise SpecError(
            "--token-env",
            f"{shown} holds whitespace, a line break or a control character; a "
            "hub token is one printable line (its value is not shown)",
        )
    return token


def _format_rows(formats: Mapping[str, Any]) -> list[str]:
    """One line per --kv-cache-dtype format: class, bytes a token, gain over auto, pools."""
    rows = ["", "format (class, scales): bytes/token, gain over auto, pool tokens, vLLM KV tokens"]
    for name, row in formats.items():
        head = f"{name} ({row['class']}, {row['scale_mode']})"
        if "error" in row:
            rows.append(f"{head}: {row['error']}")
            continue
        line = f"{head}: {row['kv_bytes_per_token']:,}, {row['capacity_gain']:.2f}x"
        if row.get("pool_tokens") is not None:
            line += f", {row['pool_tokens']:,}"
        if row.get("vllm_pool"):
            line += f", {row['vllm_pool']['kv_tokens']:,}"
        if row.get("offered") is False:
            line += f" (not offered by this version; from {row.get('floor')})"
        rows.append(line)
        rows.extend(f"  {f['code']}: {f['message']}" for f in row["scale_findings"])
    return rows
