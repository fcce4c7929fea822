"""A startup-log scan as status keeps it: camelCase through `status.ScanRecord`, read back typed
whatever the spelling (a status an earlier release wrote kept the snake_case `to_dict`); the
gates judge that record, never a scan rebuilt from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from evidence import as_scan

from kvgate.controller.sources import compact_scan, scan_engine_log
from kvgate.evidence import logs
from kvgate.judge import gates, remedy
from kvgate.records.codec import read_record, write
from kvgate.records.status import FindingRecord, ScanRecord

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
SAMPLES = sorted(DATA.glob("*.txt"))


def test_the_kept_scan_is_camel_case() -> None:
    kept = write(
        scan_engine_log((DATA / "vllm-0.33-fp8-h100-no-scales-ready.txt").read_text(), "vllm")
    )
    assert {"engineVersion", "kvCacheDtype", "attentionBackend"} <= set(kept)
    assert "kv_cache_dtype" not in kept and "kvTokens" in kept["capacity"]
    assert all("hint" not in f or f["hint"] for f in kept["findings"])  # "" is left out


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_either_spelling_reads_back_the_same_scan(path: Path) -> None:
    engine = "sglang" if path.name.startswith("sglang") else "vllm"
    scan = logs.scan_log(path.read_text(encoding="utf-8", errors="replace"), engine=engine)
    camel, snake = as_scan(write(scan.status_record())), as_scan(scan.to_dict())
    assert camel is not None and snake is not None
    # the same scan, but for a finding without a hint: "" in the old spelling, left out now
    assert dataclasses.replace(camel, findings=()) == dataclasses.replace(snake, findings=())
    assert [dataclasses.replace(f, hint=f.hint or None) for f in snake.findings] == list(
        camel.findings
    )
    assert (camel.kv_cache_dtype, camel.attention_backend, camel.engine_version) == (
        scan.kv_cache_dtype, scan.attention_backend, scan.engine_version
    )  # fmt: skip
    assert [f.code for f in camel.findings] == scan.codes()


def test_the_gates_read_a_kept_scan_of_either_spelling() -> None:
    scan = logs.scan_log(
        (DATA / "vllm-0.33-fp8-h100-no-scales-ready.txt").read_text(), engine="vllm"
    )
    for kept in (write(scan.status_record()), scan.to_dict()):
        assert gates.kv_tokens(as_scan(kept)) == scan.capacity.kv_tokens
        read = as_scan(kept)
        assert read is not None and read.capacity is not None
        assert read.capacity.max_model_len == scan.capacity.max_model_len
        assert read.attention_backend == scan.attention_backend
    same = gates.assess_backend(
        gates.BackendGate(), as_scan(write(scan.status_record())), as_scan(scan.to_dict())
    )
    assert same.reason == "BackendUnchanged", same


@pytest.mark.parametrize("hostile", [None, 7, "x", [1], {"capacity": "big"},
                                     {"kvCacheDtype": 8, "findings": "nope"}])  # fmt: skip
def test_anything_unreadable_reads_as_unknown(hostile: object) -> None:
    scan = read_record(ScanRecord, hostile)
    assert scan.kv_cache_dtype is None and scan.kv_tokens is None and scan.findings == ()
    assert gates.kv_tokens(as_scan(hostile if isinstance(hostile, dict) else None)) is None
    assert (
        remedy.find_remedy(as_scan(hostile if isinstance(hostile, dict) else None), "vllm", None)
        is None
    )


def test_the_remedy_reads_the_version_a_kept_scan_logged() -> None:
    text = (DATA / "vllm-0.13-fp8-l4-flashinfer-jit-failed.txt").read_text()
    scan = logs.scan_log(text, engine="vllm")
    camel = remedy.find_remedy(as_scan(write(scan.status_record())), "vllm", None)
    assert camel is not None and camel == remedy.find_remedy(as_scan(scan.to_dict()), "vllm", None)


def test_no_credential_an_engine_printed_reaches_the_kept_scan() -> None:
    # GIVEN a crash log whose every line also carries a credential (engines print their args)
    secret = "hf_abcdefghijklmnopqrstuvwxyz0123456789"
    text = (DATA / "vllm-0.13-fp8-l4-flashinfer-jit-failed.txt").read_text()
    hostile = "\n".join(f"{line} --api-key {secret}" for line in text.splitlines())
    kept = write(scan_engine_log(hostile, "vllm"))
    # THEN the findings still name the crash, and nothing of the credential is kept
    assert "attention-build-failed" in [f["code"] for f in kept["findings"]]
    assert secret not in str(kept) and "hf_abcdefgh" not in str(kept)


@pytest.mark.parametrize("before", [287, 295])  # 13 and 5 of its characters before the cut
def test_a_credential_across_the_cut_of_a_finding_leaves_none_of_it(before: int) -> None:
    # GIVEN a finding whose line quotes a credential just before status cuts it at 300
    secret = "hf_abcdefghijklmnopqrstuvwxyz0123456789"
    line = "x" * (before - 1) + " " + secret
    scan = ScanRecord(findings=(FindingRecord(code="engine-start-failed", text=line),))
    # WHEN status keeps it
    (kept,) = compact_scan(scan).findings
    # THEN it is cut to 300, and not even the credential's start is kept
    assert kept.text is not None and len(kept.text) <= 300 and kept.text.startswith("xxx")
    assert secret[:5] not in kept.text
