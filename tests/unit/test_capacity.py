"""kvgate.checkpoint.capacity: KV bytes per token from config.json, for GQA, MLA, hybrid and multimodal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvgate.checkpoint.capacity import (
    GIB,
    KV_DTYPE_BYTES,
    VllmPool,
    gib_to_bytes,
    parse_kv_layout,
    vllm_pool,
)
from kvgate.errors import ParseError, SpecError, UnsupportedError

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def load(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / name).read_text())


# Published configs and the figures worked out by hand from their fields:
# layers_with_kv x tensors (K,V = 2; MLA latent = 1) x kv_heads x head_dim x 2 bytes (BF16).
LAYOUTS = [
    # file, attention, layers, kv_layers, kv_heads, head_dim, bf16 bytes/token
    ("qwen3-8b.json", "gqa", 36, 36, 8, 128, 36 * 2 * 8 * 128 * 2),
    ("llama-3.1-8b.json", "gqa", 32, 32, 8, 128, 32 * 2 * 8 * 128 * 2),
    ("deepseek-v3.json", "mla", 61, 61, 1, 512 + 64, 61 * 1 * 576 * 2),
    ("qwen3-next-80b-a3b.json", "hybrid", 48, 12, 2, 256, 12 * 2 * 2 * 256 * 2),
    ("gemma-3-27b-it.json", "gqa", 62, 62, 16, 128, 62 * 2 * 16 * 128 * 2),
    ("gemma-3-4b-it.json", "gqa", 34, 34, 4, 256, 34 * 2 * 4 * 256 * 2),
]


@pytest.mark.parametrize(
    ("name", "attention", "layers", "kv_layers", "kv_heads", "head_dim", "bf16"), LAYOUTS
)
def test_layout_of_published_configs(
    name: str,
    attention: str,
    layers: int,
    kv_layers: int,
    kv_heads: int,
    head_dim: int,
    bf16: int,
) -> None:
    layout = parse_kv_layout(load(name))
    assert (layout.attention, layout.num_layers, layout.kv_layers) == (attention, layers, kv_layers)
    assert (layout.kv_heads, layout.head_dim) == (kv_heads, head_dim)
    assert layout.bytes_per_token("bf16") == bf16
    assert layout.bytes_per_token("auto") == bf16
    # one byte per element instead of two
    assert layout.bytes_per_token("fp8") * 2 == bf16


def test_qwen3_8b_reference_figures() -> None:
    # GIVEN the Qwen3-8B config  THEN 144 KiB per token in BF16, half in FP8
    layout = parse_kv_layout(load("qwen3-8b.json"))
    assert layout.bytes_per_token("bf16") == 147_456 == 144 * 1024
    assert layout.bytes_per_token("fp8") == 73_728
    assert round(layout.tokens_per_gib("bf16")) == 7_282
    assert round(layout.tokens_per_gib("fp8")) == 14_564


def test_qwen3_next_keeps_kv_only_in_every_fourth_layer() -> None:
    layout = parse_kv_layout(load("qwen3-next-80b-a3b.json"))
    assert layout.kv_layer_indices == tuple(range(3, 48, 4))
    assert "hybrid: 12 of 48 layers hold KV" in layout.notes[0]


def test_gemma3_sliding_layers_hold_kv_and_are_noted() -> None:
    layout = parse_kv_layout(load("gemma-3-27b-it.json"))
    # every sixth layer is global, the other 52 slide over 1024 tokens
    assert layout.sliding_window_layers == 52
    assert layout.sliding_window == 1024
    assert layout.architecture == "Gemma3ForConditionalGeneration"
    assert any("52 of 62 KV layers use a sliding window of 1024 tokens" in n for n in layout.notes)


def test_gemma3_4b_fills_head_counts_from_transformers_defaults() -> None:
    layout = parse_kv_layout(load("gemma-3-4b-it.json"))
    assert (
        "text_config.num_attention_heads not in config.json: used the transformers default 8 "
        "for model_type 'gemma3_text'"
    ) in layout.notes


def test_deepseek_mla_note_explains_the_latent() -> None:
    layout = parse_kv_layout(load("deepseek-v3.json"))
    assert layout.tensors_per_layer == 1
    assert layout.notes[0].startswith("MLA: one latent of kv_lora_rank 512 + qk_rope_head_dim 64")


BASE = {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512}

HYBRID_RULES = [
    # extra config fields, expected KV layer indices
    ({"layer_types": ["linear_attention", "full_attention"] * 2}, (1, 3)),
    ({"layers_block_type": ["mamba", "hybrid", "mamba", "mamba"]}, (1,)),
    ({"hybrid_override_pattern": "M*-*"}, (1, 3)),
    ({"attn_type_list": [0, 0, 1, 1]}, (2, 3)),
    ({"attn_layer_indices": [0, 2]}, (0, 2)),
    ({"attn_layer_period": 2, "attn_layer_offset": 1}, (1, 3)),
    ({"full_attention_interval": 2}, (1, 3)),
    ({"layer_types": ["sliding_attention", "full_attention"] * 2}, (0, 1, 2, 3)),
    ({"sliding_window": 4096}, (0, 1, 2, 3)),
]


@pytest.mark.parametrize(("extra", "indices"), HYBRID_RULES)
def test_layer_rules(extra: dict[str, Any], indices: tuple[int, ...]) -> None:
    layout = parse_kv_layout({**BASE, **extra})
    assert layout.kv_layer_indices == indices
    assert layout.attention == ("hybrid" if len(indices) < 4 else "mha")


def test_head_dim_from_hidden_size_and_mqa() -> None:
    layout = parse_kv_layout({**BASE, "num_key_value_heads": 1})
    assert (layout.head_dim, layout.attention) == (64, "mqa")
    assert layout.bytes_per_token("fp16") == 4 * 2 * 1 * 64 * 2


def test_missing_kv_heads_means_one_per_head() -> None:
    layout = parse_kv_layout(BASE)
    assert layout.kv_heads == 8
    assert layout.notes == (
        "num_key_value_heads not set: every one of the 8 heads has its own K/V",
    )


def test_pool_tokens_round_down_to_blocks() -> None:
    layout = parse_kv_layout(load("qwen3-8b.json"))
    # 1 GiB / 144 KiB = 7281.8 tokens -> 455 whole blocks of 16 tokens
    assert layout.pool_tokens(GIB, "bf16") == 455 * 16
    assert layout.pool_tokens(GIB, "bf16", block_size=1) == 7_281
    assert layout.pool_tokens(0, "fp8") == 0


def test_bytes_per_token_and_pool_tokens() -> None:
    layout = parse_kv_layout(load("qwen3-8b.json"))
    assert layout.bytes_per_token("bf16") == 147_456
    # 10 GiB / 72 KiB = 145,635.6 tokens -> 9,102 blocks of 16
    assert layout.pool_tokens(gib_to_bytes(10.0), "fp8") == 9_102 * 16


@pytest.mark.parametrize(
    ("dtype", "size"), [("auto", 2), ("BF16", 2), ("float16", 2), ("fp8_e5m2", 1), ("fp8", 1)]
)
def test_dtype_bytes(dtype: str, size: int) -> None:
    assert KV_DTYPE_BYTES[dtype.lower()] == size


ERRORS = [
    # config, error class, exact message
    (
        {"num_attention_heads": 8},
        ParseError,
        "config.json: field 'num_hidden_layers' is missing",
    ),
    (
        {"text_config": {"num_hidden_layers": 2, "hidden_size": 64}},
        ParseError,
        "config.json: field 'text_config.num_attention_heads' is missing",
    ),
    (
        {"num_hidden_layers": 2, "num_attention_heads": 8},
        ParseError,
        "config.json: field 'hidden_size' is missing",
    ),
    (
        {**BASE, "num_key_value_heads": "8"},
        ParseError,
        "config.json: field 'num_key_value_heads' must be a positive integer <= 16384, got '8'",
    ),
    (
        {**BASE, "hidden_size": 100},
        ParseError,
        "config.json: field 'hidden_size' 100 is not a multiple of 'num_attention_heads' 8; "
        "set 'head_dim'",
    ),
    (
        {**BASE, "kv_lora_rank": 512},
        ParseError,
        "config.json: field 'qk_rope_head_dim' is missing",
    ),
    (
        {**BASE, "layer_types": ["full_attention"]},
        ParseError,
        "config.json: field 'layer_types' must have one entry per layer (4), got 1",
    ),
    (
        {**BASE, "layer_types": ["full_attention", "x", "mamba", "mamba"]},
        UnsupportedError,
        "config.json: field 'layer_types' has unknown layer type 'x' at index 1; known types: "
        "attention, chunked_attention, conv, full_attention, global_attention, hybrid, "
        "linear_attention, local_attention, mamba, mamba2, mlp, moe, recurrent, short_conv, "
        "sliding_attention, sliding_window_attention, ssm",
    ),
    (
        {**BASE, "layer_types": ["mamba"] * 4},
        UnsupportedError,
        "config.json: none of the 4 layers holds a KV cache; kvgate gates models with "
        "attention layers",
    ),
    (
        {**BASE, "model_type": "bert"},
        UnsupportedError,
        "config.json: model_type 'bert' has no decoder KV cache; kvgate gates decoder LLMs",
    ),
    (
        {**BASE, "model_type": "t5"},
        UnsupportedError,
        "config.json: model_type 't5' is an encoder-decoder model; kvgate sizes decoder-only "
        "KV caches",
    ),
    ([1, 2], ParseError, "config.json: expected a JSON object, got list"),
    (
        {**BASE, "full_attention_interval": 0},
        ParseError,
        "config.json: field 'full_attention_interval' must be a positive integer <= 4096, got 0",
    ),
    (
        {**BASE, "attn_layer_period": 2, "attn_layer_offset": 2},
        ParseError,
        "config.json: field 'attn_layer_offset' must be an integer in [0, 2), got 2",
    ),
]


@pytest.mark.parametrize(("config", "error", "message"), ERRORS)
def test_errors_name_the_field(config: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as caught:
        parse_kv_layout(config)
    assert str(caught.value) == message


def test_unknown_dtype() -> None:
    with pytest.raises(SpecError) as caught:
        parse_kv_layout(BASE).bytes_per_token("int3")
    assert str(caught.value) == (
        "kv_cache_dtype: 'int3' is not a known KV cache dtype; use one of auto, bf16, "
        "bfloat16, float16, fp16, fp8, fp8_ds_mla, fp8_e4m3, fp8_e5m2, fp8_inc, "
        "fp8_per_token_head, half, int4_per_token_head, int8_per_token_head, nvfp4, "
        "nvfp4_4over6, nvfp4_ds_mla, octave_k3v3, octave_k3v3_compact, octave_k3v4, "
        "turboquant_3bit_nc, turboquant_4bit_nc, turboquant_k3v4_nc, turboquant_k8v4, "
        "ultraquant_4bit"
    )


@pytest.mark.parametrize(
    ("gib", "shown"), [(-1.0, "-1.0"), (float("nan"), "nan"), (float("inf"), "inf")]
)
def test_bad_memory_size(gib: float, shown: str) -> None:
    with pytest.raises(SpecError) as caught:
        gib_to_bytes(gib)
    assert str(caught.value) == f"gpu_memory_gib: {shown} is not a size in GiB; use a number >= 0"


# -- absurd configs: bounded fields, no per-layer lists for absurd counts ----------------------


@pytest.mark.parametrize(
    ("extra", "field", "limit"),
    [
        ({"num_hidden_layers": 30_000_000}, "num_hidden_layers", 4096),
        ({"num_hidden_layers": 10**400}, "num_hidden_layers", 4096),
        ({"num_attention_heads": 10**9}, "num_attention_heads", 16384),
        ({"num_key_value_heads": 10**9}, "num_key_value_heads", 16384),
        ({"head_dim": 10**12}, "head_dim", 65536),
        ({"full_attention_interval": 10**9}, "full_attention_interval", 4096),
    ],
)
def test_absurd_fields_are_refused_before_any_work(
    extra: dict[str, Any], field: str, limit: int
) -> None:
    import time
    import tracemalloc

    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(ParseError) as caught:
        parse_kv_layout({**BASE, **extra})
    took = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    message = str(caught.value)
    assert message.startswith(f"config.json: field '{field}' must be a positive integer <= {limit}")
    assert len(message) < 200
    assert peak < 1 << 20 and took < 1.0  # the 30M-layer config took 2.98 GB


def test_a_huge_string_value_is_not_echoed_in_full() -> None:
    with pytest.raises(ParseError) as caught:
        parse_kv_layout({**BASE, "num_key_value_heads": "8" * 100_000})
    assert len(str(caught.value)) < 200


def test_gib_to_bytes_refuses_absurd_sizes() -> None:
    with pytest.raises(SpecError, match="gpu_memory_gib"):
        gib_to_bytes(1e300)
    assert gib_to_bytes(80.0) == 80 * GIB


# ---- vLLM 0.11's own pool accounting (hybrid allocator, kv_cache_utils.py) ----


def test_vllm_pool_of_gemma3_counts_what_the_engine_logs_and_what_it_serves() -> None:
    config = json.loads((CONFIGS / "gemma-3-4b-it.json").read_text())
    layout = parse_kv_layout(config)
    assert (layout.kv_layers, layout.sliding_window_layers, layout.sliding_window) == (34, 29, 1024)
    assert (layout.kv_heads, layout.head_dim) == (4, 256)
    pool = vllm_pool(layout, 10 * GIB, "bf16", max_model_len=8192)
    # 5 full and 29 sliding layers: groups of 5 -> 1 full + 6 sliding groups (one padding layer);
    # page 16 x 2 x 4 x 256 x 2 B = 64 KiB; 10 GiB / 64 KiB / 5 = 32,768 blocks
    assert (pool.group_size, pool.groups, pool.num_blocks) == (5, 7, 32768)
    # "GPU KV cache size": 32,768 // 7 x 16 -- below the all-layers-full figure (padding)
    assert pool.kv_tokens == 74896 < layout.pool_tokens(10 * GIB, "bf16") == 77088
    # a request at 8,192 tokens: 512 blocks (full) + 6 x (cdiv(1023 + 2048, 16) + 1) = 1,670
    assert pool.max_concurrency == pytest.approx(32768 / 1670)
    assert pool.window_tokens == 160739  # what the pool serves, sliding layers at their window
    fp8 = vllm_pool(layout, 10 * GIB, "fp8", max_model_len=8192)
    assert (fp8.num_blocks, fp8.kv_tokens) == (65536, 149792)


def test_vllm_pool_of_gemma3_per_vllm_version() -> None:
    layout = parse_kv_layout(json.loads((CONFIGS / "gemma-3-4b-it.json").read_text()))
    old = vllm_pool(layout, 10 * GIB, "bf16", max_model_len=8192)

    def pool(version: tuple[int, ...], **kw: Any) -> VllmPool:
        return vllm_pool(layout, 10 * GIB, "bf16", max_model_len=8192, version=version, **kw)

    # 0.18-0.20: 29 sliding >= 1.5 x 5 full, so the groups stay of 5; the log line is the same
    assert pool((0, 20, 0)) == old
    # 0.21+: "GPU KV cache size" = int(max_concurrency x max_model_len) (kv_cache_utils.py:1708)
    v21 = pool((0, 21, 0))
    assert (v21.num_blocks, v21.max_concurrency) == (old.num_blocks, old.max_concurrency)
    assert v21.kv_tokens == v21.window_tokens == int(32768 / 1670 * 8192) == 160739
    # 0.26+: a sliding group holds window - 1 + 2 x 2048 in-flight tokens (async scheduling):
    # cdiv(1023 + 4096, 16) + 1 = 321 blocks; per request 512 + 6 x 321 = 2,438
    v33 = pool((0, 33, 0))
    assert v33.max_concurrency == pytest.approx(32768 / 2438)
    assert v33.kv_tokens == int(32768 / 2438 * 8192) == 110104
    # FP8 halves the page: twice the blocks, twice the logged tokens, in every version
    fp8 = vllm_pool(layout, 10 * GIB, "fp8", max_model_len=8192, version=(0, 33, 0))
    assert (fp8.num_blocks, fp8.kv_tokens) == (65536, 220209)


def test_vllm_pool_groups_near_equal_counts_by_the_larger_from_018() -> None:
    # gpt-oss-20b + an EAGLE drafter: 13 full + 12 sliding layers (the example in
    # _get_kv_cache_groups_uniform_page_size, 0.20.0 kv_cache_utils.py:1120-1127)
    config = {
        "architectures": ["GptOssForCausalLM"],
        "num_hidden_layers": 25,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "hidden_size": 2880,
        "sliding_window": 128,
        "layer_types": ["full_attention"] * 13 + ["sliding_attention"] * 12,
    }
    layout = parse_kv_layout(config)
    assert (layout.kv_layers, layout.sliding_window_layers) == (25, 12)
    before = vllm_pool(layout, GIB, "bf16", max_model_len=8192, version=(0, 17, 0))
    after = vllm_pool(layout, GIB, "bf16", max_model_len=8192, version=(0, 18, 0))
    # 0.17: groups of 12 -> 2 full groups (one of 1 + 11 padding layers) + 1 sliding group
    assert (before.group_size, before.groups) == (12, 3)
    # 0.18: 13 < 1.5 x 12 -> groups of 13 -> 1 full + 1 sliding (one padding layer)
    assert (after.group_size, after.groups) == (13, 2)
    page = 16 * 2 * 8 * 64 * 2
    assert (before.num_blocks, after.num_blocks) == (GIB // page // 12, GIB // page // 13)


def test_vllm_pool_of_a_dense_model_is_the_plain_block_count() -> None:
    layout = parse_kv_layout(json.loads((CONFIGS / "qwen3-8b.json").read_text()))
    pool = vllm_pool(layout, 4 * GIB, "fp8", max_model_len=8192)
    assert (pool.groups, pool.group_size) == (1, 36)
    assert pool.kv_tokens == layout.pool_tokens(4 * GIB, "fp8")
    assert pool.max_concurrency == pytest.approx(pool.num_blocks / 512)
    with pytest.raises(SpecError, match="memory"):
        vllm_pool(layout, -1, "fp8", max_model_len=8192)
