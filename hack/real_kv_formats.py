"""Serve every `--kv-cache-dtype` of real vLLM 0.32 (CPU) on a tiny model, one server at a time,
and record what each did: the KV tokens it sized (startup log and /metrics) or the error it died
with. The logs are what tests/data/real-engine/kv-formats/ excerpts.

    .venv/bin/python hack/real_kv_formats.py OUT_DIR [--only fp8,nvfp4]
    .venv/bin/python hack/real_kv_formats.py --pages > tests/data/real-engine/kv-formats/pages.json

Each case: build (once) hack/tiny_model.py's default Qwen3 (4 layers, 2 KV heads, head_dim 64;
`calibrated` scales for the cases that say so), start `hack/real_vllm.serve` with the 8 MiB pool
at max-model-len 2048, and either read /metrics' `kv_cache_size_tokens` and one completion, or
keep the log of the failed start. OUT_DIR/results.json holds one entry per case.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_vllm
from tiny_model import build

# (case name, --kv-cache-dtype, extra args, checkpoint variant)
CASES: Final[tuple[tuple[str, str, tuple[str, ...], str], ...]] = (
    ("bfloat16", "bfloat16", (), "none"),
    ("float16", "float16", (), "none"),
    ("fp8_e4m3", "fp8_e4m3", (), "none"),
    ("fp8_e5m2", "fp8_e5m2", (), "none"),
    ("fp8-skip-0", "fp8", ("--kv-cache-dtype-skip-layers", "0"), "none"),
    ("fp8-skip-0-1-2", "fp8", ("--kv-cache-dtype-skip-layers", "0", "1", "2"), "none"),
    ("fp8-skip-sliding-window", "fp8", ("--kv-cache-dtype-skip-layers", "sliding_window"), "none"),
    ("fp8_inc", "fp8_inc", (), "none"),
    ("fp8_per_token_head", "fp8_per_token_head", (), "none"),
    ("int8_per_token_head", "int8_per_token_head", (), "none"),
    ("int4_per_token_head", "int4_per_token_head", (), "none"),
    ("nvfp4", "nvfp4", (), "none"),
    ("nvfp4_4over6", "nvfp4_4over6", (), "none"),
    ("turboquant_k8v4", "turboquant_k8v4", (), "none"),
    ("turboquant_4bit_nc", "turboquant_4bit_nc", (), "none"),
    ("turboquant_k3v4_nc", "turboquant_k3v4_nc", (), "none"),
    ("turboquant_3bit_nc", "turboquant_3bit_nc", (), "none"),
    ("ultraquant_4bit", "ultraquant_4bit", (), "none"),
    ("fp8_ds_mla", "fp8_ds_mla", (), "none"),
    ("nvfp4_ds_mla", "nvfp4_ds_mla", (), "none"),
    ("calibrated-fp8_per_token_head", "fp8_per_token_head", (), "calibrated"),
    # zero scales in layers 1 and 3: fatal under fp8 (qwen3-broken-fp8.log); unused here?
    ("broken-int8_per_token_head", "int8_per_token_head", (), "broken"),
    # 6 layers: TurboQuant keeps 0, 1, 4, 5 in 16 bits and quantizes 2 and 3
    ("l6-turboquant_4bit_nc", "turboquant_4bit_nc", (), "none-l6"),
    ("l6-fp8", "fp8", (), "none-l6"),
)
# checkpoint variant -> hack/tiny_model.build arguments
VARIANTS: Final[dict[str, dict[str, Any]]] = {
    "none": {"kv_scales": "none"},
    "calibrated": {"kv_scales": "calibrated"},
    "broken": {"kv_scales": "broken"},
    "none-l6": {"kv_scales": "none", "layers": 6},
}


HEAD_DIMS: Final = (64, 128, 256)
# Run by the real engine's interpreter: vLLM's own page per (token, layer, KV head) for each
# format, from the code that packs it (no server, no GPU): `customize_spec` of the Triton
# backend (16-bit, per-tensor FP8, per-token-head) and of the TurboQuant backend; NVFP4 as
# FlashInfer's `customize_spec` packs it (2 slots of `nvfp4_kv_cache_full_dim`: flashinfer is
# not importable on CPU) and UltraQuant's `slot_size` (its backend needs a GPU Triton).
PAGES_SCRIPT: Final = """
import json, sys
from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE, nvfp4_kv_cache_full_dim
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionBackend
from vllm.v1.attention.ops.ultraquant.format import slot_size
import vllm
out = {"vllm": vllm.__version__, "bytes_per_head": {}}
for name in sys.argv[2:]:
    row = out["bytes_per_head"][name] = {}
    for d in map(int, sys.argv[1].split(",")):
        if name.startswith("nvfp4"):
            row[d] = 2 * nvfp4_kv_cache_full_dim(d)
        elif name == "ultraquant_4bit":
            row[d] = slot_size(d)
        else:
            dtype = STR_DTYPE_TO_TORCH_DTYPE.get(name)
            spec = FullAttentionSpec(block_size=1, num_kv_heads=1, head_size=d,
                                     dtype=dtype, kv_quant_mode=get_kv_quant_mode(name))
            backend = TurboQuantAttentionBackend if name.startswith("turboquant") else TritonAttentionBackend
            row[d] = backend.customize_spec(spec).page_size_bytes
print(json.dumps(out, indent=1, sort_keys=True))
"""
PAGE_FORMATS: Final = (
    "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_per_token_head",
    "int8_per_token_head", "int4_per_token_head", "nvfp4", "nvfp4_4over6", "turboquant_k8v4",
    "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
)  # fmt: skip


def pages() -> dict[str, Any]:
    """vLLM's own bytes per (token, layer, KV head) per format and head_dim (PAGES_SCRIPT)."""
    argv = [str(real_vllm.VLLM_PYTHON), "-c", PAGES_SCRIPT, ",".join(map(str, HEAD_DIMS))]
    done = subprocess.run(
        [*argv, *PAGE_FORMATS], capture_output=True, text=True, timeout=600, check=True,
        env=real_vllm.engine_env("127.0.0.1") | {"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run_case(
    model: Path, out: Path, name: str, dtype: str, extra: tuple[str, ...]
) -> dict[str, Any]:
    log = out / f"{name}.log"
    started = time.monotonic()
    entry: dict[str, Any] = {"case": name, "kv_cache_dtype": dtype, "extra_args": list(extra)}
    try:
        with real_vllm.serve(
            model, log, port=real_vllm.free_port(), kv_cache_dtype=dtype, extra_args=extra,
            ready_timeout=360.0,
        ) as url:  # fmt: skip
            entry["ready_s"] = round(time.monotonic() - started, 1)
            entry["kv_tokens_metrics"] = real_vllm.kv_tokens(url)
            body = {"model": str(model), "prompt": real_vllm.PROMPT, "max_tokens": 8,
                    "temperature": 0}  # fmt: skip
            answer = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
            entry["completion_status"] = answer.status_code
            entry["accepted"] = True
    except (RuntimeError, TimeoutError) as exc:
        entry["accepted"] = False
        entry["failure"] = str(exc)
        entry["failed_after_s"] = round(time.monotonic() - started, 1)
    return entry


# Lines an excerpt keeps: what was asked, what the engine said about the KV format and its pool,
# and whether a request was served.
KEEP: Final = (
    "non-default args:",
    "data type to store kv cache",
    "Initializing a V1 LLM engine",
    "block size",
    "TurboQuant",
    "GiB for KV cache on node",
    "KV cache size:",
    "k_scale must be positive",
    "EngineCore encountered a fatal error",
    '"POST /v1/completions HTTP/1.1"',
)


def excerpt(log: str, out_root: Path) -> str:
    """The KEEP lines of one server log, with this run's paths made placeholders."""
    kept = [line for line in log.splitlines() if any(k in line for k in KEEP)]
    text = "\n".join(kept) + "\n"
    text = text.replace(str(real_vllm.VLLM_VENV.resolve()), "/opt/venv-vllm")
    return text.replace(str(out_root / "tiny-qwen3-"), "/models/tiny-qwen3-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--pages", action="store_true", help="print vLLM's page sizes, no server")
    parser.add_argument("--excerpt", type=Path, help="write OUT_DIR's logs' excerpts here")
    args = parser.parse_args(argv)
    if args.excerpt is not None and args.out is not None:
        args.excerpt.mkdir(parents=True, exist_ok=True)
        for entry in json.loads((args.out / "results.json").read_text()):
            log = (args.out / f"{entry['case']}.log").read_text(errors="replace")
            (args.excerpt / f"{entry['case']}.log").write_text(excerpt(log, args.out.resolve()))
            entry.pop("failed_after_s", None)
        results = json.loads((args.out / "results.json").read_text())
        (args.excerpt / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        return 0
    if args.pages:
        print(json.dumps(pages(), indent=1, sort_keys=True))
        return 0
    if args.out is None:
        parser.error("OUT_DIR is required without --pages")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    only = {c for c in args.only.split(",") if c}
    models: dict[str, Path] = {}
    results_path = out / "results.json"
    results: list[dict[str, Any]] = (
        json.loads(results_path.read_text()) if results_path.exists() else []
    )
    for name, dtype, extra, variant in CASES:
        if only and name not in only:
            continue
        if variant not in models:
            models[variant] = build(
                out / f"tiny-qwen3-{variant}", corpus="words", **VARIANTS[variant]
            )
        entry = run_case(models[variant], out, name, dtype, extra)
        entry["checkpoint"] = variant
        results = [r for r in results if r["case"] != name] + [entry]
        results_path.write_text(json.dumps(results, indent=1) + "\n")
        print(json.dumps(entry), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
