"""metrics.cross_check_log: the startup log against /metrics cache_config_info."""

from __future__ import annotations

import dataclasses

from kvgate import logs
from kvgate.metrics import MetricSnapshot, cross_check_log

LOG = (
    "INFO 09-13 10:00:00 [core.py:76] Initializing a V1 LLM engine (v0.11.0) with config: "
    "model='M', kv_cache_dtype=fp8, device_config=cuda\n"
    "INFO 09-13 10:00:00 [kv_cache_utils.py:1087] GPU KV cache size: 80,368 tokens\n"
)


def _snapshot(**cache: str) -> MetricSnapshot:
    return MetricSnapshot(
        "vllm", None, None, None, None, None, None, None, None, None, None, None, cache, {}
    )


def test_agreeing_sources_give_nothing() -> None:
    scan = logs.scan_log(LOG)
    snap = _snapshot(cache_dtype="fp8", num_gpu_blocks="5023", block_size="16")
    assert cross_check_log(scan, snap) == ()


def test_dtype_disagreement_both_ways() -> None:
    scan = logs.scan_log(LOG)
    found = cross_check_log(scan, _snapshot(cache_dtype="auto"))
    assert [f.code for f in found] == ["log-metrics-dtype-mismatch"]
    assert found[0].severity == "error"
    bf16 = logs.scan_log(LOG.replace("kv_cache_dtype=fp8", "kv_cache_dtype=auto"))
    assert [f.code for f in cross_check_log(bf16, _snapshot(cache_dtype="fp8"))] == [
        "log-metrics-dtype-mismatch"
    ]
    assert cross_check_log(bf16, _snapshot(cache_dtype="bfloat16")) == ()


def test_capacity_and_blocks_disagreement() -> None:
    scan = logs.scan_log(LOG)
    snap = _snapshot(cache_dtype="fp8", num_gpu_blocks="2500", block_size="16")
    assert [f.code for f in cross_check_log(scan, snap)] == ["log-metrics-capacity-mismatch"]
    with_blocks = dataclasses.replace(
        scan, capacity=dataclasses.replace(scan.capacity, num_gpu_blocks=5023)
    )
    codes = [f.code for f in cross_check_log(with_blocks, snap)]
    assert codes == ["log-metrics-capacity-mismatch", "log-metrics-blocks-mismatch"]


def test_missing_values_are_not_disagreements() -> None:
    assert cross_check_log(logs.scan_log(LOG), _snapshot()) == ()
