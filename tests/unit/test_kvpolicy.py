"""spec.kvCache (kvgate.spec.kvcache): a format from the engine's own list, admission refusing a
format the named engine version lacks (naming the floor), kvCacheDtype as its one alias, and the
candidate Deployment getting the skip list."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.change.manifests import candidate_container
from kvgate.engines import kvformats
from kvgate.spec.rollout import RolloutSpec

# a sub-8-bit format must state its margin (kvgate.spec.margins): given here where the case is about
# something else, so that the one error is the case's
STATED: dict[str, Any] = {"gates": {"accuracy": {"margin": 6}}}


def spec(**overrides: Any) -> dict[str, Any]:
    return {"targetRef": {"name": "qwen", "container": "engine"}, **overrides}


def errors(raw: dict[str, Any]) -> list[str]:
    try:
        RolloutSpec.from_dict(raw)
    except ExceptionGroup as group:
        return [str(e) for e in group.exceptions]
    return []


def test_the_alias_alone_is_the_policy() -> None:
    parsed = RolloutSpec.from_dict(spec(kvCacheDtype="fp8_e4m3"))
    assert (parsed.kv_cache_dtype, parsed.kv_cache.format) == ("fp8_e4m3", "fp8_e4m3")
    assert parsed.kv_cache.policy_class == kvformats.FP8
    assert RolloutSpec.from_dict(spec()).kv_cache.format == "fp8"  # the default, as before


def test_a_policy_with_every_field() -> None:
    parsed = RolloutSpec.from_dict(
        spec(
            engine="vllm",
            kvCacheDtype="fp8",  # the CRD default the apiserver writes: not a contradiction
            kvCache={
                "format": "int8_per_token_head",
                "engineVersion": "0.32.0",
                "skipLayers": ["sliding_window"],
                "control": {"format": "bfloat16"},
            },
        )
    )
    policy = parsed.kv_cache
    assert parsed.kv_cache_dtype == "int8_per_token_head"
    assert (policy.policy_class, policy.scale_mode, policy.control_format) == (
        kvformats.PER_TOKEN_HEAD,
        kvformats.SCALES_DYNAMIC,
        "bfloat16",
    )
    container = {"name": "engine", "command": ["vllm", "serve"], "args": ["Qwen/Qwen3-8B"]}
    args = candidate_container(parsed, container)["args"]
    assert args[args.index("--kv-cache-dtype") + 1] == "int8_per_token_head"
    assert args[args.index("--kv-cache-dtype-skip-layers") :][:2] == [
        "--kv-cache-dtype-skip-layers",
        "sliding_window",
    ]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"engine": "vllm", "kvCache": {"format": "nvfp4", "engineVersion": "0.19.0"}, **STATED},
            "spec.kvCache.format: 'nvfp4' is not a KV cache format of vllm 0.19.0: vllm offers "
            "it from 0.20.0",
        ),
        (
            {
                "engine": "sglang",
                "kvCache": {"format": "fp4_e2m1", "engineVersion": "0.5.21"},
                **STATED,
            },
            "spec.kvCache.format: 'fp4_e2m1' is not a KV cache format of sglang 0.5.21: sglang "
            "dropped it in 0.5.21",
        ),
        (
            {"kvCache": {"format": "nvfp4", "engineVersion": "0.32.0"}, **STATED},
            "spec.kvCache.engineVersion: needs spec.engine (vllm or sglang) to know whose version",
        ),
        (
            {"engine": "vllm", "kvCache": {"format": "fp6"}},
            "spec.kvCache.format: 'fp6' is not a KV cache format of vllm; use one of auto, ",
        ),
        (
            {"kvCacheDtype": "fp8_e5m2", "kvCache": {"format": "fp8_e4m3"}},
            "spec.kvCacheDtype: 'fp8_e5m2' contradicts kvCache.format 'fp8_e4m3'",
        ),
        (
            {
                "engine": "vllm",
                "kvCache": {"format": "int8_per_token_head", "scaleMode": "checkpoint"},
            },
            "spec.kvCache.scaleMode: 'checkpoint' is not how int8_per_token_head is scaled; use "
            "dynamic-per-token-head",
        ),
        (
            {"engine": "sglang", "kvCache": {"format": "fp8_e4m3", "skipLayers": ["0"]}},
            "spec.kvCache.skipLayers: sglang has no --kv-cache-dtype-skip-layers",
        ),
        (
            {"kvCache": {"format": "fp8", "skipLayers": ["first"]}},
            "spec.kvCache.skipLayers[0]: 'first' is neither a layer index nor sliding_window",
        ),
        (
            {"kvCache": {"format": "fp8", "skipLayers": ["0", "sliding_window", "0"]}},
            "spec.kvCache.skipLayers[2]: '0' is already skipLayers[0]; give each layer once",
        ),
        (
            {"engine": "vllm", "kvCache": {"format": "fp8", "control": {"format": "bf16"}}},
            "spec.kvCache.control.format: 'bf16' is not a KV cache format of vllm",
        ),
    ],
)
def test_admission_refuses_with_one_line(overrides: dict[str, Any], expected: str) -> None:
    found = errors(spec(**overrides))
    assert len(found) == 1 and found[0].startswith(expected), found


def test_sglang_policy_beside_the_default_alias() -> None:
    """The apiserver writes kvCacheDtype: fp8 into every object; an SGLang kvCache is fine."""
    parsed = RolloutSpec.from_dict(
        spec(engine="sglang", kvCacheDtype="fp8", kvCache={"format": "fp8_e4m3"})
    )
    assert parsed.kv_cache_dtype == "fp8_e4m3"
    assert errors(spec(engine="sglang", kvCacheDtype="fp8")) == [
        "spec.kvCacheDtype: sglang does not accept fp8; use fp8_e4m3 or fp8_e5m2"
    ]
