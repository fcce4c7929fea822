"""Recording a step: status (conditions, gates, the promotion and revert records), Events, metrics
and the report ConfigMap.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import kopf

from kvgate import redact
from kvgate.controller import reportmap
from kvgate.controller.changes import NOTHING, StatusUpdate
from kvgate.controller.context import Begun, Ctx, Reconciled, Retry
from kvgate.controller.events import post_event
from kvgate.controller.telemetry import PHASE, ROLLBACKS, ROLLOUTS
from kvgate.flow import superseding
from kvgate.flow.steps import Event, Step
from kvgate.judge import verdictkey
from kvgate.judge.gates import ACCURACY, CANARY, CAPACITY_GAIN, POOL, SCALES
from kvgate.reasons import Reason
from kvgate.records import codec as jsonrecord
from kvgate.records import conditions as cond
from kvgate.records.mergepatch import merge_patch, minimal
from kvgate.records.status import (
    EvalStatus,
    GateResult,
    LoadStatus,
    PromotionStatus,
    RolloutStatus,
    VerdictKey,
    VerdictRecord,
    VerifyStatus,
)
from kvgate.records.timestamps import iso, parse_time
from kvgate.vocabulary import (
    VERDICT_REPORTED,
    Outcome,
    Phase,
    PullRequestState,
)

Record = TypeVar("Record", bound=Any)  # a status record (`kvgate.records.status`)


def post_events(ctx: Ctx, events: Iterable[Event]) -> None:
    """The only caller of `events.post_event`."""
    for e in events:
        post_event(ctx, e.reason, e.message, warning=e.warning)


GATE_CONDITIONS = {
    POOL: cond.POOL_PRESSURE,
    SCALES: cond.SCALES_PRESENT,
    CANARY: cond.CANARY_HEALTHY,
    ACCURACY: cond.ACCURACY_NON_INFERIOR,
    CAPACITY_GAIN: cond.CAPACITY_GAINED,
}


def gate_condition_status(result: GateResult) -> str:
    if result.outcome == Outcome.SUCCESSFUL:
        return cond.TRUE
    if result.outcome in (Outcome.FAILED, Outcome.NOT_NEEDED):
        return cond.FALSE
    if result.why.refutes:  # ScalesMissing, PoolHasRoom: known false, not unknown
        return cond.FALSE
    return cond.UNKNOWN


def patch_status(
    patch: kopf.Patch, old: Mapping[str, Any], changes: Mapping[str, Any]
) -> dict[str, Any]:
    """Patch only what the merge patch `changes` changes in `old` (nothing when nothing), so the
    status that results, returned, is the one sending `changes` whole would give."""
    new, changed = minimal(old, changes)
    for key, value in changed.items():
        patch.status[key] = value
    return new


def patch_fields(patch: kopf.Patch, old: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """Patch these `RolloutStatus` fields (None or an empty collection removes one)."""
    keys = {f.name: f.key for f in jsonrecord.fields(RolloutStatus)}
    written = RolloutStatus(**fields).to_dict()
    return patch_status(patch, old, {keys[n]: written.get(keys[n]) for n in fields})


def write(begun: Begun, patch: kopf.Patch, outcome: Reconciled) -> RolloutStatus | None:
    """Put what a reconcile came to in status: the step's status (returned), a retry's error
    count and message, or an ended rollout's deletions done."""
    ctx, old = begun.ctx, begun.old
    if outcome.cleaned:
        patch_fields(patch, old, pending_actions=())
        return None
    retry = outcome.retry
    if retry is not None:
        post_events(ctx, outcome.done.events)  # of what went through before the failure
        if retry.errors:  # an ended rollout's failed cleanup is retried without a count
            write_retry(ctx, patch, old, begun.cleared, retry)
        return None
    if outcome.step is None:
        return None
    return write_status(ctx, patch, old, begun.phase, outcome.step, outcome.done)


def write_retry(
    ctx: Ctx, patch: kopf.Patch, old: Mapping[str, Any], cleared: Mapping[str, Any], retry: Retry
) -> None:
    """A failed reconcile: the keys a new run clears, the failures in a row and the last one,
    and a warning Event on the first and every tenth."""
    patch_status(patch, old, cleared)
    errors = retry.errors
    patch_fields(patch, old, consecutive_errors=errors, message=f"retrying after: {retry.what}")
    if errors == 1 or errors % 10 == 0:
        post_events(ctx, (Event(Reason.RECONCILE_ERROR, retry.message, warning=True),))


def write_status(
    ctx: Ctx,
    patch: kopf.Patch,
    old: Mapping[str, Any],
    old_phase: Phase,
    step: Step,
    done: StatusUpdate,
) -> RolloutStatus:
    """Patch the step's status by what changed from `old` (the body's status); `done` is what
    the stages found and did. Post the Events, metrics and, on the first finish, the report."""
    deployment = (ctx.reads.deployment or {}).get("metadata", {}).get("generation")
    so_far = ctx.seeing(done).so_far
    # what the verdict was reached on, recorded with it
    key = verdictkey.key_of(so_far, ctx.spec) if step.verdict is not None else None
    if step.new_run and superseding.merged(so_far.pull_request):
        step = superseding.merged_meanwhile(step)
    new = folded(ctx.so_far, step, old_phase, done=done, now=iso(ctx.now),
                 generation=ctx.generation, deployment_generation=deployment, verdict_key=key,
                 approval_ttl_s=ctx.config.approval_ttl_s)  # fmt: skip
    status = new.to_dict()
    # The status written is the fold's whole: a key it no longer holds is removed (a nested
    # figure a new reading does not have must not survive from the last one), and a new run's
    # status replaces the last run's.
    for changed, value in merge_patch(old, status).items():  # the changed keys only
        patch.status[changed] = value
    post_events(ctx, (*done.events, *step.events))  # what the stages did, then the step
    for p in Phase:
        PHASE.labels(ctx.namespace, ctx.name, p.value).set(1 if p is step.phase else 0)
    reported = step.reason == VERDICT_REPORTED
    if new.finished_at and not ctx.so_far.finished_at:  # the first finish
        ROLLOUTS.labels(step.phase.value if not reported else "Reported").inc()
        if step.phase is Phase.ROLLED_BACK:
            ROLLBACKS.labels(step.reason).inc()
        reportmap.write_report(ctx, new)
    return new


def scrubbed(step: Step) -> Step:
    """`step` with its free text scrubbed of credentials, as Events are: status is as readable
    as Events, and its messages quote engine log lines (a crash's line, a Job's log tail)."""
    scrub = redact.scrub_text

    def gate(g: GateResult) -> GateResult:
        return dataclasses.replace(g, message=scrub(g.message))

    verdict = step.verdict
    if verdict is not None:
        verdict = dataclasses.replace(
            verdict, message=scrub(verdict.message), reasons=tuple(map(gate, verdict.reasons))
        )
    return dataclasses.replace(
        step,
        message=scrub(step.message),
        gates=tuple(map(gate, step.gates)),
        verdict=verdict,
    )


def folded(
    found: RolloutStatus,
    step: Step,
    old_phase: Phase,
    *,
    done: StatusUpdate | None = None,
    now: str,
    generation: int | None,
    deployment_generation: int | None,
    verdict_key: VerdictKey | None = None,
    approval_ttl_s: float | None = None,
) -> RolloutStatus:
    """The status after `step`, from the status this reconcile found and what its stages found
    and did (`done`). Pure, and the only place a new status is built."""
    step = scrubbed(step)
    done = done or NOTHING
    status = done.applied_to(found)
    if step.new_run:  # a newer spec superseded the run: nothing of it may vote in the next
        status = RolloutStatus(pending_actions=status.pending_actions)
    conditions = status.conditions or cond.initial_conditions(generation, now)
    gates = dict(status.gates)
    for g in step.gates:
        gates[g.gate] = g
        ctype = GATE_CONDITIONS.get(g.gate)
        if ctype is not None:
            conditions = cond.set_condition(
                conditions, ctype, gate_condition_status(g), g.reason, g.message,
                generation=generation, now=now,
            )  # fmt: skip
    reported = step.reason == VERDICT_REPORTED
    conditions = cond.summary_conditions(
        conditions, step.phase, step.reason, step.message,
        generation=generation, now=now, ready_without_terminal=reported,
        stalled=step.reason.stalls or step.gate_closed, gate_closed=step.gate_closed,
    )  # fmt: skip
    phase_since = status.phase_since
    if step.phase is not old_phase or phase_since is None or step.patched:
        phase_since = now  # a patch adopted (its record lost) is timed from here, as one made
    status = dataclasses.replace(
        status,
        phase=step.phase,
        reason=str(step.reason),
        message=step.message,
        observed_generation=generation,
        gates=gates,
        conditions=tuple(conditions),
        consecutive_errors=0,
        started_at=status.started_at or now,
        phase_since=phase_since,
        progress=_progress(status, step),
    )
    since = parse_time(phase_since)
    if (
        step.phase is Phase.AWAITING_APPROVAL
        and not reported
        and approval_ttl_s is not None
        and since
    ):
        # when the operator's approval TTL runs out (machine: phase time >= the TTL)
        expires = iso(since + dt.timedelta(seconds=approval_ttl_s))
        status = dataclasses.replace(status, approval_expires_at=expires)
    if step.eval_attempts is not None:
        ev = dataclasses.replace(status.eval or EvalStatus(), attempt=step.eval_attempts)
        status = dataclasses.replace(status, eval=ev)
    if step.load_attempts is not None:
        load = dataclasses.replace(status.load or LoadStatus(), attempt=step.load_attempts)
        status = dataclasses.replace(status, load=load)
    if step.load is not None:  # the measurement and the gain, beside the attempt's job record
        status = dataclasses.replace(status, load=_over(status.load, step.load))
    if step.verdict is not None:
        status = dataclasses.replace(status, verdict=_verdict(status, step, verdict_key))
    if (
        step.revert is not None
        and step.phase is Phase.REVERTING
        and old_phase is not Phase.REVERTING
    ):
        # The write-ahead record of the revert: how it ends once the Deployment reads back clean
        # (`revert_step`'s phase, reason and message).
        revert = dataclasses.replace(step.revert, started_at=now, attempts=0)
        status = dataclasses.replace(status, revert=revert)
    status = dataclasses.replace(
        status, promotion=_promotion(status.promotion, step, now, deployment_generation)
    )
    if step.pull_request is not None:  # pullRequest mode: the intent, then what the forge said
        # what this reconcile's action did (the opened PR, read back) is later than the step's
        # intent, so it wins over it
        done_pr = done.applied_to(RolloutStatus()).pull_request
        pr = _over(_over(found.pull_request, step.pull_request), done_pr)
        if step.pull_request.state == PullRequestState.MERGED.value and pr.merged_at is None:
            pr = dataclasses.replace(pr, merged_at=now)
        status = dataclasses.replace(status, pull_request=pr)
    if (step.terminal or reported) and status.finished_at is None:
        status = dataclasses.replace(status, finished_at=now)
    return status


def _progress(status: RolloutStatus, step: Step) -> str | None:
    """The step's progress, and none once the eval is over."""
    if step.progress is not None:
        return step.progress
    return None if step.phase is not Phase.EVALUATING else status.progress


def _over(under: Record | None, over: Record | None) -> Record:
    """`over` with its unknown fields taken from `under` (records of one type)."""
    if over is None or under is None:
        found = over if under is None else under
        assert found is not None
        return found
    known = {
        f.name: v for f in dataclasses.fields(over) if (v := getattr(over, f.name)) is not None
    }
    return dataclasses.replace(under, **known)


def _verdict(status: RolloutStatus, step: Step, key: VerdictKey | None) -> VerdictRecord:
    """The step's verdict with its key. A verdict decided again in this run (an approval) rests
    on the same gates: if they were reused, it still says whose (and so is never reused in turn)."""
    assert step.verdict is not None
    reused_from = status.verdict.reused_from if status.verdict is not None else None
    if step.reused is not None:
        reused_from = step.reused.source
    v = step.verdict
    return VerdictRecord(
        decision=v.decision.value,
        outcome=v.outcome,
        message=v.message,
        reasons=tuple(str(r.reason) for r in v.reasons),
        key=key,
        reused_from=reused_from or None,
    )


def _promotion(
    promo: PromotionStatus | None, step: Step, now: str, deployment_generation: int | None
) -> PromotionStatus | None:
    """Adopted when patched, and the verify window's samples."""
    if step.patched:
        promo = promo or PromotionStatus()
        promo = dataclasses.replace(
            promo,
            patched=True,
            adopted_at=now,
            generation=deployment_generation if promo.generation is None else promo.generation,
        )
    if step.verify_samples is not None:
        promo = promo or PromotionStatus()
        verify = promo.verify or VerifyStatus()
        if step.restart_window:
            restarts = (verify.restarts or 0) + 1 if verify.samples else verify.restarts
            verify = dataclasses.replace(verify, window_started_at=now, restarts=restarts)
        verify = dataclasses.replace(
            verify,
            samples=step.verify_samples,
            last_sample_at=now if step.verify_samples else verify.last_sample_at,
        )
        promo = dataclasses.replace(promo, verify=verify)
    return promo
