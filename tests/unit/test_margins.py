"""Margins by policy class (kvgate.spec.margins, issue 39 item 4): FP8 and per-token-head formats keep
the default 2-point margin (at most 10), a sub-8-bit format must state one (up to 50) with the
accuracy gate on, the CRD's CEL says the same, and a sub-8-bit verdict states both sides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_kvpolicy import errors

from kvgate.engines import kvformats
from kvgate.flow.steps import State
from kvgate.judge import gates, tradeoff
from kvgate.judge.gates import THROUGHPUT
from kvgate.judge.verdict import Decision
from kvgate.reasons import Reason
from kvgate.records.status import GateResult
from kvgate.spec import margins
from kvgate.spec.rollout import RolloutSpec, ScalesGate
from kvgate.vocabulary import GateMode, Outcome, Phase, PromotionMode

CRD = Path(__file__).resolve().parents[2] / "crds" / "kvgate.io_kvcacherollouts.yaml"


def spec(fmt: str, **accuracy: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"targetRef": {"name": "qwen"}, "engine": "vllm"}
    raw["kvCache"] = {"format": fmt}
    if accuracy:
        raw["gates"] = {"accuracy": accuracy}
    return raw


@pytest.mark.parametrize("fmt", ["fp8", "fp8_e4m3", "int8_per_token_head", "fp8_per_token_head"])
def test_fp8_and_per_token_head_formats_take_the_default_margin(fmt: str) -> None:
    parsed = RolloutSpec.from_dict(spec(fmt))
    assert parsed.accuracy.margin_pp == margins.DEFAULT_MARGIN_PP == 2.0
    assert errors(spec(fmt, margin=10)) == []
    assert errors(spec(fmt, margin=10.5)) == [
        "spec.gates.accuracy.margin: 10.5 is outside (0, 10]; use a value in that range"
    ]


@pytest.mark.parametrize("fmt", ["int4_per_token_head", "nvfp4", "turboquant_4bit_nc"])
def test_a_sub8bit_format_without_a_margin_is_refused_naming_the_field(fmt: str) -> None:
    assert errors(spec(fmt)) == [
        f"spec.gates.accuracy.margin: is required for the sub-8-bit KV format '{fmt}': it "
        "trades accuracy for capacity on purpose, so state the loss you accept in percentage "
        "points (e.g. 6); no default applies"
    ]
    # every other field set, margin still missing: the same one line
    assert len(errors(spec(fmt, questions=200, confidence=0.9))) == 1


def test_a_sub8bit_format_with_a_margin_is_admitted_up_to_50_points() -> None:
    parsed = RolloutSpec.from_dict(spec("turboquant_3bit_nc", margin=20))
    assert parsed.accuracy.margin_pp == 20 and parsed.kv_cache.policy_class == kvformats.SUB8BIT
    assert errors(spec("turboquant_3bit_nc", margin=50)) == []
    assert errors(spec("turboquant_3bit_nc", margin=50.5)) == [
        "spec.gates.accuracy.margin: 50.5 is outside (0, 50]; use a value in that range"
    ]


def test_a_sub8bit_format_with_the_accuracy_gate_off_is_refused() -> None:
    found = errors(spec("nvfp4", margin=6, mode="off"))
    assert found == [
        "spec.gates.accuracy.mode: off is refused for the sub-8-bit KV format 'nvfp4': the "
        "accuracy it gives up must be measured and bounded; use require"
    ]
    assert errors(spec("fp8", mode="off")) == []  # FP8 may still run without the eval


def test_the_crds_cel_rules_name_every_sub8bit_format_and_no_default_margin() -> None:
    doc = yaml.safe_load(CRD.read_text())
    schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    margin = schema["properties"]["gates"]["properties"]["accuracy"]["properties"]["margin"]
    assert "default" not in margin  # else every object would carry a stated margin
    assert margin["maximum"] == margins.MAX_SUB8BIT_MARGIN_PP
    rules = [r["rule"] for r in schema["x-kubernetes-validations"]]
    sub8 = [r for r in rules if "turboquant_4bit_nc" in r]
    assert len(sub8) == 3
    listed = "[" + ", ".join(f"'{n}'" for n in margins.SUB8BIT_FORMATS) + "]"
    assert all(listed in r for r in sub8), sub8
    assert any("has(self.gates.accuracy.margin))" in r for r in sub8)
    assert any("self.gates.accuracy.margin > 10.0" in r for r in sub8)
    # every sub-8-bit name is a format of some engine, and no other class is listed
    classes = {
        f.policy_class for f in kvformats.FORMATS.values() if f.name in margins.SUB8BIT_FORMATS
    }
    assert classes == {kvformats.SUB8BIT}


ACCURACY_PASS = GateResult(
    gates.ACCURACY,
    Outcome.SUCCESSFUL,
    Reason.ACCURACY_NON_INFERIOR,
    "control 90.0% vs candidate 86.0%, difference -4.0 pp; at least -5.3 pp (95% one-sided, "
    "adjusted for 2 looks) (margin 6 pp, n=400)",
)
CAPACITY = GateResult(
    gates.CAPACITY_GAIN,
    Outcome.SUCCESSFUL,
    Reason.CAPACITY_GAINED,
    "120,000 / 40,000 KV tokens = 3.00x",
)
THROUGHPUT_GAIN = GateResult(
    THROUGHPUT,
    Outcome.SUCCESSFUL,
    Reason.THROUGHPUT_GAINED,
    "at production load 64: 900 tok/s vs 500 tok/s, +80% (at least 1.3x asked)",
)


def test_the_gate_names_the_trade_reads_are_the_gates() -> None:
    line = tradeoff.both_sides([ACCURACY_PASS, CAPACITY, THROUGHPUT_GAIN])
    assert line == (
        f"trade: accuracy given up (bounded): {ACCURACY_PASS.message}; bought (measured): "
        f"capacity: {CAPACITY.message}; throughput: {THROUGHPUT_GAIN.message}"
    )
    assert tradeoff.both_sides([]) == (
        "trade: accuracy given up (bounded): not measured; bought (measured): nothing measured"
    )


def test_a_sub8bit_verdict_states_both_sides_an_fp8_one_does_not() -> None:
    state = State(Phase.MEASURING, config_hash="h")
    results = (ACCURACY_PASS, CAPACITY, THROUGHPUT_GAIN)
    sub8 = RolloutSpec.from_dict(spec("turboquant_4bit_nc", margin=6))
    verdict = tradeoff.judged(sub8, results, config_hash=state.config_hash, approval=state.approval)
    assert verdict.decision is Decision.PROMOTE
    assert verdict.message.startswith("all gates passed; trade: accuracy given up (bounded): ")
    assert "at least -5.3 pp (95% one-sided" in verdict.message
    assert "3.00x" in verdict.message and "+80%" in verdict.message
    fp8 = tradeoff.judged(
        RolloutSpec.from_dict(spec("fp8")),
        results,
        config_hash=state.config_hash,
        approval=state.approval,
    )
    assert fp8.message == "all gates passed"
    # a refused sub-8-bit candidate still says what the trade would have been
    worse = GateResult(
        gates.ACCURACY, Outcome.FAILED, Reason.ACCURACY_REGRESSED, "candidate worse: 9 pp"
    )
    rolled = tradeoff.judged(
        sub8, (worse, CAPACITY), config_hash=state.config_hash, approval=state.approval
    )
    assert rolled.decision is Decision.ROLL_BACK
    assert rolled.message == (
        "candidate worse: 9 pp; trade: accuracy given up (bounded): candidate worse: 9 pp; "
        f"bought (measured): capacity: {CAPACITY.message}"
    )
    manual = RolloutSpec.from_dict({**spec("nvfp4", margin=6), "promotion": {"mode": "manual"}})
    assert manual.promotion.mode is PromotionMode.MANUAL
    held = tradeoff.judged(manual, results, config_hash=state.config_hash, approval=state.approval)
    assert held.decision is Decision.HOLD and "trade: accuracy given up" in held.message


# -- a rollout per policy class: the per-(token, head) formats' scales --------------------------


@pytest.mark.parametrize("broken", [(), ("layer 1: k_scale 0.0",)])
@pytest.mark.parametrize("has_scales", [True, False, None])
@pytest.mark.parametrize("mode", [GateMode.REQUIRE, GateMode.WARN])
def test_a_per_token_head_format_says_the_checkpoint_scales_are_unused(
    broken: tuple[str, ...], has_scales: bool | None, mode: GateMode
) -> None:
    """Whatever the checkpoint holds (none, good, zero) and whatever the log says, a dynamic
    format never reads it: neither ScalesMissing (which require would fail) nor ScalesBroken."""
    got = gates.assess_scales(ScalesGate(mode), has_scales, None, broken, "int8_per_token_head")
    assert (got.outcome, got.reason) == (Outcome.SUCCESSFUL, Reason.SCALES_UNUSED)
    assert got.message.startswith(
        "checkpoint scales unused: int8_per_token_head computes a scale per (token, head)"
    )
    assert ("(broken ones included)" in got.message) is bool(broken)
    # the same checkpoint under FP8, which reads its scales: broken fails, none is missing
    fp8 = gates.assess_scales(ScalesGate(mode), has_scales, None, broken, "fp8")
    assert fp8.reason is not Reason.SCALES_UNUSED
    if broken:
        assert (fp8.outcome, fp8.reason) == (Outcome.FAILED, Reason.SCALES_BROKEN)
    assert gates.assess_scales(ScalesGate(GateMode.OFF), True, None, broken, "int8_per_token_head")\
        .reason is Reason.GATE_OFF  # fmt: skip


def test_which_formats_compute_their_scales() -> None:
    dynamic = {n for (_, n), f in kvformats.FORMATS.items() if kvformats.computes_scales(n)}
    assert dynamic == {"fp8_per_token_head", "int8_per_token_head", "int4_per_token_head"}
    assert not kvformats.computes_scales("no-such-format")


def test_the_simulator_sizes_per_token_head_pages_as_kvformats_does() -> None:
    from kvgate.sim.capacity import EMULATED_KV_DTYPES, kv_bytes_per_token, quantized_kv
    from kvgate.sim.config import QWEN3_8B

    for name in ("int8_per_token_head", "int4_per_token_head"):
        assert name in EMULATED_KV_DTYPES and quantized_kv(name)
        per_head = kvformats.lookup("vllm", name).bytes_per_head(128, backend="TRITON_ATTN")
        assert kv_bytes_per_token(QWEN3_8B, name) == 36 * 8 * per_head
    assert kv_bytes_per_token(QWEN3_8B, "int8_per_token_head") == 36 * 8 * 264
    assert kv_bytes_per_token(QWEN3_8B, "int4_per_token_head") == 36 * 8 * 136
    assert kv_bytes_per_token(QWEN3_8B, "auto") == 2 * kv_bytes_per_token(QWEN3_8B, "fp8")
    assert not quantized_kv("auto") and quantized_kv("fp8_e4m3")
