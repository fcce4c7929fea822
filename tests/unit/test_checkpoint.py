"""kvgate.checkpoint.scales (tensor names -> ScaleReport) and the local header reader of kvgate.adapters.hub."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from kvgate.adapters.hub import read_json_file, read_local_checkpoint
from kvgate.checkpoint.scales import (
    Finding,
    TensorInfo,
    parse_safetensors_header,
    scan_scales,
    unknown_scales,
)
from kvgate.errors import ParseError

LAYERS = 4
CONFIG = {"num_hidden_layers": LAYERS}


def per_layer(
    *suffixes: str, layers: range = range(LAYERS), prefix: str = "model.layers"
) -> list[str]:
    names = [f"{prefix}.{i}.{s}" for i in layers for s in suffixes]
    return [*names, "model.embed_tokens.weight", "lm_head.weight"]


WEIGHTS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "mlp.up_proj.weight",
)

NAME_STYLES = [
    # tensor names, coverage, (k, v, q) layer counts, finding codes
    (
        per_layer(*WEIGHTS, "self_attn.k_scale", "self_attn.v_scale"),
        "all",
        (4, 4, 0),
        ["QScaleMissing"],
    ),
    (
        per_layer(*WEIGHTS, "self_attn.attn.k_scale", "self_attn.attn.v_scale"),
        "all",
        (4, 4, 0),
        ["QScaleMissing"],
    ),
    (
        per_layer(
            *WEIGHTS,
            "self_attn.k_proj.k_scale",
            "self_attn.v_proj.v_scale",
            "self_attn.q_proj.weight_scale",
        ),
        "all",
        (4, 4, 0),
        ["QScaleMissing"],
    ),
    (
        per_layer(
            *WEIGHTS,
            "self_attn.k_proj.output_scale",
            "self_attn.v_proj.output_scale",
            "self_attn.q_proj.output_scale",
            "self_attn.k_proj.weight_scale",
            "self_attn.k_proj.input_scale",
        ),
        "all",
        (4, 4, 4),
        [],
    ),
    (
        per_layer(
            *WEIGHTS,
            "self_attn.qkv_proj.k_scale",
            "self_attn.qkv_proj.v_scale",
            "self_attn.q_scale",
        ),
        "all",
        (4, 4, 4),
        [],
    ),
    (
        per_layer(*WEIGHTS, "self_attn.kv_scale"),
        "all",
        (4, 4, 0),
        ["LegacyKVScale", "QScaleMissing"],
    ),
    (
        per_layer(*WEIGHTS, "mixer.k_proj.k_scale", "mixer.v_proj.v_scale"),
        "all",
        (4, 4, 0),
        ["QScaleMissing"],
    ),
    (
        per_layer(
            *WEIGHTS, "self_attn.k_cache.scale", "self_attn.v_cache.scale", "self_attn.q.scale"
        ),
        "all",
        (4, 4, 4),
        [],
    ),
    # multimodal checkpoints nest the decoder under language_model
    (
        per_layer(
            *WEIGHTS, "self_attn.k_scale", "self_attn.v_scale", prefix="model.language_model.layers"
        ),
        "all",
        (4, 4, 0),
        ["QScaleMissing"],
    ),
    # the common trap: FP8 weights, no KV scales
    (
        per_layer(*WEIGHTS, "self_attn.k_proj.weight_scale", "self_attn.k_proj.input_scale"),
        "none",
        (0, 0, 0),
        ["FP8WeightsWithoutKVScales"],
    ),
    (
        per_layer(*WEIGHTS, "mlp.up_proj.weight_scale_inv"),
        "none",
        (0, 0, 0),
        ["FP8WeightsWithoutKVScales"],
    ),
    (per_layer(*WEIGHTS), "none", (0, 0, 0), ["ScalesMissing"]),
    (
        per_layer(*WEIGHTS) + per_layer("self_attn.k_scale", "self_attn.v_scale", layers=range(2)),
        "partial",
        (2, 2, 0),
        ["ScalesPartial", "QScaleMissing"],
    ),
    (
        per_layer(*WEIGHTS, "self_attn.k_scale"),
        "partial",
        (4, 0, 0),
        ["ScalesPartial", "QScaleMissing"],
    ),
]


@pytest.mark.parametrize(("names", "coverage", "counts", "codes"), NAME_STYLES)
def test_name_styles(
    names: list[str], coverage: str, counts: tuple[int, int, int], codes: list[str]
) -> None:
    report = scan_scales(names, config=CONFIG)
    summary = report.to_dict()
    assert report.coverage == coverage
    assert (summary["k"], summary["v"], summary["q"]) == counts
    assert [f.code for f in report.findings] == codes
    assert summary["present"] is (coverage == "all")


def test_partial_message_lists_missing_layers() -> None:
    names = per_layer("self_attn.k_scale", "self_attn.v_scale", layers=range(0, 20, 2))
    report = scan_scales(names, config={"num_hidden_layers": 20})
    assert report.findings[0].message == (
        "k/v scales cover 10 of 20 attention layers; missing in layer(s) 1, 3, 5, 7, 9, 11, 13, 15, ..."
    )
    assert report.missing_layers == tuple(range(1, 20, 2))


def test_fp8_weight_trap_message() -> None:
    names = per_layer(*WEIGHTS, "self_attn.k_proj.weight_scale", "self_attn.k_proj.input_scale")
    report = scan_scales(names, config=CONFIG)
    assert report.findings[0].message == (
        "the checkpoint has 8 weight/activation scales (input_scale, weight_scale) but no k/v "
        "scales: quantized weights do not calibrate the KV cache, which will run with scale 1.0"
    )
    assert report.to_dict()["weight_scales"]["present"] is True


def test_hybrid_expects_scales_only_in_attention_layers() -> None:
    # GIVEN a hybrid model whose layers 1 and 3 hold KV  WHEN only they carry scales
    names = per_layer("self_attn.k_scale", "self_attn.v_scale", layers=range(1, 4, 2))
    report = scan_scales(names, config=CONFIG, kv_layers=[1, 3])
    # THEN coverage is complete
    assert report.coverage == "all"
    assert report.to_dict()["layers"] == {"total": 4, "expected": 2, "covered": 2, "missing": []}


def test_vision_tower_scales_do_not_count() -> None:
    names = per_layer(
        "self_attn.k_scale", "self_attn.v_scale", prefix="vision_tower.vision_model.encoder.layers"
    )
    report = scan_scales(names, config=CONFIG)
    assert report.coverage == "none"


def test_a_scale_name_with_a_trailing_newline_does_not_count() -> None:
    # no engine loads "...k_scale\n" as a k scale; `$` would have matched before the newline
    names = [n + "\n" for n in per_layer("self_attn.k_scale", "self_attn.v_scale")]
    assert scan_scales(names, config=CONFIG).coverage == "none"


def test_layers_beyond_num_hidden_layers_are_ignored() -> None:
    # DeepSeek-V3 keeps its MTP layer at index num_hidden_layers
    names = per_layer("self_attn.k_scale", "self_attn.v_scale", layers=range(LAYERS + 1))
    report = scan_scales(names, config=CONFIG)
    assert (report.coverage, len(report.covered_layers)) == ("all", LAYERS)


def test_without_config_the_layers_seen_are_expected() -> None:
    report = scan_scales(per_layer(*WEIGHTS, "self_attn.k_scale", "self_attn.v_scale"))
    assert report.total_layers is None
    assert report.expected_layers == (0, 1, 2, 3)
    assert report.coverage == "all"


def test_non_scalar_scale_is_flagged() -> None:
    tensors = {
        f"model.layers.{i}.self_attn.{kind}_scale": TensorInfo(
            f"model.layers.{i}.self_attn.{kind}_scale", "F32", (8,) if kind == "k" else ()
        )
        for i in range(LAYERS)
        for kind in ("k", "v", "q")
    }
    report = scan_scales(tensors, config=CONFIG)
    assert report.findings[-1].code == "NonScalarKVScale"
    assert report.findings[-1].message == (
        "4 k/v/q scale(s) are not per-tensor (e.g. model.layers.0.self_attn.k_scale [8]): "
        "vLLM refuses them ('Only support per-tensor scaling factor for fp8 KV cache')"
    )


def test_weight_dtypes_from_headers() -> None:
    tensors = [
        TensorInfo("model.layers.0.mlp.up_proj.weight", "F8_E4M3", (4, 4)),
        TensorInfo("model.layers.0.mlp.down_proj.weight", "F8_E4M3", (4, 4)),
        TensorInfo("model.embed_tokens.weight", "BF16", (4, 4)),
    ]
    assert scan_scales(tensors).to_dict()["weight_scales"]["weight_dtypes"] == {
        "F8_E4M3": 2,
        "BF16": 1,
    }


CONFIG_HINTS = [
    (
        {
            "quantization_config": {
                "quant_method": "compressed-tensors",
                "kv_cache_scheme": {"num_bits": 8, "type": "float"},
            }
        },
        ["KVCacheSchemeSet", "ControlRunsFP8"],
    ),
    (
        {"quantization_config": {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}},
        ["KVCacheQuantAlgoFP8", "ControlRunsFP8"],
    ),
    (
        {"text_config": {"quantization_config": {"kv_cache_quant_algo": "fp8"}}},
        ["KVCacheQuantAlgoFP8", "ControlRunsFP8"],
    ),
]


@pytest.mark.parametrize(("config", "codes"), CONFIG_HINTS)
def test_config_hints(config: dict[str, Any], codes: list[str]) -> None:
    names = per_layer(
        "self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale", "self_attn.q_scale"
    )
    report = scan_scales(names, config={**CONFIG, **config})
    assert [f.code for f in report.findings] == codes


def test_modelopt_hf_quant_config(tmp_path: Path) -> None:
    # GIVEN a ModelOpt checkpoint that declares its KV algo only in hf_quant_config.json
    directory = tmp_path / "modelopt"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(CONFIG))
    (directory / "hf_quant_config.json").write_text(
        json.dumps(
            {
                "producer": {"name": "modelopt"},
                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
            }
        )
    )
    tensors = {
        name: np.ones((), dtype=np.float32)
        for name in per_layer("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale")[:-2]
    }
    save_file(tensors, str(directory / "model.safetensors"))
    # WHEN it is read and scanned
    headers = read_local_checkpoint(directory)
    report = scan_scales(
        headers.tensors, config=headers.config, modelopt_config=headers.modelopt_config
    )
    # THEN the silent SGLang switch is reported
    assert report.kv_cache_quant_algo == "FP8"
    # hf_quant_config.json has no quant_method: vLLM's auto resolution does not apply, SGLang's does
    assert report.forces_fp8_kv == ("kv_cache_quant_algo FP8: SGLang resolves auto to fp8_e4m3",)
    assert report.findings[-1].code == "ControlRunsFP8"
    assert report.findings[-2] == Finding(
        "KVCacheQuantAlgoFP8",
        "kv_cache_quant_algo is FP8 (quantization_config or hf_quant_config.json): SGLang "
        "resolves --kv-cache-dtype auto to fp8_e4m3 without saying so",
    )


def test_compressed_tensors_config_from_data() -> None:
    config = json.loads(
        (Path(__file__).parents[1] / "data/configs/llama-3-8b-fp8-kv.json").read_text()
    )
    report = unknown_scales(config)
    assert report.kv_cache_scheme == {
        "dynamic": False,
        "num_bits": 8,
        "strategy": "tensor",
        "symmetric": True,
        "type": "float",
    }
    assert report.findings[-2].message == (
        "config.json quantization_config.kv_cache_scheme is set: vLLM (0.26+) runs the KV cache "
        "in FP8 even with --kv-cache-dtype auto, and logs no line saying so"
    )
    assert report.findings[-1].message == (
        "the checkpoint forces an FP8 KV cache under --kv-cache-dtype auto (quantization_config."
        "kv_cache_scheme is set: vLLM 0.26+ switches an auto KV cache to fp8): a control (and "
        "production) on auto runs FP8 already, so the canary would compare FP8 with FP8; pin the "
        "control's dtype (--kv-cache-dtype bfloat16, vLLM 0.11+ / SGLang 0.5.10+) or treat "
        "production as FP8"
    )
    assert report.to_dict()["forces_fp8_kv"] == list(report.forces_fp8_kv)


def test_unknown_scales_from_config_alone() -> None:
    report = unknown_scales(
        {"num_hidden_layers": 36, "quantization_config": {"quant_method": "fp8"}}
    )
    summary = report.to_dict()
    assert (summary["present"], summary["coverage"], summary["k"]) == (None, "unknown", None)
    assert [f.code for f in report.findings] == ["ScalesUnknown", "WeightsQuantized"]
    assert report.findings[1].message == (
        "config.json declares quant_method 'fp8': that quantizes weights; it does not put k/v "
        "scales in the checkpoint"
    )


def test_bad_quantization_config() -> None:
    with pytest.raises(ParseError) as caught:
        scan_scales([], config={"quantization_config": "fp8"}, source="x/config.json")
    assert str(caught.value) == "x/config.json: field 'quantization_config' must be an object"


HEADER_ERRORS = [
    (
        b"\xff",
        "shard.safetensors: safetensors header is not JSON ('utf-8' codec can't decode byte 0xff in position 0: invalid start byte)",
    ),
    (b"[]", "shard.safetensors: safetensors header is not a JSON object"),
    (b'{"a": {"dtype": "F32"}}', "shard.safetensors: safetensors header entry 'a' has no shape"),
]


@pytest.mark.parametrize(("header", "message"), HEADER_ERRORS)
def test_header_errors(header: bytes, message: str) -> None:
    with pytest.raises(ParseError) as caught:
        parse_safetensors_header(header, "shard.safetensors")
    assert str(caught.value) == message


# ---- local checkpoints (kvgate.adapters.hub, file I/O only) ----


def write_checkpoint(
    directory: Path, shards: int, *, scales: bool = True, config: dict[str, Any] | None = None
) -> Path:
    """A sharded checkpoint with one k_proj weight (and k/v scales) per layer."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps(
            config or {"num_hidden_layers": LAYERS, "num_attention_heads": 4, "hidden_size": 64}
        )
    )
    weight_map: dict[str, str] = {}
    layers_per_shard = LAYERS // shards
    for shard in range(shards):
        name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        tensors: dict[str, np.ndarray] = {}
        for layer in range(shard * layers_per_shard, (shard + 1) * layers_per_shard):
            tensors[f"model.layers.{layer}.self_attn.k_proj.weight"] = np.zeros(
                (128, 128), dtype=np.float16
            )
            if scales:
                tensors[f"model.layers.{layer}.self_attn.k_scale"] = np.ones((), dtype=np.float32)
                tensors[f"model.layers.{layer}.self_attn.v_scale"] = np.ones((), dtype=np.float32)
        save_file(tensors, str(directory / name))
        weight_map.update(dict.fromkeys(tensors, name))
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return directory


def header_size(path: Path) -> int:
    with path.open("rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_local_sharded_checkpoint_reads_only_headers(tmp_path: Path, shards: int) -> None:
    directory = write_checkpoint(tmp_path / "m", shards)
    headers = read_local_checkpoint(directory)
    shard_files = sorted(directory.glob("*.safetensors"))
    assert headers.files == tuple(p.name for p in shard_files)
    assert headers.header_bytes == sum(header_size(p) for p in shard_files)
    # the headers and the k/v scales (two 4-byte scalars a layer), never the weights
    assert headers.bytes_read == headers.header_bytes + LAYERS * 2 * 4
    assert headers.scale_values is not None and set(headers.scale_values.values()) == {(1.0,)}
    assert headers.bytes_read < sum(p.stat().st_size for p in shard_files) / 10
    assert len(headers.tensors) == LAYERS * 3
    assert headers.config == {
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "hidden_size": 64,
    }
    report = scan_scales(headers.tensors, config=headers.config)
    assert report.coverage == "all"


def test_local_single_file_and_file_path(tmp_path: Path) -> None:
    directory = tmp_path / "m"
    directory.mkdir()
    save_file(
        {"model.layers.0.self_attn.kv_scale": np.ones((), dtype=np.float32)},
        str(directory / "model.safetensors"),
    )
    assert read_local_checkpoint(directory).files == ("model.safetensors",)
    single = read_local_checkpoint(directory / "model.safetensors")
    assert (single.config, list(single.tensors)) == (None, ["model.layers.0.self_attn.kv_scale"])
    info = single.tensors["model.layers.0.self_attn.kv_scale"]
    assert (info.name, info.dtype, info.shape) == ("model.layers.0.self_attn.kv_scale", "F32", ())


def test_local_errors(tmp_path: Path) -> None:
    directory = write_checkpoint(tmp_path / "m", 2)
    (directory / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ParseError) as caught:
        read_local_checkpoint(directory)
    assert str(caught.value) == (
        f"{directory}/model.safetensors.index.json: weight_map names "
        "'model-00002-of-00002.safetensors' but the file is missing"
    )

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ParseError) as caught:
        read_local_checkpoint(empty)
    assert str(caught.value) == (
        f"{empty}: no model.safetensors or model.safetensors.index.json; kvgate reads safetensors checkpoints"
    )

    truncated = tmp_path / "t.safetensors"
    truncated.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(ParseError) as caught:
        read_local_checkpoint(truncated)
    assert str(caught.value) == (
        f"{truncated}: not a safetensors file: its header length is larger than the file (10 bytes)"
    )

    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"abc")
    with pytest.raises(ParseError) as caught:
        read_local_checkpoint(tiny)
    assert str(caught.value) == f"{tiny}: file has 3 bytes; not a safetensors file"

    with pytest.raises(ParseError) as caught:
        read_local_checkpoint(tmp_path / "absent")
    assert str(caught.value) == f"{tmp_path / 'absent'}: no such file or directory"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{\n"a" 1}', "cfg.json:2: malformed JSON: Expecting ':' delimiter"),
        ("[1]", "cfg.json: expected a JSON object, got list"),
    ],
)
def test_read_json_file_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("cfg.json").write_text(text)
    with pytest.raises(ParseError) as caught:
        read_json_file("cfg.json")
    assert str(caught.value) == message


# -- hostile checkpoints: entries stay inside the model directory, no bytes echoed ----------------


def test_an_index_entry_outside_the_model_directory_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "secret.safetensors"
    header = json.dumps({"x.weight": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}})
    outside.write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0\0")
    model = tmp_path / "a" / "b" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 1}))
    index = {"weight_map": {"x.weight": "../../../secret.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ParseError) as caught:
        read_local_checkpoint(model)
    assert str(caught.value) == (
        f"{model}/model.safetensors.index.json: weight_map names "
        "'../../../secret.safetensors', which is outside the model directory"
    )
    (model / "link.safetensors").symlink_to(outside)
    index = {"weight_map": {"x.weight": "link.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ParseError, match="outside the model directory"):
        read_local_checkpoint(model)


def test_a_file_that_is_not_safetensors_leaks_none_of_its_bytes(tmp_path: Path) -> None:
    fake = tmp_path / "environ.safetensors"
    secret = b"HF_TOKEN=hf_secretsecret\0PATH=/usr/bin\0"
    fake.write_bytes(secret)
    with pytest.raises(ParseError) as caught:
        read_local_checkpoint(fake)
    message = str(caught.value)
    (length,) = struct.unpack("<Q", secret[:8])
    assert str(length) not in message and "secret" not in message
    assert message == (
        f"{fake}: not a safetensors file: its header length is larger than the cap of "
        "25,000,000 bytes"
    )


def test_which_configs_force_fp8_kv_on_the_control() -> None:
    def forced(quant: dict[str, Any]) -> tuple[str, ...]:
        return unknown_scales({**CONFIG, "quantization_config": quant}).forces_fp8_kv

    # ModelOpt in config.json: vLLM 0.15+ and SGLang both resolve auto to fp8_e4m3
    assert forced(
        {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
    ) == (
        "ModelOpt kv_cache_quant_algo FP8: vLLM 0.15+ resolves auto to fp8_e4m3",
        "kv_cache_quant_algo FP8: SGLang resolves auto to fp8_e4m3",
    )
    # FP8 weights alone, or a ModelOpt config without a KV algo, force nothing
    assert forced({"quant_method": "fp8"}) == ()
    assert forced({"quant_method": "modelopt", "quant_algo": "FP8"}) == ()
    assert forced({"quant_method": "modelopt", "kv_cache_quant_algo": None}) == ()
    plain = unknown_scales(CONFIG)
    assert plain.forces_fp8_kv == () and "ControlRunsFP8" not in [f.code for f in plain.findings]
