"""kvgate.engines.versions against what tests/fixtures_from_wheels.py read out of the wheels."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from kvgate.engines import versions as ev

FACTS: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "data" / "engine-source" / "facts.json").read_text()
)


@pytest.mark.parametrize("key", sorted(FACTS))
def test_rows_match_the_wheels(key: str) -> None:
    engine, version = key.split("-", 1)
    row = ev.facts_for(engine, version)
    read = FACTS[key]
    assert row.kv_cache_dtypes == frozenset(read["kv_cache_dtypes"])
    assert row.backends <= frozenset(read["attention_backends"]), "a name this version lacks"
    if engine == "vllm":
        assert (row.backend_env is not None) == read["env_VLLM_ATTENTION_BACKEND"]
        assert (row.backend_flag is not None) == read["flag_attention_backend"]
        assert (row.backend_json_flag is not None) == read["flag_attention_config"]
        present = row.calculate_kv_scales in {"yes", "deprecated"}
        assert present == read["calculate_kv_scales"]
        deprecated = read["calculate_kv_scales_deprecated"]
        assert (row.calculate_kv_scales == "deprecated") == deprecated
        # recorded for the wheels read since the key was added (0.6.0-0.10.1)
        sampler = read.get("env_VLLM_USE_FLASHINFER_SAMPLER", True)
        assert (row.flashinfer_sampler_env is not None) == sampler
        assert row.backend_name(row.fp8_backend) in read["attention_backends"]


def row_flags(row: ev.VersionFacts) -> frozenset[str]:
    """The flags a row's version takes that the remedies and these tests name."""
    optional = (row.backend_flag, row.backend_json_flag, row.sampling_backend_flag)
    present = {"--kv-cache-dtype", *filter(None, optional)}
    if row.calculate_kv_scales in {"yes", "deprecated"}:
        present.add("--calculate-kv-scales")
    return frozenset(present)


def _read_versions(engine: str) -> list[tuple[int, ...]]:
    return sorted(ev.parse(k.split("-", 1)[1]) for k in FACTS if k.startswith(f"{engine}-"))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_row_is_backed_by_a_wheel_of_its_range(engine: str) -> None:
    rows = ev.all_rows(engine)
    read = _read_versions(engine)
    for row, following in zip(rows, [*rows[1:], None], strict=True):
        inside = [v for v in read if row.since <= v and (following is None or v < following.since)]
        assert inside, f"{engine} row since {row.since} has no wheel read in its range"


SGLANG_RELEASES = [(0, 4, m) for m in range(6, 11)] + [(0, 5, m) for m in range(1, 24)]


@pytest.mark.parametrize(
    ("engine", "releases"),
    [("vllm", [(0, m, 0) for m in range(11, 34)]), ("sglang", SGLANG_RELEASES)],
)
def test_rows_start_where_the_wheels_change(engine: str, releases: list[tuple[int, ...]]) -> None:
    # Every release in range was read: a row that starts later or earlier than the change it
    # describes would put a read version in the wrong row (and fail above); a redundant row
    # (same facts as the one before) is a boundary nobody can check.
    read = [v for v in _read_versions(engine) if v >= releases[0]]
    assert read == releases
    rows = ev.all_rows(engine)

    def what(row: ev.VersionFacts) -> tuple[object, ...]:
        return (
            row.kv_cache_dtypes,
            row.backends,
            row.calculate_kv_scales,
            row.backend_flag,
            row.backend_env,
        )

    for before, row in itertools.pairwise(rows):
        assert before.since < row.since
        assert what(before) != what(row), f"row {row.since} repeats the row before it"


def test_every_minor_below_the_table_was_read() -> None:
    read = [v for v in _read_versions("vllm") if v < (0, 11, 0)]
    minors = [(0, m, 0) for m in range(6, 11)]
    assert read == sorted([*minors, (0, 8, 5), (0, 10, 1), (0, 10, 2)])
    assert ev.all_rows("vllm")[0].since == (0, 6, 0)


V06 = {"auto", "fp8", "fp8_e4m3", "fp8_e5m2"}


@pytest.mark.parametrize(
    ("version", "backend", "calculate", "dtypes"),
    [
        ("0.6.0", "XFORMERS", "never", V06),
        ("0.7.0", "XFORMERS", "yes", V06),
        ("0.8.5", "XFORMERS", "yes", V06),
        ("0.9.2", "XFORMERS", "yes", V06),
        # 0.10.0-0.10.1 send FP8 KV to V0, which rejects TRITON_ATTN_VLLM_V1
        ("0.10.0", "XFORMERS", "yes", V06 | {"fp8_inc"}),
        ("0.10.1", "XFORMERS", "yes", V06 | {"fp8_inc"}),
        ("0.10.2", "TRITON_ATTN_VLLM_V1", "yes", V06 | {"fp8_inc"}),
    ],
)
def test_rows_below_0102(version: str, backend: str, calculate: str, dtypes: set[str]) -> None:
    # GIVEN a vLLM up to 0.10.2 WHEN FlashInfer's JIT fails or FlashAttention refuses FP8
    # THEN the remedy is the env variable (no flag before 0.13) naming a backend that holds an
    # FP8 KV cache on the engine (V0 or V1) that release runs it on.
    row = ev.facts_for("vllm", version)
    assert row.kv_cache_dtypes == dtypes and row.calculate_kv_scales == calculate
    assert ("--calculate-kv-scales" in row_flags(row)) == (calculate == "yes")
    for code in ev.REMEDIABLE_CODES:
        assert ev.remedy_for("vllm", version, code) == (
            (),
            {"VLLM_ATTENTION_BACKEND": backend, "VLLM_USE_FLASHINFER_SAMPLER": "0"},
        )
    assert ev.remedy_for("vllm", "0.5.5", "attention-build-failed") is None


def test_vllm_020_row() -> None:
    row = ev.facts_for("vllm", "0.20.0")
    assert row.since == (0, 20, 0)
    assert row.calculate_kv_scales == "deprecated" and "--calculate-kv-scales" in row_flags(row)
    assert "TREE_ATTN" in row.backends and "TREE_ATTN" not in ev.facts_for("vllm", "0.21").backends
    assert "turboquant_k8v4" in row.kv_cache_dtypes
    assert ev.remedy_for("vllm", "0.20.0", "attention-build-failed") == (
        ("--attention-backend", "TRITON_ATTN"),
        {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
    )


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
                assert set(flags) <= row_flags(row), (version, flags)
                if row.backend_env is None:
                    assert "VLLM_ATTENTION_BACKEND" not in env


def test_common_dtypes_for_an_unknown_version() -> None:
    # fp8_inc arrived in 0.10.0 (`CacheDType`, vllm/config.py:1609): not every version takes it.
    assert ev.kv_cache_dtypes("vllm", None) == {"auto", "fp8", "fp8_e4m3", "fp8_e5m2"}
    assert "fp8" not in ev.kv_cache_dtypes("sglang", None)


def test_a_short_version_is_the_release_it_names() -> None:
    assert ev.parse("0.21") == (0, 21, 0) == ev.parse("v0.21.0rc1")
    assert ev.facts_for("vllm", "0.21").since == (0, 21, 0)
    assert ev.facts_for("vllm", "0.15").backend_env is None  # not 0.13's row


def _script_log_strings() -> dict[str, dict[str, str]]:
    path = Path(__file__).parents[1] / "fixtures_from_wheels.py"
    spec = importlib.util.spec_from_file_location("fixtures_from_wheels", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(sys.modules[spec.name])
    module = sys.modules[spec.name]
    return dict(module.LOG_STRINGS)


def test_the_log_text_kvgate_reads_is_in_every_read_version() -> None:
    from kvgate.evidence.logs.rules import RULES

    strings = _script_log_strings()
    for engine, table in strings.items():
        needles = [r.needle for r in RULES if r.engine in {engine, None}]
        for name, text in table.items():
            assert any(text in n or n in text for n in needles), (
                f"{engine} {name}: no rule reads it"
            )
    for key, read in FACTS.items():
        engine, version = key.split("-", 1)
        found = set(read["log_strings"])
        if engine == "vllm":
            core = {"kv-memory", "kv-size", "concurrency", "banner", "dtype", "scale-default"}
            if ev.parse(version) < (0, 10, 0):  # V0 wordings: tests/old_wordings_from_wheels.py
                assert {"banner", "dtype", "scale-default"} <= found, key
                continue
            assert core | {"q-scale"} <= found, key
            assert ("backend-auto" in found) == (ev.parse(version) >= (0, 12, 0)), key
        else:
            assert {"summary", "ready", "server-args"} <= found, key
            assert found & {"pool", "pool-post"}, key


def test_every_sglang_version_serves_a_server_info_path_kvgate_asks() -> None:
    from kvgate.evidence.metrics import SERVER_INFO_PATHS

    for key, read in FACTS.items():
        if not key.startswith("sglang-"):
            continue
        served = set(read["endpoints_server_info"])
        assert served & set(SERVER_INFO_PATHS), key
        assert ("/server_info" in served) == (ev.parse(key.split("-", 1)[1]) >= (0, 5, 6)), key
