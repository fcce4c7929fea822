"""crosscheck.cross_check_log / cross_check_server_info: the startup log against the live engine."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvgate.errors import ParseError
from kvgate.evidence import logs
from kvgate.evidence.crosscheck import cross_check_log, cross_check_server_info
from kvgate.evidence.metrics import (
    MetricSnapshot,
    ServerInfo,
    parse_server_info,
)
from kvgate.records.status import ScanRecord

LOG = (
    "INFO 09-13 10:00:00 [core.py:76] Initializing a V1 LLM engine (v0.11.0) with config: "
    "model='M', kv_cache_dtype=fp8, device_config=cuda\n"
    "INFO 09-13 10:00:00 [kv_cache_utils.py:1087] GPU KV cache size: 80,368 tokens\n"
)


def scan_of(text: str) -> ScanRecord:
    """The log's scan as status keeps it (what the engine-truth gate checks)."""
    return logs.scan_log(text).status_record()


def _snapshot(**cache: str) -> MetricSnapshot:
    return MetricSnapshot(
        "vllm", None, None, None, None, None, None, None, None, None, None, None, cache, {}
    )


def test_agreeing_sources_give_nothing() -> None:
    scan = scan_of(LOG)
    snap = _snapshot(cache_dtype="fp8", num_gpu_blocks="5023", block_size="16")
    assert cross_check_log(scan, snap) == ()


def test_dtype_disagreement_both_ways() -> None:
    scan = scan_of(LOG)
    found = cross_check_log(scan, _snapshot(cache_dtype="auto"))
    assert [f.code for f in found] == ["log-metrics-dtype-mismatch"]
    assert found[0].severity == "error"
    bf16 = scan_of(LOG.replace("kv_cache_dtype=fp8", "kv_cache_dtype=auto"))
    assert [f.code for f in cross_check_log(bf16, _snapshot(cache_dtype="fp8"))] == [
        "log-metrics-dtype-mismatch"
    ]
    assert cross_check_log(bf16, _snapshot(cache_dtype="bfloat16")) == ()


def test_capacity_and_blocks_disagreement() -> None:
    scan = scan_of(LOG)
    snap = _snapshot(cache_dtype="fp8", num_gpu_blocks="2500", block_size="16")
    assert [f.code for f in cross_check_log(scan, snap)] == ["log-metrics-capacity-mismatch"]
    with_blocks = dataclasses.replace(
        scan, capacity=dataclasses.replace(scan.capacity, num_gpu_blocks=5023)
    )
    codes = [f.code for f in cross_check_log(with_blocks, snap)]
    assert codes == ["log-metrics-capacity-mismatch", "log-metrics-blocks-mismatch"]


def test_missing_values_are_not_disagreements() -> None:
    assert cross_check_log(scan_of(LOG), _snapshot()) == ()


# ---- SGLang: the log's KV dtype against /get_server_info (its /metrics carry none) ----

ENGINE_SOURCE = Path(__file__).parents[1] / "data" / "engine-source"


def _sglang(name: str) -> ScanRecord:
    return scan_of((ENGINE_SOURCE / f"{name}.log").read_text())


def _server_info(**fields: object) -> str:
    # The shape of 0.5.3's body: dataclasses.asdict(server_args) + scheduler_info + version
    # (sglang/srt/entrypoints/http_server.py:477-488).
    return json.dumps(
        {
            "model_path": "Qwen/Qwen3-8B",
            "kv_cache_dtype": "fp8_e4m3",
            "status": "ready",
            "max_total_num_tokens": 454112,
            "max_req_input_len": 40954,
            "internal_states": [{}],
            "version": "0.5.3",
            **fields,
        }
    )


@pytest.mark.parametrize(
    "name",
    ["sglang-0.4.10.post2-fp8-tp2-ready", "sglang-0.5.3-fp8-tp2-ready", "sglang-0.5.23-fp8-ready"],
)
def test_sglang_log_against_server_info(name: str) -> None:
    scan = _sglang(name)
    assert cross_check_server_info(scan, parse_server_info(_server_info()).kv_cache_dtype) == ()
    auto = parse_server_info(_server_info(kv_cache_dtype="auto")).kv_cache_dtype
    lie = cross_check_server_info(scan, auto)
    assert [f.code for f in lie] == ["log-server-info-dtype-mismatch"]
    assert lie[0].severity == "error"
    assert "kv_cache_dtype=fp8_e4m3" in lie[0].text and "SGLang server info says" in lie[0].text
    e5 = cross_check_server_info(scan, "fp8_e5m2")  # another FP8 cache is another cache
    assert [f.code for f in e5] == ["log-server-info-dtype-mismatch"]
    assert cross_check_server_info(scan, None) == ()


def test_sglang_auto_log_against_an_fp8_server() -> None:
    scan = _sglang("sglang-0.5.3-fp8-tp2-ready")
    auto = dataclasses.replace(scan, kv_cache_dtype="auto")
    assert cross_check_server_info(auto, "auto") == ()
    assert cross_check_server_info(auto, "bf16") == ()  # auto on a BF16 model is 16-bit
    assert [f.code for f in cross_check_server_info(auto, "fp8_e4m3")] == [
        "log-server-info-dtype-mismatch"
    ]


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ("<html>", "not JSON"),
        ("[1, 2]", "a JSON list, not an object"),
        (json.dumps({"model_path": "m"}), "no string kv_cache_dtype"),
        (json.dumps({"kv_cache_dtype": 8}), "no string kv_cache_dtype"),
        (json.dumps({"kv_cache_dtype": " "}), "no string kv_cache_dtype"),
    ],
)
def test_a_bad_server_info_body_is_one_line_naming_it(body: str, complaint: str) -> None:
    with pytest.raises(ParseError, match=complaint) as exc:
        parse_server_info(body, "/get_server_info")
    assert "/get_server_info" in str(exc.value) and "\n" not in str(exc.value)


def test_sglang_log_tokens_against_server_info() -> None:
    # scheduler_info's max_total_num_tokens (in server info from 0.4.6 on; /metrics only 0.5.10+)
    scan = _sglang("sglang-0.5.3-fp8-tp2-ready")
    info = parse_server_info(_server_info())
    assert info == ServerInfo("fp8_e4m3", 454112)
    assert cross_check_server_info(scan, info.kv_cache_dtype, info.max_total_num_tokens) == ()
    other = cross_check_server_info(scan, "fp8_e4m3", 227056)  # another pool (half of it)
    assert [f.code for f in other] == ["log-server-info-capacity-mismatch"]
    assert "454,112 KV tokens" in other[0].text and "max_total_num_tokens=227,056" in other[0].text
    both = cross_check_server_info(scan, "auto", 227056)
    assert [f.code for f in both] == [
        "log-server-info-capacity-mismatch",
        "log-server-info-dtype-mismatch",
    ]
    assert cross_check_server_info(scan, "fp8_e4m3", 454112 + 4000) == ()  # within 1 %


@pytest.mark.parametrize("tokens", [None, True, -5, 0, "454112", 1.5])
def test_server_info_without_a_sane_token_count_keeps_the_dtype(tokens: object) -> None:
    info = parse_server_info(_server_info(max_total_num_tokens=tokens))
    assert info == ServerInfo("fp8_e4m3", None)
    assert ServerInfo.from_status(info.to_status()) == info
    assert ServerInfo.from_status({"absent": "HTTP 404"}) is None
    assert ServerInfo.from_status({"kvCacheDtype": "auto", "maxTotalNumTokens": "9"}) == (
        ServerInfo("auto", None)
    )
