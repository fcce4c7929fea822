"""A result that is there decides, however late it is read; a timeout only stands in for one
that is not there.

The operator can be away for longer than a phase's bound (a drained node, a crash loop, a lost
leader election): back, it reads `phase_elapsed_s` far past the bound, and its observation may
already hold what the phase waited for (the arms Ready, a crash, the eval or load summary, the
rolled-out pods, the merge, the read-back). Each phase with a deadline is given that result
with an elapsed time past every bound, and must decide on the result: pass or fail on its
merits, never "did not finish in time". The reverse holds too: with the result missing the
timeout ends the phase, and no timeout or missing result ever promotes.

Two bounds are absolute on purpose and are asserted as such, with why: the approval's TTL (the
evidence expires, docs/security.md) and the verify window (it must be observed live, not
inferred across a gap). `deadlines.give_up` runs only when a reconcile failed, so no result is
there by construction: its bounds are the ones README's phase table promises.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from evidence import as_scan, as_summary, as_truth
from fake_cluster import field_load, load_error_summary
from test_proposing import OPENED
from test_verdict import SUMMARY_PASS

from kvgate.evidence.kubeobjects import PodHealth
from kvgate.flow import deadlines, machine
from kvgate.flow.steps import (
    Action,
    LiveTarget,
    Observation,
    PullRequestSeen,
    State,
    Step,
)
from kvgate.records.loadresult import LoadSummary
from kvgate.records.status import GateResult, PullRequestStatus, RevertStatus
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import PATCHED_PHASES, Outcome, Phase, PullRequestState

SPEC = RolloutSpec.from_dict(
    {
        "targetRef": {"name": "qwen"},
        "gates": {"capacity": {"samples": 3, "window": "30s"}},
        "canary": {"startupTimeout": "60s", "evalTimeout": "600s", "evalRetries": 1},
        "promotion": {"verifyWindow": "20s", "verifySamples": 5, "verifyInterval": "5s"},
    }
)
LOAD = RolloutSpec.from_dict(
    {
        "targetRef": {"name": "qwen"},
        "gates": {"capacity": {"mode": "off"}, "capacityGain": {"throughputGain": {}}},
        "canary": {"startupTimeout": "60s", "evalTimeout": "600s", "evalRetries": 1},
    }
)
PULL_REQUEST = RolloutSpec.from_dict(
    {
        "targetRef": {"name": "qwen"},
        "promotion": {
            "mode": "pullRequest",
            "pullRequest": {
                "provider": "gitea",
                "apiUrl": "http://127.0.0.1:3000/api/v1",
                "repository": "ops/serving",
                "path": "apps/qwen/kvgate-patch.yaml",
                "tokenSecretRef": {"name": "forge-token"},
                "applyDeadline": "10m",
            },
        },
    }
)
# Ten days away: past every bound of these specs (the approval TTL of 72 h included).
LATE = 10 * 24 * 3600.0

READY = PodHealth(True, ready=True, ip="127.0.0.9")
STARTING = PodHealth(True, detail="starting")
CRASHED = PodHealth(True, crashed=True, detail="exited with code 1 (Error)")
CARRIES = LiveTarget(exists=True, carries_candidate=True, ours_present=True)
AS_EVALUATED = LiveTarget(exists=True, as_evaluated=True)
CLEAN = LiveTarget(exists=True, as_evaluated=True, ours_present=False)
INTENT = RevertStatus(Phase.ROLLED_BACK, "PromotionReverted", "promotion reverted: new pods failed")


def step(
    phase: Phase, obs: Observation, spec: RolloutSpec = SPEC, ttl: float | None = None, **state: Any
) -> Step:
    state.setdefault("phase_elapsed_s", LATE)
    return machine.next_step(spec, State(phase=phase, **state), obs, poll_s=2.0, approval_ttl_s=ttl)


def decided(s: Step) -> tuple[Phase, str]:
    """Where the step goes and why; for a step entering Reverting, the end it records."""
    if s.phase is Phase.REVERTING and s.revert is not None:
        return s.revert.phase, str(s.revert.reason)
    return s.phase, str(s.reason)


def never_promotes(s: Step, was: Phase | None = None) -> None:
    """Not Promoted, no patch, and no step into a promotion (staying where it `was` is none)."""
    assert s.phase is not Phase.PROMOTED and Action.PATCH_DEPLOYMENT not in s.actions
    promoting = (Phase.PROMOTING, Phase.PULL_REQUEST_OPEN)
    assert s.phase is was or s.phase not in promoting, s.message


def scan(dtype: str = "fp8", tokens: int = 200_000, failed: bool = False) -> dict[str, Any]:
    return {
        "engine": "vllm",
        "kv_cache_dtype": dtype,
        "attention_backend": "FLASH_ATTN",
        "capacity": {"kv_tokens": tokens},
        "ready": not failed,
        "failed": failed,
        "findings": (
            [{"code": "engine-start-failed", "severity": "error", "text": "EngineCore failed."}]
            if failed
            else []
        ),
    }


def truth(dtype: str, tokens: int) -> dict[str, Any]:
    return {
        "engine": "vllm",
        "cacheConfig": {"block_size": "16", "cache_dtype": dtype,
                        "num_gpu_blocks": str(tokens // 16)},
    }  # fmt: skip


# Both arms Ready, their logs and /metrics read and agreeing; the candidate holds twice the tokens.
ARMS_READ: dict[str, Any] = {
    "control": READY,
    "candidate": READY,
    "control_scan": as_scan(scan("auto", 100_000)),
    "candidate_scan": as_scan(scan("fp8", 200_000)),
    "control_metrics": as_truth(truth("auto", 100_000)),
    "candidate_metrics": as_truth(truth("fp8", 200_000)),
}
CAPACITY = {"capacityGain": GateResult("capacityGain", Outcome.SUCCESSFUL, "CapacityGained", "2x")}


# --- Pending: the target ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seen", "end"),
    [
        (Observation(), (Phase.PREFLIGHT, "Preflight")),
        (Observation(target_problem="no readinessProbe"), (Phase.FAILED, "InvalidTarget")),
        (Observation(conflicts=("older",)), (Phase.FAILED, "RolloutConflict")),
        # absent: the Deployment is not there, and the startup timeout has passed
        (Observation(target_missing=True), (Phase.FAILED, "TargetNotFound")),
    ],
)
def test_pending_decides_on_the_target_it_reads(seen: Observation, end: tuple[Phase, str]) -> None:
    assert decided(step(Phase.PENDING, seen)) == end


# --- Preflight: the pool samples --------------------------------------------------------------


@pytest.mark.parametrize(
    ("seen", "end"),
    [
        (Observation(pool_samples=3, pool_pressured=True), (Phase.CANARY, "CanaryStarting")),
        (Observation(pool_samples=3, pool_pressured=False), (Phase.NOT_NEEDED, "PoolHasRoom")),
        # absent: too few samples at the sampling deadline leave the pool unknown, fail closed
        (Observation(pool_samples=1), (Phase.FAILED, "PoolPressureUnknown")),
    ],
)
def test_preflight_decides_on_the_pool_verdict_it_reads(
    seen: Observation, end: tuple[Phase, str]
) -> None:
    assert decided(step(Phase.PREFLIGHT, seen)) == end


# --- Canary: the arms' startup ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("seen", "end"),
    [
        # both Ready, logs and metrics read: the canary gates judge them, no CanaryTimeout
        (Observation(**ARMS_READ), (Phase.EVALUATING, "Evaluating")),
        (Observation(control=READY, candidate=CRASHED), (Phase.ROLLED_BACK, "CanaryCrashed")),
        (Observation(control=CRASHED, candidate=STARTING), (Phase.ROLLED_BACK, "CanaryCrashed")),
        # read, but what they say fails: the candidate's log and /metrics disagree
        (
            Observation(**{**ARMS_READ, "candidate_metrics": as_truth(truth("auto", 200_000))}),
            (Phase.ROLLED_BACK, "LogMetricsDisagree"),
        ),
        # absent: an arm not Ready, or /metrics never read, at the startup timeout
        (Observation(control=READY, candidate=STARTING), (Phase.ROLLED_BACK, "CanaryTimeout")),
        (
            Observation(**{**ARMS_READ, "candidate_metrics": None}),
            (Phase.ROLLED_BACK, "MetricsUnreadable"),
        ),
    ],
)
def test_canary_decides_on_the_arms_it_reads(seen: Observation, end: tuple[Phase, str]) -> None:
    s = step(Phase.CANARY, seen)
    assert decided(s) == end, s.message
    never_promotes(s)


# --- Evaluating: the eval summary -------------------------------------------------------------

EVAL_DONE = Observation(control=READY, candidate=READY, job_exists=True)


@pytest.mark.parametrize(
    ("summary", "attempts", "end"),
    [
        ({}, 1, (Phase.PROMOTING, "Promoting")),
        ({"verdict": "fail"}, 1, (Phase.ROLLED_BACK, "AccuracyRegressed")),
        # an attempt that reported its own error is retried within evalRetries, then ends on
        # that error (not "did not finish")
        ({"verdict": "error", "error": "engine 500"}, 1, (Phase.EVALUATING, "EvalRetry")),
        ({"verdict": "error", "error": "engine 500"}, 2, (Phase.ROLLED_BACK, "EvalError")),
    ],
)
def test_evaluating_decides_on_the_summary_it_reads(
    summary: dict[str, Any], attempts: int, end: tuple[Phase, str]
) -> None:
    seen = replace(EVAL_DONE, eval_summary=as_summary({**SUMMARY_PASS, **summary}))
    s = step(Phase.EVALUATING, seen, eval_attempts=attempts, gates=CAPACITY)
    assert decided(s) == end, s.message
    assert "did not finish" not in s.message
    if s.reason == "EvalError":
        assert s.message == "eval failed 2 time(s), last: engine 500"


def test_evaluating_without_a_summary_times_out_and_a_lost_arm_voids_it() -> None:
    absent = step(Phase.EVALUATING, EVAL_DONE, eval_attempts=2)
    assert decided(absent) == (Phase.ROLLED_BACK, "EvalError")
    assert "did not finish within 1260s" in absent.message
    lost = step(Phase.EVALUATING, replace(EVAL_DONE, candidate=CRASHED), eval_attempts=2)
    assert decided(lost) == (Phase.ROLLED_BACK, "CanaryCrashed")


# --- Measuring: the load summary --------------------------------------------------------------


def load_gates() -> dict[str, GateResult]:
    """The gates a passing canary and eval recorded before Measuring (as status keeps them)."""
    canary = step(Phase.CANARY, Observation(**ARMS_READ), LOAD, phase_elapsed_s=1)
    evaluated = step(
        Phase.EVALUATING,
        replace(EVAL_DONE, eval_summary=as_summary(SUMMARY_PASS)),
        LOAD,
        eval_attempts=1,
        phase_elapsed_s=1,
        gates={g.gate: g for g in canary.gates},
    )
    assert evaluated.phase is Phase.MEASURING, evaluated.message
    return {g.gate: g for g in (*canary.gates, *evaluated.gates)}


LOAD_RAN = Observation(control=READY, candidate=READY, load_job_exists=True)


@pytest.mark.parametrize(
    ("summary", "attempts", "end"),
    [
        (field_load(64), 1, (Phase.PROMOTING, "Promoting")),
        (field_load(64, fp8_gains=False), 1, (Phase.NOT_NEEDED, "ThroughputNotNeeded")),
        (load_error_summary(64), 1, (Phase.MEASURING, "LoadRetry")),
        (load_error_summary(64), 2, (Phase.FAILED, "LoadError")),
    ],
)
def test_measuring_decides_on_the_load_summary_it_reads(
    summary: dict[str, Any], attempts: int, end: tuple[Phase, str]
) -> None:
    seen = replace(LOAD_RAN, load_summary=LoadSummary.from_dict(summary), production_concurrency=64)
    s = step(Phase.MEASURING, seen, LOAD, load_attempts=attempts, gates=load_gates())
    assert decided(s) == end, s.message
    assert "did not finish" not in s.message


def test_measuring_without_a_summary_times_out_and_never_promotes() -> None:
    s = step(Phase.MEASURING, LOAD_RAN, LOAD, load_attempts=2, gates=load_gates())
    assert decided(s) == (Phase.FAILED, "LoadError") and "did not finish within" in s.message
    never_promotes(s)


# --- AwaitingApproval: the approval (its TTL is absolute on purpose) ---------------------------

MANUAL = RolloutSpec.from_dict({"targetRef": {"name": "qwen"}, "promotion": {"mode": "manual"}})


def test_an_approval_read_late_promotes_when_no_ttl_bounds_it() -> None:
    # Without an approval TTL nothing in AwaitingApproval times out: the approval decides.
    s = step(Phase.AWAITING_APPROVAL, Observation(live=AS_EVALUATED), MANUAL, config_hash="h1",
             gates=CAPACITY, approval="h1", approver="carol")  # fmt: skip
    assert decided(s) == (Phase.PROMOTING, "Promoting")


def test_an_approval_read_past_the_ttl_expires_even_if_given_in_time() -> None:
    # Deliberately absolute: "Evidence expires: a rollout still waiting KVGATE_APPROVAL_TTL after
    # its verdict ends RolledBack/ApprovalExpired" (docs/security.md), and the approval must come
    # "within approvalPolicy.expireAfter of the verdict" (docs/rollout.md). The annotation
    # carries no time, so an approval given in time cannot be told from one given late; and
    # either way the evidence the patch would rest on is older than the TTL. Fail closed.
    s = step(Phase.AWAITING_APPROVAL, Observation(live=AS_EVALUATED), MANUAL, ttl=72 * 3600.0,
             config_hash="h1", gates=CAPACITY, approval="h1", approver="carol")  # fmt: skip
    assert decided(s) == (Phase.ROLLED_BACK, "ApprovalExpired")
    never_promotes(s)


# --- Promoting: the Deployment's rollout ------------------------------------------------------


@pytest.mark.parametrize(
    ("seen", "end", "says"),
    [
        # rolled out, its pods' startup log clean: verify it (the window is observed live next)
        (
            Observation(live=CARRIES, rollout_done=True, rollout_scan=as_scan(scan())),
            (Phase.VERIFYING, "Verifying"),
            "new pods ready",
        ),
        (
            Observation(live=CARRIES, rollout_crashed="pod x: restarted 1x"),
            (Phase.ROLLED_BACK, "PromotionReverted"),
            "new pods failed: pod x: restarted 1x",
        ),
        (
            Observation(live=CARRIES, rollout_done=True, rollout_scan=as_scan(scan(failed=True))),
            (Phase.ROLLED_BACK, "PromotionReverted"),
            "EngineCore failed.",
        ),
        # absent: not rolled out at the startup timeout
        (
            Observation(live=CARRIES),
            (Phase.ROLLED_BACK, "PromotionReverted"),
            "not rolled out within 60s",
        ),
    ],
)
def test_promoting_decides_on_the_rollout_it_reads(
    seen: Observation, end: tuple[Phase, str], says: str
) -> None:
    s = step(Phase.PROMOTING, seen, patched=True)
    assert decided(s) == end, s.message
    assert says in (s.revert.message or "" if s.revert is not None else s.message)
    assert Action.PATCH_DEPLOYMENT not in s.actions


def test_promoting_adopts_a_patch_found_late_and_refuses_a_changed_target() -> None:
    adopt = step(Phase.PROMOTING, Observation(live=CARRIES))
    assert (adopt.phase, adopt.patched, adopt.actions) == (Phase.PROMOTING, True, ())
    changed = LiveTarget(exists=True, differences=("image",))
    assert decided(step(Phase.PROMOTING, Observation(live=changed))) == (
        Phase.FAILED,
        "TargetChanged",
    )


# --- Verifying: the live window (absolute on purpose) -----------------------------------------


def test_a_window_observed_live_promotes_however_long_the_phase_lasted() -> None:
    # The phase may be long (the window restarted after an earlier gap): a window of samples
    # observed live decides; Verifying's bound is give_up's, for failing reconciles only.
    s = step(Phase.VERIFYING, Observation(live=CARRIES, sampled=True), verify_samples=4,
             since_last_sample_s=5, window_elapsed_s=20)  # fmt: skip
    assert decided(s) == (Phase.PROMOTED, "Promoted")


def test_samples_across_the_operators_absence_do_not_complete_the_window() -> None:
    # Deliberately absolute: a verify window is production observed live ("The verify window
    # takes N samples", docs/rollout.md); an operator away for longer than two intervals saw
    # nothing in between, so its window starts over and only a live window promotes.
    s = step(Phase.VERIFYING, Observation(live=CARRIES, sampled=True), verify_samples=4,
             since_last_sample_s=LATE, window_elapsed_s=LATE)  # fmt: skip
    assert (s.phase, s.verify_samples, s.restart_window) == (Phase.VERIFYING, 1, True)
    never_promotes(s)


def test_a_failed_verify_sample_read_late_reverts() -> None:
    seen = Observation(live=CARRIES, sampled=True, production_problem="pod y is not Ready")
    s = step(Phase.VERIFYING, seen, verify_samples=4, since_last_sample_s=LATE, patched=True)
    assert decided(s) == (Phase.ROLLED_BACK, "PromotionReverted")
    assert s.revert is not None and "pod y is not Ready" in (s.revert.message or "")


# --- Reverting: the read-back -----------------------------------------------------------------


def test_a_clean_read_back_ends_reverting_however_late() -> None:
    s = step(Phase.REVERTING, Observation(live=CLEAN), revert=INTENT, revert_attempts=3)
    assert (s.phase, s.reason, s.message) == (
        Phase.ROLLED_BACK,
        "PromotionReverted",
        "promotion reverted: new pods failed",
    )


def test_a_revert_not_read_back_is_retried_now_and_never_ends() -> None:
    s = step(Phase.REVERTING, Observation(live=CARRIES), revert=INTENT, revert_attempts=3,
             revert_error="403 Forbidden")  # fmt: skip
    assert (s.phase, s.reason, s.actions) == (
        Phase.REVERTING,
        "RevertFailed",
        (Action.REVERT_DEPLOYMENT,),
    )


# --- PullRequestOpen, PullRequestMerged: the forge and the GitOps tool ------------------------

MERGED = PullRequestStatus(number=7, url=OPENED.url, state="merged", merge_sha="abc123")


@pytest.mark.parametrize(
    ("state", "end"),
    [
        (PullRequestState.MERGED, (Phase.PULL_REQUEST_MERGED, "PullRequestMerged")),
        (PullRequestState.CLOSED, (Phase.DECLINED, "Declined")),
        (PullRequestState.OPEN, (Phase.PULL_REQUEST_OPEN, "PullRequestOpen")),
    ],
)
def test_the_pull_request_decides_as_the_forge_reports_it(
    state: PullRequestState, end: tuple[Phase, str]
) -> None:
    seen = PullRequestSeen(7, OPENED.url or "", state, merge_sha="abc123")
    s = step(Phase.PULL_REQUEST_OPEN, Observation(pull_request=seen), PULL_REQUEST,
             config_hash="0123456789abcdef", pull_request=OPENED)  # fmt: skip
    assert decided(s) == end, s.message


def test_a_merge_applied_promotes_however_late_it_is_read() -> None:
    # The apply deadline (10m) is long past, but the Deployment carries the tested change now.
    s = step(Phase.PULL_REQUEST_MERGED, Observation(applied=True), PULL_REQUEST,
             pull_request=MERGED)  # fmt: skip
    assert decided(s) == (Phase.PROMOTED, "Promoted")
    missing = step(Phase.PULL_REQUEST_MERGED, Observation(apply_gap="args differ"), PULL_REQUEST,
                   pull_request=MERGED)  # fmt: skip
    assert decided(missing) == (Phase.FAILED, "NotApplied")


# --- deadlines.give_up: a failed reconcile has no result --------------------------------------

BOUNDED = [Phase.PENDING, Phase.PREFLIGHT, Phase.CANARY, Phase.EVALUATING, Phase.MEASURING,
           Phase.PROMOTING, Phase.VERIFYING]  # fmt: skip
UNBOUNDED = [Phase.AWAITING_APPROVAL, Phase.PULL_REQUEST_OPEN, Phase.PULL_REQUEST_MERGED]


@pytest.mark.parametrize("phase", BOUNDED)
def test_give_up_past_a_phase_bound_ends_without_promoting(phase: Phase) -> None:
    # give_up is called only when a reconcile raised (observing or acting failed): there is
    # no observation, so no result is there to decide; the phase's bound (README's table,
    # "each phase is bounded by the spec") holds from the first error past it. An end is
    # Failed before the patch, a revert after it.
    late = State(phase=phase, phase_elapsed_s=LATE)
    got = machine.give_up(SPEC, late, "apiserver down", 1, limit=30)
    assert got is not None and "passed its deadline" in got.message
    never_promotes(got)
    if phase in PATCHED_PHASES:
        assert decided(got) == (Phase.ROLLED_BACK, "PromotionReverted")
    else:
        assert (got.phase, got.reason) == (Phase.FAILED, "ExternalErrors")


@pytest.mark.parametrize("phase", UNBOUNDED)
def test_give_up_has_no_bound_where_the_phase_waits_on_people(phase: Phase) -> None:
    # An approval or a merge takes what it takes (the approval TTL is next_step's, above);
    # only errors past the limit end these phases.
    late = State(phase=phase, phase_elapsed_s=LATE)
    assert deadlines.phase_deadline(SPEC, phase) is None
    assert machine.give_up(SPEC, late, "apiserver down", 1, limit=30) is None


def test_reverting_has_no_bound_and_never_ends_on_errors() -> None:
    # Reverting ends only on a clean read-back (sticky, docs/rollout.md): no deadline, and
    # errors past the limit report RevertFailed and keep trying.
    late = State(phase=Phase.REVERTING, phase_elapsed_s=LATE, revert=INTENT)
    assert deadlines.phase_deadline(SPEC, Phase.REVERTING) is None
    assert machine.give_up(SPEC, late, "apiserver down", 1, limit=30) is None
    got = machine.give_up(SPEC, late, "apiserver down", 31, limit=30)
    assert got is not None and (got.phase, got.reason) == (Phase.REVERTING, "RevertFailed")


# --- the reverse: nothing seen, however late, never promotes ----------------------------------

NOTHING_SEEN = [
    (Phase.PENDING, SPEC, {}),
    (Phase.PREFLIGHT, SPEC, {}),
    (Phase.CANARY, SPEC, {}),
    (Phase.EVALUATING, SPEC, {"eval_attempts": 2, "gates": CAPACITY}),
    (Phase.MEASURING, LOAD, {"load_attempts": 2}),
    (Phase.AWAITING_APPROVAL, MANUAL, {"gates": CAPACITY, "config_hash": "h1"}),
    (Phase.PROMOTING, SPEC, {"patched": True}),
    (Phase.VERIFYING, SPEC, {"patched": True, "verify_samples": 4}),
    (Phase.REVERTING, SPEC, {"revert": INTENT, "revert_attempts": 1}),
    (Phase.PULL_REQUEST_OPEN, PULL_REQUEST, {"pull_request": OPENED}),
    (Phase.PULL_REQUEST_MERGED, PULL_REQUEST, {"pull_request": MERGED}),
]


@pytest.mark.parametrize(("phase", "spec", "state"), NOTHING_SEEN)
def test_a_timeout_or_a_missing_result_never_promotes(
    phase: Phase, spec: RolloutSpec, state: dict[str, Any]
) -> None:
    for live in (None, AS_EVALUATED, CARRIES):
        s = step(phase, Observation(live=live), spec, ttl=72 * 3600.0, **state)
        never_promotes(s, phase)
        assert s.verdict is None or s.verdict.decision.value != "Promote", s.message


# --- a recorded attempt whose Job was never made -------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "attempts", "job", "create"),
    [
        (Phase.EVALUATING, {"eval_attempts": 1}, "job_exists", Action.CREATE_EVAL_JOB),
        (Phase.EVALUATING, {"eval_attempts": 2}, "job_exists", Action.CREATE_EVAL_JOB),
        (Phase.MEASURING, {"load_attempts": 1}, "load_job_exists", Action.CREATE_LOAD_JOB),
        (Phase.MEASURING, {"load_attempts": 2}, "load_job_exists", Action.CREATE_LOAD_JOB),
    ],
)
def test_an_attempt_whose_job_was_never_made_has_not_timed_out(
    phase: Phase, attempts: dict[str, int], job: str, create: Action
) -> None:
    # GIVEN the attempt recorded (write-ahead) and the operator away before making its Job
    spec = LOAD if phase is Phase.MEASURING else SPEC
    gates = load_gates() if phase is Phase.MEASURING else CAPACITY
    none = Observation(control=READY, candidate=READY, **{job: False})
    s = step(phase, none, spec, attempt_job_made=False, gates=gates, **attempts)
    # THEN it makes the Job now: no eval or load ran, so none "did not finish"
    assert (s.phase, create in s.actions) == (phase, True), s.message
    assert "did not finish" not in s.message
    never_promotes(s, was=phase)
    # AND a Job that was made and is gone still times out (nothing left to wait for)
    gone = step(phase, none, spec, attempt_job_made=True, gates=gates, **attempts)
    assert "did not finish within" in gone.message
    never_promotes(gone)
