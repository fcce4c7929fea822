"""Cross-check: kvgate's own log scanner reads every emulated startup log as the sim meant it.

The simulator's facts come from its HTTP surface (metrics, server info); the scanner only
sees the log text. Agreement shows the two sides were written from the same engine output.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.evidence.logs import scan_log

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MODEL = "Qwen/Qwen3-8B"
VLLM = ["vllm", "serve", MODEL, "--max-model-len", "8192"]
SGLANG = ["sglang", "--model-path", MODEL, "--enable-metrics"]

# (engine args, env, starts, expected backend, error codes the scanner must report)
CASES = [
    pytest.param([*VLLM, "--kv-cache-dtype", "fp8"], {"KVGATE_SIM_ENGINE_VERSION": v}, False, "FLASHINFER",
                 {"attention-build-failed", "engine-start-failed"}, id=f"vllm-{v}-l4-fp8-jit")
    for v in ("0.12.0", "0.13.0", "0.16.0", "0.20.0", "0.29.0", "0.33.0")
] + [
    pytest.param([*VLLM, "--kv-cache-dtype", "fp8"], {"KVGATE_SIM_ENGINE_VERSION": "0.11.0"}, True, "TRITON_ATTN",
                 set(), id="vllm-0.11.0-l4-fp8-triton-default"),
    pytest.param([*VLLM, "--kv-cache-dtype", "fp8"],
                 {"KVGATE_SIM_ENGINE_VERSION": "0.10.2", "VLLM_ATTENTION_BACKEND": "FLASHINFER"}, False,
                 "FLASHINFER", {"attention-build-failed", "engine-start-failed"}, id="vllm-0.10.2-l4-fp8-jit"),
    pytest.param([*VLLM, "--kv-cache-dtype", "fp8"],
                 {"KVGATE_SIM_ENGINE_VERSION": "0.10.2", "VLLM_ATTENTION_BACKEND": "TRITON_ATTN_VLLM_V1"}, True,
                 "TRITON_ATTN", set(), id="vllm-0.10.2-l4-fp8-triton"),
    pytest.param([*VLLM, "--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"],
                 {"KVGATE_SIM_ENGINE_VERSION": "0.13.0"}, True, "TRITON_ATTN", set(), id="vllm-0.13.0-triton"),
    pytest.param([*VLLM, "--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"],
                 {"KVGATE_SIM_ENGINE_VERSION": "0.33.0"}, True, "TRITON_ATTN", set(), id="vllm-0.33.0-triton"),
    pytest.param(VLLM, {"KVGATE_SIM_ENGINE_VERSION": "0.16.0"}, True, "FLASH_ATTN", set(), id="vllm-0.16.0-bf16"),
    pytest.param([*VLLM, "--kv-cache-dtype", "fp8"], {"KVGATE_SIM_GPU": "H100"}, True, "FLASH_ATTN", set(),
                 id="vllm-0.33.0-h100-fp8"),
    pytest.param(VLLM, {"KVGATE_SIM_FAULTS": "oom-at-start"}, False, None, {"out-of-memory", "engine-start-failed"},
                 id="vllm-oom"),
    pytest.param([*SGLANG, "--kv-cache-dtype", "fp8_e4m3"], {"KVGATE_SIM_ENGINE_VERSION": "0.5.3"}, False,
                 "flashinfer", {"attention-build-failed"}, id="sglang-0.5.3-l4-fp8-jit"),
] + [
    pytest.param([*SGLANG, "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "triton"],
                 {"KVGATE_SIM_ENGINE_VERSION": v}, True, "triton", set(), id=f"sglang-{v}-triton")
    for v in ("0.5.3", "0.5.10", "0.5.23")
]  # fmt: skip


def _sim_tokens(engine, name: str) -> int:
    text = httpx.get(engine.url + "/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    if name == "vllm":
        return int(families["vllm:cache_config_info"].samples[0].labels["num_gpu_blocks"]) * 16
    return int(
        httpx.get(engine.url + "/get_server_info", timeout=10).json()["max_total_num_tokens"]
    )


@pytest.mark.parametrize(("args", "env", "starts", "backend", "errors"), CASES)
def test_scanner_reads_the_emulated_log(sim, args, env, starts, backend, errors) -> None:
    engine = sim(args, env, ready=starts)
    if not starts:
        assert engine.wait(60) != 0
    scan = scan_log(engine.log())
    name = args[0]
    assert scan.engine == name
    dtype = next((args[i + 1] for i, a in enumerate(args) if a == "--kv-cache-dtype"), None)
    if dtype:
        assert scan.kv_cache_dtype == dtype
    if backend:
        assert scan.attention_backend == backend
    assert scan.failed is not starts and scan.ready is starts
    assert errors <= set(scan.codes()), scan.codes()
    if starts:
        assert scan.capacity.kv_tokens == _sim_tokens(engine, name)
        assert not {f.code for f in scan.findings if f.severity == "error"}
    if name == "vllm":
        assert scan.engine_version == env.get("KVGATE_SIM_ENGINE_VERSION", "0.33.0")


# ---- kvgate.evidence.metrics on the sim's /metrics -------------------------------------------------
METRIC_CASES = [
    pytest.param([*VLLM, "--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"],
                 {"KVGATE_SIM_ENGINE_VERSION": v}, "fp8", id=f"vllm-{v}")
    for v in ("0.13.0", "0.16.0", "0.33.0")
] + [
    pytest.param([*VLLM[:-2], "--max-model-len", "8192"], {"KVGATE_SIM_ENGINE_VERSION": "0.11.0"}, "auto",
                 id="vllm-0.11.0-bf16"),
    pytest.param([*VLLM, "--kv-cache-dtype", "fp8"],
                 {"KVGATE_SIM_ENGINE_VERSION": "0.10.2", "VLLM_ATTENTION_BACKEND": "TRITON_ATTN_VLLM_V1"}, "fp8",
                 id="vllm-0.10.2"),
    pytest.param(SGLANG, {"KVGATE_SIM_ENGINE_VERSION": "0.5.10"}, None, id="sglang-0.5.10"),
    pytest.param(SGLANG, {"KVGATE_SIM_ENGINE_VERSION": "0.5.23"}, None, id="sglang-0.5.23"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "env", "dtype"), METRIC_CASES)
def test_kvgate_metrics_reads_the_sim(sim, args, env, dtype) -> None:
    from kvgate.evidence.metrics import delta, parse_metrics

    engine = sim(args, env)
    before = parse_metrics(httpx.get(engine.url + "/metrics").text, taken_at=0.0)
    for _ in range(3):
        body = {"model": MODEL, "prompt": "Hello there", "max_tokens": 12}
        assert httpx.post(engine.url + "/v1/completions", json=body, timeout=30).status_code == 200
    after = parse_metrics(httpx.get(engine.url + "/metrics").text, taken_at=10.0)
    assert after.engine == args[0]
    assert after.kv_capacity_tokens == scan_log(engine.log()).capacity.kv_tokens
    assert after.kv_cache_dtype == dtype
    assert (after.running, after.waiting) == (0, 0)
    assert after.kv_usage == 0
    assert after.generation_tokens - before.generation_tokens == 36
    window = delta(before, after)
    assert window.itl is not None and window.itl.p90 > 0


def test_kvgate_sees_pool_pressure_only_under_load(sim) -> None:
    from kvgate.evidence.metrics import parse_metrics
    from kvgate.evidence.pool import pool_pressure

    load = {"KVGATE_SIM_LOAD": "concurrency=64,prompt=2000,output=400", "KVGATE_SIM_SPEED": "0.01"}
    busy = sim(VLLM, load)
    quiet = sim(
        VLLM, {"KVGATE_SIM_LOAD": "concurrency=2,prompt=500,output=200", "KVGATE_SIM_SPEED": "0.01"}
    )
    scrapes: dict[str, list] = {"busy": [], "quiet": []}
    for i in range(8):
        for name, engine in (("busy", busy), ("quiet", quiet)):
            text = httpx.get(engine.url + "/metrics").text
            scrapes[name].append(parse_metrics(text, taken_at=float(i)))
        time.sleep(0.25)
    assert pool_pressure(scrapes["busy"]).pressured is True
    assert pool_pressure(scrapes["quiet"]).pressured is False


def test_kvgate_scan_logs_cli_on_emulated_logs(sim, tmp_path) -> None:
    ok = sim([*VLLM, "--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"])
    crashed = sim([*VLLM, "--kv-cache-dtype", "fp8"], ready=False)
    assert crashed.wait(60) != 0
    for engine, code in ((ok, 0), (crashed, 1)):
        result = subprocess.run(
            [sys.executable, "-m", "kvgate", "scan-logs", "--json", str(engine.log_path)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == code, result.stderr
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report["engine"] == "vllm" and report["kv_cache_dtype"] == "fp8"
        assert report["attention_backend"] == ("TRITON_ATTN" if code == 0 else "FLASHINFER")


@pytest.mark.parametrize(
    ("args", "lie"),
    [
        pytest.param([*VLLM, "--kv-cache-dtype", "fp8", "--attention-backend", "TRITON_ATTN"], "auto",
                     id="log-fp8-metrics-auto"),
        pytest.param(VLLM, "fp8", id="log-auto-metrics-fp8"),
    ],
)  # fmt: skip
def test_metrics_kv_dtype_fault_is_caught_by_the_cross_check(sim, args, lie) -> None:
    from kvgate.evidence.crosscheck import cross_check_log
    from kvgate.evidence.metrics import parse_metrics

    honest = sim(args)
    lying = sim(args, {"KVGATE_SIM_FAULTS": f"metrics-kv-dtype={lie}"})
    for engine, codes in ((honest, []), (lying, ["log-metrics-dtype-mismatch"])):
        snap = parse_metrics(httpx.get(engine.url + "/metrics", timeout=10).text)
        scan = scan_log(engine.log()).status_record()
        assert [f.code for f in cross_check_log(scan, snap)] == codes
    assert parse_metrics(httpx.get(lying.url + "/metrics", timeout=10).text).kv_cache_dtype == lie


@pytest.mark.parametrize("version", ["0.5.3", "0.5.23"])
def test_sglang_server_info_dtype_fault_is_caught_by_the_cross_check(sim, version) -> None:
    # SGLang's /metrics carry no KV dtype: the second source is its server info.
    from kvgate.evidence.crosscheck import cross_check_server_info
    from kvgate.evidence.metrics import parse_server_info

    args = [*SGLANG, "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "triton"]
    env = {"KVGATE_SIM_ENGINE_VERSION": version}
    honest = sim(args, env)
    lying = sim(args, {**env, "KVGATE_SIM_FAULTS": "metrics-kv-dtype=auto"})
    for engine, dtype, codes in (
        (honest, "fp8_e4m3", []),
        (lying, "auto", ["log-server-info-dtype-mismatch"]),
    ):
        path = "/server_info" if version == "0.5.23" else "/get_server_info"  # as the operator
        info = parse_server_info(httpx.get(engine.url + path, timeout=10).text)
        scan = scan_log(engine.log()).status_record()
        assert (scan.kv_cache_dtype, info.kv_cache_dtype) == ("fp8_e4m3", dtype)
        assert info.max_total_num_tokens == scan.kv_tokens  # the same pool
        found = cross_check_server_info(scan, info.kv_cache_dtype, info.max_total_num_tokens)
        assert [f.code for f in found] == codes
