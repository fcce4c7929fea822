"""verdict: gates over a grid of evidence, worst-of, fail closed, and the transition function."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from evidence import arms_of, as_scan, as_summary, as_truth

from kvgate.evidence import kubeobjects
from kvgate.evidence.kubeobjects import PodHealth
from kvgate.flow import deadlines, machine, steps
from kvgate.flow.steps import Action, LiveTarget, Observation, State
from kvgate.judge import remedy
from kvgate.judge import verdict as v
from kvgate.judge.accuracy import accuracy_detail, assess_accuracy
from kvgate.judge.gates import (
    assess_arms_dtype,
    assess_backend,
    assess_capacity_gain,
    assess_engine_truth,
    assess_pool,
    assess_scales,
    assess_speed,
    crash_summary,
    mean_between,
)
from kvgate.judge.verdict import Decision
from kvgate.reasons import Reason
from kvgate.records import codec as jsonrecord
from kvgate.records.status import GateResult, HistogramTotals, RevertStatus, RolloutStatus
from kvgate.spec.rollout import (
    AccuracyGate,
    BackendGate,
    CapacityGainGate,
    CapacityGate,
    RolloutSpec,
    ScalesGate,
    SpeedGate,
)
from kvgate.vocabulary import GateMode, Outcome, Phase, PromotionMode

SCALE_WARNING = {
    "code": "kv-scale-default",
    "severity": "warning",
    "text": "Using KV cache scaling factor 1.0 for fp8_e4m3.",
}


def scan(
    backend: str | None = "FLASH_ATTN",
    tokens: int | None = 100_000,
    *findings: dict[str, Any],
    dtype: str = "fp8",
) -> dict[str, Any]:
    return {
        "engine": "vllm",
        "kv_cache_dtype": dtype,
        "attention_backend": backend,
        "capacity": {"kv_tokens": tokens},
        "ready": True,
        "failed": False,
        "findings": list(findings),
    }


def truth(dtype: str | None = "fp8", tokens: int | None = 100_000) -> dict[str, Any]:
    """An arm's /metrics cache info as status keeps it (metrics.cache_truth)."""
    config: dict[str, str] = {"block_size": "16"}
    if dtype is not None:
        config["cache_dtype"] = dtype
    if tokens is not None:
        config["num_gpu_blocks"] = str(tokens // 16)
    return {"engine": "vllm", "cacheConfig": config}


def agreeing(control: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    """Observation fields: both arms' /metrics say what their logs say."""
    return {
        "control_scan": as_scan(control),
        "candidate_scan": as_scan(candidate),
        "control_metrics": as_truth(
            truth(control["kv_cache_dtype"], control["capacity"]["kv_tokens"])
        ),
        "candidate_metrics": as_truth(
            truth(candidate["kv_cache_dtype"], candidate["capacity"]["kv_tokens"])
        ),
    }


SUMMARY_PASS = {
    "kind": "kvgate.eval/summary",
    "verdict": "pass",
    "error": None,
    "margin": 0.02,
    "questions_used": 200,
    "control": {"accuracy": 0.91, "correct": 182, "n": 200},
    "candidate": {"accuracy": 0.905, "correct": 181, "n": 200},
    "paired": {"difference": -0.005, "tango95": [-0.019, 0.009]},
}


# --- gates ------------------------------------------------------------------------------------

POOL_GRID = [
    (GateMode.REQUIRE, True, Outcome.SUCCESSFUL, "PoolPressured"),
    (GateMode.REQUIRE, False, Outcome.NOT_NEEDED, "PoolHasRoom"),
    (GateMode.REQUIRE, None, Outcome.ERROR, "PoolPressureUnknown"),
    (GateMode.WARN, False, Outcome.WARNING, "PoolHasRoom"),
    (GateMode.WARN, None, Outcome.WARNING, "PoolPressureUnknown"),
    (GateMode.OFF, False, Outcome.SKIPPED, "GateOff"),
]


@pytest.mark.parametrize(("mode", "pressured", "outcome", "reason"), POOL_GRID)
def test_pool_gate(mode: GateMode, pressured: bool | None, outcome: Outcome, reason: str) -> None:
    got = assess_pool(CapacityGate(mode=mode), pressured, "usage 0.42")
    assert (got.outcome, got.reason) == (outcome, reason)


def test_pool_room_message() -> None:
    got = assess_pool(CapacityGate(), False, "peak usage 42%, no queue")
    assert (
        got.message
        == "KV pool has room: peak usage 42%, no queue; an FP8 KV cache buys nothing here"
    )


SCALES_GRID = [
    # mode, checkpoint has scales, candidate warns, outcome, reason
    (GateMode.WARN, False, True, Outcome.WARNING, "ScalesMissing"),
    (GateMode.REQUIRE, False, True, Outcome.FAILED, "ScalesMissing"),
    (GateMode.REQUIRE, None, True, Outcome.FAILED, "ScalesMissing"),
    (GateMode.WARN, True, True, Outcome.WARNING, "ScalesDropped"),
    (GateMode.REQUIRE, True, True, Outcome.FAILED, "ScalesDropped"),
    (GateMode.REQUIRE, True, False, Outcome.SUCCESSFUL, "ScalesPresent"),
    # the checkpoint unread and a silent log: nothing shows the scales (real vLLM 0.32 loads a
    # checkpoint without them silently), so no promotion in require mode
    (GateMode.WARN, None, False, Outcome.WARNING, "ScalesUnknown"),
    (GateMode.REQUIRE, None, False, Outcome.INCONCLUSIVE, "ScalesUnknown"),
    (GateMode.REQUIRE, False, False, Outcome.FAILED, "ScalesMissing"),
    (GateMode.OFF, False, True, Outcome.SKIPPED, "GateOff"),
]


@pytest.mark.parametrize(("mode", "has", "warns", "outcome", "reason"), SCALES_GRID)
def test_scales_gate(
    mode: GateMode, has: bool | None, warns: bool, outcome: Outcome, reason: str
) -> None:
    candidate = scan("TRITON_ATTN", 200_000, *([SCALE_WARNING] if warns else []))
    got = assess_scales(ScalesGate(mode), has, as_scan(candidate))
    assert (got.outcome, got.reason) == (outcome, reason)


def test_scales_dropped_message_is_louder() -> None:
    got = assess_scales(ScalesGate(GateMode.WARN), True, as_scan(scan("X", 1, SCALE_WARNING)))
    assert got.message == (
        "checkpoint has KV scales but the candidate warns they were not used: "
        "Using KV cache scaling factor 1.0 for fp8_e4m3."
    )


BACKEND_GRID = [
    (BackendGate(), "FLASH_ATTN", "FLASH_ATTN", Outcome.SUCCESSFUL, "BackendUnchanged"),
    (BackendGate(), "FLASH_ATTN", "FLASHINFER", Outcome.WARNING, "BackendChanged"),
    (
        BackendGate(allow_fallback=False),
        "FLASH_ATTN",
        "FLASHINFER",
        Outcome.FAILED,
        "BackendChanged",
    ),
    (
        BackendGate(allowed=("TRITON_ATTN",)),
        "FLASH_ATTN",
        "FLASHINFER",
        Outcome.FAILED,
        "BackendNotAllowed",
    ),
    (
        BackendGate(allowed=("TRITON_ATTN",)),
        "FLASH_ATTN",
        "TRITON_ATTN",
        Outcome.WARNING,
        "BackendChanged",
    ),
    (BackendGate(), "FLASH_ATTN", None, Outcome.WARNING, "BackendUnknown"),
    (BackendGate(allowed=("TRITON_ATTN",)), "FLASH_ATTN", None, Outcome.ERROR, "BackendUnknown"),
]


@pytest.mark.parametrize(("gate", "control", "candidate", "outcome", "reason"), BACKEND_GRID)
def test_backend_gate(
    gate: BackendGate, control: str, candidate: str | None, outcome: Outcome, reason: str
) -> None:
    got = assess_backend(gate, as_scan(scan(control)), as_scan(scan(candidate)))
    assert (got.outcome, got.reason) == (outcome, reason)


def test_backend_changed_message() -> None:
    got = assess_backend(BackendGate(), as_scan(scan("FLASH_ATTN")), as_scan(scan("TRITON_ATTN")))
    assert got.message == (
        "attention backend changed from FLASH_ATTN to TRITON_ATTN: "
        "two things changed at once (KV dtype and kernel)"
    )


CAPACITY_GRID = [
    (100_000, 200_000, Outcome.SUCCESSFUL, "CapacityGained"),
    (100_000, 180_000, Outcome.SUCCESSFUL, "CapacityGained"),
    (100_000, 179_999, Outcome.FAILED, "CapacityNotGained"),
    (None, 200_000, Outcome.ERROR, "CapacityUnknown"),
    (100_000, None, Outcome.ERROR, "CapacityUnknown"),
]


@pytest.mark.parametrize(("control", "candidate", "outcome", "reason"), CAPACITY_GRID)
def test_capacity_gain_gate(
    control: int | None, candidate: int | None, outcome: Outcome, reason: str
) -> None:
    got = assess_capacity_gain(CapacityGainGate(1.8), control, candidate)
    assert (got.outcome, got.reason) == (outcome, reason)


def test_capacity_message() -> None:
    got = assess_capacity_gain(CapacityGainGate(1.8), 100_000, 150_000)
    assert got.message == "150,000 / 100,000 KV tokens = 1.50x, below the minimum 1.8x"


ACCURACY_GRID = [
    ("pass", Outcome.SUCCESSFUL, "AccuracyNonInferior"),
    ("fail", Outcome.FAILED, "AccuracyRegressed"),
    ("inconclusive", Outcome.INCONCLUSIVE, "AccuracyInconclusive"),
    ("error", Outcome.ERROR, "EvalError"),
    ("garbage", Outcome.ERROR, "EvalError"),
]


@pytest.mark.parametrize(("verdict", "outcome", "reason"), ACCURACY_GRID)
def test_accuracy_gate(verdict: str, outcome: Outcome, reason: str) -> None:
    got = assess_accuracy(AccuracyGate(), as_summary({**SUMMARY_PASS, "verdict": verdict}))
    assert (got.outcome, got.reason) == (outcome, reason)


def test_accuracy_detail_message() -> None:
    got = assess_accuracy(AccuracyGate(), as_summary(SUMMARY_PASS))
    assert got.message == (
        "control 91.0% vs candidate 90.5%, difference -0.5 pp [-1.9, +0.9] (two-sided 95%) "
        "(margin 2 pp, n=200)"
    )


def test_accuracy_detail_shows_the_one_sided_look_adjusted_bound() -> None:
    # A PASS must not print a two-sided interval whose low end is below minus the margin.
    bounds = {"lower": -0.011, "lower_confidence": 0.95, "upper": 0.0, "look": 14,
              "look_adjusted": True}  # fmt: skip
    got = accuracy_detail(as_summary({**SUMMARY_PASS, "bounds": bounds}))
    assert got == (
        "control 91.0% vs candidate 90.5%, difference -0.5 pp; at least -1.1 pp (95% one-sided, "
        "adjusted for 14 looks) (margin 2 pp, n=200)"
    )
    # A FAIL leads with what was shown (a loss of at least 3 pp), not with what was ruled out
    # (a loss above 9 pp reads as reassuring).
    failed = accuracy_detail(as_summary({**SUMMARY_PASS, "verdict": "fail",
                              "bounds": {**bounds, "lower": -0.09, "upper": -0.03,
                                         "upper_confidence": 0.975}}))  # fmt: skip
    assert failed == (
        "candidate worse: 90.5% vs control 91.0%, difference -0.5 pp; shown worse by at least "
        "3.0 pp (97.5% one-sided, adjusted for 14 looks) (margin 2 pp, n=200)"
    )
    assert "-9.0" not in failed


def test_accuracy_missing_is_pending() -> None:
    assert assess_accuracy(AccuracyGate(), None).outcome is Outcome.PENDING


SPEED_GRID = [
    (None, 0.02, 0.02, Outcome.SKIPPED),
    (SpeedGate(max_tpot_regression=0.1), 0.020, 0.021, Outcome.SUCCESSFUL),
    (SpeedGate(max_tpot_regression=0.1), 0.020, 0.0225, Outcome.FAILED),
    (SpeedGate(), None, 0.02, Outcome.ERROR),
    (SpeedGate(), 0.02, None, Outcome.ERROR),
]


@pytest.mark.parametrize(("gate", "control", "candidate", "outcome"), SPEED_GRID)
def test_speed_gate(
    gate: SpeedGate | None, control: float | None, candidate: float | None, outcome: Outcome
) -> None:
    assert assess_speed(gate, control, candidate).outcome is outcome


# --- decide -----------------------------------------------------------------------------------


def R(outcome: Outcome, reason: str = "R", gate: str = "g") -> GateResult:
    return GateResult(gate, outcome, reason, f"{reason} message")


DECIDE_GRID = [
    ([R(Outcome.SUCCESSFUL), R(Outcome.SKIPPED)], Decision.PROMOTE),
    ([R(Outcome.SUCCESSFUL), R(Outcome.WARNING)], Decision.PROMOTE),
    ([R(Outcome.SUCCESSFUL), R(Outcome.PENDING)], Decision.HOLD),
    ([R(Outcome.NOT_NEEDED), R(Outcome.SUCCESSFUL)], Decision.NOT_NEEDED),
    ([R(Outcome.SUCCESSFUL), R(Outcome.INCONCLUSIVE)], Decision.ROLL_BACK),
    ([R(Outcome.SUCCESSFUL), R(Outcome.ERROR)], Decision.ROLL_BACK),
    ([R(Outcome.FAILED), R(Outcome.NOT_NEEDED)], Decision.ROLL_BACK),
    ([R(Outcome.ERROR), R(Outcome.PENDING)], Decision.ROLL_BACK),
    ([], Decision.HOLD),
]


@pytest.mark.parametrize(("results", "decision"), DECIDE_GRID)
def test_decide_worst_of(results: list[GateResult], decision: Decision) -> None:
    got = v.decide(results, mode=PromotionMode.AUTO, config_hash="h", approval=None)
    assert got.decision is decision


def test_decide_lists_every_blocking_reason_worst_first() -> None:
    results = [
        R(Outcome.SUCCESSFUL, "CapacityGained"),
        R(Outcome.ERROR, "EvalError"),
        R(Outcome.FAILED, "AccuracyRegressed"),
        R(Outcome.WARNING, "BackendChanged"),
    ]
    got = v.decide(results, mode=PromotionMode.AUTO, config_hash="h", approval=None)
    assert [r.reason for r in got.reasons] == ["AccuracyRegressed", "EvalError"]
    assert got.message == "AccuracyRegressed message; EvalError message"


APPROVAL_GRID = [
    (PromotionMode.MANUAL, None, Decision.HOLD),
    (PromotionMode.MANUAL, "abc", Decision.PROMOTE),
    (PromotionMode.MANUAL, "stale", Decision.HOLD),
    (PromotionMode.AUTO, None, Decision.PROMOTE),
]


@pytest.mark.parametrize(("mode", "approval", "decision"), APPROVAL_GRID)
def test_manual_approval_is_bound_to_the_config_hash(
    mode: PromotionMode, approval: str | None, decision: Decision
) -> None:
    got = v.decide([R(Outcome.SUCCESSFUL)], mode=mode, config_hash="abc", approval=approval)
    assert got.decision is decision


def test_stale_approval_is_named() -> None:
    got = v.decide(
        [R(Outcome.SUCCESSFUL)], mode=PromotionMode.MANUAL, config_hash="abc", approval="old"
    )
    assert got.message == (
        "all gates passed; approve with annotation kvgate.io/approve=abc; "
        "approval 'old' is for another config"
    )


def test_unreadable_stored_outcome_fails_closed() -> None:
    gates = RolloutStatus.from_dict({"gates": {"x": {"outcome": "Maybe"}, "y": {}}}).gates
    assert gates["x"].outcome is Outcome.ERROR and gates["x"].gate == "x"
    assert gates["y"].outcome is Outcome.ERROR and gates["y"].gate == "y"


def test_a_gate_is_stored_under_its_name_without_it() -> None:
    gate = GateResult("speed", Outcome.FAILED, Reason.SPEED_REGRESSED, "slower")
    written = RolloutStatus(gates={"speed": gate}).to_dict()
    assert written["gates"] == {
        "speed": {"outcome": "Failed", "reason": "SpeedRegressed", "message": "slower"}
    }
    assert RolloutStatus.from_dict(written).gates == {"speed": gate}


# --- pods -------------------------------------------------------------------------------------


def pod(
    phase: str = "Running",
    ready: bool = True,
    restarts: int = 0,
    state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "status": {
            "phase": phase,
            "podIP": "127.0.0.5",
            "containerStatuses": [
                {
                    "name": "engine",
                    "ready": ready,
                    "restartCount": restarts,
                    "state": state or {"running": {}},
                }
            ],
        }
    }


POD_GRID = [
    (None, False, False),
    (pod(), True, False),
    (pod(ready=False), False, False),
    (
        pod(phase="Failed", ready=False, state={"terminated": {"exitCode": 1, "reason": "Error"}}),
        False,
        True,
    ),
    (pod(ready=False, restarts=2), False, True),
    (pod(ready=False, state={"waiting": {"reason": "CrashLoopBackOff"}}), False, True),
    (pod(ready=False, state={"waiting": {"reason": "ContainerCreating"}}), False, False),
    (pod(phase="Pending", ready=False), False, False),
]


@pytest.mark.parametrize(("obj", "ready", "crashed"), POD_GRID)
def test_pod_health(obj: dict[str, Any] | None, ready: bool, crashed: bool) -> None:
    got = kubeobjects.pod_health(obj, "engine")
    assert (got.ready, got.crashed) == (ready, crashed)


def test_terminated_detail() -> None:
    got = kubeobjects.pod_health(
        pod(phase="Failed", ready=False, state={"terminated": {"exitCode": 1, "reason": "Error"}})
    )
    assert got.detail == "exited with code 1 (Error)"


# --- transition function ----------------------------------------------------------------------

SPEC = RolloutSpec.from_dict(
    {
        "targetRef": {"name": "qwen"},
        "gates": {"capacity": {"samples": 3, "window": "30s"}},
        "canary": {"startupTimeout": "60s", "evalTimeout": "600s", "evalRetries": 1},
        "promotion": {"verifyWindow": "20s"},
    }
)
READY = PodHealth(True, ready=True, ip="127.0.0.9")
CRASHED = PodHealth(True, crashed=True, detail="exited with code 1 (Error)")
STARTING = PodHealth(True, detail="starting")


def step(phase: Phase, obs: Observation, spec: RolloutSpec = SPEC, **state: Any) -> steps.Step:
    return machine.next_step(spec, State(phase=phase, **state), obs, poll_s=2.0)


def test_pending_invalid_spec_fails() -> None:
    s = step(Phase.PENDING, Observation(spec_errors=("spec.engine: bad",)))
    assert (s.phase, s.reason, s.message) == (Phase.FAILED, "InvalidSpec", "spec.engine: bad")


def test_pending_waits_for_target_then_fails() -> None:
    assert step(Phase.PENDING, Observation(target_missing=True)).phase is Phase.PENDING
    late = step(Phase.PENDING, Observation(target_missing=True), phase_elapsed_s=61)
    assert (late.phase, late.reason) == (Phase.FAILED, "TargetNotFound")


def test_pending_refuses_a_second_rollout() -> None:
    s = step(Phase.PENDING, Observation(conflicts=("older",)))
    assert (s.phase, s.reason) == (Phase.FAILED, "RolloutConflict")
    assert (
        s.message
        == "Deployment qwen already has an active rollout: older; wait for it or delete it"
    )


def test_pending_to_preflight() -> None:
    assert step(Phase.PENDING, Observation()).phase is Phase.PREFLIGHT


def test_preflight_samples_then_decides() -> None:
    s = step(Phase.PREFLIGHT, Observation(pool_samples=1))
    assert (s.phase, s.reason, s.requeue_s) == (Phase.PREFLIGHT, "SamplingPool", 15.0)
    room = step(Phase.PREFLIGHT, Observation(pool_samples=3, pool_pressured=False, pool_detail="d"))
    assert (room.phase, room.reason) == (Phase.NOT_NEEDED, "PoolHasRoom")
    assert Action.DELETE_CANARIES in room.actions
    go = step(Phase.PREFLIGHT, Observation(pool_samples=3, pool_pressured=True, pool_detail="d"))
    assert (go.phase, go.actions) == (Phase.CANARY, (Action.CREATE_CANARIES,))


def test_preflight_unknown_pressure_fails_closed() -> None:
    s = step(Phase.PREFLIGHT, Observation(pool_samples=0), phase_elapsed_s=91)
    assert (s.phase, s.reason) == (Phase.FAILED, "PoolPressureUnknown")


def test_canary_crash_rolls_back_with_the_remedy() -> None:
    crash_scan = scan(
        "FLASHINFER",
        200_000,
        {
            "code": "flashinfer-jit-failed",
            "severity": "error",
            "text": "RuntimeError: Ninja build failed.",
            "hint": "add --attention-backend TRITON_ATTN",
        },
    )
    s = step(
        Phase.CANARY,
        Observation(control=READY, candidate=CRASHED, candidate_scan=as_scan(crash_scan)),
    )
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "CanaryCrashed")
    # A code kvgate's log rules do not classify: the pod's end leads, the engine's line follows.
    assert s.message == (
        "candidate crashed: exited with code 1 (Error), cause not classified; "
        "remedy: add --attention-backend TRITON_ATTN; the candidate's flags go in "
        "spec.extraArgs, its environment in spec.extraEnv; log: RuntimeError: Ninja build failed."
    )
    assert [e.reason for e in s.events] == ["CanaryCrashed", "RolledBack"]
    assert all(e.warning for e in s.events)
    assert {e.message for e in s.events} == {s.message}  # the Event says what status.message says


def test_canary_waits_then_times_out() -> None:
    wait = step(Phase.CANARY, Observation(control=READY, candidate=STARTING), phase_elapsed_s=10)
    assert (wait.phase, wait.actions) == (Phase.CANARY, ())
    missing = step(Phase.CANARY, Observation(control=READY, candidate=PodHealth(False)))
    assert missing.actions == (Action.CREATE_CANARIES,)
    late = step(Phase.CANARY, Observation(control=READY, candidate=STARTING), phase_elapsed_s=60)
    assert (late.phase, late.reason) == (Phase.ROLLED_BACK, "CanaryTimeout")


def test_a_wait_that_sees_nothing_new_keeps_its_message_for_ten_seconds() -> None:
    # GIVEN canaries still starting, polled every second, WHEN nothing about them changes,
    # THEN the message (so status) changes only as the wait crosses 10 s steps, then minutes
    obs = Observation(control=READY, candidate=STARTING)
    spec = RolloutSpec.from_dict(
        {"targetRef": {"name": "qwen"}, "canary": {"startupTimeout": "15m"}}
    )
    messages = [step(Phase.CANARY, obs, spec, phase_elapsed_s=t).message for t in range(0, 130)]
    assert len(set(messages)) == 8  # 0, 10, 20, 30, 40, 50 s, then 1 and 2 min
    assert messages[9].startswith("waiting for canary pods Ready (0 s of at most 15 min)")
    assert "(1 min of at most 15 min)" in messages[119]
    # what the pods show still changes it at once
    other = Observation(control=READY, candidate=PodHealth(True, detail="pulling image"))
    assert step(Phase.CANARY, other, spec, phase_elapsed_s=3).message != messages[3]


def _unschedulable(message: object) -> dict[str, Any]:
    obj = pod(phase="Pending", ready=False)
    obj["status"].pop("containerStatuses")
    obj["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    ]
    return obj


def test_an_unschedulable_canary_says_what_the_scheduler_lacks() -> None:
    why = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available."
    got = kubeobjects.pod_health(_unschedulable(why), "engine")
    assert (got.exists, got.ready, got.crashed, got.unschedulable) == (True, False, False, True)
    assert got.detail == f"waiting for nvidia.com/gpu: {why}"
    wait = step(Phase.CANARY, Observation(control=READY, candidate=got), phase_elapsed_s=10)
    assert (wait.phase, wait.reason) == (Phase.CANARY, "WaitingForCanary")
    assert f"candidate waiting for nvidia.com/gpu: {why}" in wait.message
    late = step(Phase.CANARY, Observation(control=READY, candidate=got), phase_elapsed_s=60)
    # no node took it: no verdict, so Failed (never a rollback), the scheduler's words kept
    assert (late.phase, late.reason) == (Phase.FAILED, "CanaryUnschedulable")
    assert "Insufficient nvidia.com/gpu" in late.message


@pytest.mark.parametrize(
    ("message", "detail"),
    [
        ("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.", None),
        (None, "unschedulable: no node fits"),
        (["x"], "unschedulable: ['x']"),
        ("Insufficient cpu, Insufficient memory " + "x" * 1000, None),
    ],
)
def test_unschedulable_reasons_are_bounded_and_never_raise(
    message: object, detail: str | None
) -> None:
    got = kubeobjects.pod_health(_unschedulable(message), "engine")
    assert got.unschedulable and len(got.detail) <= 340
    if detail is not None:
        assert got.detail == detail
    assert got.detail.startswith(("waiting for", "unschedulable: "))
    scheduled = pod(phase="Pending", ready=False)
    scheduled["status"].pop("containerStatuses")
    scheduled["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    assert kubeobjects.pod_health(scheduled).detail == "pod Pending"


def test_canary_ready_goes_to_eval_with_findings() -> None:
    s = step(
        Phase.CANARY,
        Observation(
            control=READY,
            candidate=READY,
            **agreeing(
                scan("FLASH_ATTN", 100_000, dtype="auto"),
                scan("TRITON_ATTN", 201_000, SCALE_WARNING),
            ),
        ),
    )
    # attempt 1 is recorded first; the next reconcile makes its Job (write-ahead)
    assert s.phase is Phase.EVALUATING and s.actions == ()
    assert {g.gate: g.reason for g in s.gates} == {
        "canary": "CanaryHealthy",
        "engineTruth": "LogMetricsAgree",
        "scales": "ScalesMissing",
        "backend": "BackendChanged",
        "capacityGain": "CapacityGained",
    }
    assert [e.reason for e in s.events] == ["ScalesMissing", "BackendChanged"]
    assert s.eval_attempts == 1


def test_canary_without_capacity_gain_rolls_back_before_eval() -> None:
    s = step(
        Phase.CANARY,
        Observation(
            control=READY,
            candidate=READY,
            **agreeing(scan(dtype="auto"), scan(tokens=120_000)),
        ),
    )
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "CapacityNotGained")


def test_canary_with_unreadable_capacity_fails_closed() -> None:
    s = step(
        Phase.CANARY,
        Observation(
            control=READY,
            candidate=READY,
            **agreeing(scan(dtype="auto"), scan(tokens=None)),
        ),
    )
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "CapacityUnknown")


def test_candidate_log_fp8_but_metrics_not_rolls_back_naming_both() -> None:
    control, candidate = scan("FLASH_ATTN", 100_000, dtype="auto"), scan("FLASH_ATTN", 201_000)
    obs = Observation(
        control=READY,
        candidate=READY,
        **{**agreeing(control, candidate), "candidate_metrics": as_truth(truth("auto", 201_000))},
    )
    s = step(Phase.CANARY, obs)
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "LogMetricsDisagree")
    assert "candidate: startup log says kv_cache_dtype=fp8" in s.message
    assert "cache_dtype=auto" in s.message
    assert Action.CREATE_EVAL_JOB not in s.actions


def test_control_metrics_fp8_behind_a_bf16_log_rolls_back() -> None:
    control, candidate = scan("FLASH_ATTN", 100_000, dtype="auto"), scan("FLASH_ATTN", 201_000)
    obs = Observation(
        control=READY,
        candidate=READY,
        **{**agreeing(control, candidate), "control_metrics": as_truth(truth("fp8", 100_000))},
    )
    s = step(Phase.CANARY, obs)
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "LogMetricsDisagree")
    assert s.message.startswith("startup log and /metrics disagree: control: ")
    assert "cache_dtype=fp8" in s.message


def test_engine_truth_gate() -> None:
    arms = {"control": scan(dtype="auto"), "candidate": scan(tokens=200_000)}
    ok = assess_engine_truth(
        arms_of(as_scan, arms),
        arms_of(as_truth, {"control": truth("bfloat16"), "candidate": truth("fp8_e4m3", 200_000)}),
    )
    assert (ok.outcome, ok.reason) == (Outcome.SUCCESSFUL, "LogMetricsAgree")
    assert (
        ok.message
        == "log and /metrics agree (candidate: KV dtype, KV tokens; control: KV dtype, KV tokens)"
    )
    # another pool behind the same dtype: the tokens disagree
    pool = assess_engine_truth(
        arms_of(as_scan, arms),
        arms_of(as_truth, {"control": truth("auto"), "candidate": truth("fp8", 100_000)}),
    )
    assert (pool.outcome, pool.reason) == (Outcome.ERROR, "LogMetricsDisagree")
    assert "candidate: startup log says 200,000 KV tokens, /metrics 100,000" in pool.message
    # e5m2 is another cache than e4m3
    e5 = assess_engine_truth(
        arms_of(as_scan, arms),
        arms_of(as_truth, {"control": truth("auto"), "candidate": truth("fp8_e5m2", 200_000)}),
    )
    assert e5.outcome is Outcome.ERROR
    # metrics without cache info: nothing to compare for the candidate, a warning
    silent = assess_engine_truth(
        arms_of(as_scan, arms), arms_of(as_truth, {"control": truth(None, None), "candidate": {}})
    )
    assert (silent.outcome, silent.reason) == (Outcome.WARNING, "MetricsSilent")


def test_canary_waits_for_metrics_then_fails_closed() -> None:
    scans = {
        "control_scan": as_scan(scan(dtype="auto")),
        "candidate_scan": as_scan(scan(tokens=201_000)),
    }
    obs = Observation(
        control=READY, candidate=READY, metrics_error="candidate /metrics: refused", **scans
    )
    wait = step(Phase.CANARY, obs, phase_elapsed_s=10)
    assert (wait.phase, wait.reason) == (Phase.CANARY, "ReadingMetrics")
    assert "refused" in wait.message
    late = step(Phase.CANARY, obs, phase_elapsed_s=60)
    assert (late.phase, late.reason) == (Phase.ROLLED_BACK, "MetricsUnreadable")
    assert late.gates[0].outcome is Outcome.ERROR


GOOD_GATES = {"capacityGain": R(Outcome.SUCCESSFUL, "CapacityGained", "capacityGain")}


def test_eval_pass_promotes() -> None:
    s = step(
        Phase.EVALUATING,
        Observation(
            control=READY, candidate=READY, job_exists=True, eval_summary=as_summary(SUMMARY_PASS)
        ),
        eval_attempts=1,
        gates=GOOD_GATES,
    )
    assert s.phase is Phase.PROMOTING
    # Write-ahead: the decision is recorded first; the patch is made in Promoting.
    assert s.actions == (Action.DELETE_CANARIES,)


def test_eval_fail_rolls_back() -> None:
    s = step(
        Phase.EVALUATING,
        Observation(
            control=READY,
            candidate=READY,
            job_exists=True,
            eval_summary=as_summary({**SUMMARY_PASS, "verdict": "fail"}),
        ),
        eval_attempts=1,
        gates=GOOD_GATES,
    )
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "AccuracyRegressed")


def test_eval_error_retries_then_rolls_back() -> None:
    retry = step(
        Phase.EVALUATING,
        Observation(control=READY, candidate=READY, job_exists=True, eval_error="boom"),
        eval_attempts=1,
    )
    assert (retry.phase, retry.reason, retry.eval_attempts) == (Phase.EVALUATING, "EvalRetry", 2)
    assert retry.actions == ()  # attempt 2 is recorded first, made by the next reconcile
    final = step(
        Phase.EVALUATING,
        Observation(control=READY, candidate=READY, job_exists=True, eval_error="boom"),
        eval_attempts=2,
    )
    assert (final.phase, final.reason) == (Phase.ROLLED_BACK, "EvalError")
    assert final.message == "eval failed 2 time(s), last: boom"


@pytest.mark.parametrize("attempt", [1, 2])
def test_a_recorded_eval_attempt_without_its_job_makes_it(attempt: int) -> None:
    # GIVEN the attempt status recorded (the step before made nothing), no Job yet
    s = step(
        Phase.EVALUATING,
        Observation(control=READY, candidate=READY, job_exists=False),
        eval_attempts=attempt,
    )
    # THEN this reconcile makes it; the first attempt opens the speed window right before
    assert (s.phase, s.reason) == (Phase.EVALUATING, "Evaluating")
    expected = (Action.SNAPSHOT_SPEED,) if attempt == 1 else ()
    assert s.actions == (*expected, Action.CREATE_EVAL_JOB)


def test_eval_earlier_warning_does_not_block_but_earlier_failure_does() -> None:
    bad = {"scales": R(Outcome.FAILED, "ScalesMissing", "scales")}
    s = step(
        Phase.EVALUATING,
        Observation(
            control=READY, candidate=READY, job_exists=True, eval_summary=as_summary(SUMMARY_PASS)
        ),
        eval_attempts=1,
        gates=bad,
    )
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "ScalesMissing")


def test_eval_arm_lost_rolls_back() -> None:
    s = step(
        Phase.EVALUATING,
        Observation(control=READY, candidate=CRASHED, job_exists=True),
        eval_attempts=1,
    )
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "CanaryCrashed")


def test_an_arm_deleted_under_the_eval_is_lost_whatever_its_engine_did_on_the_way_out() -> None:
    # GIVEN the control canary deleted by someone else: its engine exits cleanly on SIGTERM, so
    # the terminating pod may read Succeeded (or still Running) before it is gone
    for phase in ("Succeeded", "Running"):
        obj = pod(phase=phase, ready=phase == "Running")
        obj["metadata"] = {"name": "r-control", "deletionTimestamp": "2026-12-03T23:00:00Z"}
        control = kubeobjects.pod_health(obj, "engine")
        assert control.deleting and control.detail.startswith("being deleted (")
        s = step(
            Phase.EVALUATING,
            Observation(control=control, candidate=READY, job_exists=True),
            eval_attempts=1,
        )
        # THEN the arm is lost (not "crashed, cause not classified"), and the rollout ends
        assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "CanaryCrashed")
        assert s.message.startswith("control pod disappeared: being deleted ("), s.message
    assert not kubeobjects.pod_health(pod(), "engine").deleting


def test_report_mode_stops_before_patching() -> None:
    spec = RolloutSpec.from_dict({"targetRef": {"name": "qwen"}, "promotion": {"mode": "report"}})
    s = step(
        Phase.EVALUATING,
        Observation(
            control=READY, candidate=READY, job_exists=True, eval_summary=as_summary(SUMMARY_PASS)
        ),
        spec=spec,
        eval_attempts=1,
    )
    assert (s.phase, s.reason, s.requeue_s) == (Phase.AWAITING_APPROVAL, "VerdictReported", None)
    assert Action.PATCH_DEPLOYMENT not in s.actions


def test_manual_mode_waits_for_the_bound_approval() -> None:
    spec = RolloutSpec.from_dict({"targetRef": {"name": "qwen"}, "promotion": {"mode": "manual"}})
    gates = {"accuracy": R(Outcome.SUCCESSFUL, "AccuracyNonInferior", "accuracy")}
    hold = step(
        Phase.AWAITING_APPROVAL,
        Observation(),
        spec=spec,
        gates=gates,
        config_hash="h1",
        approval="h0",
    )
    assert hold.phase is Phase.AWAITING_APPROVAL
    go = step(
        Phase.AWAITING_APPROVAL,
        Observation(),
        spec=spec,
        gates=gates,
        config_hash="h1",
        approval="h1",
    )
    assert go.phase is Phase.PROMOTING and Action.PATCH_DEPLOYMENT not in go.actions


AS_EVALUATED = LiveTarget(exists=True, as_evaluated=True)
CARRIES = LiveTarget(exists=True, carries_candidate=True, ours_present=True, differences=("args",))
CLEAN = LiveTarget(exists=True, as_evaluated=True, ours_present=False)
STUCK = LiveTarget(exists=True, carries_candidate=True, ours_present=True)


def test_promoting_patches_only_an_unchanged_target_and_only_once() -> None:
    patch = step(Phase.PROMOTING, Observation(live=AS_EVALUATED))
    assert (patch.phase, patch.actions) == (Phase.PROMOTING, (Action.PATCH_DEPLOYMENT,))
    # the patch went through before the operator died: adopt it, never patch again
    adopt = step(Phase.PROMOTING, Observation(live=CARRIES))
    assert (adopt.phase, adopt.patched, adopt.actions) == (Phase.PROMOTING, True, ())
    changed = LiveTarget(exists=True, differences=("image", "args"))
    stale = step(Phase.PROMOTING, Observation(live=changed))
    assert (stale.phase, stale.reason) == (Phase.FAILED, "TargetChanged")
    assert "image, args" in stale.message and Action.PATCH_DEPLOYMENT not in stale.actions


@pytest.mark.parametrize("phase", [Phase.PROMOTING, Phase.VERIFYING])
def test_an_external_revert_supersedes_and_is_never_repatched(phase: Phase) -> None:
    s = step(phase, Observation(live=CLEAN), patched=True)
    assert (s.phase, s.reason) == (Phase.FAILED, "Superseded")
    assert Action.PATCH_DEPLOYMENT not in s.actions


def test_superseded_with_kvgate_edits_left_reverts_them_first() -> None:
    partly = LiveTarget(exists=True, carries_candidate=False, ours_present=True)
    s = step(Phase.VERIFYING, Observation(live=partly), patched=True)
    assert s.phase is Phase.REVERTING and s.revert is not None
    assert (s.revert.phase, s.revert.reason) == (Phase.FAILED, "Superseded")


def test_promotion_crash_enters_reverting_without_patching_yet() -> None:
    s = step(
        Phase.PROMOTING,
        Observation(rollout_crashed="pod x: restarted 1x", live=STUCK),
        patched=True,
    )
    assert s.phase is Phase.REVERTING and Action.REVERT_DEPLOYMENT not in s.actions
    assert s.revert == RevertStatus(
        Phase.ROLLED_BACK,
        "PromotionReverted",
        "promotion reverted: new pods failed: pod x: restarted 1x",
    )


def test_reverting_patches_then_ends_only_after_the_read_back() -> None:
    intent = RevertStatus(Phase.ROLLED_BACK, "PromotionReverted", "new pods failed")
    first = step(Phase.REVERTING, Observation(live=STUCK), revert=intent, patched=True)
    assert (first.phase, first.actions) == (Phase.REVERTING, (Action.REVERT_DEPLOYMENT,))
    done = step(Phase.REVERTING, Observation(live=CLEAN), revert=intent, revert_attempts=1)
    assert (done.phase, done.reason, done.message) == (
        Phase.ROLLED_BACK,
        "PromotionReverted",
        "new pods failed",
    )


def test_a_revert_that_does_not_take_is_sticky_revert_failed() -> None:
    intent = RevertStatus(Phase.ROLLED_BACK, "PromotionReverted", "new pods failed")
    for attempts in (1, 2, 7):
        # The next attempt is due a back-off after the last (5 s, 10 s ... every minute), and
        # is read back on the next reconcile, not after another back-off (issue 25).
        due = deadlines.revert_retry_due_s(attempts)
        s = step(
            Phase.REVERTING,
            Observation(live=STUCK),
            revert=intent,
            revert_attempts=attempts,
            revert_error="403 Forbidden",
            phase_elapsed_s=due,
        )
        assert (s.phase, s.reason) == (Phase.REVERTING, "RevertFailed")
        assert s.actions == (Action.REVERT_DEPLOYMENT,) and "403 Forbidden" in s.message
        assert s.requeue_s == steps.MIN_DELAY_S
        assert any(e.reason == "RevertFailed" and e.warning for e in s.events)
        early = step(Phase.REVERTING, Observation(live=STUCK), revert=intent,
                     revert_attempts=attempts, revert_error="403 Forbidden",
                     phase_elapsed_s=due - deadlines.revert_backoff(attempts) + 1)  # fmt: skip
        assert (early.phase, early.reason, early.actions) == (Phase.REVERTING, "RevertFailed", ())
        assert early.requeue_s == deadlines.revert_backoff(attempts) - 1
        assert "403 Forbidden" in early.message and "next try in " in early.message
    assert (
        deadlines.revert_backoff(1) == 5
        and deadlines.revert_backoff(30) == deadlines.REVERT_BACKOFF_MAX_S
    )
    # healthy pods never turn a failed revert into Promoted: the phase only reads live
    assert step(Phase.REVERTING, Observation(live=STUCK, rollout_done=True), revert=intent,
                revert_attempts=1).phase is Phase.REVERTING  # fmt: skip


def test_a_terminal_end_with_the_candidate_live_reverts_first() -> None:
    # GIVEN an eval that fails while the Deployment carries the candidate (a crashed run's patch)
    s = step(
        Phase.EVALUATING,
        Observation(control=READY, candidate=READY, job_exists=True, eval_summary=as_summary(SUMMARY_PASS),
                    live=STUCK),
        eval_attempts=1,
        gates=GOOD_GATES,
    )  # fmt: skip
    assert s.phase is Phase.REVERTING and s.revert is not None
    assert s.revert.reason == "UnexpectedPatch"


def test_promotion_backend_drift_reverts_when_fallback_not_allowed() -> None:
    spec = RolloutSpec.from_dict(
        {"targetRef": {"name": "q"}, "gates": {"backend": {"allowFallback": False}}}
    )
    s = step(
        Phase.PROMOTING,
        Observation(
            rollout_done=True,
            rollout_scan=as_scan(scan("FLASHINFER")),
            control_scan=as_scan(scan("TRITON_ATTN")),
            live=STUCK,
        ),
        spec=spec,
        patched=True,
    )
    assert s.phase is Phase.REVERTING and s.revert is not None
    assert s.revert.reason == "PromotionReverted"


VERIFY = RolloutSpec.from_dict(
    {"targetRef": {"name": "q"}, "promotion": {"verifyWindow": "20s", "verifySamples": 5}}
)


def test_verify_needs_every_sample_and_the_whole_window() -> None:
    s = step(
        Phase.PROMOTING,
        Observation(
            rollout_done=True,
            rollout_scan=as_scan(scan("TRITON_ATTN")),
            control_scan=as_scan(scan("TRITON_ATTN")),
            live=STUCK,
        ),
        spec=VERIFY,
        patched=True,
    )
    assert (s.phase, s.verify_samples, s.restart_window) == (Phase.VERIFYING, 0, True)
    ok = Observation(live=STUCK, sampled=True)
    # four samples over 20 s are not enough, nor five samples over 15 s
    four = step(Phase.VERIFYING, ok, spec=VERIFY, verify_samples=3, since_last_sample_s=5,
                window_elapsed_s=20)  # fmt: skip
    assert (four.phase, four.verify_samples) == (Phase.VERIFYING, 4)
    short = step(Phase.VERIFYING, ok, spec=VERIFY, verify_samples=4, since_last_sample_s=5,
                 window_elapsed_s=15)  # fmt: skip
    assert short.phase is Phase.VERIFYING
    done = step(Phase.VERIFYING, ok, spec=VERIFY, verify_samples=4, since_last_sample_s=5,
                window_elapsed_s=20)  # fmt: skip
    assert (done.phase, done.reason) == (Phase.PROMOTED, "Promoted")


def test_a_gap_in_observation_restarts_the_verify_window() -> None:
    # GIVEN the operator was down for longer than two intervals (5 s each)
    back = step(
        Phase.VERIFYING,
        Observation(live=STUCK, sampled=True),
        spec=VERIFY,
        verify_samples=4,
        since_last_sample_s=300,
        window_elapsed_s=400,
    )
    assert (back.phase, back.verify_samples, back.restart_window) == (Phase.VERIFYING, 1, True)


def test_a_failed_verify_sample_reverts() -> None:
    bad = step(
        Phase.VERIFYING,
        Observation(live=STUCK, sampled=True, production_problem="pod y is not Ready"),
        spec=VERIFY,
        patched=True,
    )
    assert bad.phase is Phase.REVERTING and bad.revert is not None
    assert "pod y is not Ready" in bad.revert.message


@pytest.mark.parametrize(
    "phase", [Phase.PROMOTED, Phase.ROLLED_BACK, Phase.NOT_NEEDED, Phase.FAILED]
)
def test_terminal_phases_do_not_move(phase: Phase) -> None:
    s = step(phase, Observation(spec_errors=("x",), rollout_crashed="y"))
    assert (s.phase, s.actions, s.requeue_s) == (phase, (), None)


@pytest.mark.parametrize("mode", [GateMode.REQUIRE, GateMode.WARN])
def test_missing_evidence_never_promotes(mode: GateMode) -> None:
    # GIVEN no eval summary and no capacity figures, WHEN decided, THEN nothing promotes
    results = [
        assess_capacity_gain(CapacityGainGate(), None, None),
        assess_accuracy(AccuracyGate(), None),
        assess_scales(ScalesGate(mode), None, None),
    ]
    got = v.decide(results, mode=PromotionMode.AUTO, config_hash="h", approval="h")
    assert got.decision is not Decision.PROMOTE


DTYPE_GRID = [
    ("fp8", "auto", "fp8", Outcome.SUCCESSFUL, "CanaryHealthy"),
    ("fp8", "auto", "fp8_e4m3", Outcome.SUCCESSFUL, "CanaryHealthy"),
    ("fp8", "auto", "auto", Outcome.ERROR, "CandidateDtypeMismatch"),
    # A log that does not say is not a mismatch: unread, which blocks as well (issue 23)
    ("fp8", "auto", None, Outcome.INCONCLUSIVE, "CandidateDtypeUnread"),
    ("fp8_e5m2", "auto", "fp8", Outcome.ERROR, "CandidateDtypeMismatch"),
    ("fp8", "fp8", "fp8", Outcome.ERROR, "ControlDtypeMismatch"),
]


@pytest.mark.parametrize(("wanted", "control", "candidate", "outcome", "reason"), DTYPE_GRID)
def test_arms_must_run_the_dtypes_they_stand_for(
    wanted: str, control: str, candidate: str | None, outcome: Outcome, reason: str
) -> None:
    got = assess_arms_dtype(
        wanted, as_scan({"kv_cache_dtype": control}), as_scan({"kv_cache_dtype": candidate})
    )
    assert (got.outcome, got.reason) == (outcome, reason)


def _truth(
    dtype: str | None = None, blocks: int | None = None, server: str | None = None
) -> dict[str, Any]:
    config = {"cache_dtype": dtype} if dtype else {}
    if blocks:
        config |= {"num_gpu_blocks": str(blocks), "block_size": "16"}
    truth: dict[str, Any] = {"engine": "vllm", "cacheConfig": config}
    if server:
        truth["serverInfo"] = {"kvCacheDtype": server, "maxTotalNumTokens": 40000}
    return truth


@pytest.mark.parametrize(
    ("truth", "outcome", "reason", "said"),
    [
        (
            _truth("fp8"),
            Outcome.SUCCESSFUL,
            "CanaryHealthy",
            "candidate runs fp8 (read from its /metrics",
        ),
        (
            _truth(server="fp8_e4m3"),
            Outcome.SUCCESSFUL,
            "CanaryHealthy",
            "runs fp8_e4m3 (read from",
        ),
        (_truth("auto"), Outcome.ERROR, "CandidateDtypeMismatch", "the candidate's /metrics shows"),
        (_truth(), Outcome.INCONCLUSIVE, "CandidateDtypeUnread", "cannot be shown to run fp8"),
        (None, Outcome.INCONCLUSIVE, "CandidateDtypeUnread", "neither the candidate's startup log"),
    ],
)
def test_a_log_that_does_not_name_the_dtype_takes_the_engines_metrics_or_blocks(
    truth: dict[str, Any] | None, outcome: Outcome, reason: str, said: str
) -> None:
    got = assess_arms_dtype(
        "fp8",
        as_scan({"kv_cache_dtype": "auto"}),
        as_scan({"kv_cache_dtype": None}),
        as_truth(truth),
    )
    assert (got.outcome, got.reason) == (outcome, reason) and said in got.message
    verdict = v.decide((got,), mode=PromotionMode.AUTO, config_hash="h", approval="h")
    assert (verdict.decision is Decision.PROMOTE) is (outcome is Outcome.SUCCESSFUL)


def test_capacity_and_engine_truth_read_the_metrics_when_the_log_is_silent() -> None:
    from kvgate.judge.gates import assess_engine_truth, kv_tokens

    assert kv_tokens(as_scan({"capacity": {}}), as_truth(_truth("fp8", blocks=2000))) == 32000
    assert (
        kv_tokens(as_scan({"capacity": {"kv_tokens": 7}}), as_truth(_truth("fp8", blocks=2000)))
        == 7
    )
    assert kv_tokens(None, None) is None
    silent = {"kv_cache_dtype": None, "capacity": {}}
    got = assess_engine_truth(
        arms_of(as_scan, {"candidate": silent, "control": silent}),
        arms_of(
            as_truth,
            {"candidate": _truth("fp8", blocks=2000), "control": _truth("auto", blocks=1000)},
        ),
    )
    assert (got.outcome, got.reason) == (Outcome.WARNING, "LogSilent")
    assert "its own /metrics are the only source" in got.message
    got = assess_engine_truth(
        arms_of(as_scan, {"candidate": silent, "control": silent}), arms_of(as_truth, {})
    )
    assert (got.outcome, got.reason) == (Outcome.WARNING, "MetricsSilent")


def test_crash_summary_prefers_the_root_cause() -> None:
    crashed = scan(
        "FLASHINFER",
        None,
        {
            "code": "engine-start-failed",
            "severity": "error",
            "text": "EngineCore failed to start.",
            "hint": "see root cause",
        },
        {
            "code": "attention-build-failed",
            "severity": "error",
            "text": "Ninja build failed",
            "hint": "use TRITON_ATTN",
        },
    )
    assert crash_summary(as_scan(crashed), "fallback") == ("Ninja build failed", "use TRITON_ATTN")
    assert crash_summary(None, "exited with code 1") == ("exited with code 1", None)


MEAN_GRID = [
    ({"sum": 1.0, "count": 100}, {"sum": 3.0, "count": 200}, 0.02),
    ({"sum": 1.0, "count": 100}, {"sum": 1.0, "count": 100}, None),  # no tokens in the window
    (None, {"sum": 3.0, "count": 200}, None),
    ({"sum": 1.0, "count": 100}, {"error": "down"}, None),
    ({"sum": 5.0, "count": 100}, {"sum": 1.0, "count": 200}, None),  # counter reset: unusable
]


@pytest.mark.parametrize(("before", "after", "mean"), MEAN_GRID)
def test_mean_between(
    before: dict[str, Any] | None, after: dict[str, Any], mean: float | None
) -> None:
    got = mean_between(
        None if before is None else jsonrecord.read_record(HistogramTotals, before),
        jsonrecord.read_record(HistogramTotals, after),
    )
    assert got == pytest.approx(mean) if mean is not None else got is None


def test_sglang_scale_warning_does_not_mean_dropped_when_the_checkpoint_has_scales() -> None:
    sglang = {**scan("triton", 45_911, SCALE_WARNING), "engine": "sglang"}
    assert (
        assess_scales(ScalesGate(GateMode.REQUIRE), True, as_scan(sglang)).reason == "ScalesPresent"
    )
    assert (
        assess_scales(ScalesGate(GateMode.REQUIRE), None, as_scan(sglang)).reason == "ScalesMissing"
    )


GIVE_UP_GRID = [
    (Phase.CANARY, 30, None),
    (Phase.CANARY, 31, (Phase.FAILED, "ExternalErrors")),
    (Phase.VERIFYING, 31, (Phase.REVERTING, "Reverting")),
    (Phase.PROMOTING, 31, (Phase.REVERTING, "Reverting")),
    (Phase.REVERTING, 31, (Phase.REVERTING, "RevertFailed")),
    (Phase.PROMOTED, 99, None),
]


@pytest.mark.parametrize(("phase", "errors", "end"), GIVE_UP_GRID)
def test_give_up_after_the_error_limit(
    phase: Phase, errors: int, end: tuple[Phase, str] | None
) -> None:
    got = deadlines.give_up(SPEC, State(phase=phase), "apiserver down", errors, limit=30)
    assert (None if got is None else (got.phase, got.reason)) == end
    if got is not None and phase is Phase.VERIFYING:
        assert got.revert is not None and Action.REVERT_DEPLOYMENT not in got.actions
        assert got.revert.message == (
            "gave up after 31 consecutive errors (limit 30); last: apiserver down"
        )


def test_phase_deadlines_hold_while_observation_keeps_failing() -> None:
    # GIVEN a canary phase past its startup timeout, WHEN only one error has happened
    late = State(phase=Phase.CANARY, phase_elapsed_s=SPEC.canary.startup_timeout_s + 1)
    got = deadlines.give_up(SPEC, late, "apiserver down", 1, limit=30)
    assert got is not None and (got.phase, got.reason) == (Phase.FAILED, "ExternalErrors")
    assert "deadline" in got.message
    assert (
        deadlines.give_up(SPEC, State(phase=Phase.CANARY, phase_elapsed_s=1), "x", 1, limit=30)
        is None
    )


def test_eval_timeout_is_per_attempt() -> None:
    # evalTimeout 600 s and one retry: 1200 s plus 60 s grace in Evaluating before giving up
    running = Observation(control=READY, candidate=READY, job_exists=True)
    assert (
        step(Phase.EVALUATING, running, eval_attempts=2, phase_elapsed_s=1259).phase
        is Phase.EVALUATING
    )
    late = step(Phase.EVALUATING, running, eval_attempts=2, phase_elapsed_s=1260)
    assert (late.phase, late.reason) == (Phase.ROLLED_BACK, "EvalError")
    assert (
        late.message
        == "eval failed 2 time(s), last: eval did not finish within 1260s (2 attempt(s))"
    )


def test_a_summary_seen_after_the_phase_deadline_is_judged_not_timed_out() -> None:
    # GIVEN an eval that finished but was read only past the phase's budget (the operator was
    # down longer than the grace): its verdict decides, as a late load result's does
    done = Observation(
        control=READY, candidate=READY, job_exists=True, eval_summary=as_summary(SUMMARY_PASS)
    )
    s = step(Phase.EVALUATING, done, eval_attempts=2, phase_elapsed_s=5000, gates=GOOD_GATES)
    assert s.phase is Phase.PROMOTING
    failed = replace(done, eval_summary=as_summary({**SUMMARY_PASS, "verdict": "fail"}))
    s = step(Phase.EVALUATING, failed, eval_attempts=2, phase_elapsed_s=5000, gates=GOOD_GATES)
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "AccuracyRegressed")


def test_a_job_error_is_retried_even_late_in_the_phase() -> None:
    failed = Observation(
        control=READY, candidate=READY, job_exists=True, eval_error="DeadlineExceeded"
    )
    s = step(Phase.EVALUATING, failed, eval_attempts=1, phase_elapsed_s=700)
    assert (s.phase, s.reason, s.eval_attempts) == (Phase.EVALUATING, "EvalRetry", 2)


def test_crash_summary_falls_back_to_the_last_log_line() -> None:
    crashed = {**scan(None, None), "tail": ["...", "OSError: [Errno 98] Address already in use"]}
    assert crash_summary(as_scan(crashed), "exited with code 1 (Error)") == (
        "exited with code 1 (Error); last log line: OSError: [Errno 98] Address already in use",
        None,
    )


# --- remediation: the remedy that fits the candidate's engine version ---------------------------

JIT_FAILED = {
    "code": "attention-build-failed",
    "severity": "error",
    "text": "RuntimeError: Ninja build failed.",
    "hint": "generic hint",
}
REMEDIES = {
    "0.10.2": "VLLM_ATTENTION_BACKEND=TRITON_ATTN_VLLM_V1 and VLLM_USE_FLASHINFER_SAMPLER=0",
    "0.11.0": "VLLM_ATTENTION_BACKEND=TRITON_ATTN and VLLM_USE_FLASHINFER_SAMPLER=0",
    "0.33.0": "--attention-backend TRITON_ATTN and VLLM_USE_FLASHINFER_SAMPLER=0",
}


def crashed_scan(version: str | None, *findings: dict[str, Any]) -> dict[str, Any]:
    return {**scan("FLASHINFER", None, *(findings or (JIT_FAILED,))), "engine_version": version,
            "failed": True, "ready": False}  # fmt: skip


def remedy_spec(mode: str) -> RolloutSpec:
    return RolloutSpec.from_dict(
        {
            "targetRef": {"name": "qwen"},
            "canary": {"startupTimeout": "60s", "remediation": mode},
        }
    )


@pytest.mark.parametrize("version", sorted(REMEDIES))
def test_the_remedy_fits_the_engine_version(version: str) -> None:
    fix = remedy.find_remedy(as_scan(crashed_scan(version)), "vllm", "0.9.0")
    assert fix is not None and fix.refused == ""
    assert (fix.code, fix.version, fix.text) == (
        "attention-build-failed",
        version,
        REMEDIES[version],
    )
    # the log's version wins over the image tag; the tag is the fallback
    assert (
        remedy.find_remedy(as_scan(crashed_scan(None)), "vllm", version).text == REMEDIES[version]
    )
    # no version at all: no remedy (the way to pick a backend depends on it)
    assert remedy.find_remedy(as_scan(crashed_scan(None)), "vllm", None) is None


@pytest.mark.parametrize("version", sorted(REMEDIES))
def test_auto_remediation_restarts_the_candidate_once_with_that_remedy(version: str) -> None:
    fix = remedy.find_remedy(as_scan(crashed_scan(version)), "vllm", None)
    obs = Observation(
        control=READY, candidate=CRASHED, candidate_scan=as_scan(crashed_scan(version)), remedy=fix
    )
    s = step(Phase.CANARY, obs, remedy_spec("auto"))
    assert (s.phase, s.reason, s.remedy) == (Phase.CANARY, "Remediating", fix)
    assert s.actions == (Action.REMEDIATE, Action.DELETE_CANARIES)  # record, then replace pods
    assert s.message.endswith(f"with the remedy for vllm {version}: {REMEDIES[version]}")
    assert [e.reason for e in s.events] == ["CanaryCrashed", "Remediating"]
    # the remedied candidate crashes too: at most one remedy, then it rolls back
    again = step(Phase.CANARY, obs, remedy_spec("auto"), remedy_attempts=1)
    assert (again.phase, again.reason) == (Phase.ROLLED_BACK, "CanaryCrashed")
    assert "already applied" in again.message and again.remedy is None


@pytest.mark.parametrize("version", sorted(REMEDIES))
def test_remediation_off_rolls_back_naming_that_remedy(version: str) -> None:
    fix = remedy.find_remedy(as_scan(crashed_scan(version)), "vllm", None)
    obs = Observation(
        control=READY, candidate=CRASHED, candidate_scan=as_scan(crashed_scan(version)), remedy=fix
    )
    for spec in (remedy_spec("off"), SPEC):  # off is the default
        s = step(Phase.CANARY, obs, spec)
        assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "CanaryCrashed")
        # The classified cause leads; the remedy, where it goes, then the engine's line.
        assert s.message.startswith(
            "candidate crashed: the attention backend could not JIT-compile its FP8 KV kernels "
            "(FlashInfer without nvcc/ninja in the image: the L4 trap) (attention-build-failed); "
            f"remedy for vllm {version}: {REMEDIES[version]}; set spec."
        ), s.message
        assert s.message.endswith(
            "; or set spec.canary.remediation: auto and kvgate applies it and tests again; "
            "log: RuntimeError: Ninja build failed."
        ), s.message
        assert s.events[0].reason == "CanaryCrashed" and s.events[0].message == s.message
        assert Action.REMEDIATE not in s.actions


def test_a_remedy_off_the_allowlist_is_named_not_applied() -> None:
    from kvgate.spec.allowed import Allowlist

    class NoSampler(Allowlist):
        def env_allowed(self, engine: Any, name: str) -> bool:
            return name != "VLLM_USE_FLASHINFER_SAMPLER"

    fix = remedy.find_remedy(as_scan(crashed_scan("0.33.0")), "vllm", None, NoSampler())
    assert (
        fix is not None and "VLLM_USE_FLASHINFER_SAMPLER is not an allowed variable" in fix.refused
    )
    obs = Observation(
        control=READY, candidate=CRASHED, candidate_scan=as_scan(crashed_scan("0.33.0")), remedy=fix
    )
    s = step(Phase.CANARY, obs, remedy_spec("auto"))
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "CanaryCrashed")
    assert "(not applied, the allowlist refuses it: VLLM_USE_FLASHINFER_SAMPLER" in s.message


def test_only_known_signatures_of_the_candidate_get_a_remedy() -> None:
    oom = {"code": "out-of-memory", "severity": "error", "text": "CUDA out of memory"}
    assert remedy.find_remedy(as_scan(crashed_scan("0.33.0", oom)), "vllm", None) is None
    refused = {"code": "fp8-unsupported", "severity": "error", "text": "FlashAttention refuses"}
    fix = remedy.find_remedy(as_scan(crashed_scan("0.15.0", refused)), "vllm", None)
    assert fix is not None and fix.text == REMEDIES["0.33.0"]
    # a crashed control is never remedied: its config is production's
    obs = Observation(control=CRASHED, candidate=READY, control_scan=as_scan(crashed_scan("0.33.0")),
                      candidate_scan=as_scan(scan()), remedy=None)  # fmt: skip
    s = step(Phase.CANARY, obs, remedy_spec("auto"))
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "CanaryCrashed")
    assert s.message.startswith("control crashed: the attention backend could not JIT-compile")
    assert "spec.extraArgs" not in s.message  # the control runs production's config


def test_a_checkpoint_forcing_fp8_on_the_control_fails_preflight_before_any_canary() -> None:
    forcing = ("quantization_config.kv_cache_scheme is set",)
    obs = Observation(pool_samples=3, pool_pressured=True, control_stores="fp8", forces_fp8=forcing)
    s = step(Phase.PREFLIGHT, obs)
    assert (s.phase, s.reason) == (Phase.FAILED, "ControlRunsFP8")
    assert s.message == machine.control_runs_fp8(forcing, "auto", "qwen")
    assert Action.CREATE_CANARIES not in s.actions
    go = step(Phase.PREFLIGHT, Observation(pool_samples=3, pool_pressured=True))
    assert go.phase is Phase.CANARY
    # production pins a dtype: that is what runs, whatever the checkpoint says
    pinned = replace(obs, production_kv_dtype="bfloat16", control_stores="bfloat16")
    assert step(Phase.PREFLIGHT, pinned).phase is Phase.CANARY
    # a control stated as FP8 (and running it) is the rollout's baseline: FP8 to BF16 is asked
    from_fp8 = RolloutSpec.from_dict(
        {
            "targetRef": {"name": "qwen"},
            "kvCache": {"format": "bfloat16", "control": {"format": "fp8"}},
        }
    )
    assert step(Phase.PREFLIGHT, obs, spec=from_fp8).phase is Phase.CANARY


def test_the_control_runs_fp8_only_under_auto_with_a_forcing_checkpoint() -> None:
    why = ["quantization_config.kv_cache_scheme is set"]
    got = machine.control_runs_fp8(why, "auto", "vllm")
    assert got is not None and "kv_cache_scheme is set" in got and "vllm runs auto" in got
    assert machine.control_runs_fp8(why, "bfloat16", "vllm") is None  # a pinned dtype wins
    assert machine.control_runs_fp8([], "auto", "vllm") is None


def test_a_stated_control_format_must_be_what_production_runs() -> None:
    # auto states nothing; a stated format production runs (by any of its names) passes
    assert machine.control_mismatch("auto", "fp8", "auto", "vllm", "d") is None
    assert machine.control_mismatch("fp8_e4m3", "fp8", "auto", "vllm", "d") is None
    assert machine.control_mismatch("bfloat16", "auto", "auto", "vllm", "d") is None
    # production's auto stores FP8 on this checkpoint: a stated bfloat16 is refused, saying why
    got = machine.control_mismatch("bfloat16", "fp8", "auto", "vllm", "d")
    assert got == (
        "spec.kvCache.control.format: 'bfloat16' is stated, but d runs fp8 "
        "(--kv-cache-dtype auto on this checkpoint); state the format production runs, or auto"
    )
    got = machine.control_mismatch("fp8", "bfloat16", "bfloat16", "vllm", "d")
    assert got is not None and "d runs bfloat16 (--kv-cache-dtype bfloat16);" in got
    # production on auto, checkpoint unread: what the control stores is unknown, never a match
    for stated in ("fp8", "bfloat16"):
        got = machine.control_mismatch(stated, None, "auto", "vllm", "d")
        assert got == (
            f"spec.kvCache.control.format: '{stated}' is stated, but what d stores under "
            "--kv-cache-dtype auto is unknown (the checkpoint was not read); pin production's "
            "dtype, or state auto"
        )
    # the machine holds the spec to what preflight read, before the pool and any canary
    stated_fp8 = RolloutSpec.from_dict(
        {
            "targetRef": {"name": "d"},
            "kvCache": {"format": "bfloat16", "control": {"format": "fp8"}},
        }
    )
    unread = Observation(pool_samples=3, pool_pressured=True, control_stores=None)
    got = machine.control_mismatch("fp8", None, "auto", "vllm", "d")
    ended = step(Phase.PREFLIGHT, unread, spec=stated_fp8)
    assert (ended.phase, ended.reason, ended.message) == (Phase.FAILED, Reason.INVALID_SPEC, got)
    assert Action.CREATE_CANARIES not in ended.actions
    read = replace(unread, control_stores="fp8_e4m3")
    assert step(Phase.PREFLIGHT, read, spec=stated_fp8).phase is Phase.CANARY


def test_sglang_dtype_is_checked_against_server_info() -> None:
    sg = {**scan(dtype="fp8_e4m3", tokens=200_000), "engine": "sglang"}
    control = {**scan(dtype="auto"), "engine": "sglang"}

    def sg_truth(dtype: str | None, tokens: int) -> dict[str, Any]:
        # SGLang's /metrics: capacity (max_total_num_tokens) but no dtype; the dtype comes from
        # /get_server_info
        out: dict[str, Any] = {"engine": "sglang", "cacheConfig": {}, "maxTotalTokens": tokens}
        if dtype is not None:
            out["serverInfo"] = {"kvCacheDtype": dtype}
        return out

    ok = assess_engine_truth(
        arms_of(as_scan, {"control": control, "candidate": sg}),
        arms_of(
            as_truth,
            {"control": sg_truth("auto", 100_000), "candidate": sg_truth("fp8_e4m3", 200_000)},
        ),
    )
    assert (ok.outcome, ok.reason) == (Outcome.SUCCESSFUL, "LogMetricsAgree")
    assert "candidate: KV dtype (server info), KV tokens;" in ok.message
    lie = assess_engine_truth(
        arms_of(as_scan, {"control": control, "candidate": sg}),
        arms_of(
            as_truth, {"control": sg_truth("auto", 100_000), "candidate": sg_truth("auto", 200_000)}
        ),
    )
    assert (lie.outcome, lie.reason) == (Outcome.ERROR, "LogMetricsDisagree")
    assert (
        "candidate: startup log says kv_cache_dtype=fp8_e4m3, SGLang server info says "
        "kv_cache_dtype=auto"
    ) in lie.message
    assert "control:" not in lie.message
    # server info's pool is another than the log's: a disagreement even where /metrics (0.5.3)
    # export no capacity
    pool = assess_engine_truth(
        arms_of(as_scan, {"control": control, "candidate": sg}),
        arms_of(
            as_truth,
            {
                "control": sg_truth("auto", 100_000),
                "candidate": {
                    "engine": "sglang",
                    "cacheConfig": {},
                    "serverInfo": {"kvCacheDtype": "fp8_e4m3", "maxTotalNumTokens": 150_000},
                },
            },
        ),
    )
    assert (pool.outcome, pool.reason) == (Outcome.ERROR, "LogMetricsDisagree")
    assert "max_total_num_tokens=150,000" in pool.message
    # an SGLang without the endpoint: nothing to compare, the capacity check still runs
    absent = assess_engine_truth(
        arms_of(as_scan, {"control": control, "candidate": sg}),
        arms_of(
            as_truth,
            {
                "control": {**sg_truth(None, 100_000), "serverInfo": {"absent": "HTTP 404"}},
                "candidate": {**sg_truth(None, 200_000), "serverInfo": {"absent": "HTTP 404"}},
            },
        ),
    )
    assert (absent.outcome, absent.reason) == (Outcome.SUCCESSFUL, "LogMetricsAgree")
    assert "KV dtype" not in absent.message


@pytest.mark.parametrize(
    ("mode", "outcome"),
    [(GateMode.WARN, Outcome.WARNING), (GateMode.REQUIRE, Outcome.INCONCLUSIVE)],
)
def test_a_silent_log_is_no_evidence_that_scales_were_used(
    mode: GateMode, outcome: Outcome
) -> None:
    # checkpoint unknown, and a log that names no KV dtype: its lack of a warning proves nothing
    got = assess_scales(ScalesGate(mode), None, as_scan({"kv_cache_dtype": None, "findings": []}))
    assert (got.outcome, got.reason) == (outcome, "ScalesUnknown")
    # a log that names its KV dtype but says nothing of scales proves no more: real vLLM 0.32
    # serves a checkpoint without scales without a word
    spoken = assess_scales(
        ScalesGate(mode), None, as_scan({"kv_cache_dtype": "fp8", "findings": []})
    )
    assert (spoken.outcome, spoken.reason) == (outcome, "ScalesUnknown")
    assert "spec.model.name" in spoken.message
    read = assess_scales(ScalesGate(mode), True, as_scan({"kv_cache_dtype": "fp8", "findings": []}))
    assert (read.outcome, read.reason) == (Outcome.SUCCESSFUL, "ScalesPresent")


def test_gate_mode_opens_only_on_a_passing_verdict_and_never_patches() -> None:
    spec = RolloutSpec.from_dict({"targetRef": {"name": "qwen"}, "promotion": {"mode": "gate"}})
    passing = step(
        Phase.EVALUATING,
        Observation(
            control=READY, candidate=READY, job_exists=True, eval_summary=as_summary(SUMMARY_PASS)
        ),
        spec=spec,
        eval_attempts=1,
    )
    assert (passing.phase, passing.reason, passing.gate_closed) == (
        Phase.AWAITING_APPROVAL, "VerdictReported", False,
    )  # fmt: skip
    assert Action.PATCH_DEPLOYMENT not in passing.actions
    regressed = Observation(
        control=READY, candidate=READY, job_exists=True,
        eval_summary=as_summary({**SUMMARY_PASS, "verdict": "fail"}),
    )  # fmt: skip
    failing = step(
        Phase.EVALUATING,
        regressed,
        spec=spec,
        eval_attempts=1,
    )
    assert (failing.phase, failing.reason, failing.gate_closed) == (
        Phase.ROLLED_BACK, "AccuracyRegressed", True,
    )  # fmt: skip
    assert failing.message.startswith("gate closed: ")
    # the same failing verdict in report mode is a reported result, not a closed gate
    report = RolloutSpec.from_dict({"targetRef": {"name": "qwen"}, "promotion": {"mode": "report"}})
    reported = step(
        Phase.EVALUATING,
        regressed,
        spec=report,
        eval_attempts=1,
    )
    assert (reported.phase, reported.gate_closed) == (Phase.ROLLED_BACK, False)


BROKEN = ("layer 1: k_scale 0.0", "layer 3: v_scale nan")


@pytest.mark.parametrize("mode", [GateMode.REQUIRE, GateMode.WARN])
def test_scales_that_cannot_scale_fail_the_gate_in_any_mode_but_off(mode: GateMode) -> None:
    vllm = as_scan(scan("flash_attn", 45_911))
    result = assess_scales(ScalesGate(mode), True, vllm, BROKEN, "fp8")
    assert (result.outcome, result.reason) == (Outcome.FAILED, "ScalesBroken")
    assert "(layer 1: k_scale 0.0; layer 3: v_scale nan) and fp8 reads them" in result.message
    off = assess_scales(ScalesGate(GateMode.OFF), True, vllm, BROKEN, "fp8")
    assert off.outcome is Outcome.SKIPPED


def test_broken_scales_do_not_matter_to_a_format_that_ignores_them() -> None:
    vllm = as_scan(scan("flash_attn", 45_911))
    # int8_per_token_head scales each token and head itself: the checkpoint's are unused
    result = assess_scales(ScalesGate(GateMode.REQUIRE), True, vllm, BROKEN, "int8_per_token_head")
    assert result.reason != "ScalesBroken"


def test_broken_scales_under_a_format_kvgate_does_not_know_fail_closed() -> None:
    vllm = as_scan(scan("flash_attn", 45_911))
    result = assess_scales(ScalesGate(GateMode.REQUIRE), True, vllm, BROKEN, "fp9_future")
    assert result.reason == "ScalesBroken"
    many = tuple(f"layer {n}: k_scale 0.0" for n in range(5))
    shown = assess_scales(ScalesGate(GateMode.REQUIRE), True, vllm, many, "fp8").message
    # the first three, and where the rest are (the status keeps 16 and a count)
    assert "layer 2: k_scale 0.0; more in status.preflight.checkpoint.brokenScales)" in shown


SGLANG_DROPPED_LINES = [
    # sglang/srt/model_loader/weight_utils.py:1838 (0.5.23): maybe_remap_kv_scale_name
    "[2025-10-06 10:00:00] Found .k_scale in the checkpoint (e.g. model.layers.0.self_attn.k_scale)"
    ", but not found the expected name in the model (e.g. model.layers.0.self_attn.attn.k_scale)."
    " .k_scale is not loaded.",
    # sglang/srt/models/qwen3.py:760 (0.5.23), the line sglang#35455 quotes
    "[2025-10-06 10:00:00] Parameter model.layers.3.self_attn.v_scale not found in params_dict",
]


@pytest.mark.parametrize("dropped", SGLANG_DROPPED_LINES)
def test_sglang_dropping_the_checkpoints_scales_is_scales_dropped(dropped: str) -> None:
    from kvgate.evidence import logs

    # GIVEN an SGLang candidate whose loader skipped the checkpoint's k/v scales, then printed its
    # 1.0 line (which it prints whether or not it loaded them: sglang#31224)
    log = "\n".join([
        "[2025-10-06 10:00:00] server_args={'model_path': 'm', 'kv_cache_dtype': 'fp8_e4m3'}",
        dropped,
        "[2025-10-06 10:00:00] Using FP8 KV cache but no scaling factors provided. Defaulting to "
        "scaling factors of 1.0.",
        "[2025-10-06 10:00:00] The server is fired up and ready to roll!",
    ])  # fmt: skip
    scan = logs.scan_log(log, engine="sglang").status_record()
    # THEN the checkpoint's scales do not make it ScalesPresent: the loader's own words decide
    for mode, outcome in ((GateMode.REQUIRE, Outcome.FAILED), (GateMode.WARN, Outcome.WARNING)):
        got = assess_scales(ScalesGate(mode), True, scan)
        assert (got.outcome, got.reason) == (outcome, "ScalesDropped")
        assert dropped.split("] ", 1)[1] in got.message


def test_an_sglang_parameter_that_is_no_kv_scale_drops_nothing() -> None:
    from kvgate.evidence import logs

    log = "\n".join([
        "[2025-10-06 10:00:00] server_args={'model_path': 'm', 'kv_cache_dtype': 'fp8_e4m3'}",
        "[2025-10-06 10:00:00] Parameter model.layers.3.mlp.gate_up_proj.bias not found in "
        "params_dict",
        "[2025-10-06 10:00:00] The server is fired up and ready to roll!",
    ])  # fmt: skip
    scan = logs.scan_log(log, engine="sglang").status_record()
    assert "kv-scale-dropped" not in {f.code for f in scan.findings}
    got = assess_scales(ScalesGate(GateMode.REQUIRE), True, scan)
    assert got.reason == "ScalesPresent"
