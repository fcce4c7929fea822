"""RolloutSpec parsing: defaults, every error names its field, all errors reported at once."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.errors import SpecError
from kvgate.spec.reader import parse_duration
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import (
    Engine,
    GateMode,
    Outcome,
    Phase,
    PromotionMode,
    Remediation,
    config_hash,
    worst,
)

MINIMAL: dict[str, Any] = {"targetRef": {"name": "qwen"}}


def spec_errors(spec: dict[str, Any]) -> list[SpecError]:
    """Every error the parse reports at once, or [] when `spec` parses."""
    try:
        RolloutSpec.from_dict(spec)
    except ExceptionGroup as group:
        return [e for e in group.exceptions if isinstance(e, SpecError)]
    return []


def _with(**overrides: Any) -> dict[str, Any]:
    spec = {"targetRef": {"name": "qwen", "container": "engine"}}
    spec.update(overrides)
    return spec


def test_defaults_are_the_sre_defaults() -> None:
    spec = RolloutSpec.from_dict(MINIMAL)
    assert spec.target.name == "qwen" and spec.target.container is None
    assert spec.engine is Engine.AUTO and spec.kv_cache_dtype == "fp8"
    assert spec.capacity.mode is GateMode.REQUIRE
    assert (spec.capacity.window_s, spec.capacity.samples, spec.capacity.usage_threshold) == (
        300.0,
        10,
        0.9,
    )
    assert spec.scales.mode is GateMode.WARN
    assert spec.backend.allow_fallback is True and spec.backend.allowed == ()
    assert spec.accuracy.margin_pp == 2.0 and spec.accuracy.questions == 500
    assert spec.capacity_gain.min_ratio == 1.8
    assert spec.capacity_gain.throughput_gain is None  # off: existing rollouts are unchanged
    assert spec.speed is None
    assert spec.promotion.mode is PromotionMode.AUTO and spec.promotion.verify_window_s == 600.0


def test_the_throughput_gate_is_on_when_its_section_is_there() -> None:
    on = RolloutSpec.from_dict(_with(gates={"capacityGain": {"throughputGain": {}}}))
    gate = on.capacity_gain.throughput_gain
    assert gate is not None and on.capacity_gain.min_ratio == 1.8
    assert (gate.min_ratio, gate.ttft_p99_ms, gate.tpot_p99_ms, gate.max_concurrency) == (
        1.3,
        None,
        None,
        128,
    )
    slo = {"minRatio": 1.2, "ttftP99Ms": 2000, "tpotP99Ms": 60.5, "maxConcurrency": 256}
    gate = RolloutSpec.from_dict(
        _with(gates={"capacityGain": {"throughputGain": slo}})
    ).capacity_gain.throughput_gain
    assert gate is not None
    assert (gate.min_ratio, gate.ttft_p99_ms, gate.tpot_p99_ms, gate.max_concurrency) == (
        1.2,
        2000.0,
        60.5,
        256,
    )


def test_full_spec_parses() -> None:
    spec = RolloutSpec.from_dict(
        _with(
            engine="vllm",
            kvCacheDtype="fp8_e4m3",
            extraArgs=["--attention-backend", "TRITON_ATTN"],
            extraEnv=[{"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "0"}],
            model={"name": "Qwen/Qwen3-8B", "revision": "main", "tokenSecretRef": {"name": "hf"}},
            gates={
                "capacity": {"mode": "warn", "window": "1m30s", "samples": 4},
                "accuracy": {"task": "gsm8k_cot", "questions": 200, "chunk": 50, "margin": 1.5},
                "speed": {"concurrency": [8, 32], "maxTpotRegression": 0.2},
            },
            canary={"startupTimeout": "2m", "evalRetries": 1},
            promotion={"mode": "manual", "verifyWindow": "30s"},
        )
    )
    assert spec.extra_args == ("--attention-backend", "TRITON_ATTN")
    assert (spec.extra_env[0].name, spec.extra_env[0].value) == ("VLLM_USE_FLASHINFER_SAMPLER", "0")
    assert spec.model.token_secret is not None and spec.model.token_secret.key == "token"
    assert spec.capacity.window_s == 90.0 and spec.capacity.interval_s == 30.0
    assert spec.accuracy.task == "gsm8k_cot" and spec.accuracy.margin_pp == 1.5
    assert spec.speed is not None and spec.speed.concurrency == (8, 32)
    assert spec.canary.startup_timeout_s == 120.0
    assert spec.canary.remediation is Remediation.OFF  # the default
    assert RolloutSpec.from_dict(_with(canary={"remediation": "auto"})).canary.remediation is (
        Remediation.AUTO
    )
    assert spec.promotion.mode is PromotionMode.MANUAL and spec.promotion.verify_window_s == 30.0


BAD_SPECS = [
    ({}, ["spec.targetRef: is required", "spec.targetRef.name: is required"]),
    (
        _with(targetRef={"name": "../vllm", "container": "Engine_1"}),
        [
            "spec.targetRef.name: '../vllm' is not a Kubernetes object name",
            "spec.targetRef.container: 'Engine_1' is not a container name",
        ],
    ),
    (
        _with(targetRef={"name": "vllm\n"}),
        ["spec.targetRef.name: 'vllm\\n' is not a Kubernetes object name"],
    ),
    (_with(engine="trtllm"), ["spec.engine: 'trtllm' is not one of auto, vllm, sglang"]),
    (
        _with(kvCacheDtype="int8"),
        ["spec.kvCacheDtype: 'int8' is not one of fp8, fp8_e4m3, fp8_e5m2"],
    ),
    (
        _with(engine="sglang", kvCacheDtype="fp8"),
        ["spec.kvCacheDtype: sglang does not accept fp8; use fp8_e4m3 or fp8_e5m2"],
    ),
    (_with(extraArgs="--x"), ["spec.extraArgs: '--x' is not a list"]),
    (_with(extraArgs=["--a", 3]), ["spec.extraArgs[1]: 3 is not a string"]),
    (
        _with(extraEnv=[{"name": "1BAD"}]),
        ["spec.extraEnv[0].name: '1BAD' is not a valid environment variable name"],
    ),
    (  # `$` let one trailing newline by; the apiserver would refuse the pod much later
        _with(extraEnv=[{"name": "OK\n", "value": "x"}]),
        ["spec.extraEnv[0].name: 'OK\\n' is not a valid environment variable name"],
    ),
    (
        _with(extraEnv=[{"value": "x"}]),
        ["spec.extraEnv[0]: {'value': 'x'} is not {name, value}; give a name"],
    ),
    (
        _with(gates={"capacity": {"mode": "maybe"}}),
        ["spec.gates.capacity.mode: 'maybe' is not one of require, warn, off"],
    ),
    (
        _with(gates={"capacity": {"window": "5 minutes"}}),
        ["spec.gates.capacity.window: '5 minutes' is not a duration; use e.g. 90s, 5m or 1h30m"],
    ),
    (
        _with(gates={"capacity": {"samples": 1}}),
        ["spec.gates.capacity.samples: 1 is outside [2, 120]; use a value in that range"],
    ),
    (
        _with(gates={"accuracy": {"margin": 0}}),
        ["spec.gates.accuracy.margin: 0 is outside (0, 10]; use a value in that range"],
    ),
    (
        _with(gates={"accuracy": {"margin": "2pp"}}),
        ["spec.gates.accuracy.margin: '2pp' is not a number; use a value in (0, 10]"],
    ),
    (
        _with(gates={"accuracy": {"questions": 2000}}),
        ["spec.gates.accuracy.questions: 2000 is outside [20, 1319]; use a value in that range"],
    ),
    (
        _with(gates={"accuracy": {"questions": 100, "chunk": 200}}),
        ["spec.gates.accuracy.chunk: 200 exceeds questions (100); use a chunk <= questions"],
    ),
    (
        _with(gates={"accuracy": {"sequential": "yes"}}),
        ["spec.gates.accuracy.sequential: 'yes' is not true or false"],
    ),
    (
        _with(gates={"capacityGain": {"minRatio": 0.5}}),
        ["spec.gates.capacityGain.minRatio: 0.5 is outside [1, 8]; use a value in that range"],
    ),
    (
        _with(gates={"capacityGain": {"throughputGain": {"minRatio": 0, "tpotP99Ms": "50ms"}}}),
        [
            "spec.gates.capacityGain.throughputGain.minRatio: 0 is outside (0, 100]; use a value "
            "in that range",
            "spec.gates.capacityGain.throughputGain.tpotP99Ms: '50ms' is not a number; use a "
            "value in (0, 60000]",
        ],
    ),
    (
        _with(gates={"capacityGain": {"throughputGain": "on"}}),
        ["spec.gates.capacityGain.throughputGain: 'on' is not an object"],
    ),
    (
        _with(canary={"startupTimeout": "0s"}),
        ["spec.canary.startupTimeout: 0s is shorter than 1s; use a longer duration"],
    ),
    (
        _with(canary={"remediation": "always"}),
        ["spec.canary.remediation: 'always' is not one of auto, off"],
    ),
    (
        _with(promotion={"mode": "yolo"}),
        ["spec.promotion.mode: 'yolo' is not one of auto, manual, report, gate, pullRequest"],
    ),
    (_with(model={"tokenSecretRef": {}}), ["spec.model.tokenSecretRef.name: is required"]),
    (_with(gates=[]), ["spec.gates: [] is not an object"]),
    (
        _with(canary={"evalImage": "attacker/judge:latest"}),
        [
            "spec.canary.evalImage: the eval image is set by the operator (KVGATE_EVAL_IMAGE, "
            "chart value evalImage), not by a rollout; remove this field"
        ],
    ),
    (
        _with(engine="vllm", extraEnv=[{"name": "LD_PRELOAD", "value": "/x.so"}]),
        [
            "spec.extraEnv[0].name: LD_PRELOAD is not an allowed variable (it loads code, "
            "redirects downloads or traffic, or carries a credential); allowed: "
            "VLLM_ATTENTION_BACKEND, VLLM_FLASHINFER_FORCE_TENSOR_CORES, VLLM_FLASH_ATTN_VERSION, "
            "VLLM_USE_FLASHINFER_SAMPLER, VLLM_USE_TRITON_FLASH_ATTN"
        ],
    ),
    (
        _with(extraEnv=[{"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "0\nX=1"}]),
        [
            "spec.extraEnv[0].value: the value of VLLM_USE_FLASHINFER_SAMPLER holds a control "
            "character or line break"
        ],
    ),
    (
        _with(extraEnv=[{"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": 0}]),
        ["spec.extraEnv[0].value: 0 is not a string; quote it"],
    ),
]

_ARG_CASES = [
    (["--trust-remote-code"], "spec.extraArgs[0]", "--trust-remote-code is not an allowed flag ("),
    (
        ["--attention-backend", "X", "--middleware", "evil.Middleware"],
        "spec.extraArgs[2]",
        "--middleware is not an allowed flag (",
    ),
    (["--kv-cache-dtype=auto"], "spec.extraArgs[0]", "--kv-cache-dtype is set by kvgate"),
    (["TRITON_ATTN"], "spec.extraArgs[0]", "TRITON_ATTN is not a --flag"),
]


@pytest.mark.parametrize(("spec", "messages"), BAD_SPECS)
def test_bad_spec_names_the_field(spec: dict[str, Any], messages: list[str]) -> None:
    # GIVEN a spec with one problem WHEN parsed THEN the error names the field, exactly
    with pytest.raises(ExceptionGroup) as info:
        RolloutSpec.from_dict(spec)
    errors = info.value.exceptions
    assert all(isinstance(e, SpecError) for e in errors)
    assert [str(e) for e in errors] == messages
    assert [e.field for e in errors] == [m.split(":")[0] for m in messages]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("args", "field", "start"), _ARG_CASES)
def test_extra_args_outside_the_allowlist_are_refused(
    args: list[str], field: str, start: str
) -> None:
    (error,) = spec_errors(_with(extraArgs=args))
    assert error.field == field
    assert str(error).startswith(f"{field}: {start}")


def test_the_allowlist_follows_the_engine() -> None:
    sglang_only = _with(engine="vllm", extraArgs=["--mem-fraction-static", "0.8"])
    assert [e.field for e in spec_errors(sglang_only)] == ["spec.extraArgs[0]"]
    assert spec_errors({**sglang_only, "engine": "sglang", "kvCacheDtype": "fp8_e4m3"}) == []
    assert spec_errors({**sglang_only, "engine": "auto"}) == []  # either engine's until detected


def test_operator_allowlist_extends_what_a_rollout_may_set() -> None:
    from kvgate.spec.allowed import Allowlist

    spec = _with(
        extraArgs=["--attention-backend", "TRITON_ATTN", "--enforce-eager"],
        extraEnv=[{"name": "KVGATE_SIM_FAULTS", "value": "crash-after=300"}],
    )
    with pytest.raises(ExceptionGroup) as info:
        RolloutSpec.from_dict(spec)  # the built-in lists
    assert [e.field for e in info.value.exceptions] == [  # type: ignore[attr-defined]
        "spec.extraArgs[2]",
        "spec.extraEnv[0].name",
    ]
    allow = Allowlist.from_config(args=["--enforce-eager"], env=["KVGATE_SIM_*"])
    parsed = RolloutSpec.from_dict(spec, allow=allow)
    assert parsed.extra_args[-1] == "--enforce-eager"
    assert (parsed.extra_env[0].name, parsed.extra_env[0].value) == (
        "KVGATE_SIM_FAULTS",
        "crash-after=300",
    )
    # ...but never past the denylist
    denied = _with(extraEnv=[{"name": "KVGATE_SIM_TOKEN", "value": "x"}])
    with pytest.raises(ExceptionGroup):
        RolloutSpec.from_dict(denied, allow=allow)


def test_the_eval_image_is_not_part_of_the_spec() -> None:
    # the judge's image is OperatorConfig.eval_image; the parsed spec has no field for it
    assert not hasattr(RolloutSpec.from_dict(MINIMAL).canary, "eval_image")


def test_every_error_is_reported_at_once() -> None:
    spec = _with(engine="x", kvCacheDtype="y", promotion={"mode": "z"})
    assert [e.field for e in spec_errors(spec)] == [
        "spec.engine",
        "spec.kvCacheDtype",
        "spec.promotion.mode",
    ]
    assert spec_errors(MINIMAL) == []


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25), ("1.5m", 90.0)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "m", "5 m", "5d", "1h 30m", "-5s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


def test_worst_orders_outcomes() -> None:
    assert worst([]) is Outcome.SKIPPED
    assert worst([Outcome.SUCCESSFUL, Outcome.WARNING]) is Outcome.WARNING
    assert worst([Outcome.PENDING, Outcome.NOT_NEEDED]) is Outcome.NOT_NEEDED
    assert worst([Outcome.ERROR, Outcome.INCONCLUSIVE, Outcome.SUCCESSFUL]) is Outcome.ERROR
    assert worst([Outcome.ERROR, Outcome.FAILED]) is Outcome.FAILED


def test_blocking_outcomes() -> None:
    assert {o for o in Outcome if o.blocks} == {
        Outcome.INCONCLUSIVE,
        Outcome.ERROR,
        Outcome.FAILED,
    }


def test_terminal_phases() -> None:
    assert {p for p in Phase if p.terminal} == {
        Phase.PROMOTED,
        Phase.ROLLED_BACK,
        Phase.NOT_NEEDED,
        Phase.FAILED,
        Phase.DECLINED,
    }


def test_config_hash_is_stable_and_sensitive() -> None:
    a = config_hash({"args": ["--kv-cache-dtype", "fp8"], "b": 1})
    assert a == config_hash({"b": 1, "args": ["--kv-cache-dtype", "fp8"]})
    assert a != config_hash({"args": ["--kv-cache-dtype", "fp8_e4m3"], "b": 1})
    assert len(a) == 16
