"""kvgate.engine_versions against what tests/fixtures_from_wheels.py read out of the wheels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvgate import engine_versions as ev

FACTS: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "data" / "engine-source" / "facts.json").read_text()
)


@pytest.mark.parametrize("key", sorted(FACTS))
def test_rows_match_the_wheels(key: str) -> None:
    engine, version = key.split("-", 1)
    row = ev.facts_for(engine, version)
    read = FACTS[key]
    assert row.verified
    assert row.kv_cache_dtypes == frozenset(read["kv_cache_dtypes"])
    assert row.backends <= frozenset(read["attention_backends"]), "a name this version lacks"
    if engine == "vllm":
        assert (row.backend_env is not None) == read["env_VLLM_ATTENTION_BACKEND"]
        assert (row.backend_flag is not None) == read["flag_attention_backend"]
        assert (row.backend_json_flag is not None) == read["flag_attention_config"]
        assert (row.calculate_kv_scales != "removed") == read["calculate_kv_scales"]


def test_triton_name_per_version() -> None:
    assert "TRITON_ATTN" not in FACTS["vllm-0.10.2"]["attention_backends"]
    assert "TRITON_ATTN_VLLM_V1" not in FACTS["vllm-0.11.0"]["attention_backends"]
    assert ev.facts_for("vllm", "0.10.2").backend_name("TRITON_ATTN") == "TRITON_ATTN_VLLM_V1"
    assert ev.facts_for("vllm", "0.11.0").backend_name("TRITON_ATTN") == "TRITON_ATTN"
    with pytest.raises(ValueError, match="no attention backend"):
        ev.facts_for("vllm", "0.11.0").backend_name("TRITON_ATTN_VLLM_V1")


@pytest.mark.parametrize(
    ("engine", "version", "code", "remedy"),
    [
        (
            "vllm",
            "0.10.2",
            "attention-build-failed",
            (
                (),
                {
                    "VLLM_ATTENTION_BACKEND": "TRITON_ATTN_VLLM_V1",
                    "VLLM_USE_FLASHINFER_SAMPLER": "0",
                },
            ),
        ),
        (
            "vllm",
            "0.11.0",
            "fp8-unsupported",
            ((), {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN", "VLLM_USE_FLASHINFER_SAMPLER": "0"}),
        ),
        (
            "vllm",
            "0.33.0",
            "attention-build-failed",
            (("--attention-backend", "TRITON_ATTN"), {"VLLM_USE_FLASHINFER_SAMPLER": "0"}),
        ),
        (
            "sglang",
            "0.5.3",
            "attention-build-failed",
            (("--attention-backend", "triton", "--sampling-backend", "pytorch"), {}),
        ),
        ("sglang", "0.5.23", "fp8-unsupported", (("--attention-backend", "triton"), {})),
        ("vllm", None, "attention-build-failed", None),
        (
            "sglang",
            None,
            "attention-build-failed",
            (("--attention-backend", "triton", "--sampling-backend", "pytorch"), {}),
        ),
        ("vllm", "0.33.0", "out-of-memory", None),
    ],
)
def test_remedy_for(engine: str, version: str | None, code: str, remedy: object) -> None:
    assert ev.remedy_for(engine, version, code) == remedy


def test_every_remedy_uses_only_what_its_version_has() -> None:
    for engine in ("vllm", "sglang"):
        for row in ev.all_rows(engine):
            version = ".".join(map(str, row.since))
            for code in ev.REMEDIABLE_CODES:
                remedy = ev.remedy_for(engine, version, code)
                assert remedy is not None
                args, env = remedy
                flags = [a for a in args if a.startswith("--")]
                assert set(flags) <= row.flags(), (version, flags)
                if row.backend_env is None:
                    assert "VLLM_ATTENTION_BACKEND" not in env


def test_common_dtypes_for_an_unknown_version() -> None:
    assert ev.kv_cache_dtypes("vllm", None) == {"auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"}
    assert "fp8" not in ev.kv_cache_dtypes("sglang", None)
