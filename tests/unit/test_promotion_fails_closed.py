"""Every doubt ends in a wait, a revert or a stop, never in a patch or Promoted.

The transition function (`machine.next_step`) on the branches no other test reached: Promoting,
Verifying and Reverting when the target is edited or deleted behind kvgate's back, when the new
pods never become ready and when their startup log reports a failure; a canary whose logs are
not read yet; an eval that reports its own error; a verdict in report mode. Each case is one
observation, as `look` would make it.
"""

from __future__ import annotations

from typing import Any

import pytest
from evidence import as_scan, as_summary

from kvgate.evidence.kubeobjects import PodHealth
from kvgate.flow import deadlines, machine
from kvgate.flow.steps import Action, LiveTarget, Observation, State, Step
from kvgate.records.status import GateResult, RevertStatus
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import Outcome, Phase

SPEC = RolloutSpec.from_dict(
    {
        "targetRef": {"name": "qwen"},
        "canary": {"startupTimeout": "60s", "evalRetries": 1},
        "promotion": {"verifyWindow": "20s", "verifySamples": 5, "verifyInterval": "5s"},
    }
)
GONE = LiveTarget(exists=False)
CARRIES = LiveTarget(exists=True, carries_candidate=True, ours_present=True)
INTENT = RevertStatus(Phase.ROLLED_BACK, "PromotionReverted", "promotion reverted: new pods failed")


def step(phase: Phase, obs: Observation, **state: Any) -> Step:
    return machine.next_step(SPEC, State(phase=phase, **state), obs, poll_s=2.0)


def startup_scan(*, failed: bool, code: str = "engine-start-failed") -> dict[str, Any]:
    findings = [{"code": code, "severity": "error", "text": "EngineCore failed to start."}]
    return {
        "engine": "vllm",
        "kv_cache_dtype": "fp8",
        "attention_backend": "TRITON_ATTN",
        "capacity": {"kv_tokens": 100_000},
        "ready": not failed,
        "failed": failed,
        "findings": findings if failed else [],
    }


@pytest.mark.parametrize("phase", [Phase.PROMOTING, Phase.VERIFYING])
@pytest.mark.parametrize("patched", [False, True])
def test_a_deleted_target_stops_the_rollout_without_touching_anything(
    phase: Phase, patched: bool
) -> None:
    s = step(phase, Observation(live=GONE), patched=patched)
    assert (s.phase, s.reason) == (Phase.FAILED, "TargetDeleted")
    assert s.message == "Deployment qwen disappeared"
    assert not {Action.PATCH_DEPLOYMENT, Action.REVERT_DEPLOYMENT} & set(s.actions)
    assert s.revert is None


def test_new_pods_not_ready_within_the_startup_timeout_are_reverted() -> None:
    # GIVEN the patched Deployment whose new pods are still not rolled out after 60 s
    waiting = step(Phase.PROMOTING, Observation(live=CARRIES), patched=True, phase_elapsed_s=59)
    assert (waiting.phase, waiting.reason) == (Phase.PROMOTING, "RollingOut")
    late = step(Phase.PROMOTING, Observation(live=CARRIES), patched=True, phase_elapsed_s=60)
    # THEN it reverts, the intent recorded first (the revert patch comes on the Reverting step)
    assert late.phase is Phase.REVERTING
    assert not {Action.PATCH_DEPLOYMENT, Action.REVERT_DEPLOYMENT} & set(late.actions)
    assert late.revert == RevertStatus(
        Phase.ROLLED_BACK,
        "PromotionReverted",
        "promotion reverted: Deployment not rolled out within 60s",
    )


def test_a_failure_in_the_promoted_pods_startup_log_reverts_even_when_they_are_ready() -> None:
    obs = Observation(
        live=CARRIES, rollout_done=True, rollout_scan=as_scan(startup_scan(failed=True))
    )
    s = step(Phase.PROMOTING, obs, patched=True)
    assert s.phase is Phase.REVERTING and s.revert is not None
    assert (s.revert.phase, s.revert.reason) == (Phase.ROLLED_BACK, "PromotionReverted")
    assert s.revert.message is not None and s.revert.message.startswith("promotion reverted: ")
    # the same pods with a clean log go on to verification
    clean = Observation(
        live=CARRIES, rollout_done=True, rollout_scan=as_scan(startup_scan(failed=False))
    )
    assert step(Phase.PROMOTING, clean, patched=True).phase is Phase.VERIFYING


def test_rolled_out_pods_whose_log_is_not_read_yet_are_not_verified() -> None:
    s = step(Phase.PROMOTING, Observation(live=CARRIES, rollout_done=True), patched=True)
    assert (s.phase, s.reason) == (Phase.PROMOTING, "RollingOut")


def test_a_problem_in_production_during_verification_reverts() -> None:
    obs = Observation(live=CARRIES, sampled=True, production_problem="TTFT p99 2.5x the baseline")
    s = step(Phase.VERIFYING, obs, patched=True, verify_samples=4, window_elapsed_s=30)
    assert s.phase is Phase.REVERTING and s.revert is not None
    assert s.revert.message == (
        "promotion reverted during verification: TTFT p99 2.5x the baseline"
    )


def test_verifying_between_samples_waits_for_the_rest_of_the_interval() -> None:
    s = step(
        Phase.VERIFYING,
        Observation(live=CARRIES, sampled=False),
        patched=True,
        verify_samples=2,
        since_last_sample_s=2,
    )
    assert (s.phase, s.verify_samples) == (Phase.VERIFYING, None)  # None: the count stays
    assert s.requeue_s == pytest.approx(3.0)
    assert "2/5 samples" in s.message


def test_a_revert_of_a_deleted_deployment_ends_as_intended_and_says_so() -> None:
    s = step(Phase.REVERTING, Observation(live=GONE), revert=INTENT, patched=True)
    assert (s.phase, s.reason) == (Phase.ROLLED_BACK, "PromotionReverted")
    assert s.message == "promotion reverted: new pods failed (Deployment qwen is gone)"
    assert Action.REVERT_DEPLOYMENT not in s.actions


def test_a_revert_whose_container_was_renamed_is_loud_and_retried_never_ended() -> None:
    # GIVEN someone renamed the container while kvgate's edits are still on the Deployment
    renamed = LiveTarget(exists=True, container_found=False, ours_present=True)
    for attempts in (0, 3):
        s = step(
            Phase.REVERTING,
            Observation(live=renamed),
            revert=INTENT,
            patched=True,
            revert_attempts=attempts,
        )
        # THEN kvgate patches nothing it cannot find, warns, and comes back after a back-off
        assert (s.phase, s.reason) == (Phase.REVERTING, "RevertFailed")
        assert s.actions == ()
        assert "container is gone or renamed" in s.message
        assert any(e.reason == "RevertFailed" and e.warning for e in s.events)
        assert s.requeue_s == deadlines.revert_backoff(attempts + 1)


READY = PodHealth(True, ready=True, ip="127.0.0.9")


def test_ready_canaries_whose_startup_logs_are_unread_are_not_judged() -> None:
    for scans in ({}, {"control_scan": as_scan(startup_scan(failed=False))}):
        s = step(Phase.CANARY, Observation(control=READY, candidate=READY, **scans))
        assert (s.phase, s.reason, s.actions) == (Phase.CANARY, "ReadingLogs", ())
        assert s.gates == ()


@pytest.mark.parametrize(
    ("error", "said"), [("lm-eval: task gsm8k not found", "lm-eval: task gsm8k not found"),
                        (None, "eval reported an error")],
)  # fmt: skip
def test_an_eval_that_reports_its_own_error_is_retried_then_ends_without_a_verdict(
    error: str | None, said: str
) -> None:
    summary = as_summary({"kind": "kvgate.eval/summary", "verdict": "error", "error": error})
    obs = Observation(control=READY, candidate=READY, job_exists=True, eval_summary=summary)
    retry = step(Phase.EVALUATING, obs, eval_attempts=1)
    assert (retry.phase, retry.reason, retry.eval_attempts) == (Phase.EVALUATING, "EvalRetry", 2)
    final = step(Phase.EVALUATING, obs, eval_attempts=2)
    assert (final.phase, final.reason) == (Phase.ROLLED_BACK, "EvalError")
    assert final.message == f"eval failed 2 time(s), last: {said}"
    assert Action.PATCH_DEPLOYMENT not in final.actions


@pytest.mark.parametrize("mode", ["report", "gate"])
def test_a_verdict_in_a_mode_that_never_patches_is_reported_even_when_approved(mode: str) -> None:
    spec = RolloutSpec.from_dict({"targetRef": {"name": "qwen"}, "promotion": {"mode": mode}})
    gates = {"capacityGain": GateResult("capacityGain", Outcome.SUCCESSFUL, "CapacityGained", "")}
    s = machine.next_step(
        spec,
        State(phase=Phase.AWAITING_APPROVAL, gates=gates, config_hash="h1", approval="h1"),
        Observation(),
        poll_s=2.0,
    )
    assert (s.phase, s.reason, s.actions) == (Phase.AWAITING_APPROVAL, "VerdictReported", ())
