"""The accuracy gate off (no eval Job, Skipped, never the default) and the control's floor: a
model that scores about 0 on both arms is inconclusive, never non-inferior (issue 37)."""

from __future__ import annotations

from typing import Any

import pytest
from evidence import as_summary
from test_verdict import READY, SCALE_WARNING, agreeing, scan, step

from kvgate.errors import SpecError
from kvgate.evaluation.gate import assess_look, build_summary, plan_gate
from kvgate.flow.steps import Observation
from kvgate.judge.accuracy import assess_accuracy
from kvgate.judge.stats import PairedCounts
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import CONTROL_BELOW_FLOOR, GateMode, Outcome, Phase


def _spec(**accuracy: Any) -> RolloutSpec:
    return RolloutSpec.from_dict(
        {
            "targetRef": {"name": "qwen"},
            "gates": {"capacity": {"samples": 3, "window": "30s"}, "accuracy": accuracy},
            "canary": {"startupTimeout": "60s"},
            "promotion": {"verifyWindow": "20s"},
        }
    )


def _ready_canary() -> Observation:
    return Observation(
        control=READY,
        candidate=READY,
        **agreeing(
            scan("TRITON_ATTN", 100_000, dtype="auto"),
            scan("TRITON_ATTN", 201_000, SCALE_WARNING),
        ),
    )


def test_accuracy_is_required_unless_turned_off() -> None:
    assert _spec().accuracy.mode is GateMode.REQUIRE
    assert _spec(mode="off").accuracy.mode is GateMode.OFF


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"gates": {"accuracy": {"mode": "warn"}}}, "spec.gates.accuracy.mode"),
        (
            {"gates": {"accuracy": {"mode": "off"}, "divergence": {"mode": "require"}}},
            "divergence screen",
        ),
        ({"gates": {"accuracy": {"mode": "off"}, "speed": {"concurrency": [4]}}}, "speed gate"),
    ],
)
def test_accuracy_off_is_refused_where_it_would_hide_a_gate(extra: dict, says: str) -> None:
    with pytest.raises(ExceptionGroup) as err:
        RolloutSpec.from_dict({"targetRef": {"name": "qwen"}, **extra})
    (only,) = err.value.exceptions
    assert isinstance(only, SpecError) and only.field == "spec.gates.accuracy.mode"
    assert says in str(only)


def test_canary_with_accuracy_off_promotes_without_an_eval_job() -> None:
    s = step(Phase.CANARY, _ready_canary(), spec=_spec(mode="off"))
    assert (s.phase, s.eval_attempts) == (Phase.PROMOTING, None)  # no eval recorded
    gates = {g.gate: g for g in s.gates}
    assert (gates["accuracy"].outcome, gates["accuracy"].reason) == (
        Outcome.SKIPPED,
        "AccuracyOff",
    )
    assert "mode is off" in gates["accuracy"].message
    assert s.verdict is not None and s.verdict.message.startswith("all gates passed")


def test_canary_with_accuracy_on_still_runs_the_eval() -> None:
    s = step(Phase.CANARY, _ready_canary(), spec=_spec())
    assert (s.phase, s.eval_attempts) == (Phase.EVALUATING, 1)


def test_accuracy_off_still_rolls_back_on_a_blocking_canary_gate() -> None:
    obs = Observation(
        control=READY,
        candidate=READY,
        # the candidate holds no more tokens than the control: the capacity gain fails
        **agreeing(scan("TRITON_ATTN", 100_000, dtype="auto"), scan("TRITON_ATTN", 100_000)),
    )
    s = step(Phase.CANARY, obs, spec=_spec(mode="off"))
    assert s.phase is Phase.ROLLED_BACK and s.reason == "CapacityNotGained"


def test_accuracy_off_goes_on_to_the_load_job_when_asked() -> None:
    spec = RolloutSpec.from_dict(
        {
            "targetRef": {"name": "qwen"},
            "gates": {
                "accuracy": {"mode": "off"},
                "capacityGain": {"throughputGain": {"minRatio": 1.2}},
            },
        }
    )
    s = step(Phase.CANARY, _ready_canary(), spec=spec)
    assert (s.phase, s.load_attempts, s.eval_attempts) == (Phase.MEASURING, 1, None)


@pytest.mark.parametrize("control_right", [0, 5, 10])
def test_a_control_below_the_margin_is_inconclusive_never_non_inferior(control_right: int) -> None:
    plan = plan_gate(500, margin=0.02)
    counts = PairedCounts(control_right, 0, 0, 500 - control_right)  # both arms alike
    look = assess_look(plan, 0, counts)
    assert (look.verdict, look.reason) == ("inconclusive", CONTROL_BELOW_FLOOR)
    summary = build_summary(
        plan=plan, task="gsm8k", verdict=look.verdict, counts=counts, looks_taken=1
    )
    assert summary["reason"] == CONTROL_BELOW_FLOOR
    assert f"the control scored {control_right}/500" in summary["claim"]
    gate = assess_accuracy(_spec().accuracy, as_summary(summary))
    assert gate.outcome is Outcome.INCONCLUSIVE and gate.outcome.blocks
    assert "cannot be measured" in gate.message


def test_a_control_above_the_floor_still_passes() -> None:
    plan = plan_gate(500, margin=0.02)
    look = assess_look(plan, 0, PairedCounts(20, 0, 0, 480))  # 4%: lower bound above 2 pp
    assert (look.verdict, look.reason) == ("pass", "noninferior")
