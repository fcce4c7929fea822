"""hack/tiny_model.py: the tiny checkpoints real vLLM serves (tests/data/real-engine/)."""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

import tiny_model
from kvgate.adapters.hub import read_local_checkpoint

HAS_GSM8K = (tiny_model.gsm8k_dir() / "train.jsonl").is_file()
needs_gsm8k = pytest.mark.skipif(not HAS_GSM8K, reason=f"no GSM8K in {tiny_model.gsm8k_dir()}")


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def header(directory: Path) -> dict[str, Any]:
    return tiny_model.read_safetensors_header(directory / "model.safetensors")


def config(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "config.json").read_text())


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One build per variant (the `words` corpus: no data dir needed, and faster)."""
    root = tmp_path_factory.mktemp("tiny")
    variants: dict[str, dict[str, Any]] = {
        "qwen3": {},
        "llama": {"arch": "llama"},
        "qwen3-small": {"layers": 2, "heads": 8, "kv_heads": 4, "head_dim": 32},
        "calibrated": {"kv_scales": "calibrated"},
        "broken": {"kv_scales": "broken"},
    }
    return {
        name: tiny_model.build(root / name, corpus="words", **kwargs)
        for name, kwargs in variants.items()
    }


def test_same_arguments_give_identical_files(tmp_path: Path, built: dict[str, Path]) -> None:
    again = tiny_model.build(tmp_path / "again", corpus="words")
    assert digests(again) == digests(built["qwen3"])
    assert sorted(digests(again)) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_another_seed_gives_other_weights(tmp_path: Path, built: dict[str, Path]) -> None:
    other = digests(tiny_model.build(tmp_path / "seed1", corpus="words", seed=1))
    assert other["model.safetensors"] != digests(built["qwen3"])["model.safetensors"]


@needs_gsm8k
def test_gsm8k_build_is_identical_in_a_fresh_process(tmp_path: Path) -> None:
    """The default corpus, built by the script in two processes (tokenizers trains in threads)."""
    script = Path(tiny_model.__file__)
    for name in ("a", "b"):
        subprocess.run([sys.executable, str(script), str(tmp_path / name)], check=True)
    assert digests(tmp_path / "a") == digests(tmp_path / "b")


def test_weight_shapes_follow_the_arguments(built: dict[str, Path]) -> None:
    tensors = header(built["qwen3-small"])
    assert tensors["model.layers.1.self_attn.q_proj.weight"]["shape"] == [8 * 32, 256]
    assert tensors["model.layers.1.self_attn.k_proj.weight"]["shape"] == [4 * 32, 256]
    assert tensors["model.layers.1.self_attn.v_proj.weight"]["shape"] == [4 * 32, 256]
    assert tensors["model.layers.1.self_attn.o_proj.weight"]["shape"] == [256, 8 * 32]
    assert tensors["model.layers.1.self_attn.q_norm.weight"]["shape"] == [32]
    assert "model.layers.2.self_attn.q_proj.weight" not in tensors
    assert tensors["model.embed_tokens.weight"]["shape"] == [4096, 256]
    assert "lm_head.weight" not in tensors  # tied to the embeddings


def test_names_per_architecture(built: dict[str, Path]) -> None:
    qwen3, llama = set(header(built["qwen3"])), set(header(built["llama"]))
    assert qwen3 - llama == {
        f"model.layers.{i}.self_attn.{n}_norm.weight" for i in range(4) for n in "qk"
    }
    assert llama < qwen3
    per_layer = {name.split(".", 3)[3] for name in llama if name.startswith("model.layers.0.")}
    assert per_layer == {
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    }


def test_safetensors_layout_is_valid(built: dict[str, Path]) -> None:
    """Offsets are contiguous from 0 and end at the file's end; BF16 everywhere but the scales."""
    path = built["calibrated"] / "model.safetensors"
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    assert length % 8 == 0
    tensors = {k: v for k, v in header(built["calibrated"]).items() if k != "__metadata__"}
    spans = sorted(tuple(v["data_offsets"]) for v in tensors.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(data) - 8 - length
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    for name, info in tensors.items():
        size = 4 if info["dtype"] == "F32" else 2
        assert info["data_offsets"][1] - info["data_offsets"][0] == size * int(
            np.prod(info["shape"])
        )
        assert info["dtype"] == ("F32" if name.endswith("_scale") else "BF16")


def test_weights_are_small_normals_and_norms_are_one(built: dict[str, Path]) -> None:
    directory = built["qwen3"]
    tensors = header(directory)
    data = (directory / "model.safetensors").read_bytes()
    start = 8 + struct.unpack("<Q", data[:8])[0]

    def values(name: str) -> np.ndarray:
        begin, end = tensors[name]["data_offsets"]
        raw = np.frombuffer(data[start + begin : start + end], dtype="<u2")
        return (raw.astype(np.uint32) << 16).view(np.float32)

    assert np.all(values("model.norm.weight") == 1.0)
    assert np.all(values("model.layers.0.self_attn.k_norm.weight") == 1.0)
    q = values("model.layers.0.self_attn.q_proj.weight")
    assert 0.018 < float(q.std()) < 0.022 and abs(float(q.mean())) < 0.001


def test_bf16_rounds_to_nearest_even() -> None:
    cases = np.array([1.0, 1.00390625, 1.01171875, -2.5, 0.0], dtype=np.float32)
    # 1 + 2**-8 is halfway between two bf16 values: ties go to the even mantissa (1.0);
    # 1 + 3 * 2**-8 is halfway too and goes up to the even 1 + 2**-6.
    got = np.frombuffer(tiny_model.bf16_bytes(cases), dtype="<u2")
    assert [hex(v) for v in got] == ["0x3f80", "0x3f80", "0x3f82", "0xc020", "0x0"]


def test_config_fields(built: dict[str, Path]) -> None:
    qwen3, llama = config(built["qwen3"]), config(built["llama"])
    assert qwen3["architectures"] == ["Qwen3ForCausalLM"] and qwen3["model_type"] == "qwen3"
    assert llama["architectures"] == ["LlamaForCausalLM"] and llama["model_type"] == "llama"
    for cfg in (qwen3, llama):
        assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]) == (
            256,
            4,
            512,
        )
        assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (
            4,
            2,
            64,
        )
        assert cfg["vocab_size"] == 4096 and cfg["max_position_embeddings"] == 4096
        assert cfg["tie_word_embeddings"] is True and cfg["torch_dtype"] == "bfloat16"
        assert "quantization_config" not in cfg
    small = config(built["qwen3-small"])
    assert (small["num_hidden_layers"], small["num_attention_heads"]) == (2, 8)
    assert (small["num_key_value_heads"], small["head_dim"]) == (4, 32)


def test_tokenizer_round_trips_and_matches_config(built: dict[str, Path]) -> None:
    directory = built["qwen3"]
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    assert tokenizer.get_vocab_size() <= config(directory)["vocab_size"]
    text = "<|im_start|>user\nNatalia sold 48 clips in April. How many? ünïcode ✓<|im_end|>\n"
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert ids[0] == tokenizer.token_to_id("<|im_start|>")
    cfg = config(directory)
    assert cfg["bos_token_id"] == tokenizer.token_to_id("<|endoftext|>")
    assert cfg["eos_token_id"] == tokenizer.token_to_id("<|im_end|>")
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tokenizer_config["chat_template"]
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    assert tokenizer_config["model_max_length"] == 4096
    generation = json.loads((directory / "generation_config.json").read_text())
    assert cfg["eos_token_id"] in generation["eos_token_id"]


@needs_gsm8k
def test_gsm8k_tokenizer_compresses_gsm8k(tmp_path: Path) -> None:
    lines = tiny_model.corpus_lines("gsm8k", seed=0)
    tokenizer = tiny_model.train_tokenizer(lines[:2000], 4096)
    question = lines[0]
    assert len(tokenizer.encode(question).ids) < len(question) / 3


def test_calibrated_scales_and_quantization_config(built: dict[str, Path]) -> None:
    tensors = header(built["calibrated"])
    for i in range(4):
        for kind in "kv":
            assert tensors[f"model.layers.{i}.self_attn.{kind}_scale"]["shape"] == []
            assert tensors[f"model.layers.{i}.self_attn.{kind}_scale"]["dtype"] == "F32"
    quant = config(built["calibrated"])["quantization_config"]
    assert quant["quant_method"] == "compressed-tensors" and quant["config_groups"] == {}
    scheme = quant["kv_cache_scheme"]
    assert (scheme["num_bits"], scheme["type"], scheme["strategy"]) == (8, "float", "tensor")
    assert scheme["dynamic"] is False and scheme["symmetric"] is True


def test_broken_scales_are_zero_on_odd_layers() -> None:
    scales = tiny_model.kv_scale_values("broken", 4, seed=0)
    assert scales[1] == scales[3] == (0.0, 0.0)
    assert all(v > 0 for v in (*scales[0], *scales[2]))
    assert tiny_model.kv_scale_values("calibrated", 4, seed=0)[0] == scales[0]
    assert tiny_model.kv_scale_values("none", 4, seed=0) == {}


def test_kvgate_scanner_reads_the_variants(built: dict[str, Path]) -> None:
    _, plain = read_local_checkpoint(built["qwen3"]).analyse()
    assert plain.coverage == "none" and plain.kv_cache_scheme is None
    assert "ScalesMissing" in {f.code for f in plain.findings}

    layout, calibrated = read_local_checkpoint(built["calibrated"]).analyse()
    assert (layout.num_layers, layout.kv_heads, layout.head_dim) == (4, 2, 64)
    assert calibrated.coverage == "all" and calibrated.present is True
    assert calibrated.kv_cache_scheme is not None and calibrated.forces_fp8_kv

    # By name the zero scales look calibrated; their values say otherwise (vLLM 0.32 loads them
    # and dies at the first request: tests/data/real-engine/README.md).
    _, broken = read_local_checkpoint(built["broken"]).analyse()
    assert broken.coverage == "all"
    assert broken.broken_layers == (1, 3)
    assert any(f.code == "ScalesBroken" and "zero" in f.message for f in broken.findings)


@pytest.mark.parametrize(
    "kwargs",
    [{"arch": "gpt2"}, {"kv_scales": "some"}, {"heads": 3, "kv_heads": 2}, {"layers": 0}],
)
def test_bad_arguments_are_refused(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        tiny_model.build(tmp_path, corpus="words", **kwargs)


REAL_ENGINE = Path(__file__).resolve().parents[1] / "data" / "real-engine"


def test_real_engine_logs_are_stable_fixtures() -> None:
    """The recorded vLLM 0.32 logs (README there): placeholders only, and what each showed.
    The `cpu-excerpt-*` files beside them are excerpts (SOURCE.md), not whole startups."""
    logs = {
        p.stem: p.read_text(encoding="utf-8")
        for p in REAL_ENGINE.glob("*.log")
        if not p.name.startswith("cpu-excerpt-")
    }
    assert set(logs) >= {
        "qwen3-bf16",
        "qwen3-fp8",
        "llama-bf16",
        "qwen3-l2-h8-kv4-d32-bf16",
        "qwen3-calibrated-fp8",
        "qwen3-broken-fp8",
    }
    for name, text in logs.items():
        assert "/tmp/kv" not in text and "scratch-model" not in text, name
        assert "version 0.32.0" in text and "model   /models/tiny-" in text, name
    assert "quantization=compressed-tensors" in logs["qwen3-calibrated-fp8"]
    assert "kv_cache_dtype=fp8" in logs["qwen3-calibrated-fp8"]
    assert "k_scale must be positive for FP8 path" in logs["qwen3-broken-fp8"]
    assert "k_scale must be positive" not in logs["qwen3-calibrated-fp8"]


def test_a_cached_model_is_built_once_whole_and_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tiny_model, "CACHE", tmp_path / "models")
    builds: list[dict[str, Any]] = []
    real_build = tiny_model.build

    def counted(out: Path, **options: Any) -> Path:
        builds.append(options)
        return real_build(out, **options)

    monkeypatch.setattr(tiny_model, "build", counted)
    first = tiny_model.cached("tiny", corpus="words", layers=2)
    again = tiny_model.cached("tiny", corpus="words", layers=2)
    other = tiny_model.cached("tiny", corpus="words", layers=3)
    # built once per options, outside any temp dir the Jobs' pods hide, nothing half-made left
    assert first == again != other and len(builds) == 2
    assert first.parent == tmp_path / "models" and first.name.startswith("tiny-")
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == sorted(
        [first.name, other.name]
    )
    assert digests(first) == digests(real_build(tmp_path / "direct", corpus="words", layers=2))
