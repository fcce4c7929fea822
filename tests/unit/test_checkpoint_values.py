"""The checkpoint scan reads what the k/v scales hold (only those tensors), on real checkpoints
built by hack/tiny_model.py: `broken` (0.0 in layers 1 and 3, which real vLLM 0.32 loads and
then dies on: tests/data/real-engine/qwen3-broken-fp8.log), `calibrated` and `none`."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest

from kvgate.adapters import hub
from kvgate.checkpoint.scales import ScaleReport, format_findings
from tiny_model import build, read_safetensors_header, write_safetensors

REAL_ENGINE = Path(__file__).resolve().parents[1] / "data" / "real-engine"


def scan(model: Path) -> tuple[hub.CheckpointHeaders, ScaleReport]:
    headers = hub.read_local_checkpoint(model)
    return headers, headers.analyse()[1]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("scales")
    return {
        v: build(root / v, corpus="words", kv_scales=v)  # type: ignore[arg-type]
        for v in ("broken", "calibrated", "none")
    }


def test_zero_scales_are_broken_and_named_by_layer(models: dict[str, Path]) -> None:
    headers, report = scan(models["broken"])
    assert (report.values_read, report.broken_layers) == (8, (1, 3))
    assert report.present  # the names alone say "calibrated": that is what the values correct
    codes = [f.code for f in report.findings]
    assert "ScalesBroken" in codes
    message = next(f.message for f in report.findings if f.code == "ScalesBroken")
    assert "2 of 4 attention layers" in message
    assert "layer 1 k_scale 0.0; layer 1 v_scale 0.0; layer 3 k_scale 0.0" in message
    assert "recalibrate" in message
    # what real vLLM did with this very checkpoint
    log = (REAL_ENGINE / "qwen3-broken-fp8.log").read_text()
    assert "k_scale must be positive for FP8 path" in log
    # only the header and the eight 4-byte scalars were read, not the weights
    size = sum((models["broken"] / f).stat().st_size for f in headers.files)
    assert headers.bytes_read == headers.header_bytes + 8 * 4 < size // 100


def test_calibrated_and_plain_checkpoints(models: dict[str, Path]) -> None:
    _, calibrated = scan(models["calibrated"])
    assert (calibrated.values_read, calibrated.broken, calibrated.coverage) == (8, (), "all")
    assert "ScalesBroken" not in [f.code for f in calibrated.findings]
    # the kv_cache_scheme makes vLLM run `auto` in FP8 (measured: qwen3-calibrated-auto.log)
    assert calibrated.effective_kv_format("auto") == "fp8"
    assert calibrated.to_dict()["effective_kv_format_under_auto"] == "fp8"
    assert calibrated.effective_kv_format("bfloat16") == "bfloat16"
    _, plain = scan(models["none"])
    assert (plain.values_read, plain.coverage, plain.effective_kv_format("auto")) == (
        0,
        "none",
        "auto",
    )


def test_what_the_scan_means_per_format(models: dict[str, Path]) -> None:
    _, broken = scan(models["broken"])
    assert [f.code for f in format_findings(broken, "vllm", "fp8")] == ["ScalesBroken"]
    unused = format_findings(broken, "vllm", "int8_per_token_head")
    assert [f.code for f in unused] == ["ScalesUnused"]
    assert unused[0].message.startswith("checkpoint scales unused: int8_per_token_head")
    assert "(including the broken ones)" in unused[0].message
    assert format_findings(broken, "vllm", "auto") == ()
    assert [f.code for f in format_findings(broken, "vllm", "nvfp4")] == ["ScalesNotApplicable"]
    _, plain = scan(models["none"])
    assert format_findings(plain, "vllm", "fp8_per_token_head") == ()


def _rewrite(model: Path, out: Path, scales: dict[str, tuple[str, tuple[int, ...], bytes]]) -> Path:
    """`model`'s tensors with its k/v scales replaced by `scales`."""
    header = read_safetensors_header(model / "model.safetensors")
    data = (model / "model.safetensors").read_bytes()
    start = 8 + struct.unpack("<Q", data[:8])[0]
    tensors: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
    for name, entry in header.items():
        if name == "__metadata__" or name.endswith(("k_scale", "v_scale")):
            continue
        begin, end = entry["data_offsets"]  # type: ignore[index]
        tensors[name] = (
            str(entry["dtype"]),
            tuple(entry["shape"]),
            data[start + begin : start + end],
        )  # type: ignore[index, arg-type]
    tensors.update(scales)
    out.mkdir()
    for f in ("config.json", "tokenizer.json"):
        (out / f).write_bytes((model / f).read_bytes())
    write_safetensors(out / "model.safetensors", tensors)
    return out


@pytest.mark.parametrize(
    ("value", "shown"), [(-1.5, "-1.5"), (math.nan, "nan"), (math.inf, "inf"), (0.0, "0.0")]
)
def test_negative_nan_and_infinite_scales(
    models: dict[str, Path], tmp_path: Path, value: float, shown: str
) -> None:
    good = struct.pack("<f", 0.02)
    scales = {
        f"model.layers.{i}.self_attn.{kv}_scale": ("F32", (), good) for i in range(4) for kv in "kv"
    }
    scales["model.layers.2.self_attn.v_scale"] = ("F32", (), struct.pack("<f", value))
    model = _rewrite(models["calibrated"], tmp_path / "m", scales)
    _, report = scan(model)
    assert report.broken == ((2, f"v_scale {shown}"),)


def test_bf16_and_per_head_scales(models: dict[str, Path], tmp_path: Path) -> None:
    bf16 = lambda x: struct.pack("<f", x)[2:]  # noqa: E731 - the high half of a float32
    scales = {
        f"model.layers.{i}.self_attn.{kv}_scale": (
            "BF16",
            (2,),
            bf16(0.5) + bf16(0.25 if i else 0.0),
        )
        for i in range(4)
        for kv in "kv"
    }
    model = _rewrite(models["calibrated"], tmp_path / "m", scales)
    _, report = scan(model)
    assert report.broken == ((0, "k_scale 0.0"), (0, "v_scale 0.0"))
    assert len(report.per_head) == 8  # [num_kv_heads]: per-head, not a bad shape
    codes = [f.code for f in report.findings]
    assert "PerHeadKVScales" in codes and "NonScalarKVScale" not in codes
