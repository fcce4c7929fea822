"""kvgate.engines.kvformats: every KV format the version table lists has a class, a scale mode and a
byte count, and the byte counts are vLLM's own (tests/data/real-engine/kv-formats/
pages-vllm-0.32.0.json, written by `hack/real_kv_formats.py --pages` from the real engine's
code; tests/realengine/test_kv_formats_real_vllm.py regenerates it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvgate.checkpoint.capacity import parse_kv_layout
from kvgate.engines import kvformats as kf
from kvgate.engines import versions as ev
from kvgate.errors import SpecError, UnsupportedError

PAGES: dict[str, Any] = json.loads(
    (
        Path(__file__).parents[1] / "data" / "real-engine" / "kv-formats" / "pages-vllm-0.32.0.json"
    ).read_text()
)
FACTS: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "data" / "engine-source" / "facts.json").read_text()
)


@pytest.mark.parametrize("engine", [ev.VLLM, ev.SGLANG])
def test_every_listed_name_is_a_known_format_and_no_format_is_invented(engine: str) -> None:
    listed = set().union(*(row.kv_cache_dtypes for row in ev.all_rows(engine)))
    known = {name for e, name in kf.FORMATS if e == engine}
    assert listed == known
    for key, read in FACTS.items():  # and every version read out of a wheel
        if key.startswith(engine + "-"):
            offered = ev.facts_for(engine, key.split("-", 1)[1]).kv_cache_dtypes
            assert set(offered) == set(read["kv_cache_dtypes"])


@pytest.mark.parametrize("name", sorted(PAGES["bytes_per_head"]))
def test_bytes_per_head_are_vllms_own(name: str) -> None:
    assert PAGES["vllm"].startswith("0.32.0")
    fmt = kf.lookup(ev.VLLM, name)
    for head_dim, expected in PAGES["bytes_per_head"][name].items():
        assert fmt.bytes_per_head(int(head_dim)) == expected, (name, head_dim)


def test_the_classes_and_scale_modes() -> None:
    def of(names: str) -> set[tuple[str, str]]:
        return {
            (kf.lookup("vllm", n).policy_class, kf.lookup("vllm", n).scale_mode)
            for n in names.split()
        }

    assert of("fp8 fp8_e4m3 fp8_e5m2 fp8_inc") == {(kf.FP8, kf.SCALES_CHECKPOINT)}
    assert of("fp8_per_token_head int8_per_token_head") == {(kf.PER_TOKEN_HEAD, kf.SCALES_DYNAMIC)}
    assert of("int4_per_token_head") == {(kf.SUB8BIT, kf.SCALES_DYNAMIC)}
    assert of("nvfp4 nvfp4_4over6") == {(kf.SUB8BIT, kf.SCALES_BLOCK)}
    assert of("turboquant_k8v4 turboquant_3bit_nc ultraquant_4bit") == {
        (kf.SUB8BIT, kf.SCALES_PACKED)
    }
    assert of("auto bfloat16 float16") == {(kf.BASELINE, kf.SCALES_NONE)}
    assert not kf.reads_checkpoint_scales("vllm", "fp8_per_token_head")


@pytest.mark.parametrize(
    ("engine", "version", "name", "words"),
    [
        ("vllm", "0.19.2", "nvfp4", "vllm offers it from 0.20.0"),
        ("vllm", "0.24.0", "int4_per_token_head", "from 0.25.0"),
        ("vllm", "0.11.0", "float16", "from 0.18.0"),
        ("sglang", "0.5.21", "fp4_e2m1", "sglang dropped it in 0.5.21"),
        ("sglang", "0.5.4", "nvfp4", "from 0.5.16"),
    ],
)
def test_a_format_the_version_lacks_is_refused_naming_the_floor(
    engine: str, version: str, name: str, words: str
) -> None:
    with pytest.raises(SpecError, match=words) as caught:
        kf.require(engine, version, name)
    assert caught.value.field == "kvCache.format"
    assert kf.require(engine, "0.33.0" if engine == "vllm" else "0.5.16", name).name == name


def test_an_unknown_format_names_the_known_ones() -> None:
    with pytest.raises(SpecError, match="'fp6' is not a vllm KV cache format; use one of auto"):
        kf.lookup("vllm", "fp6")


def test_octave_is_listed_but_not_sized() -> None:
    with pytest.raises(UnsupportedError, match=r"octave_k3v4.*not read"):
        kf.lookup("vllm", "octave_k3v4").bytes_per_head(128)


# -- capacity per format ------------------------------------------------------------------------

# Llama-3.1-8B's shape: 32 layers, 8 KV heads, head_dim 128.
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
}


def test_bytes_per_token_with_sidecars_and_skipped_layers() -> None:
    layout = parse_kv_layout(LLAMA)
    bf16, fp8 = 32 * 8 * 512, 32 * 8 * 256
    assert layout.bytes_per_token("auto") == layout.bytes_per_token("bf16") == bf16
    assert layout.bytes_per_token("fp8") == fp8
    assert layout.bytes_per_token("fp8_per_token_head") == 32 * 8 * (256 + 8)
    assert layout.bytes_per_token("int4_per_token_head") == 32 * 8 * (128 + 8)
    assert layout.bytes_per_token("nvfp4") == 32 * 8 * 2 * (64 + 8)
    skip = layout.bytes_per_token("fp8", skip_layers=["0", "31"])
    assert skip == 30 * 8 * 256 + 2 * 8 * 512
    # TurboQuant keeps the first and last two layers in 16 bits on a dense model
    assert layout.bytes_per_token("turboquant_4bit_nc") == 28 * 8 * 134 + 4 * 8 * 512
    assert layout.skipped_layers("turboquant_k8v4") == {0, 1, 30, 31}
    # an index listed twice, or also a boundary layer, is skipped once
    assert layout.skipped_layers("turboquant_k8v4", skip_layers=["1", "5"]) == {0, 1, 5, 30, 31}


def test_sliding_window_skip_and_bad_entries() -> None:
    gemma = json.loads(
        (Path(__file__).parents[1] / "data" / "configs" / "gemma-3-27b-it.json").read_text()
    )
    layout = parse_kv_layout(gemma)
    skipped = layout.skipped_layers("fp8", skip_layers=["sliding_window"])
    assert len(skipped) == layout.sliding_window_layers > 0
    assert skipped.isdisjoint(i for i in range(layout.num_layers) if (i + 1) % 6 == 0)
    with pytest.raises(SpecError, match=r"kvCache\.skipLayers\[0\]: 'ten' is neither"):
        layout.bytes_per_token("fp8", skip_layers=["ten"])
    with pytest.raises(SpecError, match="'99' is neither a layer index below 62"):
        layout.bytes_per_token("fp8", skip_layers=["99"])


def test_mla_formats_only_on_mla() -> None:
    deepseek = json.loads(
        (Path(__file__).parents[1] / "data" / "configs" / "deepseek-v3.json").read_text()
    )
    mla = parse_kv_layout(deepseek)
    assert mla.bytes_per_token("fp8_ds_mla") == 61 * 656
    assert mla.bytes_per_token("fp8") == 61 * 576
    with pytest.raises(UnsupportedError, match=r"int8_per_token_head.*MLA"):
        mla.bytes_per_token("int8_per_token_head")
    with pytest.raises(UnsupportedError, match="for DeepSeek MLA models only"):
        parse_kv_layout(LLAMA).bytes_per_token("nvfp4_ds_mla")


def test_every_format_with_scales_is_quantized() -> None:
    # scales.format_findings asks "checkpoint or dynamic scales?" before "quantized?": the two
    # orders agree only while no 16-bit format carries scales
    for format_ in kf.FORMATS.values():
        if format_.scale_mode in (kf.SCALES_CHECKPOINT, kf.SCALES_DYNAMIC):
            assert format_.quantized, format_


@pytest.mark.parametrize(
    ("engine", "stated", "runs", "same"),
    [
        ("vllm", "bfloat16", "auto", True),  # any two 16-bit names: the model dtype is not read
        ("vllm", "float16", "bfloat16", True),
        ("vllm", "fp8", "fp8_e4m3", True),  # vLLM's fp8 is its e4m3
        ("vllm", "FP8_E4M3", "fp8", True),
        ("vllm", "fp8_e5m2", "fp8", False),
        ("vllm", "bfloat16", "fp8", False),
        ("vllm", "fp8", "auto", False),
        ("vllm", "int8_per_token_head", "fp8_per_token_head", False),
        ("sglang", "fp8_e4m3", "fp8_e4m3", True),
        ("sglang", "bf16", "auto", True),
        ("sglang", "fp8_e4m3", "fp8_e5m2", False),
        ("vllm", "fp8", "not-a-format", False),  # unknown to kvgate: only the same name matches
        ("vllm", "odd", "odd", True),
    ],
)
def test_a_stated_format_matches_only_the_storage_it_names(
    engine: str, stated: str, runs: str, same: bool
) -> None:
    assert kf.same_storage(engine, stated, runs) is same
    assert kf.same_storage(engine, runs, stated) is same
