"""What one reconcile of a rollout comes to: the deletions an earlier reconcile recorded, then
observe, decide and act, each once and in that order. It returns a `context.Reconciled` for
`record.write` to put in status; nothing here writes status or speaks to kopf.

The stage rooms `observe` (with `preflight` and `promoted`), `act` and `record` do not import
each other; `pullrequest` serves both observe and act in pullRequest mode.
"""

from __future__ import annotations

from kvgate.controller.act import act_best_effort, acts, run_pending
from kvgate.controller.changes import NOTHING
from kvgate.controller.context import Begun, Reconciled, Retry, describe
from kvgate.controller.observe import observe
from kvgate.controller.telemetry import RECONCILE_ERRORS
from kvgate.errors import ExternalError, KvgateError
from kvgate.flow import machine
from kvgate.flow.steps import Step
from kvgate.reasons import Reason


def run(begun: Begun) -> Reconciled:
    ctx, phase = begun.ctx, begun.phase
    if begun.ended and not ctx.so_far.pending_actions:
        return Reconciled()
    state = begun.state
    spec, config = ctx.spec, ctx.config
    done = NOTHING  # what the stages that went through found and did, in order
    try:
        done = run_pending(ctx, Step(phase, Reason.CLEANUP, "deleting children"))
        if begun.ended or state is None:  # only the recorded deletions were due
            return Reconciled(cleaned=True)
        obs, findings = observe(ctx.seeing(done), phase, begun.spec_errors, state)
        done = done.then(findings)
        step = machine.next_step(
            spec, state, obs, poll_s=config.poll_interval_s, approval_ttl_s=config.approval_ttl_s
        )
        for fold in acts(ctx, step, done):  # what the actions did, kept up to a failing one
            done = fold
        return Reconciled(step, done)
    except Exception as exc:
        if begun.ended or state is None:  # an ended rollout's deletions: retried, not counted
            if isinstance(exc, ExternalError):
                return Reconciled(retry=Retry(f"cleanup: {exc}", exc))
            raise
        # Not evidence against the candidate: retry, and past the limit (or the phase's
        # deadline) end the rollout, reverting first in the patched phases (never promoting).
        errors = (ctx.so_far.consecutive_errors or 0) + 1
        what = describe(exc)
        RECONCILE_ERRORS.labels(type(exc).__name__).inc()
        if isinstance(exc, KvgateError):
            ctx.logger.warning("reconcile failed: %s", what)
        else:  # a bug: keep the traceback in the log, never in status or Events
            ctx.logger.error("reconcile failed: %s", what, exc_info=exc)
        given_up = machine.give_up(spec, state, what, errors, limit=config.error_limit)
        if given_up is None:
            return Reconciled(done=done, retry=Retry(what, exc, errors))
        return Reconciled(given_up, act_best_effort(ctx, given_up, done))
