"""One dtype normaliser: the gates, the cross-checks and the log scan ask `kv_dtype_family`."""

from __future__ import annotations

import pytest

from kvgate.evidence.logs.fold import _normalise_dtype
from kvgate.judge.gates import assess_arms_dtype
from kvgate.records.status import ScanRecord
from kvgate.vocabulary import Outcome, Reason, kv_dtype_family


@pytest.mark.parametrize(
    ("spelling", "family"),
    [
        ("auto", "16-bit"),
        ("BF16", "16-bit"),
        ("torch.float16", "16-bit"),
        ("fp8", "fp8_e4m3"),
        ("FP8_E4M3", "fp8_e4m3"),
        ("'torch.float8_e4m3fn'", "fp8_e4m3"),  # as a log quotes it
        ("fp8_inc", "fp8_e4m3"),
        ("fp8_e5m2", "fp8_e5m2"),
        ("torch.float8_e5m2", "fp8_e5m2"),
        ("float32", "float32"),
        ("int8", "int8"),
    ],
)
def test_every_spelling_of_a_kv_dtype_has_one_family(spelling: str, family: str) -> None:
    assert kv_dtype_family(spelling) == family


@pytest.mark.parametrize(
    ("logged", "reported"),
    [("fp8", "fp8"), ("'bfloat16'", "auto"), ("float32", "auto"), ("float8_e5m2", "fp8_e5m2")],
)
def test_the_log_scan_reports_the_engine_spelling_but_torch_fp8_by_family(
    logged: str, reported: str
) -> None:
    assert _normalise_dtype(logged) == reported


def test_the_gate_reads_a_candidate_in_any_spelling_of_the_wanted_family() -> None:
    control = ScanRecord(kv_cache_dtype="BF16")
    same = assess_arms_dtype("fp8", control, ScanRecord(kv_cache_dtype="FP8_E4M3"))
    assert same.outcome is not Outcome.ERROR, same
    other = assess_arms_dtype("fp8", control, ScanRecord(kv_cache_dtype="fp8_e5m2"))
    assert (other.outcome, other.reason) == (Outcome.ERROR, Reason.CANDIDATE_DTYPE_MISMATCH)
