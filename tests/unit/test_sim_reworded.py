"""The simulator's `reworded-log` and `no-cache-info` faults: an engine whose startup lines say
nothing a log scanner reads, and one whose /metrics carry no cache_config_info."""

from __future__ import annotations

import io

from kvgate.evidence.logs import scan_lines
from kvgate.sim.config import GPUS, parse_faults
from kvgate.sim.logfmt import REWORDED, VllmLog


def test_the_faults_parse() -> None:
    faults = parse_faults("reworded-log,no-cache-info", GPUS["L4"])
    assert faults.reworded_log and faults.no_cache_info
    plain = parse_faults("", GPUS["L4"])
    assert not plain.reworded_log and not plain.no_cache_info


def test_a_reworded_log_hides_every_kv_fact_from_the_scanner_but_not_readiness() -> None:
    lines = [
        ("utils.py:302", "vLLM server version 0.33.0, serving model Qwen/Qwen3-8B"),
        ("cache.py:206", "Using fp8 data type to store kv cache. It reduces the GPU memory"),
        ("cuda.py:350", "Using TRITON_ATTN backend."),
        ("kv_cache_utils.py:1087", "GPU KV cache size: 40,544 tokens"),
        ("kv_cache_utils.py:1091", "Maximum concurrency for 8,192 tokens per request: 4.95x"),
    ]
    out = {}
    for reword in (False, True):
        buffer = io.StringIO()
        log = VllmLog(api_pid=1, core_pid=2, out=buffer, reword=reword)
        for where, message in lines:
            log.info("APIServer", where, message)
        log.uvicorn("Application startup complete.", stream=buffer)
        out[reword] = scan_lines(buffer.getvalue().splitlines(), None, source="sim")
    plain, reworded = out[False], out[True]
    assert plain.kv_cache_dtype == "fp8" and plain.capacity.kv_tokens == 40544
    assert (reworded.kv_cache_dtype, reworded.attention_backend) == (None, None)
    assert reworded.capacity.kv_tokens is None and reworded.capacity.max_concurrency is None
    assert reworded.engine == "vllm" and reworded.ready  # what it does not hide
    assert REWORDED.startswith("engine settings applied")
