"""How long may a phase last, how long between revert attempts, and when does kvgate give up?"""

from __future__ import annotations

from typing import Final

from kvgate.flow.steps import EVAL_GRACE_S, Event, State, Step, end_step, revert_step
from kvgate.reasons import Reason
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import PATCHED_PHASES, Phase

REVERT_BACKOFF_MAX_S: Final = 60.0  # production may be crashing meanwhile: retry every minute


def load_timeout_s(spec: RolloutSpec) -> float:
    """One load attempt's bound (its Job's deadline): throughputGain.timeout, else the eval's."""
    gate = spec.capacity_gain.throughput_gain
    return gate.timeout_s if gate is not None else spec.canary.eval_timeout_s


def _attempt_s(spec: RolloutSpec, phase: Phase) -> float:
    """One eval (Evaluating) or load (Measuring) attempt's bound: its Job's deadline."""
    return load_timeout_s(spec) if phase is Phase.MEASURING else spec.canary.eval_timeout_s


def latest_start_s(spec: RolloutSpec, phase: Phase) -> float:
    """How far into Evaluating or Measuring an attempt's Job may be made and still have its own
    bound and the grace left: the other attempts' bounds (a later one moves the phase clock:
    the operator was away)."""
    return _attempt_s(spec, phase) * spec.canary.eval_retries


def job_phase_deadline(spec: RolloutSpec, phase: Phase) -> float:
    """Evaluating or Measuring: every attempt's bound plus a grace for scheduling."""
    return _attempt_s(spec, phase) * (spec.canary.eval_retries + 1) + EVAL_GRACE_S


def phase_deadline(spec: RolloutSpec, phase: Phase) -> float | None:
    """How long a phase may last, even while observation keeps failing (None: no limit)."""
    c, p, cap = spec.canary, spec.promotion, spec.capacity
    deadlines = {
        Phase.PENDING: c.startup_timeout_s,
        Phase.PREFLIGHT: cap.sampling_deadline_s + c.startup_timeout_s,
        Phase.CANARY: c.startup_timeout_s,
        Phase.EVALUATING: job_phase_deadline(spec, Phase.EVALUATING),
        Phase.MEASURING: job_phase_deadline(spec, Phase.MEASURING),
        Phase.PROMOTING: c.startup_timeout_s,
        Phase.VERIFYING: p.verify_window_s * 3 + c.startup_timeout_s,
    }
    return deadlines.get(phase)


def revert_backoff(attempts: int) -> float:
    """Seconds before the next revert attempt: 5, 10, 20, 40, then every minute."""
    return float(min(5.0 * 2.0 ** max(attempts - 1, 0), REVERT_BACKOFF_MAX_S))


def revert_retry_due_s(attempts: int) -> float:
    """When, in seconds after Reverting began, the attempt after `attempts` refused ones is due
    (status has no per-attempt clock; after an outage overdue attempts come one per read-back)."""
    return sum(revert_backoff(a) for a in range(1, attempts + 1))


def give_up(spec: RolloutSpec, state: State, error: str, errors: int, *, limit: int) -> Step | None:
    """After `limit` consecutive errors, or past the phase's deadline, the rollout ends.

    None: retry. A patched phase does not end: it goes to Reverting, whose end needs a read
    back. Reverting itself never ends here (sticky): it reports RevertFailed and keeps trying.
    Before Promoting kvgate has changed nothing on the Deployment (the patch is only made in
    Promoting, after its intent is recorded), so there the end is Failed.
    """
    deadline = phase_deadline(spec, state.phase)
    late = deadline is not None and state.phase_elapsed_s >= deadline
    if state.phase.terminal or (errors <= limit and not late):
        return None
    why = (
        f"gave up after {errors} consecutive errors (limit {limit})"
        if errors > limit
        else f"phase {state.phase.value} passed its deadline of {deadline:g}s"
    )
    message = f"{why}; last: {error}"
    if state.phase is Phase.REVERTING:
        retry_s = revert_backoff(state.revert_attempts + 1)
        return Step(
            Phase.REVERTING,
            Reason.REVERT_FAILED,
            f"revert not confirmed: {message}; next try in {retry_s:g}s",
            events=(Event(Reason.REVERT_FAILED, message, warning=True),),
            revert=state.revert,
            requeue_s=retry_s,
        )
    if state.phase in PATCHED_PHASES:
        return revert_step(Phase.ROLLED_BACK, Reason.PROMOTION_REVERTED, message)
    return end_step(Phase.FAILED, Reason.EXTERNAL_ERRORS, message)
