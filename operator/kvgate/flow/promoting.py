"""What happens next once the promotion is decided: patch the Deployment, verify it under
production traffic, or revert it? The phases of `machine.next_step` after the verdict.
"""

from __future__ import annotations

import math

from kvgate.flow.deadlines import revert_backoff, revert_retry_due_s
from kvgate.flow.steps import (
    MIN_DELAY_S,
    Action,
    Event,
    LiveTarget,
    Observation,
    State,
    Step,
    clamp_delay,
    end_step,
    revert_step,
)
from kvgate.judge.gates import CANARY, assess_backend, crash_summary
from kvgate.reasons import Reason
from kvgate.records.status import GateResult, RevertStatus
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import Outcome, Phase


def promoting(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    live = obs.live or LiveTarget(exists=False)
    name = spec.target.name
    if not live.exists:
        return end_step(Phase.FAILED, Reason.TARGET_DELETED, f"Deployment {name} disappeared")
    if not state.patched:
        if live.carries_candidate:
            # The patch went through but its record did not (operator died in between).
            return Step(
                Phase.PROMOTING,
                Reason.ROLLING_OUT,
                f"found the candidate on Deployment {name}; waiting for it to roll out",
                patched=True,
                requeue_s=MIN_DELAY_S,
            )
        if not live.as_evaluated:
            changed = ", ".join(live.differences) or "container"
            return end_step(
                Phase.FAILED,
                Reason.TARGET_CHANGED,
                f"Deployment {name} changed since it was evaluated ({changed}); not promoting "
                "evidence about another config: start a new rollout",
            )
        return Step(
            Phase.PROMOTING,
            Reason.PATCHING,
            f"patching Deployment {name}",
            actions=(Action.PATCH_DEPLOYMENT,),
            requeue_s=MIN_DELAY_S,
        )
    if not live.carries_candidate:
        return _superseded(name)
    if obs.rollout_crashed:
        return _reverted(f": new pods failed: {obs.rollout_crashed}")
    if not obs.rollout_done or obs.rollout_scan is None:
        # Only a rollout not done times out: one seen done late (the operator was away) is
        # judged on its pods, as a late eval or load summary is.
        if state.phase_elapsed_s >= spec.canary.startup_timeout_s:
            timeout = spec.canary.startup_timeout_s
            return _reverted(f": Deployment not rolled out within {timeout:g}s")
        return Step(
            Phase.PROMOTING,
            Reason.ROLLING_OUT,
            f"waiting for Deployment {name} to roll out",
            requeue_s=clamp_delay(poll_s),
        )
    problems: list[GateResult] = []
    if obs.control_scan is not None:
        backend = assess_backend(spec.backend, obs.control_scan, obs.rollout_scan)
        problems = [backend] if backend.outcome.blocks else []
    if obs.rollout_scan.failed:
        what, _ = crash_summary(obs.rollout_scan, "startup log reports a failure")
        problems.append(GateResult(CANARY, Outcome.FAILED, Reason.PROMOTION_FAILED, what))
    if problems:
        return _reverted(": " + "; ".join(p.message for p in problems))
    return Step(
        Phase.VERIFYING,
        Reason.VERIFYING,
        f"new pods ready; verifying production with {spec.promotion.verify_samples} samples "
        f"over {spec.promotion.verify_window_s:g}s",
        verify_samples=0,
        restart_window=True,
        requeue_s=MIN_DELAY_S,
    )


def _reverted(why: str) -> Step:
    return revert_step(Phase.ROLLED_BACK, Reason.PROMOTION_REVERTED, f"promotion reverted{why}")


def _superseded(name: str) -> Step:
    return end_step(
        Phase.FAILED,
        Reason.SUPERSEDED,
        f"Deployment {name} no longer carries the candidate (reverted or edited by someone "
        "else): an external abort; kvgate does not re-apply it",
    )


def verify_due(spec: RolloutSpec, state: State) -> bool:
    """Whether a verify sample is due now (the handler scrapes only then)."""
    last = state.since_last_sample_s
    return last is None or last >= spec.promotion.verify_interval_s * 0.9


def verifying(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    live = obs.live or LiveTarget(exists=False)
    name, p = spec.target.name, spec.promotion
    if not live.exists:
        return end_step(Phase.FAILED, Reason.TARGET_DELETED, f"Deployment {name} disappeared")
    if not live.carries_candidate:
        return _superseded(name)
    if obs.production_problem:
        return _reverted(f" during verification: {obs.production_problem}")
    interval = p.verify_interval_s
    if not obs.sampled:
        left = interval - (state.since_last_sample_s or 0.0)
        return Step(
            Phase.VERIFYING,
            Reason.VERIFYING,
            f"verifying production ({state.verify_samples}/{p.verify_samples} samples)",
            requeue_s=clamp_delay(left),
        )
    gap = state.since_last_sample_s
    # An operator away for longer than two intervals saw nothing: the window starts over.
    restart = gap is not None and gap > 2 * max(interval, MIN_DELAY_S) + MIN_DELAY_S
    samples = 1 if restart else state.verify_samples + 1
    elapsed = 0.0 if restart else state.window_elapsed_s
    if samples >= p.verify_samples and elapsed >= p.verify_window_s:
        return end_step(
            Phase.PROMOTED,
            Reason.PROMOTED,
            f"Deployment {name} runs --kv-cache-dtype {spec.kv_cache_dtype}; verified by "
            f"{samples} samples over {elapsed:.0f}s",
            verify_samples=samples,
        )
    note = " (window restarted after a gap in observation)" if restart else ""
    return Step(
        Phase.VERIFYING,
        Reason.VERIFYING,
        f"verifying production ({samples}/{p.verify_samples} samples){note}",
        verify_samples=samples,
        restart_window=restart,
        requeue_s=clamp_delay(interval),
    )


def reverting(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    intent = state.revert or RevertStatus(Phase.ROLLED_BACK, Reason.PROMOTION_REVERTED, "reverting")
    message = intent.message or ""
    live = obs.live or LiveTarget(exists=False)
    name = spec.target.name
    if not live.exists:
        return end_step(intent.end, intent.why, f"{message} (Deployment {name} is gone)")
    if not live.ours_present:
        # Read back: none of kvgate's edits is left on the Deployment.
        events = (Event(Reason.PROMOTION_REVERTED, f"Deployment {name} read back without kvgate's "
                        "change", warning=True),) if state.patched or state.revert_attempts else ()  # fmt: skip
        return end_step(intent.end, intent.why, message, events=events)
    if not live.container_found:
        message = f"cannot revert Deployment {name}: its container is gone or renamed"
        return Step(
            Phase.REVERTING,
            Reason.REVERT_FAILED,
            message,
            events=(Event(Reason.REVERT_FAILED, message, warning=True),),
            requeue_s=revert_backoff(state.revert_attempts + 1),
        )
    if state.revert_attempts > 0:
        # An earlier attempt did not take (refused, or re-mutated): loud, sticky, retried. Every
        # attempt is read back on the next reconcile (seconds); the back-off spaces attempts.
        why = state.revert_error or "the Deployment still carries kvgate's change after the patch"
        wait_s = revert_retry_due_s(state.revert_attempts) - state.phase_elapsed_s
        message = (
            f"revert of Deployment {name} not confirmed after {state.revert_attempts} "
            f"attempt(s): {why}; "
            + (f"next try in {math.ceil(wait_s)}s" if wait_s > 0 else "trying again now")
        )
        return Step(
            Phase.REVERTING,
            Reason.REVERT_FAILED,
            message,
            actions=() if wait_s > 0 else (Action.REVERT_DEPLOYMENT,),
            events=() if wait_s > 0 else (Event(Reason.REVERT_FAILED, message, warning=True),),
            requeue_s=wait_s if wait_s > 0 else MIN_DELAY_S,
        )
    return Step(
        Phase.REVERTING,
        Reason.REVERTING,
        f"reverting Deployment {name}: {message}",
        actions=(Action.REVERT_DEPLOYMENT,),
        requeue_s=MIN_DELAY_S,
    )
