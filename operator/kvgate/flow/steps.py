"""What does the state machine read, and what may one step do?

`State` is what status says, `Observation` what the handler saw now (only the fields of the
current phase are filled) and `Step` what `machine.next_step` returns: the next phase, the
actions to take, events and the requeue delay. Nothing here does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from kvgate.evidence.kubeobjects import PodHealth
from kvgate.judge.remedy import Remedy
from kvgate.judge.verdict import Verdict
from kvgate.reasons import Reason
from kvgate.records.evalsummary import AccuracyStatus
from kvgate.records.loadresult import LoadProgress, LoadSummary, LoadVerdict
from kvgate.records.status import (
    CacheTruth,
    ClocksRecord,
    EvalProgress,
    GateResult,
    LoadStatus,
    PullRequestStatus,
    RevertStatus,
    ScanRecord,
)
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import GateMode, Outcome, Phase, PullRequestState

MIN_DELAY_S: Final = 1.0
EVAL_GRACE_S: Final = 60.0  # scheduling and Job-controller slack on top of the eval attempts
MAX_DELAY_S: Final = 30.0


class Action(StrEnum):
    CREATE_CANARIES = "CreateCanaries"
    DELETE_CANARIES = "DeleteCanaries"
    CREATE_EVAL_JOB = "CreateEvalJob"
    DELETE_EVAL_JOB = "DeleteEvalJob"  # the eval and load Jobs, and the eval NetworkPolicy
    CREATE_LOAD_JOB = "CreateLoadJob"
    SNAPSHOT_SPEED = "SnapshotSpeed"
    PATCH_DEPLOYMENT = "PatchDeployment"
    REVERT_DEPLOYMENT = "RevertDeployment"
    REMEDIATE = "Remediate"  # record the step's remedy and the remedied candidate in status
    OPEN_PULL_REQUEST = "OpenPullRequest"  # open (or update) the recorded intent's PR
    # An end not through the pull request (aborted, given up): close it, so no one merges a
    # change the rollout no longer stands behind
    CLOSE_PULL_REQUEST = "ClosePullRequest"


@dataclass(frozen=True, slots=True)
class Event:
    reason: Reason
    message: str
    warning: bool = False


@dataclass(frozen=True, slots=True)
class State:
    """What the status says: the phase, how long it has lasted, the gates so far."""

    phase: Phase
    phase_elapsed_s: float = 0.0
    config_hash: str = ""
    eval_attempts: int = 0
    load_attempts: int = 0  # Measuring: load Jobs started (status.load.attempt)
    # Evaluating / Measuring: the current attempt's Job was made (status names it); one never
    # made (the operator was away once its attempt was recorded) has not timed out
    attempt_job_made: bool = False
    gates: Mapping[str, GateResult] = field(default_factory=dict)
    approval: str | None = None  # the config hash an approval that counts names
    approver: str = ""  # who gave it (recorded by the approval policy), for status and Events
    approval_ignored: str = ""  # why an approval annotation present does not count
    abort: str | None = None  # kvgate.io/abort is set: who set it and why, one line
    # Promoting / Verifying / Reverting: what status says kvgate did
    patched: bool = False  # the candidate patch was applied (or found applied) by kvgate
    verify_samples: int = 0  # passing verify samples in the current window
    since_last_sample_s: float | None = None
    window_elapsed_s: float = 0.0
    revert: RevertStatus | None = None
    revert_attempts: int = 0
    revert_error: str | None = None
    remedy_attempts: int = 0  # candidates started again with a remedy (at most one)
    # reconciles that failed in a row (an action raised): the phase's deadline is then
    # `deadlines.give_up`'s, which names the failure
    consecutive_errors: int = 0
    pull_request: PullRequestStatus | None = None  # pullRequest mode: what status records
    # The spec's generation when it is newer than the one this run evaluates (None: the same)
    spec_changed_to: int | None = None


@dataclass(frozen=True, slots=True)
class LiveTarget:
    """The production Deployment as read now, against what kvgate evaluated and changes."""

    exists: bool
    container_found: bool = True
    as_evaluated: bool = False  # image, command, args and env equal the evaluated container
    differences: tuple[str, ...] = ()  # guarded fields that differ from the evaluated ones
    carries_candidate: bool = False  # every edit kvgate makes is there
    ours_present: bool = False  # at least one edit kvgate makes is there
    # fields where it is neither the candidate nor the config before (`promotion.changed_around`)
    changed_around: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PullRequestSeen:
    """A pull request as the forge reported it in this reconcile."""

    number: int
    url: str
    state: PullRequestState
    merge_sha: str | None = None


@dataclass(frozen=True, slots=True)
class ReusedVerdict:
    """The verdict this candidate takes: whose, how old, and its eval and load gates."""

    source: str  # namespace/name of the rollout that reached it
    finished_at: str
    age_s: float
    key_digest: str
    gates: tuple[GateResult, ...]

    @property
    def message(self) -> str:
        return (
            f"reused the verdict of {self.source} (Promoted {_age(self.age_s)} ago, verdict "
            f"key {self.key_digest}: the same image digest, engine version, GPU, backend, "
            f"config and gates); no eval or load of its own"
        )


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True, slots=True)
class Observation:
    """What the handler saw this time; only the fields of the current phase are filled."""

    spec_errors: tuple[str, ...] = ()
    target_problem: str | None = None  # Pending: why the Deployment/container/engine is unusable
    target_missing: bool = False
    conflicts: tuple[str, ...] = ()
    dtype_problem: str | None = None
    # Preflight
    pool_samples: int = 0
    pool_pressured: bool | None = None
    pool_detail: str = ""
    checkpoint_has_scales: bool | None = None
    broken_scales: tuple[str, ...] = ()  # k/v scales in the checkpoint that cannot scale
    # What the control arm would store: production's --kv-cache-dtype, what that stores on this
    # checkpoint (None: unknown) and why the checkpoint makes `auto` store FP8 (if it does)
    engine: str = "vllm"
    production_kv_dtype: str = "auto"
    control_stores: str | None = None
    forces_fp8: tuple[str, ...] = ()
    skip_layers_problem: str | None = None  # spec.kvCache.skipLayers names no layer of the model
    # Canary
    control: PodHealth | None = None
    candidate: PodHealth | None = None
    control_scan: ScanRecord | None = None
    candidate_scan: ScanRecord | None = None
    # Canary: each arm's `metrics.cache_truth`, once its /metrics was read (None: not yet)
    control_metrics: CacheTruth | None = None
    candidate_metrics: CacheTruth | None = None
    metrics_error: str | None = None  # the last failed scrape of an arm's /metrics
    remedy: Remedy | None = None  # Canary: the remedy for the candidate's crash, if known
    # Evaluating
    job_exists: bool = False
    eval_summary: AccuracyStatus | None = None  # the finished Job's summary, read once
    eval_error: str | None = None
    eval_progress: EvalProgress | None = None  # the running attempt's last look
    control_tpot_s: float | None = None
    candidate_tpot_s: float | None = None
    speed_clocks: ClocksRecord | None = None  # None: no Prometheus to ask
    load_clocks: ClocksRecord | None = None  # over the load Job's run; None: no Prometheus
    # Canary, with spec.reuseVerdict: a verdict this candidate may take (`kvgate.flow.reuse`)
    reused_verdict: ReusedVerdict | None = None
    # Measuring: the load Job (`load_summary` only from a finished Job's nonce-carrying last line)
    load_job_exists: bool = False
    load_summary: LoadSummary | None = None
    load_error: str | None = None
    load_progress: LoadProgress | None = None  # the running Job's progress lines, folded
    production_concurrency: int | None = None  # what the load Job was asked to run at
    # Promoting / Verifying
    rollout_done: bool = False
    rollout_crashed: str | None = None
    rollout_scan: ScanRecord | None = None
    production_problem: str | None = None
    sampled: bool = False  # Verifying: a verify sample was taken now
    # PullRequestOpen: the recorded pull request as the forge reports it now (None: not read)
    pull_request: PullRequestSeen | None = None
    # PullRequestMerged: the live Deployment carries the tested change (args/env, the verdict
    # annotation, pods on the tested image digest); else `apply_gap` says what is missing
    applied: bool = False
    apply_gap: str = ""
    # Every phase after Pending: the live target
    live: LiveTarget | None = None


@dataclass(frozen=True, slots=True)
class Step:
    phase: Phase
    reason: Reason
    message: str
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = ()
    gates: tuple[GateResult, ...] = ()
    requeue_s: float | None = None
    verdict: Verdict | None = None
    eval_attempts: int | None = None
    load_attempts: int | None = None  # Measuring: the load attempt this step starts
    load: LoadStatus | None = None  # Measuring: the measurement and the gain, for status.load
    revert: RevertStatus | None = None  # set on the step that enters Reverting
    patched: bool | None = None  # True: record that the candidate patch is on the Deployment
    verify_samples: int | None = None  # Verifying: passing samples so far in this window
    restart_window: bool = False  # Verifying: the window starts over at this sample
    remedy: Remedy | None = None  # Canary: record it, then start the candidate again with it
    gate_closed: bool = False  # gate mode: an end that is not a passing verdict (Stalled)
    progress: str | None = None  # Evaluating: the eval's progress in a few words (status.progress)
    pull_request: PullRequestStatus | None = None  # pullRequest mode: fields to record
    reused: ReusedVerdict | None = None  # the verdict was another rollout's (status.verdict)
    new_run: bool = False  # a newer spec superseded the run: status starts again (superseding)

    @property
    def terminal(self) -> bool:
        return self.phase.terminal


def clamp_delay(seconds: float) -> float:
    return min(max(seconds, MIN_DELAY_S), MAX_DELAY_S)


def end_step(phase: Phase, reason: Reason, message: str, **kw: Any) -> Step:
    """A terminal step; canaries and the Jobs are no longer needed."""
    actions = (*kw.pop("actions", ()), Action.DELETE_CANARIES, Action.DELETE_EVAL_JOB)
    bad = phase in (Phase.ROLLED_BACK, Phase.FAILED, Phase.DECLINED)
    events = list(kw.pop("events", ()))
    # The specific reason (alert on CanaryCrashed), then the outcome (alert on any RolledBack).
    for r in (reason, OUTCOME_EVENTS[phase]):
        if all(e.reason != r for e in events):
            events.append(Event(r, message, warning=bad))
    return Step(phase, reason, message, actions=actions, events=tuple(events), **kw)


OUTCOME_EVENTS: Final = {
    Phase.PROMOTED: Reason.PROMOTED,
    Phase.ROLLED_BACK: Reason.ROLLED_BACK,
    Phase.NOT_NEEDED: Reason.NOT_NEEDED,
    Phase.FAILED: Reason.ROLLOUT_FAILED,
    Phase.DECLINED: Reason.DECLINED,
}


def gate_events(results: Sequence[GateResult]) -> tuple[Event, ...]:
    """Events of the gate results worth one of their own (alerting matches the reason); a
    passing accuracy gate too: its headline figures are what `kubectl describe` should say."""
    events = []
    for r in results:
        passed = r.why is Reason.ACCURACY_NON_INFERIOR and r.outcome is Outcome.SUCCESSFUL
        if passed or r.why.own_event:
            events.append(Event(r.why, r.message, warning=not passed))
    return tuple(events)


def revert_step(phase: Phase, reason: Reason, message: str, **kw: Any) -> Step:
    """Enter Reverting: the end (phase, reason, message) is recorded first; the revert patch is
    made on the next reconcile, after this status write succeeded."""
    intent = RevertStatus(phase, reason, message)
    return Step(
        Phase.REVERTING,
        Reason.REVERTING,
        f"reverting the Deployment: {message}",
        actions=(Action.DELETE_CANARIES, Action.DELETE_EVAL_JOB),
        events=tuple(kw.pop("events", ())),
        revert=intent,
        requeue_s=MIN_DELAY_S,
        **kw,
    )


@dataclass(frozen=True, slots=True)
class ProgressText:
    """The eval's progress in words: `long` for status.message, `short` for the printer column."""

    long: str
    short: str


def eval_progress(progress: EvalProgress | None, planned: int) -> ProgressText | None:
    """`look 2/6, 200 of 600 questions, candidate -0.5 pp so far` (None before the first look)."""
    if progress is None or progress.look is None or progress.questions is None:
        return None
    looks = f"{progress.look}/{progress.looks_planned or '?'}"
    diff = progress.difference
    points = f"{100 * diff:+.1f} pp" if diff is not None and math.isfinite(diff) else ""
    return ProgressText(
        long=f"look {looks}, {progress.questions:,} of {planned:,} questions"
        + (f", candidate {points} so far" if points else ""),
        short=f"{progress.questions}/{planned} q, look {looks}" + (f", {points}" if points else ""),
    )


def load_error(obs: Observation) -> str | None:
    """Why the load attempt gave no evidence (None: it did, or it is still running)."""
    if obs.load_error is not None:
        return obs.load_error
    summary = obs.load_summary
    if summary is None:
        return None
    if summary.verdict is LoadVerdict.ERROR or summary.verdict is None:
        return f"the load run failed: {summary.error or 'an arm measured nothing'}"
    return None


def task_error(spec: RolloutSpec, summary: AccuracyStatus) -> str | None:
    """An asked-for task that ran and errored (a timeout on a long prompt...): retried like
    a GSM8K error. A missing block is not retried: the gate fails it closed."""
    lc = summary.long_context if spec.accuracy.long_context is not None else None
    if lc is not None and lc.verdict == "error":
        return f"long-context task: {lc.error or 'error'}"
    dv = summary.divergence if spec.divergence.mode is GateMode.REQUIRE else None
    if dv is not None and dv.verdict == "error":
        return f"divergence screen: {dv.error or 'error'}"
    return None
