"""What happens next? The one state machine, `next_step`, and its phases.

Given the spec, what status says and what the handler observed now, `next_step` returns the
next phase, the actions to take, events and the requeue delay. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Final

from kvgate.engines import kvformats
from kvgate.evidence import kubeobjects
from kvgate.evidence.kubeobjects import PodHealth
from kvgate.flow import deadlines, promoting, proposing, steps, superseding
from kvgate.flow.steps import (
    MAX_DELAY_S,
    MIN_DELAY_S,
    Action,
    Event,
    Observation,
    ReusedVerdict,
    State,
    Step,
    clamp_delay,
    end_step,
    eval_progress,
    gate_events,
    revert_step,
)
from kvgate.judge import crash, tradeoff
from kvgate.judge.accuracy import assess_accuracy, assess_divergence, assess_long_context
from kvgate.judge.gates import (
    ACCURACY,
    CANARY,
    ENGINE_TRUTH,
    EVAL_GATES,
    THROUGHPUT,
    assess_arms_dtype,
    assess_backend,
    assess_capacity_gain,
    assess_engine_truth,
    assess_pool,
    assess_scales,
    assess_speed,
    kv_tokens,
)
from kvgate.judge.remedy import Remedy
from kvgate.judge.throughput import assess_throughput
from kvgate.judge.verdict import Decision, Verdict, decide
from kvgate.reasons import Reason
from kvgate.records.status import GateResult, LoadStatus
from kvgate.records.timestamps import duration, waited
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import VERDICT_REPORTED, GateMode, Outcome, Phase, PromotionMode, Remediation

_APPROVAL_S: Final = MAX_DELAY_S / 3  # how often an awaited approval is looked for


def next_step(
    spec: RolloutSpec,
    state: State,
    obs: Observation,
    *,
    poll_s: float,
    approval_ttl_s: float | None = None,
) -> Step:
    """The one transition function: (spec, state, observation) -> next step.

    Whatever the phase decided, an end other than Promoted is only reached when the live
    Deployment carries none of kvgate's edits; otherwise the rollout reverts first. An abort
    (`state.abort`) ends any running phase that way; an approval that has not come within
    `approval_ttl_s` of the verdict never comes (the evidence is stale). In gate mode every
    end but a passing verdict closes the gate.
    """
    step = _step(spec, state, obs, poll_s=poll_s, approval_ttl_s=approval_ttl_s)
    if spec.promotion.mode is PromotionMode.PULL_REQUEST:
        if (intent := step.revert) is not None:
            # kvgate never changes the Deployment in pullRequest mode, so it never reverts it
            # either: what the GitOps tool applied stays until Git changes.
            step = end_step(
                intent.end,
                intent.why,
                f"{intent.message or ''}; the Deployment is left as it is (pullRequest mode: "
                "change it in Git)",
                gates=step.gates,
                verdict=step.verdict,
                events=step.events,
            )
        return proposing.closing(spec, state, step)
    if spec.promotion.mode is PromotionMode.GATE and step.terminal:
        # Fail closed: NotNeeded and Failed close the gate too; nothing here was shown safe.
        message = f"gate closed: {step.message}"
        return replace(step, gate_closed=True, message=message)
    return step


def give_up(spec: RolloutSpec, state: State, error: str, errors: int, *, limit: int) -> Step | None:
    """`deadlines.give_up` (None: retry), closing an open pull request as every end does."""
    step = deadlines.give_up(spec, state, error, errors, limit=limit)
    return None if step is None else proposing.closing(spec, state, step)


def _step(
    spec: RolloutSpec,
    state: State,
    obs: Observation,
    *,
    poll_s: float,
    approval_ttl_s: float | None,
) -> Step:
    handler = _PHASES.get(state.phase)
    if handler is None:  # terminal: nothing moves
        return Step(state.phase, Reason.TERMINAL, f"rollout is {state.phase.value}")
    live = obs.live
    if (
        live is not None
        and live.ours_present
        and state.phase in (Phase.PREFLIGHT, Phase.CANARY, Phase.EVALUATING, Phase.MEASURING)
    ):
        # kvgate patches only in Promoting: a candidate on the Deployment now was put there by a
        # crashed run or by hand, and nothing here says it should stay.
        return revert_step(
            Phase.ROLLED_BACK,
            Reason.UNEXPECTED_PATCH,
            f"the Deployment carries the candidate config while the rollout is "
            f"{state.phase.value} (not promoted); reverting it",
        )
    if state.abort is not None and state.phase is not Phase.REVERTING:
        step = end_step(Phase.ROLLED_BACK, Reason.ABORTED, state.abort)
    elif (superseded := superseding.superseded(spec, state, obs)) is not None:
        return superseded
    elif (
        state.phase is Phase.AWAITING_APPROVAL
        and approval_ttl_s is not None
        and state.phase_elapsed_s >= approval_ttl_s
    ):
        step = end_step(
            Phase.ROLLED_BACK,
            Reason.APPROVAL_EXPIRED,
            f"no approval within {approval_ttl_s:g}s of the verdict: the evidence is stale; "
            "change the spec (or re-create the rollout) to evaluate again",
        )
    else:
        step = handler(spec, state, obs, poll_s)
    if (
        step.terminal
        and step.phase is not Phase.PROMOTED
        and live is not None
        and live.exists
        and live.ours_present
    ):
        return revert_step(step.phase, step.reason, step.message, gates=step.gates,
                       verdict=step.verdict)  # fmt: skip
    return step


def _pending(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    if obs.spec_errors:
        return end_step(Phase.FAILED, Reason.INVALID_SPEC, "; ".join(obs.spec_errors))
    if obs.target_missing:
        if state.phase_elapsed_s >= spec.canary.startup_timeout_s:
            return end_step(
                Phase.FAILED,
                Reason.TARGET_NOT_FOUND,
                f"Deployment {spec.target.name} not found within "
                f"{spec.canary.startup_timeout_s:g}s; create it, then the rollout",
            )
        return Step(
            Phase.PENDING,
            Reason.WAITING_FOR_TARGET,
            f"waiting for Deployment {spec.target.name}",
            requeue_s=clamp_delay(poll_s),
        )
    if obs.target_problem:
        return end_step(Phase.FAILED, Reason.INVALID_TARGET, obs.target_problem)
    if obs.dtype_problem:
        return end_step(Phase.FAILED, Reason.INVALID_SPEC, obs.dtype_problem)
    if obs.conflicts:
        return end_step(
            Phase.FAILED,
            Reason.ROLLOUT_CONFLICT,
            f"Deployment {spec.target.name} already has an active rollout: "
            f"{', '.join(obs.conflicts)}; wait for it or delete it",
        )
    return Step(
        Phase.PREFLIGHT,
        Reason.PREFLIGHT,
        f"checking whether the KV pool of {spec.target.name} is the limit",
        requeue_s=MIN_DELAY_S,
    )


def control_runs_fp8(reasons: Sequence[str], production_dtype: str, target: str) -> str | None:
    """Why the control arm would run FP8 (the checkpoint forces it under `auto`); None when it
    does not: no such checkpoint, or production pins a dtype (an explicit dtype wins)."""
    if not reasons or production_dtype != "auto":
        return None
    return (
        f"the checkpoint forces an FP8 KV cache under --kv-cache-dtype auto ({'; '.join(reasons)})"
        f" and {target} runs auto: production and the control run FP8 already, so "
        "the canary would compare FP8 with FP8; pin the dtype (--kv-cache-dtype bfloat16) first"
    )


def control_mismatch(
    stated: str, runs: str | None, production_dtype: str, engine: str, target: str
) -> str | None:
    """Why the control format the spec states is not the one production runs (`runs`: what
    production's --kv-cache-dtype stores on this checkpoint, None when unknown); None when it
    is, or under `auto`. Unknown is not a match: fail closed."""
    if stated == "auto" or (runs is not None and kvformats.same_storage(engine, stated, runs)):
        return None
    if runs is None:
        return (
            f"spec.kvCache.control.format: '{stated}' is stated, but what {target} stores under "
            f"--kv-cache-dtype {production_dtype} is unknown (the checkpoint was not read); pin "
            "production's dtype, or state auto"
        )
    how = f"--kv-cache-dtype {production_dtype}" + (
        " on this checkpoint" * (runs != production_dtype)
    )
    return (
        f"spec.kvCache.control.format: '{stated}' is stated, but {target} runs {runs} ({how}); "
        "state the format production runs, or auto"
    )


def _preflight(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    if obs.skip_layers_problem:  # known once the model's config is read: still the spec's fault
        return end_step(Phase.FAILED, Reason.INVALID_SPEC, obs.skip_layers_problem)
    stated, target = spec.kv_cache.control_format, spec.target.name
    mismatch = control_mismatch(
        stated, obs.control_stores, obs.production_kv_dtype, obs.engine, target
    )
    if mismatch:  # production runs another format than the spec says: fail closed
        return end_step(Phase.FAILED, Reason.INVALID_SPEC, mismatch)
    # A stated control that matched is the rollout's own baseline: FP8 to another format is asked.
    forced = stated == "auto" and control_runs_fp8(obs.forces_fp8, obs.production_kv_dtype, target)
    if forced:  # no BF16 arm to compare with: fail before any canary
        return end_step(Phase.FAILED, Reason.CONTROL_RUNS_FP8, forced)
    gate = spec.capacity
    sampling = obs.pool_samples < gate.samples and state.phase_elapsed_s < gate.sampling_deadline_s
    if gate.mode is not GateMode.OFF and obs.pool_pressured is None and sampling:
        return Step(
            Phase.PREFLIGHT,
            Reason.SAMPLING_POOL,
            f"sampling pool pressure {obs.pool_samples}/{gate.samples}",
            requeue_s=clamp_delay(gate.interval_s),
        )
    pool = assess_pool(gate, obs.pool_pressured, obs.pool_detail or "no samples")
    if pool.outcome is Outcome.NOT_NEEDED:
        return end_step(Phase.NOT_NEEDED, Reason.POOL_HAS_ROOM, pool.message, gates=(pool,))
    if pool.outcome.blocks:
        return end_step(Phase.FAILED, pool.why, pool.message, gates=(pool,))
    events: tuple[Event, ...] = ()
    if pool.outcome is Outcome.WARNING:
        events = (Event(pool.why, pool.message, warning=pool.why is not Reason.POOL_HAS_ROOM),)
    return Step(
        Phase.CANARY,
        Reason.CANARY_STARTING,
        "starting the control and candidate pods",
        actions=(Action.CREATE_CANARIES,),
        events=events,
        gates=(pool,),
        requeue_s=clamp_delay(poll_s),
    )


def _canary(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    control = obs.control or PodHealth(False)
    candidate = obs.candidate or PodHealth(False)
    for arm, health, scan in (
        ("candidate", candidate, obs.candidate_scan),
        ("control", control, obs.control_scan),
    ):
        if health.crashed:
            fix = obs.remedy if arm == "candidate" else None
            crashed = crash.describe(
                arm,
                scan,
                health.detail,
                fix,
                auto=spec.canary.remediation is Remediation.AUTO,
                already_applied=arm == "candidate" and bool(state.remedy_attempts),
            )
            if fix is not None:
                step = _remediate(spec, state, fix, crashed)
                if step is not None:
                    return step
            message = crashed.message
            return _ended(Phase.ROLLED_BACK, CANARY, Outcome.FAILED, Reason.CANARY_CRASHED, message)
    if not (control.ready and candidate.ready):
        arms = {"control": control, "candidate": candidate}
        stuck = {arm: h for arm, h in arms.items() if h.unschedulable and not h.ready}
        timed_out = state.phase_elapsed_s >= spec.canary.startup_timeout_s
        if stuck and (timed_out or any(kubeobjects.never_fits(h) for h in stuck.values())):
            # no node took a canary: no verdict, so Failed (never a rollback)
            within = duration(spec.canary.startup_timeout_s) if timed_out else None
            message = kubeobjects.unschedulable_message(stuck, within)
            return _ended(Phase.FAILED, CANARY, Outcome.ERROR, Reason.CANARY_UNSCHEDULABLE, message)
        if timed_out:
            waiting = [a for a, h in arms.items() if not h.ready]
            message = (
                f"{' and '.join(waiting)} not Ready within {spec.canary.startup_timeout_s:g}s "
                f"({candidate.detail if not candidate.ready else control.detail})"
            )
            return _ended(Phase.ROLLED_BACK, CANARY, Outcome.ERROR, Reason.CANARY_TIMEOUT, message)
        missing = not (control.exists and candidate.exists)
        return Step(
            Phase.CANARY,
            Reason.WAITING_FOR_CANARY,
            f"waiting for canary pods Ready ({waited(state.phase_elapsed_s)} of at most "
            f"{duration(spec.canary.startup_timeout_s)}): {kubeobjects.said_once(arms)}",
            actions=(Action.CREATE_CANARIES,) if missing else (),
            requeue_s=clamp_delay(poll_s),
        )
    if obs.control_scan is None or obs.candidate_scan is None:
        return Step(
            Phase.CANARY, Reason.READING_LOGS, "reading startup logs", requeue_s=clamp_delay(poll_s)
        )
    if obs.control_metrics is None or obs.candidate_metrics is None:
        if state.phase_elapsed_s >= spec.canary.startup_timeout_s:
            message = (
                f"the arms' /metrics were not readable within {spec.canary.startup_timeout_s:g}s"
                f" ({obs.metrics_error or 'no scrape answered'}): the log cannot be checked"
            )
            return _ended(
                Phase.ROLLED_BACK, ENGINE_TRUTH, Outcome.ERROR, Reason.METRICS_UNREADABLE, message
            )
        why = f": {obs.metrics_error}" if obs.metrics_error else ""
        return Step(
            Phase.CANARY, Reason.READING_METRICS, f"reading the arms' /metrics{why}",
            requeue_s=clamp_delay(poll_s),
        )  # fmt: skip
    healthy = assess_arms_dtype(
        spec.kv_cache_dtype, obs.control_scan, obs.candidate_scan, obs.candidate_metrics
    )
    truth = assess_engine_truth(
        {"control": obs.control_scan, "candidate": obs.candidate_scan},
        {"control": obs.control_metrics, "candidate": obs.candidate_metrics},
    )
    gates = (
        healthy,
        truth,
        assess_scales(
            spec.scales,
            obs.checkpoint_has_scales,
            obs.candidate_scan,
            obs.broken_scales,
            spec.kv_cache_dtype,
        ),
        assess_backend(spec.backend, obs.control_scan, obs.candidate_scan),
        assess_capacity_gain(
            spec.capacity_gain,
            kv_tokens(obs.control_scan, obs.control_metrics),
            kv_tokens(obs.candidate_scan, obs.candidate_metrics),
        ),
    )
    events = gate_events(gates)
    early = decide(gates, mode=PromotionMode.AUTO, config_hash="", approval="")
    if early.decision is Decision.ROLL_BACK:
        reason = early.reasons[0].why
        return end_step(
            Phase.ROLLED_BACK, reason, early.message, gates=gates, events=events, verdict=early
        )
    if obs.reused_verdict is not None:
        return _reused(spec, state, obs.reused_verdict, gates, events)
    if spec.accuracy.mode is GateMode.OFF:  # no eval Job; the accuracy gate says so
        message = "accuracy not evaluated: spec.gates.accuracy.mode is off"
        skipped = GateResult(ACCURACY, Outcome.SKIPPED, Reason.ACCURACY_OFF, message)
        return _judged(spec, state, (), (*gates, skipped), events, poll_s, "accuracy off")
    return Step(
        Phase.EVALUATING,
        Reason.EVALUATING,
        f"running the paired {spec.accuracy.task} eval ({spec.accuracy.questions} questions)",
        # Write-ahead: this step records attempt 1; the next reconcile makes its NetworkPolicy
        # and Job (`_evaluating`), so that whatever ends the rollout finds them by status.
        events=events,
        gates=gates,
        requeue_s=clamp_delay(poll_s),
        eval_attempts=1,
    )


def _reused(
    spec: RolloutSpec,
    state: State,
    reused: ReusedVerdict,
    gates: tuple[GateResult, ...],
    events: tuple[Event, ...],
) -> Step:
    """spec.reuseVerdict: another rollout's eval and load gates (same verdict key) stand in for
    this one's; the canary's gates were judged here."""
    results = (*gates, *reused.gates)
    verdict = decide(results, mode=spec.promotion.mode, config_hash=state.config_hash,
                     approval=state.approval)  # fmt: skip
    events = (*events, Event(Reason.VERDICT_REUSED, reused.message))
    if verdict.decision is Decision.ROLL_BACK:
        return end_step(Phase.ROLLED_BACK, verdict.reasons[0].why, verdict.message,
                        gates=results, verdict=verdict, events=events, reused=reused)  # fmt: skip
    step = _after_verdict(spec, state, verdict, results)
    return replace(step, events=(*events, *step.events), reused=reused)


def _remediate(spec: RolloutSpec, state: State, fix: Remedy, crashed: crash.Crash) -> Step | None:
    """With `remediation: auto`, the first crash with a known remedy starts the candidate again.

    Write-ahead: this step records the remedy (status.remediation, the remedied candidate's
    fingerprint and config hash) and resets the startup clock; both canaries are deleted and
    created again on later reconciles, after this status write. None: roll back instead.
    """
    if spec.canary.remediation is not Remediation.AUTO or state.remedy_attempts or fix.refused:
        return None
    message = (
        f"{crashed.headline}; starting the candidate again with the remedy for {fix.engine} "
        f"{fix.version}: {fix.text}"
    )
    return Step(
        Phase.CANARY,
        Reason.REMEDIATING,
        message,
        actions=(Action.REMEDIATE, Action.DELETE_CANARIES),
        events=(
            # the crash as it is (cause, remedy, the engine's line); kvgate applies the remedy
            Event(Reason.CANARY_CRASHED, replace(crashed, where=None).message, warning=True),
            Event(Reason.REMEDIATING, message),
        ),
        remedy=fix,
        requeue_s=MIN_DELAY_S,
    )


def _ended(phase: Phase, gate: str, outcome: Outcome, reason: Reason, message: str) -> Step:
    """An end decided by one gate's result, which says the same."""
    return end_step(phase, reason, message, gates=(GateResult(gate, outcome, reason, message),))


def _arm_lost(obs: Observation) -> Step | None:
    """A canary lost mid-eval or mid-load: the comparison is void."""
    for arm, health in (("control", obs.control), ("candidate", obs.candidate)):
        if health is not None and (health.deleting or not health.exists):
            lost = f"{arm} pod disappeared: {health.detail}"
        elif health is not None and health.crashed:
            lost = crash.describe(arm, None, health.detail).message
        else:
            continue
        return _ended(Phase.ROLLED_BACK, CANARY, Outcome.FAILED, Reason.CANARY_CRASHED, lost)
    return None


def _evaluating(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    if (lost := _arm_lost(obs)) is not None:
        return lost
    # evalTimeout bounds one attempt (the Job's activeDeadlineSeconds); the phase as a whole
    # only catches a Job that never runs (every attempt's time, plus a scheduling grace).
    budget = deadlines.job_phase_deadline(spec, Phase.EVALUATING)
    error = obs.eval_error
    if obs.eval_summary is not None and obs.eval_summary.verdict == "error":
        error = obs.eval_summary.error or "eval reported an error"
    elif obs.eval_summary is not None and error is None:
        error = steps.task_error(spec, obs.eval_summary)
    stuck = (
        error is None
        and obs.eval_summary is None
        and (obs.job_exists or state.attempt_job_made)
        and state.phase_elapsed_s >= budget
        and not _cannot_make(state, obs.job_exists)
    )
    if stuck:
        error = f"eval did not finish within {budget:g}s ({state.eval_attempts} attempt(s))"
    if error is not None:
        # An eval that errors is not a failed eval: retry within the limit.
        if not stuck and (retry := _retry(spec, "eval", state.eval_attempts, error, poll_s)):
            return retry
        gate = GateResult(ACCURACY, Outcome.ERROR, Reason.EVAL_ERROR, error)
        message = f"eval failed {state.eval_attempts} time(s), last: {error}"
        return end_step(Phase.ROLLED_BACK, Reason.EVAL_ERROR, message, gates=(gate,))
    if obs.eval_summary is None:
        progress = eval_progress(obs.eval_progress, spec.accuracy.questions)
        elapsed = (
            f"{waited(state.phase_elapsed_s)} elapsed, "
            f"at most {duration(spec.canary.eval_timeout_s)} an attempt"
        )
        return Step(
            Phase.EVALUATING,
            Reason.EVALUATING,
            f"eval attempt {state.eval_attempts} running: "
            + (f"{progress.long}; " if progress is not None else "no look yet; ")
            + elapsed,
            actions=() if obs.job_exists else _eval_start(state),
            requeue_s=clamp_delay(poll_s),
            progress=progress.short if progress is not None else "starting",
        )
    accuracy = assess_accuracy(spec.accuracy, obs.eval_summary)
    long_context = assess_long_context(spec.accuracy.long_context, obs.eval_summary)
    divergence = assess_divergence(spec.divergence, obs.eval_summary)
    speed = assess_speed(spec.speed, obs.control_tpot_s, obs.candidate_tpot_s, obs.speed_clocks)
    gates = (accuracy, long_context, divergence, speed)
    earlier = tuple(g for g in state.gates.values() if g.gate not in EVAL_GATES)
    events = gate_events(gates)
    return _judged(spec, state, earlier, gates, events, poll_s, "accuracy gates passed")


def _judged(
    spec: RolloutSpec,
    state: State,
    earlier: tuple[GateResult, ...],
    gates: tuple[GateResult, ...],
    events: tuple[Event, ...],
    poll_s: float,
    passed: str,
) -> Step:
    """Roll back, or measure what the candidate buys (the load Job), or the verdict."""
    verdict = tradeoff.judged(
        spec, (*earlier, *gates), config_hash=state.config_hash, approval=state.approval
    )
    if verdict.decision is Decision.ROLL_BACK:
        return end_step(Phase.ROLLED_BACK, verdict.reasons[0].why, verdict.message,
                        gates=gates, verdict=verdict, events=events)  # fmt: skip
    if spec.capacity_gain.throughput_gain is not None:
        # recorded first, made by the next reconcile (write-ahead, as the eval's)
        return Step(Phase.MEASURING, Reason.MEASURING,
                    f"{passed}; measuring throughput on both arms (load Job)", events=events,
                    gates=gates, requeue_s=clamp_delay(poll_s), load_attempts=1)  # fmt: skip
    step = _after_verdict(spec, state, verdict, gates)
    return replace(step, events=(*events, *step.events))


def _cannot_make(state: State, job_exists: bool) -> bool:
    """The recorded attempt's Job is not there and the reconciles that make it keep failing:
    an outside error that `deadlines.give_up` ends (Failed, naming it) at the same deadline."""
    return not job_exists and state.consecutive_errors > 0


def _retry(spec: RolloutSpec, role: str, attempts: int, error: str, poll_s: float) -> Step | None:
    """The next attempt of the eval or load Job after `attempts` that errored, within
    spec.canary.evalRetries (None: none left). Recorded first, made by the next reconcile
    (write-ahead, as attempt 1)."""
    if attempts > spec.canary.eval_retries:
        return None
    attempt = attempts + 1
    eval_job = role == "eval"
    return Step(
        Phase.EVALUATING if eval_job else Phase.MEASURING,
        Reason.EVAL_RETRY if eval_job else Reason.LOAD_RETRY,
        f"{role} attempt {attempts} errored ({error}); starting attempt {attempt}",
        events=(Event(Reason.EVAL_ERROR if eval_job else Reason.LOAD_ERROR, error, warning=True),),
        requeue_s=clamp_delay(poll_s),
        eval_attempts=attempt if eval_job else None,
        load_attempts=None if eval_job else attempt,
    )


def _eval_start(state: State) -> tuple[Action, ...]:
    """The first eval attempt opens the speed gate's window (TPOT totals) right before its Job."""
    if state.eval_attempts <= 1:
        return (Action.SNAPSHOT_SPEED, Action.CREATE_EVAL_JOB)
    return (Action.CREATE_EVAL_JOB,)


def _measuring(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    """The load Job, retried on error like the eval Job, then the throughput gate and the
    verdict. A load that never gives evidence ends Failed, never a verdict."""
    if (lost := _arm_lost(obs)) is not None:
        return lost
    attempts = max(state.load_attempts, 1)
    timeout_s = deadlines.load_timeout_s(spec)
    budget = deadlines.job_phase_deadline(spec, Phase.MEASURING)
    finding = None
    error = steps.load_error(obs)
    if error is None and obs.load_summary is not None:
        finding = assess_throughput(
            spec.capacity_gain.throughput_gain,
            obs.load_summary,
            obs.load_clocks,
            production_concurrency=obs.production_concurrency,
        )
        if finding.result.outcome is Outcome.ERROR:
            error, finding = finding.result.message, None
    stuck = (
        error is None
        and finding is None
        and (obs.load_job_exists or state.attempt_job_made)
        and state.phase_elapsed_s >= budget
        and not _cannot_make(state, obs.load_job_exists)
    )
    if stuck:
        error = f"load did not finish within {budget:g}s ({attempts} attempt(s))"
    if error is not None:
        if not stuck and (retry := _retry(spec, "load", attempts, error, poll_s)):
            return retry
        message = f"load failed {attempts} time(s), last: {error}"
        gate = GateResult(THROUGHPUT, Outcome.ERROR, Reason.THROUGHPUT_UNKNOWN, message)
        return end_step(Phase.FAILED, Reason.LOAD_ERROR, message, gates=(gate,))
    if finding is None:
        progress = f"{obs.load_progress.describe()}; " if obs.load_progress is not None else ""
        return Step(
            Phase.MEASURING,
            Reason.MEASURING,
            f"load attempt {attempts} running: {progress}{waited(state.phase_elapsed_s)} "
            f"elapsed, at most {duration(timeout_s)} an attempt",
            actions=() if obs.load_job_exists else (Action.CREATE_LOAD_JOB,),
            requeue_s=clamp_delay(poll_s),
        )
    result = finding.result
    load = LoadStatus(
        attempt=attempts,
        throughput_gain=finding.gain,
        best_gain=finding.best_gain,
        summary=obs.load_summary,
    )
    results = (*[g for g in state.gates.values() if g.gate != THROUGHPUT], result)
    verdict = tradeoff.judged(spec, results, config_hash=state.config_hash, approval=state.approval)
    gain = Event(result.why, result.message, warning=result.outcome is not Outcome.SUCCESSFUL)
    end = {Decision.ROLL_BACK: Phase.ROLLED_BACK, Decision.NOT_NEEDED: Phase.NOT_NEEDED}
    if verdict.decision in end:
        step = end_step(end[verdict.decision], verdict.reasons[0].why, verdict.message,
                        gates=(result,), verdict=verdict, events=(gain,))  # fmt: skip
    else:
        step = _after_verdict(spec, state, verdict, (result,))
        step = replace(step, events=(gain, *step.events))
    return replace(step, load=load)


def _after_verdict(
    spec: RolloutSpec, state: State, verdict: Verdict, gates: tuple[GateResult, ...]
) -> Step:
    if spec.promotion.mode is PromotionMode.PULL_REQUEST and verdict.decision is Decision.PROMOTE:
        return proposing.after_verdict(spec, state, verdict, gates)
    judged = partial(Step, actions=(Action.DELETE_CANARIES,), gates=gates, verdict=verdict)
    if not spec.promotion.mode.changes_deployment:
        message = (
            f"verdict: promote ({verdict.message}); {spec.promotion.mode} mode: "
            "the Deployment is not changed"
        )
        events = (Event(VERDICT_REPORTED, message),)
        return judged(Phase.AWAITING_APPROVAL, VERDICT_REPORTED, message, events=events)
    if verdict.decision is Decision.HOLD:
        return judged(
            Phase.AWAITING_APPROVAL,
            Reason.AWAITING_APPROVAL,
            verdict.message,
            requeue_s=_APPROVAL_S,
        )
    # Write-ahead: this step only records the decision; the patch is made in Promoting, on
    # the next reconcile, after this status write succeeded.
    patching = f"promotion decided; patching Deployment {spec.target.name}"
    return judged(Phase.PROMOTING, Reason.PROMOTING, patching, requeue_s=MIN_DELAY_S)


def _awaiting(spec: RolloutSpec, state: State, obs: Observation, poll_s: float) -> Step:
    if not spec.promotion.mode.changes_deployment:
        return Step(Phase.AWAITING_APPROVAL, VERDICT_REPORTED, "verdict reported")
    verdict = decide(
        tuple(state.gates.values()),
        mode=spec.promotion.mode,
        config_hash=state.config_hash,
        approval=state.approval,
    )
    if verdict.decision is Decision.PROMOTE:
        step = _after_verdict(spec, state, verdict, ())
        by = f" by {state.approver}" if state.approver else ""
        return replace(
            step, events=(Event(Reason.APPROVED, f"approved{by} for config {state.config_hash}"),)
        )
    if verdict.decision is Decision.ROLL_BACK:
        return end_step(Phase.ROLLED_BACK, verdict.reasons[0].why, verdict.message, verdict=verdict)
    message = verdict.message
    if state.approval_ignored:
        message = f"{message}; {state.approval_ignored}"
    return Step(Phase.AWAITING_APPROVAL, Reason.AWAITING_APPROVAL, message, requeue_s=_APPROVAL_S)


_PHASES: Final = {
    Phase.PENDING: _pending,
    Phase.PREFLIGHT: _preflight,
    Phase.CANARY: _canary,
    Phase.EVALUATING: _evaluating,
    Phase.MEASURING: _measuring,
    Phase.AWAITING_APPROVAL: _awaiting,
    Phase.PROMOTING: promoting.promoting,
    Phase.VERIFYING: promoting.verifying,
    Phase.REVERTING: promoting.reverting,
    Phase.PULL_REQUEST_OPEN: proposing.pull_request_open,
    Phase.PULL_REQUEST_MERGED: proposing.pull_request_merged,
}
