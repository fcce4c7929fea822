"""kvgate.evidence.logs over startup logs rendered from the engines' own format strings.

tests/data/engine-source/*.log come from tests/fixtures_from_wheels.py: every log line is
preceded by `#: <wheel> <file>:<line>`, the string it was rendered from.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvgate.evidence import logs

DATA = Path(__file__).parents[1] / "data" / "engine-source"

# file -> engine, version, dtype, backend, (kv_tokens, max_concurrency, kv_memory_gib),
#         ready, failed, codes that must be present
EXPECTED: dict[str, tuple[object, ...]] = {
    "vllm-0.10.2-fp8-v0-fallback-ready": (
        "vllm",
        "0.10.2",
        "fp8",
        "XFORMERS",
        (2654 * 16, 10.37, 3.24),
        True,
        False,
        {"fp8-kv-enabled", "attention-backend-fallback", "kv-scale-default", "ready"},
    ),
    "vllm-0.10.2-triton-attn-invalid": (
        "vllm",
        "0.10.2",
        "auto",
        None,
        (None, None, None),
        False,
        True,
        {"engine-start-failed"},
    ),
    "vllm-0.11.0-fp8-triton-ready": (
        "vllm",
        "0.11.0",
        "fp8",
        "TRITON_ATTN",
        (80368, 19.62, 5.52),
        True,
        False,
        {"fp8-kv-enabled", "attention-backend-fallback", "kv-scale-default", "ready"},
    ),
    "vllm-0.15.0-fp8-flashinfer-ready": (
        "vllm",
        "0.15.0",
        "fp8",
        "FLASHINFER",
        (80080, 19.55, 5.5),
        True,
        False,
        {"fp8-kv-enabled", "attention-backend-fallback", "uncalibrated-q-scale", "ready"},
    ),
    "vllm-0.20.0-fp8-flashinfer-ready": (
        "vllm",
        "0.20.0",
        "fp8",
        "FLASHINFER",
        (80080, 19.55, 5.5),
        True,
        False,
        {"fp8-kv-enabled", "attention-backend-fallback", "uncalibrated-q-scale", "ready"},
    ),
    "vllm-0.15.0-fp8-flashinfer-jit-failed": (
        "vllm",
        "0.15.0",
        "fp8",
        "FLASHINFER",
        (None, None, None),
        False,
        True,
        {"fp8-kv-enabled", "attention-build-failed", "engine-start-failed"},
    ),
    "vllm-0.15.0-fp8-flash-attn-refused": (
        "vllm",
        "0.15.0",
        "fp8",
        None,
        (None, None, None),
        False,
        True,
        {"fp8-unsupported"},
    ),
    "vllm-0.33.0-fp8-flashinfer-ready": (
        "vllm",
        "0.33.0",
        "fp8",
        "FLASHINFER",
        (80080, 19.55, 5.5),
        True,
        False,
        {"fp8-kv-enabled", "kv-scale-default", "ready"},
    ),
    "sglang-0.4.10.post2-fp8-tp2-ready": (
        "sglang",
        None,
        "fp8_e4m3",
        "flashinfer",
        (454112, 11.09, 6.92),
        True,
        False,
        {"fp8-kv-enabled", "kv-scale-default", "ready"},
    ),
    "sglang-0.5.3-fp8-tp2-ready": (
        "sglang",
        None,
        "fp8_e4m3",
        "flashinfer",
        (454112, 11.09, 6.92),
        True,
        False,
        {"fp8-kv-enabled", "kv-scale-default", "ready"},
    ),
    "sglang-0.5.10-fp8-ready": (
        "sglang",
        None,
        "fp8_e4m3",
        "flashinfer",
        (454112, 11.09, 6.92),
        True,
        False,
        {"fp8-kv-enabled", "kv-scale-default", "ready"},
    ),
    "sglang-0.5.23-fp8-ready": (
        "sglang",
        None,
        "fp8_e4m3",
        "flashinfer",
        (454112, 11.09, 6.92),
        True,
        False,
        {"fp8-kv-enabled", "kv-scale-default", "ready"},
    ),
    # the loader's own line says the checkpoint's scales were dropped (the 1.0 line proves
    # nothing on SGLang: sglang#31224)
    "sglang-0.5.23-fp8-scales-dropped": (
        "sglang",
        None,
        "fp8_e4m3",
        "flashinfer",
        (454112, 11.09, 6.92),
        True,
        False,
        {"fp8-kv-enabled", "kv-scale-dropped", "kv-scale-default", "ready"},
    ),
    "sglang-0.5.23-fp8-triton-crash": (
        "sglang",
        None,
        "fp8_e4m3",
        "triton",
        (None, None, None),
        False,
        True,
        {"fp8-kv-enabled", "engine-start-failed"},
    ),
    # the same start on an A100: the scheduler's traceback ends in Triton's fp8e4nv error
    "sglang-0.5.23-fp8-triton-sm80-crash": (
        "sglang",
        None,
        "fp8_e4m3",
        "triton",
        (None, None, None),
        False,
        True,
        {"fp8-kv-enabled", "fp8-unsupported", "engine-start-failed"},
    ),
}


def _log(name: str) -> str:
    return "".join(
        line
        for line in (DATA / f"{name}.log").read_text().splitlines(keepends=True)
        if not line.startswith("#:")
    )


def test_every_fixture_is_expected() -> None:
    assert {p.stem for p in DATA.glob("*.log")} == set(EXPECTED)


def test_every_log_line_names_its_source() -> None:
    for path in DATA.glob("*.log"):
        lines = path.read_text().splitlines()
        assert lines[0].startswith("#: engine=")
        previous = lines[0]
        for line in lines[1:]:
            if not line.startswith("#:") and previous.startswith("#:") and "lines)" not in previous:
                assert re.match(r"#: \S+\.whl \S+\.py:\d+", previous), (path.name, previous)
            previous = line if line.startswith("#:") or "lines)" not in previous else previous


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("engine", ["given", "detected"])
def test_scan(name: str, engine: str) -> None:
    want_engine, version, dtype, backend, capacity, ready, failed, codes = EXPECTED[name]
    scan = logs.scan_log(_log(name), engine=str(want_engine) if engine == "given" else None)
    cap = scan.capacity
    assert (scan.engine, scan.engine_version, scan.kv_cache_dtype) == (want_engine, version, dtype)
    assert scan.attention_backend == backend
    assert (cap.kv_tokens, cap.max_concurrency, cap.kv_memory_gib) == capacity
    assert (scan.ready, scan.failed) == (ready, failed)
    assert set(codes) <= set(scan.codes()), scan.codes()


def test_v0_capacity_is_blocks_times_block_size() -> None:
    scan = logs.scan_log(_log("vllm-0.10.2-fp8-v0-fallback-ready"))
    assert (scan.capacity.num_gpu_blocks, scan.capacity.max_model_len) == (2654, 4096)


def test_remedies_fit_the_version() -> None:
    hint_010 = logs.scan_log(_log("vllm-0.10.2-triton-attn-invalid")).to_dict()
    assert hint_010["engine_version"] == "0.10.2"
    jit = logs.scan_log(_log("vllm-0.15.0-fp8-flashinfer-jit-failed")).finding(
        "attention-build-failed"
    )
    assert jit is not None and "--attention-backend TRITON_ATTN" in jit.hint
    assert "VLLM_ATTENTION_BACKEND" not in jit.hint  # ignored from 0.15 on
    refused = logs.scan_log(_log("vllm-0.15.0-fp8-flash-attn-refused")).finding("fp8-unsupported")
    assert refused is not None and "--attention-backend TRITON_ATTN" in refused.hint
    old = logs.scan_log(_log("vllm-0.10.2-fp8-v0-fallback-ready").replace("FP8 KV cache.", "x"))
    assert old.engine_version == "0.10.2"


def test_an_sglang_crash_names_its_root_cause_line_per_container() -> None:
    """first-hour #22: "See the traceback around line 7" named the sigquit line after the
    traceback (line 5 of the reviewer's file). Lines count from 1 in each container's log."""
    from kvgate.controller.sources import scan_engine_log
    from kvgate.judge import crash

    def start_failed(scan: logs.LogScan) -> logs.Finding:
        found = scan.finding("engine-start-failed")
        assert found is not None
        return found

    # the reviewer's file as it is (provenance lines and all): the traceback's head, line 5
    raw = (DATA / "sglang-0.5.23-fp8-triton-crash.log").read_text()
    assert raw.splitlines()[4].endswith("Scheduler hit an exception: Traceback (most recent "
                                        "call last):")  # fmt: skip
    assert start_failed(logs.scan_log(raw)).hint == "See the traceback from line 5."
    assert start_failed(logs.scan_log(_log("sglang-0.5.23-fp8-triton-crash"))).hint == (
        "See the traceback from line 2."
    )
    # the whole traceback: its last line is Triton's error, which is the root cause
    log = _log("sglang-0.5.23-fp8-triton-sm80-crash")
    lines = log.splitlines()
    error = next(i for i, line in enumerate(lines, 1) if "type fp8e4nv not supported" in line)
    assert lines[error - 1].startswith('ValueError("type fp8e4nv') and error == len(lines) - 1
    scan = logs.scan_log(log)
    unsupported = scan.finding("fp8-unsupported")
    assert unsupported is not None and unsupported.line == error
    assert start_failed(scan).hint == f"Root cause: fp8-unsupported at line {error}."
    # the operator: the crash in the previous container, a restart after it; each line counted
    # in its own log, and the crash classifier's root cause is Triton's line
    record = scan_engine_log(_log("sglang-0.5.23-fp8-ready"), "sglang", previous=log)
    cause = crash.root_cause(record)
    assert cause is not None and (cause.code, cause.line) == ("fp8-unsupported", error)
    failed = next(f for f in record.findings if f.code == "engine-start-failed")
    assert failed.hint == (
        f"Root cause: fp8-unsupported at line {error} of the previous container's log "
        "(kubectl logs --previous)."
    )


def test_sglang_dict_line_is_not_read_as_vllm() -> None:
    scan = logs.scan_log(_log("sglang-0.5.23-fp8-triton-crash"))
    assert scan.engine == "sglang"
    assert scan.finding("fp8-kv-enabled") is not None


def test_v0_block_size_is_the_one_whose_concurrency_prints_as_logged() -> None:
    text = _log("vllm-0.10.2-fp8-v0-fallback-ready")
    # 2654 x 16 / 4096 prints "10.37" (executor_base.py:119); at block size 32 it would be 20.73
    assert logs.scan_log(text.replace("10.37x", "20.73x")).capacity.kv_tokens == 2654 * 32
    # no block size of 0.10.2's BlockSize Literal prints 10.40: no token count, not a guess
    assert logs.scan_log(text.replace("10.37x", "10.40x")).capacity.kv_tokens is None
    # 3 blocks at 131,072 tokens: 1, 8 and 16 all print "0.00" -> ambiguous, no guess
    tiny = text.replace("# cuda blocks: 2654", "# cuda blocks: 3").replace(
        "for 4096 tokens per request: 10.37x", "for 131072 tokens per request: 0.00x"
    )
    assert logs.scan_log(tiny).capacity.kv_tokens is None
