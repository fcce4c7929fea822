"""kvgate.evidence.logs: startup logs of vLLM 0.10-0.33 and SGLang 0.4-0.5 -> LogScan.

The fixtures in tests/data/logs are built from the engines' format strings
(reference/engines.md); prefixes, colours, CRLF, interleaving and truncation are applied
here so every variation is checked against the plain log's result.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

from kvgate.errors import ParseError, UnsupportedError
from kvgate.evidence.logs import ANCHORS, CODES, RULES, Finding, LogScan, scan_lines, scan_log

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def read(name: str) -> str:
    return (LOGS / name).read_text()


# -- whole fixtures ----------------------------------------------------------------------------

# file -> engine, version, dtype, backend, (kv_tokens, max_concurrency, kv_memory_gib), ready, failed
FIXTURES: dict[str, tuple[object, ...]] = {
    "vllm-0.10-fp8-v0-fallback-ready.txt": (
        "vllm",
        "0.10.1",
        "fp8",
        "XFORMERS",
        # V0: 27488 cuda blocks x block size 16 (derived from 10.74x at 40960 tokens)
        (439808, 10.74, None),
        True,
        False,
    ),
    "vllm-0.11-bf16-ready.txt": (
        "vllm",
        "0.11.0",
        "auto",
        "FLASH_ATTN",
        (28896, 3.53, 3.97),
        True,
        False,
    ),
    "vllm-0.11-fp8-tp2-no-scales-ready.txt": (
        "vllm",
        "0.11.0",
        "fp8",
        "TRITON_ATTN",
        (115632, 14.12, 3.97),
        True,
        False,
    ),
    "vllm-0.13-fp8-l4-flashinfer-jit-failed.txt": (
        "vllm",
        "0.13.0",
        "fp8",
        "FLASHINFER",
        (57808, 7.06, 3.97),
        False,
        True,
    ),
    "vllm-0.13-cuda-oom.txt": (
        "vllm",
        "0.13.0",
        "fp8",
        "FLASHINFER",
        (None, None, None),
        False,
        True,
    ),
    "vllm-0.15-fp8-flash-attn-unsupported.txt": (
        "vllm",
        "0.15.0",
        "fp8",
        None,
        (None, None, None),
        False,
        True,
    ),
    "vllm-0.16-fp8-scales-triton-ready.txt": (
        "vllm",
        "0.16.0",
        "fp8_e4m3",
        "TRITON_ATTN",
        (60864, 7.43, 4.18),
        True,
        False,
    ),
    "vllm-0.20-insufficient-kv-memory.txt": (
        "vllm",
        "0.20.0",
        "auto",
        "FLASH_ATTN",
        (None, None, 2.93),
        False,
        True,
    ),
    "vllm-0.33-fp8-h100-no-scales-ready.txt": (
        "vllm",
        "0.33.0",
        "fp8",
        "FLASH_ATTN",
        (763120, 23.29, 52.4),
        True,
        False,
    ),
    "vllm-0.33-invalid-kv-cache-dtype.txt": (
        "vllm",
        "0.33.0",
        "fp8_e4m3fn",
        None,
        (None, None, None),
        False,
        True,
    ),
    "vllm-0.33-no-cache-blocks.txt": (
        "vllm",
        "0.33.0",
        "auto",
        "FLASH_ATTN",
        (None, None, -1.2),
        False,
        True,
    ),
    "sglang-0.4.6-bf16-ready.txt": (
        "sglang",
        None,
        "auto",
        "flashinfer",
        (80099, 1.96, 11.0),
        True,
        False,
    ),
    "sglang-0.5.3-fp8-tp2-ready.txt": (
        "sglang",
        None,
        "fp8_e4m3",
        "flashinfer",
        (436906, 10.67, 15.0),
        True,
        False,
    ),
    "sglang-0.5.3-fp8-flashinfer-jit-failed.txt": (
        "sglang",
        None,
        "fp8_e4m3",
        "flashinfer",
        (76416, None, 5.24),
        False,
        True,
    ),
    "sglang-0.5.3-invalid-kv-cache-dtype.txt": (
        "sglang",
        None,
        None,
        None,
        (None, None, None),
        False,
        True,
    ),
    "sglang-0.5.10-not-enough-memory.txt": (
        "sglang",
        None,
        "auto",
        "flashinfer",
        (None, None, None),
        False,
        True,
    ),
    "sglang-0.5.23-fp8-ready.txt": (
        "sglang",
        None,
        "fp8_e4m3",
        "flashinfer",
        (454112, 11.09, 6.92),
        True,
        False,
    ),
}

# file -> (code, line, count) in report order
FINDINGS: dict[str, list[tuple[str, int, int]]] = {
    "vllm-0.10-fp8-v0-fallback-ready.txt": [
        ("fp8-kv-enabled", 2, 1),
        ("attention-backend-fallback", 4, 2),
        ("attention-backend", 7, 1),
        ("q-scale-missing", 9, 1),
        ("kv-scale-default", 10, 1),
        ("uncalibrated-q-scale", 11, 1),
        ("kv-capacity", 12, 1),
        ("ready", 18, 1),
    ],
    "vllm-0.11-bf16-ready.txt": [
        ("attention-backend", 11, 1),
        ("kv-capacity", 15, 1),
        ("ready", 27, 1),
    ],
    "vllm-0.11-fp8-tp2-no-scales-ready.txt": [
        ("fp8-kv-enabled", 2, 1),
        ("attention-backend", 10, 1),
        ("attention-backend-fallback", 10, 1),
        ("q-scale-missing", 12, 2),
        ("kv-scale-default", 13, 2),
        ("uncalibrated-q-scale", 14, 2),
        ("kv-capacity", 21, 1),
        ("ready", 27, 1),
    ],
    "vllm-0.13-fp8-l4-flashinfer-jit-failed.txt": [
        ("fp8-kv-enabled", 2, 1),
        ("attention-backend", 10, 1),
        ("attention-backend-fallback", 10, 1),
        ("q-scale-missing", 12, 1),
        ("kv-scale-default", 13, 1),
        ("uncalibrated-q-scale", 14, 1),
        ("kv-capacity", 17, 1),
        ("engine-start-failed", 19, 2),
        ("attention-build-failed", 25, 4),
    ],
    "vllm-0.13-cuda-oom.txt": [
        ("fp8-kv-enabled", 2, 1),
        ("attention-backend", 6, 1),
        ("attention-backend-fallback", 6, 1),
        ("engine-start-failed", 7, 2),
        ("out-of-memory", 11, 1),
    ],
    "vllm-0.15-fp8-flash-attn-unsupported.txt": [
        ("fp8-kv-enabled", 2, 1),
        ("engine-start-failed", 6, 2),
        ("fp8-unsupported", 10, 1),
    ],
    "vllm-0.16-fp8-scales-triton-ready.txt": [
        ("fp8-kv-enabled", 2, 1),
        ("attention-backend", 7, 1),
        ("q-scale-missing", 9, 1),
        ("kv-capacity", 12, 1),
        ("ready", 19, 1),
    ],
    "vllm-0.20-insufficient-kv-memory.txt": [
        ("attention-backend", 4, 1),
        ("kv-capacity", 5, 1),
        ("engine-start-failed", 6, 2),
        ("insufficient-kv-memory", 10, 1),
    ],
    "vllm-0.33-fp8-h100-no-scales-ready.txt": [
        ("fp8-kv-enabled", 2, 1),
        ("attention-backend", 7, 1),
        ("q-scale-missing", 10, 1),
        ("kv-scale-default", 11, 1),
        ("uncalibrated-q-scale", 12, 1),
        ("kv-capacity", 15, 1),
        ("ready", 22, 1),
    ],
    "vllm-0.33-invalid-kv-cache-dtype.txt": [("invalid-kv-cache-dtype", 8, 1)],
    "vllm-0.33-no-cache-blocks.txt": [
        ("attention-backend", 3, 1),
        ("kv-capacity", 4, 1),
        ("engine-start-failed", 5, 2),
        ("insufficient-kv-memory", 7, 1),
    ],
    "sglang-0.4.6-bf16-ready.txt": [
        ("attention-backend", 2, 1),
        ("kv-capacity", 11, 1),
        ("ready", 20, 1),
    ],
    "sglang-0.5.3-fp8-tp2-ready.txt": [
        ("fp8-kv-enabled", 1, 1),
        ("attention-backend", 3, 1),
        ("kv-scale-default", 7, 2),
        ("kv-capacity", 14, 1),
        ("ready", 22, 1),
    ],
    "sglang-0.5.3-fp8-flashinfer-jit-failed.txt": [
        ("fp8-kv-enabled", 1, 1),
        ("attention-backend", 2, 1),
        ("kv-scale-default", 4, 1),
        ("kv-capacity", 7, 1),
        ("attention-build-failed", 15, 3),
        ("engine-start-failed", 27, 1),
    ],
    "sglang-0.5.3-invalid-kv-cache-dtype.txt": [
        ("engine-start-failed", 3, 1),
        ("invalid-kv-cache-dtype", 3, 1),
    ],
    "sglang-0.5.10-not-enough-memory.txt": [
        ("attention-backend", 2, 1),
        ("insufficient-kv-memory", 8, 1),
        ("engine-start-failed", 10, 1),
    ],
    "sglang-0.5.23-fp8-ready.txt": [
        ("fp8-kv-enabled", 1, 1),
        ("attention-backend", 2, 1),
        ("kv-scale-default", 4, 1),
        ("kv-capacity", 9, 1),
        ("ready", 14, 1),
    ],
}


def test_every_fixture_is_in_the_tables() -> None:
    assert sorted(p.name for p in LOGS.glob("*.txt")) == sorted(FIXTURES) == sorted(FINDINGS)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_fields(name: str) -> None:
    engine, version, dtype, backend, capacity, ready, failed = FIXTURES[name]
    scan = scan_log(read(name))
    assert (scan.engine, scan.engine_version, scan.kv_cache_dtype, scan.attention_backend) == (
        engine,
        version,
        dtype,
        backend,
    )
    got = (scan.capacity.kv_tokens, scan.capacity.max_concurrency, scan.capacity.kv_memory_gib)
    assert got == capacity
    assert (scan.ready, scan.failed) == (ready, failed)
    assert scan.lines == len(read(name).splitlines())


@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_fixture_findings(name: str) -> None:
    scan = scan_log(read(name))
    assert [(f.code, f.line, f.count) for f in scan.findings] == FINDINGS[name]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_findings_are_well_formed(name: str) -> None:
    scan = scan_log(read(name))
    lines = read(name).splitlines()
    for finding in scan.findings:
        assert finding.severity == SEVERITY[finding.code], finding
        assert 1 <= finding.line <= len(lines)
        # the finding's text is the message of the line it points at
        assert finding.text in lines[finding.line - 1] or finding.code in DERIVED_TEXT, finding
        assert finding.severity == "info" or finding.hint, finding
    assert scan.failed == any(f.severity == "error" for f in scan.findings)


SEVERITY = {
    "fp8-kv-enabled": "info",
    "attention-backend": "info",
    "kv-capacity": "info",
    "ready": "info",
    "kv-scale-default": "warning",
    "kv-scale-dropped": "warning",
    "q-scale-missing": "warning",
    "uncalibrated-q-scale": "warning",
    "attention-backend-fallback": "warning",
    "attention-build-failed": "error",
    "fp8-unsupported": "error",
    "engine-start-failed": "error",
    "out-of-memory": "error",
    "insufficient-kv-memory": "error",
    "invalid-kv-cache-dtype": "error",
}
# Findings whose text is kvgate's summary rather than the engine's line.
DERIVED_TEXT = {"fp8-kv-enabled", "attention-backend", "attention-backend-fallback", "kv-capacity"}


def test_severity_table_covers_the_vocabulary() -> None:
    assert sorted(SEVERITY) == sorted(CODES)


# -- variations of the same logs -------------------------------------------------------------


def crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


def ansi(text: str) -> str:
    # vLLM's coloured formatter: the process tag and the level name get colours.
    text = re.sub(r"^(\([^)]*pid=\d+\))", "\x1b[36m\\1\x1b[0m", text, flags=re.M)
    return re.sub(r"\b(INFO|WARNING|ERROR)\b", "\x1b[1;32m\\1\x1b[0m", text)


def kubectl_timestamps(text: str) -> str:
    return "".join(
        f"2026-11-29T19:02:{i % 60:02d}.123456789Z {line}"
        for i, line in enumerate(text.splitlines(keepends=True))
    )


def kubectl_prefix(text: str) -> str:
    return "".join(f"[pod/canary-0/engine] {line}" for line in text.splitlines(keepends=True))


def old_worker_tags(text: str) -> str:
    return re.sub(r"\(Worker_TP(\d) pid=", r"(VllmWorker rank=\1 pid=", text)


def journald(text: str) -> str:
    return "".join(
        f"Nov 29 19:02:{i % 60:02d} gpu-node-1 vllm[17578]: {line}"
        for i, line in enumerate(text.splitlines(keepends=True))
    )


def docker_compose(text: str) -> str:
    return "".join(f"engine-1  | {line}" for line in text.splitlines(keepends=True))


def no_final_newline(text: str) -> str:
    return text.rstrip("\n")


VARIATIONS: dict[str, Callable[[str], str]] = {
    "crlf": crlf,
    "ansi": ansi,
    "kubectl-timestamps": kubectl_timestamps,
    "kubectl-prefix": kubectl_prefix,
    "old-worker-tags": old_worker_tags,
    "no-final-newline": no_final_newline,
    "journald": journald,
    "docker-compose": docker_compose,
}


def summary(scan: LogScan) -> tuple[object, ...]:
    """Everything but the finding texts (which keep the variation's own characters)."""
    return (
        scan.engine,
        scan.engine_version,
        scan.kv_cache_dtype,
        scan.attention_backend,
        scan.attention_backend_candidates,
        scan.capacity,
        scan.ready,
        scan.failed,
        [(f.code, f.severity, f.line, f.count, f.hint) for f in scan.findings],
        scan.lines,
    )


@pytest.mark.parametrize("variation", sorted(VARIATIONS))
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_variation_gives_the_same_scan(name: str, variation: str) -> None:
    plain = scan_log(read(name))
    varied = scan_log(VARIATIONS[variation](read(name)))
    assert summary(varied) == summary(plain)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_ansi_is_stripped_from_texts(name: str) -> None:
    assert scan_log(ansi(read(name))).findings == scan_log(read(name)).findings


@pytest.mark.parametrize("keepends", [True, False])
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_scan_lines_equals_scan_log(name: str, keepends: bool) -> None:
    lines = read(name).splitlines(keepends=keepends)
    assert scan_lines(iter(lines)) == scan_log(read(name))


def test_multi_line_items_count_as_their_lines() -> None:
    text = read("vllm-0.13-fp8-l4-flashinfer-jit-failed.txt")
    lines = text.splitlines(keepends=True)
    chunks = ["".join(lines[i : i + 7]) for i in range(0, len(lines), 7)]
    assert scan_lines(chunks) == scan_log(text)


def test_noise_before_the_startup_shifts_lines_only() -> None:
    noise = '(APIServer pid=1) INFO:     10.42.0.7:51234 - "POST /v1/completions HTTP/1.1" 200 OK\n'
    text = read("vllm-0.11-fp8-tp2-no-scales-ready.txt")
    plain, noisy = scan_log(text), scan_log(noise * 5000 + text)
    assert [(f.code, f.line + 5000, f.count) for f in plain.findings] == [
        (f.code, f.line, f.count) for f in noisy.findings
    ]


def test_interleaved_workers_are_counted_once_per_cause() -> None:
    # GIVEN the TP0 and TP1 warning blocks written in the opposite order, lines mixed
    text = read("vllm-0.11-fp8-tp2-no-scales-ready.txt")
    lines = text.splitlines(keepends=True)
    workers = [i for i, line in enumerate(lines) if "[kv_cache.py" in line]
    block = [lines[i] for i in workers]
    reordered = block[1::2] + block[0::2]
    for index, line in zip(workers, reordered, strict=True):
        lines[index] = line
    # THEN each scale warning is one finding seen twice
    scan = scan_log("".join(lines))
    counts = {f.code: f.count for f in scan.findings}
    assert counts["q-scale-missing"] == counts["kv-scale-default"] == 2
    assert counts["uncalibrated-q-scale"] == 2


def test_progress_bar_redraws_on_one_line() -> None:
    # SGLang's tqdm bar redraws with '\r'; a log line written after it shares the line.
    text = read("sglang-0.5.23-fp8-ready.txt").replace(
        "[2026-11-29 19:26:02 TP0] max_total_num_tokens",
        "Capturing batches (bs=1 avail_mem=8.2 GB):  50%|#####     | 1/2\r"
        "Capturing batches (bs=1 avail_mem=8.2 GB): 100%|##########| 2/2\r"
        "[2026-11-29 19:26:02 TP0] max_total_num_tokens",
    )
    assert summary(scan_log(text)) == summary(scan_log(read("sglang-0.5.23-fp8-ready.txt")))


def test_log_cut_before_the_crash_is_neither_ready_nor_failed() -> None:
    text = read("vllm-0.13-fp8-l4-flashinfer-jit-failed.txt")
    cut = text[: text.index("(EngineCore_DP0 pid=93) ERROR")]
    scan = scan_log(cut)
    assert (scan.ready, scan.failed) == (False, False)
    assert scan.capacity.kv_tokens == 57808
    assert "engine-start-failed" not in scan.codes()


def test_log_cut_mid_line() -> None:
    text = read("vllm-0.11-bf16-ready.txt")
    cut = text[: text.index("GPU KV cache size") + len("GPU KV cache si")]
    scan = scan_log(cut)
    assert scan.capacity.kv_memory_gib == 3.97
    assert scan.capacity.kv_tokens is None
    assert scan.lines == 15


# -- single messages: every known wording ----------------------------------------------------

VLLM_PREFIX = "(EngineCore_DP0 pid=93) WARNING 11-29 19:05:31 [x.py:1] "
SGLANG_PREFIX = "[2026-11-29 19:20:20 TP0] "

# (engine, message, expected code)
MESSAGES: list[tuple[str, str, str]] = [
    (
        "vllm",
        "Using fp8 data type to store kv cache. It reduces the GPU memory footprint and boosts the performance. Meanwhile, it may cause accuracy drop without a proper scaling factor.",
        "fp8-kv-enabled",
    ),
    (
        "vllm",
        "Using fp8_e5m2 data type to store kv cache. It reduces the GPU memory footprint and boosts the performance. Meanwhile, it may cause accuracy drop without a proper scaling factor",
        "fp8-kv-enabled",
    ),
    (
        "vllm",
        "Checkpoint does not provide a q scaling factor. Setting it to k_scale. This only matters for the flash-attn backend.",
        "q-scale-missing",
    ),
    (
        "vllm",
        "Checkpoint does not provide a q scaling factor. Setting it to k_scale. This only matters for FP8 Attention backends (flash-attn or flashinfer).",
        "q-scale-missing",
    ),
    (
        "vllm",
        "Using KV cache scaling factor 1.0 for fp8_e4m3. This may cause accuracy issues. Please make sure k/v_scale scaling factors are available in the fp8 checkpoint.",
        "kv-scale-default",
    ),
    (
        "vllm",
        "Using KV cache scaling factor 1.0 for fp8_e4m3. If this is unintended, verify that k/v_scale scaling factors are properly set in the checkpoint.",
        "kv-scale-default",
    ),
    (
        "vllm",
        "Found kv_scale in the checkpoint (e.g. model.layers.0.self_attn.kv_scale), but not found the expected name in the model (e.g. model.layers.0.self_attn.attn.kv_scale). kv_scale is not loaded.",
        "kv-scale-default",
    ),
    (
        "vllm",
        "Found k_scale in the checkpoint (e.g. model.layers.0.self_attn.k_proj.k_scale), but not found the expected name in the model (e.g. model.layers.0.self_attn.attn.k_scale). k_scale is not loaded.",
        "kv-scale-default",
    ),
    # shortened wording seen in newer real logs (first sentence only)
    ("vllm", "Checkpoint does not provide a q scaling factor.", "q-scale-missing"),
    ("vllm", "Using KV cache scaling factor 1.0 for fp8_e4m3.", "kv-scale-default"),
    (
        "vllm",
        "Using uncalibrated q_scale 1.0 and/or prob_scale 1.0 with fp8 attention. This may cause accuracy issues. Please make sure q/prob scaling factors are available in the fp8 checkpoint.",
        "uncalibrated-q-scale",
    ),
    (
        "vllm",
        "Using FLASHINFER attention backend out of potential backends: ['FLASHINFER', 'TRITON_ATTN']",
        "attention-backend",
    ),
    (
        "vllm",
        "Using TRITON_ATTN attention backend out of potential backends: ('TRITON_ATTN',)",
        "attention-backend",
    ),
    (
        "vllm",
        "Using TRITON_ATTN attention backend out of potential backends: ['TRITON_ATTN'].",
        "attention-backend",
    ),
    ("vllm", "Using AttentionBackendEnum.FLASHINFER backend.", "attention-backend"),
    ("vllm", "Using FlashInfer backend on V1 engine.", "attention-backend"),
    ("vllm", "Using Flash Attention backend on V1 engine.", "attention-backend"),
    ("vllm", "Using FlexAttention backend for head_size=80 on V1 engine.", "attention-backend"),
    (
        "vllm",
        "Using FlashInfer backend with HND KV cache layout on V1 engine by default for Blackwell (SM 10.0) GPUs.",
        "attention-backend",
    ),
    (
        "vllm",
        "--kv-cache-dtype is not supported by the V1 Engine. Falling back to V0. ",
        "attention-backend-fallback",
    ),
    ("vllm", "Cannot use FlashAttention backend for FP8 KV cache.", "attention-backend-fallback"),
    (
        "vllm",
        "--block-size 32 precluded higher-priority backend(s) ['FLASH_ATTN']. Using FLASHINFER instead, which may result in reduced performance. Consider removing --block-size to auto-select the optimal block size.",
        "attention-backend-fallback",
    ),
    ("vllm", "RuntimeError: Ninja build failed. Ninja output:", "attention-build-failed"),
    (
        "vllm",
        "RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist",
        "attention-build-failed",
    ),
    ("vllm", "RuntimeError: Could not find nvcc", "attention-build-failed"),
    (
        "vllm",
        "RuntimeError: nvcc not found and PyTorch is not built with CUDA support. Could not determine CUDA version.",
        "attention-build-failed",
    ),
    (
        "vllm",
        "flashinfer.jit.exceptions.MissingJITCacheError: JIT compilation is disabled via FLASHINFER_DISABLE_JIT environment variable, but the required module is not found in the JIT cache. Please add the missing module to the JIT cache build configuration.",
        "attention-build-failed",
    ),
    (
        "vllm",
        "RuntimeError: FlashInfer requires GPUs with sm75 or higher",
        "attention-build-failed",
    ),
    (
        "vllm",
        "NotImplementedError: FlashAttention does not support fp8 kv-cache on this device.",
        "fp8-unsupported",
    ),
    (
        "vllm",
        "ValueError: type fp8e4nv not supported in this architecture. The supported fp8 dtypes are ('fp8e4b15', 'fp8e5')",
        "fp8-unsupported",
    ),
    (
        "vllm",
        "ValueError: Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for this configuration. Reason: ['kv_cache_dtype not supported']",
        "fp8-unsupported",
    ),
    (
        "vllm",
        "ValueError: No valid attention backend found for cuda with AttentionSelectorConfig(head_size=128, dtype=torch.bfloat16, kv_cache_dtype=fp8). Reasons: {FLASH_ATTN: [kv_cache_dtype not supported], FLEX_ATTENTION: [kv_cache_dtype not supported]}.",
        "fp8-unsupported",
    ),
    (
        "vllm",
        "ValueError: Selected backend AttentionBackendEnum.FLASHINFER is not valid for this configuration. Reason: ['FP8 KV cache requires FA3 on SM90, FA4 with head_size=512 on SM90, or FA4 on SM100']",
        "fp8-unsupported",
    ),
    (
        "vllm",
        "NotImplementedError: VLLM_USE_V1=1 is not supported with --kv-cache-dtype.",
        "fp8-unsupported",
    ),
    (
        "vllm",
        "Torch SDPA backend FP8 KV cache requires intel_extension_for_pytorch support.",
        "fp8-unsupported",
    ),
    (
        "vllm",
        "ValueError: Only support per-tensor scaling factor for fp8 KV cache",
        "fp8-unsupported",
    ),
    (
        "vllm",
        "ValueError: Only support per-tensor scaling factorfor fp8-quantized Q/prob",
        "fp8-unsupported",
    ),
    (
        "vllm",
        "ValueError: Selected backend AttentionBackendEnum.FLASHINFER is not valid for this configuration. Reason: ['head_size not supported']",
        "engine-start-failed",
    ),
    ("vllm", "EngineCore failed to start.", "engine-start-failed"),
    ("vllm", "EngineCore encountered a fatal error.", "engine-start-failed"),
    ("vllm", "WorkerProc failed to start.", "engine-start-failed"),
    (
        "vllm",
        "Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor.",
        "engine-start-failed",
    ),
    (
        "vllm",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}",
        "engine-start-failed",
    ),
    (
        "vllm",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 22.03 GiB of which 1.06 GiB is free.",
        "out-of-memory",
    ),
    (
        "vllm",
        "ValueError: Free memory on device cuda:0 (10.2/22.03 GiB) on startup is less than desired GPU memory utilization (0.9, 19.83 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
        "out-of-memory",
    ),
    (
        "vllm",
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.",
        "insufficient-kv-memory",
    ),
    (
        "vllm",
        "ValueError: To serve at least one request with the model's max seq len (40960), (6.25 GiB KV cache is needed, which is larger than the available KV cache memory (2.93 GiB). Based on the available memory, the estimated maximum model length is 19184. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine.",
        "insufficient-kv-memory",
    ),
    ("vllm", "ValueError: Unknown kv cache dtype: fp8_e4m3fn", "invalid-kv-cache-dtype"),
    (
        "vllm",
        "ValueError: Invalid kv_cache_dtype: 'fp8_e4m3fn'. Valid values are: ('auto', 'fp8')",
        "invalid-kv-cache-dtype",
    ),
    (
        "vllm",
        "vllm serve: error: argument --kv-cache-dtype: invalid choice: 'fp8_e4m3fn' (choose from 'auto', 'bfloat16', 'fp8', 'fp8_e4m3', 'fp8_e5m2', 'fp8_inc')",
        "invalid-kv-cache-dtype",
    ),
    ("vllm", "GPU KV cache size: 652,144 tokens", "kv-capacity"),
    (
        "vllm",
        "GPU KV cache size: 1,304,288 tokens, Maximum concurrency for 4,096 tokens per request: 318.43x",
        "kv-capacity",
    ),
    (
        "vllm",
        "GPU + host KV cache size: 1,304,288 tokens, Maximum concurrency for 4,096 tokens per request: 318.43x",
        "kv-capacity",
    ),
    ("vllm", "Available KV cache memory: 69.66 GiB", "kv-capacity"),
    ("vllm", "# cuda blocks: 12345, # CPU blocks: 2048", "kv-capacity"),
    ("vllm", "Application startup complete.", "ready"),
    (
        "sglang",
        "Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of 1.0. This may lead to less accurate results!",
        "kv-scale-default",
    ),
    (
        "sglang",
        "Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of 1.0.",
        "kv-scale-default",
    ),
    ("sglang", "Using KV cache dtype: torch.float8_e4m3fn", "fp8-kv-enabled"),
    (
        "sglang",
        "KV Cache is allocated. dtype: torch.float8_e5m2, #tokens: 454112, K size: 3.46 GB, V size: 3.46 GB",
        "fp8-kv-enabled",
    ),
    (
        "sglang",
        "Attention backend not set. Use flashinfer backend by default.",
        "attention-backend",
    ),
    (
        "sglang",
        "Attention backend not explicitly specified. Use triton backend by default.",
        "attention-backend",
    ),
    ("sglang", "Attention backend not specified. Use fa3 backend by default.", "attention-backend"),
    ("sglang", "MLA optimization is turned on. Use flashinfer backend.", "attention-backend"),
    ("sglang", "Using triton as attention backend for Qwen3NextForCausalLM.", "attention-backend"),
    (
        "sglang",
        "FlashAttention3 only supports fp8_e4m3 if using FP8; Setting attention backend to triton.",
        "attention-backend-fallback",
    ),
    ("sglang", "ValueError: --kv-cache-dtype fp8_e5m2 is not supported on CPU.", "fp8-unsupported"),
    (
        "sglang",
        "TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, fp4_e2m1, bf16, or auto.",
        "fp8-unsupported",
    ),
    ("sglang", "ValueError: Unsupported kv_cache_dtype: fp8.", "invalid-kv-cache-dtype"),
    (
        "sglang",
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
        "insufficient-kv-memory",
    ),
    (
        "sglang",
        "Received sigquit from a child process. It usually means the child failed.",
        "engine-start-failed",
    ),
    (
        "sglang",
        "Rank 0 scheduler is dead. Please check if there are relevant logs.",
        "engine-start-failed",
    ),
    (
        "sglang",
        "RuntimeError: Initialization failed. Please see the error messages above.",
        "engine-start-failed",
    ),
    (
        "sglang",
        "KV Cache is allocated. #tokens: 80099, K size: 5.50 GB, V size: 5.50 GB",
        "kv-capacity",
    ),
    ("sglang", "KV Cache is allocated. #tokens: 80099, KV size: 5.50 GB", "kv-capacity"),
    (
        "sglang",
        "Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 81920, KV size: 11.25 GB, avail mem=1.20 GB",
        "kv-capacity",
    ),
    (
        "sglang",
        "max_total_num_tokens=80099, chunked_prefill_size=2048, max_prefill_tokens=16384, max_running_requests=2049, context_len=40960",
        "kv-capacity",
    ),
    ("sglang", "The server is fired up and ready to roll!", "ready"),
]


@pytest.mark.parametrize(("engine", "message", "code"), MESSAGES)
def test_each_known_message(engine: str, message: str, code: str) -> None:
    prefix = VLLM_PREFIX if engine == "vllm" else SGLANG_PREFIX
    scan = scan_log(prefix + message + "\n", engine)
    assert code in scan.codes()


@pytest.mark.parametrize(("engine", "message", "code"), MESSAGES)
def test_each_known_message_is_detected_without_a_hint(
    engine: str, message: str, code: str
) -> None:
    prefix = VLLM_PREFIX if engine == "vllm" else SGLANG_PREFIX
    scan = scan_log(prefix + message + "\n")
    assert code in scan.codes()
    assert scan.engine == engine


@pytest.mark.parametrize(("engine", "message", "code"), MESSAGES)
def test_every_line_a_rule_reads_carries_its_anchor(engine: str, message: str, code: str) -> None:
    # The anchor prefilter must never hide a line from the rule that reads it.
    for rule in RULES:
        if rule.needle in message:
            assert rule.anchor in message, (rule.name, message)


def test_fixture_lines_carry_their_anchors() -> None:
    for path in LOGS.glob("*.txt"):
        for line in path.read_text().splitlines():
            for rule in RULES:
                if rule.needle in line:
                    assert rule.anchor in line, (path.name, rule.name, line)


def test_anchors_are_not_in_request_traffic() -> None:
    traffic = [
        '(APIServer pid=1) INFO:     10.42.0.7:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        "(APIServer pid=1) INFO 11-29 20:00:01 [async_llm.py:261] Added request chatcmpl-0123456789abcdef.",
        '[2026-11-29 19:20:29] INFO:     127.0.0.1:40946 - "GET /get_model_info HTTP/1.1" 200 OK',
        "[2026-11-29 19:20:30 TP0] Decode batch. #running-req: 12, #token: 5120, token usage: 0.06, cuda graph: True, gen throughput (token/s): 512.30, #queue-req: 0, ",
    ]
    for line in traffic:
        assert [a for a in ANCHORS if a in line] == []


# -- derived findings and hints --------------------------------------------------------------


def test_l4_trap_hint_names_the_remedy() -> None:
    scan = scan_log(read("vllm-0.13-fp8-l4-flashinfer-jit-failed.txt"))
    build = scan.finding("attention-build-failed")
    assert build is not None and build.severity == "error"
    assert build.hint == (
        "FlashInfer could not JIT-compile its FP8 KV kernels (no nvcc/ninja in the image; the "
        "L4 trap). Set --attention-backend TRITON_ATTN and VLLM_USE_FLASHINFER_SAMPLER=0, or "
        "use an image with the CUDA toolkit or a matching flashinfer-jit-cache."
    )
    start = scan.finding("engine-start-failed")
    assert start is not None and start.hint == "Root cause: attention-build-failed at line 25."


@pytest.mark.parametrize(
    ("version", "setting"),
    [
        ("0.10.2", "VLLM_ATTENTION_BACKEND=TRITON_ATTN_VLLM_V1"),
        ("0.12.0", "VLLM_ATTENTION_BACKEND=TRITON_ATTN"),
        ("0.13.0", "--attention-backend TRITON_ATTN"),
        ("0.33.0", "--attention-backend TRITON_ATTN"),
    ],
)
def test_jit_hint_follows_the_version(version: str, setting: str) -> None:
    text = read("vllm-0.13-fp8-l4-flashinfer-jit-failed.txt").replace("0.13.0", version)
    build = scan_log(text).finding("attention-build-failed")
    assert build is not None and f"Set {setting} and " in build.hint


def test_sglang_jit_hint_uses_sglang_flag() -> None:
    build = scan_log(read("sglang-0.5.3-fp8-flashinfer-jit-failed.txt")).finding(
        "attention-build-failed"
    )
    assert (
        build is not None
        and "Set --attention-backend triton --sampling-backend pytorch," in build.hint
    )


def test_insufficient_kv_memory_hint_quotes_the_numbers() -> None:
    finding = scan_log(read("vllm-0.20-insufficient-kv-memory.txt")).finding(
        "insufficient-kv-memory"
    )
    assert finding is not None
    assert finding.hint == (
        "max_model_len 40960 needs 6.25 GiB of KV cache but 2.93 GiB is free: set "
        "--max-model-len 19184 or less, or raise --gpu-memory-utilization."
    )


def test_sglang_invalid_fp8_hint() -> None:
    finding = scan_log(read("sglang-0.5.3-invalid-kv-cache-dtype.txt")).finding(
        "invalid-kv-cache-dtype"
    )
    assert finding is not None
    assert finding.hint == "SGLang has no plain `fp8`: use --kv-cache-dtype fp8_e4m3 (or fp8_e5m2)."


def test_root_cause_without_a_specific_finding_quotes_the_exception() -> None:
    core = "(EngineCore_DP0 pid=9) ERROR 11-29 19:00:00 [core.py:1] "
    head = f"{core}EngineCore failed to start.\n{core}Traceback (most recent call last):\n"
    wrapper = (
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause "
        "above. Failed core proc(s): {'EngineCore_DP0': 1}\n"
    )
    # GIVEN a traceback cut before its exception: point at the failure line
    start = scan_log(head + wrapper).finding("engine-start-failed")
    assert start is not None and start.hint == "See the traceback around line 1."
    # GIVEN an exception no rule knows: quote it, not the front-end's wrapper
    start = scan_log(head + f"{core}KeyError: 'model.layers.0.mlp'\n" + wrapper).finding(
        "engine-start-failed"
    )
    assert start is not None
    assert start.hint == "Root cause at line 3: KeyError: 'model.layers.0.mlp'"


def test_silent_fp8_from_the_checkpoint() -> None:
    # compressed-tensors kv_cache_scheme turns FP8 on without --kv-cache-dtype (vllm#44879)
    text = read("vllm-0.33-fp8-h100-no-scales-ready.txt")
    text = text.replace("kv_cache_dtype=fp8", "kv_cache_dtype=auto").replace(
        ", 'kv_cache_dtype': 'fp8'", ""
    )
    text = "\n".join(line for line in text.splitlines() if "data type to store" not in line)
    scan = scan_log(text)
    assert scan.kv_cache_dtype == "fp8"
    enabled = scan.finding("fp8-kv-enabled")
    assert enabled is not None and enabled.line == 9
    assert "no FP8 --kv-cache-dtype was seen" in enabled.text


def test_no_fp8_finding_for_an_invalid_dtype() -> None:
    scan = scan_log(read("vllm-0.33-invalid-kv-cache-dtype.txt"))
    assert "fp8-kv-enabled" not in scan.codes()


def test_flashinfer_02_jit_left_unfinished() -> None:
    text = read("sglang-0.4.6-bf16-ready.txt")
    cut = text[: text.index("2025-05-24 10:01:12,402")]
    finding = scan_log(cut).finding("attention-build-failed")
    assert finding is not None and finding.severity == "warning"
    assert finding.text.endswith(
        "started loading and never finished (still building, hung, or the log is cut)"
    )
    assert not scan_log(cut).failed


def test_flashinfer_02_jit_unfinished_before_a_crash_is_an_error() -> None:
    text = read("sglang-0.4.6-bf16-ready.txt")
    cut = text[: text.index("2025-05-24 10:01:12,402")]
    crash = "[2025-05-24 10:03:00] Received sigquit from a child process. It usually means the child failed.\n"
    scan = scan_log(cut + crash)
    finding = scan.finding("attention-build-failed")
    assert finding is not None and finding.severity == "error" and scan.failed


def test_sglang_ready_needs_warmup_unless_skipped() -> None:
    text = read("sglang-0.5.23-fp8-ready.txt")
    without_ready = text.replace(
        "[2026-11-29 19:26:05] The server is fired up and ready to roll!\n", ""
    )
    assert not scan_log(without_ready).ready
    skipped = without_ready.replace("skip_server_warmup=False", "skip_server_warmup=True")
    assert scan_log(skipped).ready


@pytest.mark.parametrize(
    ("line", "failed"),
    [
        ("vllm serve: error: argument --max-model-len: invalid int value: 'x'", True),
        ("[pod/canary/engine] launch_server.py: error: unrecognized arguments: --foo", True),
        # a logged message that merely contains ': error: ' is not argparse exiting
        (
            "(APIServer pid=1) ERROR 11-29 20:00:00 [serving.py:1] request failed: error: bad json",
            False,
        ),
        ("[2026-11-29 19:20:30] tokenizer: error: bad request", False),
    ],
)
def test_argparse_errors(line: str, failed: bool) -> None:
    assert scan_log(line + "\n").failed is failed


@pytest.mark.parametrize(
    "line",
    [
        "(APIServer pid=1) INFO 11-29 20:00:01 [logger.py:40] Received request cmpl-1: prompt: "
        "'Why does RuntimeError: Ninja build failed. appear? EngineCore failed to start.', "
        "params: SamplingParams(n=1)",
        "[2026-11-29 20:00:01] Receive: obj=GenerateReqInput(text='torch.OutOfMemoryError: "
        "CUDA out of memory. The server is fired up and ready to roll!')",
        "[2026-11-29 20:00:02] Finish: obj=GenerateReqInput(rid='1'), out={'text': 'Received "
        "sigquit from a child process. It usually means the child failed.'}",
    ],
)
def test_echoed_requests_are_not_findings(line: str) -> None:
    scan = scan_log(read("vllm-0.11-bf16-ready.txt") + line + "\n")
    assert scan.findings == scan_log(read("vllm-0.11-bf16-ready.txt")).findings


def test_backend_fallback_only_when_fp8() -> None:
    bf16 = "(EngineCore_DP0 pid=9) INFO 11-29 19:00:00 [cuda.py:1] Using FLASHINFER attention backend out of potential backends: ('FLASHINFER', 'TRITON_ATTN')\n"
    assert "attention-backend-fallback" not in scan_log(bf16).codes()
    fp8 = "(APIServer pid=1) INFO 11-29 19:00:00 [utils.py:1] non-default args: {'kv_cache_dtype': 'fp8'}\n"
    assert "attention-backend-fallback" in scan_log(fp8 + bf16).codes()


# -- engine choice and bad input -------------------------------------------------------------


def test_explicit_engine_ignores_the_other_engines_rules() -> None:
    scan = scan_log(read("vllm-0.13-fp8-l4-flashinfer-jit-failed.txt"), "sglang")
    assert scan.engine == "sglang"
    # FlashInfer's own lines are engine-neutral; vLLM's are not read
    assert scan.codes() == ["attention-build-failed"]
    build = scan.finding("attention-build-failed")
    assert build is not None and "--attention-backend triton" in build.hint


@pytest.mark.parametrize("engine", [None, "auto", "vllm", "VLLM"])
def test_engine_names(engine: str | None) -> None:
    assert scan_log(read("vllm-0.11-bf16-ready.txt"), engine).engine == "vllm"


def test_unknown_log_has_no_engine() -> None:
    scan = scan_log("hello\nworld\n")
    assert (scan.engine, scan.findings, scan.ready, scan.failed, scan.lines) == (
        None,
        (),
        False,
        False,
        2,
    )


@pytest.mark.parametrize("text", ["", "\n", "  \n\r\n\t\n"])
def test_empty_log(text: str) -> None:
    with pytest.raises(ParseError) as info:
        scan_log(text, source="pod/canary-0")
    assert info.exconly() == (
        "kvgate.errors.ParseError: pod/canary-0: the log is empty; pass the engine's startup log"
    )
    with pytest.raises(ParseError):
        scan_lines(text.splitlines())


@pytest.mark.parametrize("engine", ["foo", "trtllm", ""])
def test_unknown_engine(engine: str) -> None:
    with pytest.raises(UnsupportedError) as info:
        scan_log("x\n", engine)
    assert str(info.value) == f"engine '{engine}' is not known; use vllm, sglang or auto"


def test_to_dict() -> None:
    scan = scan_log(read("vllm-0.11-fp8-tp2-no-scales-ready.txt"))
    data = scan.to_dict()
    assert list(data) == [
        "engine",
        "engine_version",
        "kv_cache_dtype",
        "attention_backend",
        "attention_backend_candidates",
        "capacity",
        "ready",
        "failed",
        "findings",
        "lines",
    ]
    assert data["capacity"] == {
        "kv_tokens": 115632,
        "max_concurrency": 14.12,
        "kv_memory_gib": 3.97,
        "max_model_len": 8192,
        "num_gpu_blocks": None,
    }
    first = data["findings"][0]  # type: ignore[index]
    assert first == dataclasses.asdict(scan.findings[0])
    assert set(first) == {"code", "severity", "line", "text", "hint", "count"}


def test_finding_is_frozen() -> None:
    finding = Finding("ready", "info", 1, "Application startup complete.")
    with pytest.raises(dataclasses.FrozenInstanceError):
        finding.line = 2  # type: ignore[misc]


# -- hostile lines: every rule stays linear ----------------------------------------------------

MB = 1 << 20
# Prefixes that a rule's regex (or a header regex) can start matching at many positions of one
# line: a super-linear pattern retries each of them to the end of the line.
_REPEATED_PREFIXES = (
    "[2025-01-01 00:00:00 ",  # SGLang header without its `] `
    "INFO 01-01 00:00:00 [",  # vLLM header without its `] `
    "max_total_num_tokens=1,",  # s.summary without context_len
    "precluded higher-priority backend(s) ",  # v.block_size_precluded without `. Using`
    "argument --kv-cache-dtype: invalid choice: x (choose from ",  # argparse_dtype without `)`
    "(pid=1 ",
    "A.",
    "\x1b[",
)


def _hostile_lines(rule_needle: str, size: int) -> dict[str, str]:
    lines = {
        f"repeat {prefix!r}": prefix * (size // len(prefix)) + rule_needle
        for prefix in _REPEATED_PREFIXES
    }
    lines["needle repeated"] = (rule_needle + " ") * (size // (len(rule_needle) + 1))
    lines["needle then one token"] = rule_needle + "a" * size
    lines["needle then spaces"] = rule_needle + " " * size + "x"
    return lines


# Linear or not is measured as growth, not speed: the scan's CPU time on a line 4x as long,
# divided by its CPU time on the line (the best of a few runs each). Linear work grows 4x (less
# with fixed costs), quadratic 16x; a figure above GROWTH_LIMIT is measured again before it
# fails a test, so one preempted run on a loaded machine cannot. Speeds are bench figures
# (bench/bench_log_scan.py), never asserted here.
GROWTH: Final = 4
GROWTH_LIMIT: Final = 10.0


def _best_time(scan: Callable[[str], object], line: str, runs: int) -> float:
    """The least CPU time of `runs` scans: this thread's, so time spent waiting for a core on
    a busy machine is not counted."""
    best = float("inf")
    for _ in range(runs):
        start = time.thread_time()
        scan(line)
        best = min(best, time.thread_time() - start)
    return max(best, 1e-6)


def _growth(
    scan: Callable[[str], object],
    line_of: Callable[[int], str],
    size: int,
    *,
    linear: bool = True,
) -> float:
    """The growth; a figure on the unexpected side of GROWTH_LIMIT (`linear`: above it) is
    measured again with more runs, so that a run slowed by the machine decides nothing."""

    def measure(runs: int) -> float:
        small = _best_time(scan, line_of(size), runs)
        return _best_time(scan, line_of(GROWTH * size), runs) / small

    growth = measure(2)
    unexpected = growth > GROWTH_LIMIT if linear else growth <= GROWTH_LIMIT
    return measure(5) if unexpected else growth


def _steepest(size: int, cases: tuple[str, ...] | None = None) -> tuple[float, str]:
    """The largest growth over every rule's hostile lines (see `_hostile_lines`)."""
    worst = (0.0, "")
    for rule in RULES:
        for name in _hostile_lines(rule.needle, 1):
            if cases is not None and name not in cases:
                continue

            def line_of(length: int, needle: str = rule.needle, case: str = name) -> str:
                return _hostile_lines(needle, length)[case]

            worst = max(worst, (_growth(scan_log, line_of, size), f"{rule.name}: {name}"))
    return worst


def test_the_growth_measure_catches_a_quadratic_pattern() -> None:
    r"""The measure the two tests below rely on fails a super-linear regex: `(?:a|\[)*b`
    searched in a line of `a`s restarts at every position and reads to the end of the line."""
    quadratic = re.compile(r"(?:a|\[)*b")
    assert _growth(quadratic.search, lambda n: "a" * n, 8 << 10, linear=False) > GROWTH_LIMIT
    linear = re.compile(r"ba+c")  # one pass: only the first position can start a match
    assert _growth(linear.search, lambda n: "b" + "a" * n, 4 << 10) < GROWTH_LIMIT


def test_the_log_regexes_are_linear_on_a_long_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the line cap, each rule and header regex runs in linear time on lines of
    repeated partial matches (a quadratic pattern took 4-6 s on 115 KB, minutes on 1 MB)."""
    import kvgate.evidence.logs.collect

    monkeypatch.setattr(kvgate.evidence.logs.collect, "_MAX_LINE", 2 * MB)
    growth, case = _steepest(8 << 10)
    assert growth < GROWTH_LIMIT, f"{case}: {GROWTH}x the line took {growth:.1f}x the time"


def test_an_overlong_line_is_read_to_its_cap_only() -> None:
    """Rules look at the first _MAX_LINE characters of a line, whatever its length."""
    import kvgate.evidence.logs.collect

    cap = kvgate.evidence.logs.collect._MAX_LINE
    found = scan_log("INFO 01-01 00:00:00 [x.py:1] KV cache size: 1,234 tokens\n")
    assert found.capacity.kv_tokens == 1234
    beyond = scan_log("x" * cap + " KV cache size: 1,234 tokens\n")
    assert beyond.capacity.kv_tokens is None
    assert beyond.lines == 1
    cases = ("needle repeated", "needle then one token", f"repeat {_REPEATED_PREFIXES[0]!r}")
    # from the cap up: past it the rules' work stays the cap's
    growth, case = _steepest(cap, cases)
    assert growth < GROWTH_LIMIT, f"{case}: {GROWTH}x the line took {growth:.1f}x the time"


def test_scan_lines_of_an_overlong_line_keeps_line_numbers() -> None:
    text = "a" * (3 * MB) + "\nINFO 01-01 00:00:00 [x.py:1] Application startup complete.\n"
    scan = scan_lines(iter(text.splitlines(keepends=True)))
    assert scan.finding("ready") is not None
    assert scan.finding("ready").line == 2  # type: ignore[union-attr]
