"""`kvgate preflight --kv-cache-dtype F [--kv-cache-dtype-skip-layers ...] [--attention-backend]`:
each format's class, bytes a token with its sidecars, gain, pools, and what the checkpoint's
scales mean for it; on tiny_model's real checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.cli import main
from tiny_model import build

MIB8 = str(8 / 1024)  # GiB


def preflight(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    code = main(["preflight", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if "--json" in argv else {}), out + err


def test_formats_on_a_broken_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = build(tmp_path / "b", corpus="words", kv_scales="broken")
    common = ("--gpu-memory-gib", MIB8, "--max-model-len", "2048", "--vllm-version", "0.32.0")
    code, result, _ = preflight(
        capsys, str(model), *common, "--block-size", "128", "--kv-cache-dtype", "fp8",
        "--kv-cache-dtype", "int8_per_token_head", "--kv-cache-dtype", "nvfp4", "--json",
    )  # fmt: skip
    # the kv_cache_scheme makes `auto` FP8: the command says the gate fails, as before
    assert code != 0 and result["scales"]["effective_kv_format_under_auto"] == "fp8"
    fp8, per_head, nvfp4 = (result["formats"][n] for n in ("fp8", "int8_per_token_head", "nvfp4"))
    assert [f["code"] for f in fp8["scale_findings"]] == ["ScalesBroken"]
    assert [f["code"] for f in per_head["scale_findings"]] == ["ScalesUnused"]
    assert (per_head["class"], per_head["kv_bytes_per_token"]) == ("per-token-head", 4 * 2 * 136)
    assert (nvfp4["class"], nvfp4["kv_bytes_per_token"]) == ("sub-8-bit", 4 * 2 * 72)
    assert fp8["vllm_pool"]["kv_tokens"] == 8192  # as the real engine logged it
    assert round(per_head["capacity_gain"], 3) == round(2048 / 1088, 3)


def test_skip_layers_backend_and_version_floor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = build(tmp_path / "n", corpus="words")
    code, result, _ = preflight(
        capsys, str(model), "--gpu-memory-gib", MIB8, "--max-model-len", "2048",
        "--vllm-version", "0.19.0", "--block-size", "128", "--attention-backend", "cpu_attn",
        "--kv-cache-dtype", "fp8", "--kv-cache-dtype", "nvfp4",
        "--kv-cache-dtype-skip-layers", "0", "--json",
    )  # fmt: skip
    assert code == 0
    fp8, nvfp4 = result["formats"]["fp8"], result["formats"]["nvfp4"]
    # layer 0 in BF16: 512 + 3 x 256; the real engine logged 6,528 tokens (fp8-skip-0.log)
    assert (fp8["kv_bytes_per_token"], fp8["skipped_layers"]) == (1280, [0])
    assert (nvfp4["offered"], nvfp4["floor"]) == (False, "0.20.0")
    _, _, text = preflight(
        capsys, str(model), "--kv-cache-dtype", "turboquant_4bit_nc", "--kv-cache-dtype", "fp6"
    )
    assert "--kv-cache-dtype: 'fp6' is not a vllm KV cache format; use one of auto" in text
    assert "Traceback" not in text
