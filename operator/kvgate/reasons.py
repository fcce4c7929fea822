"""Why is a rollout where it is? The one vocabulary of reasons (status, gates, Events, conditions).

Control flow asks a reason what it means (`.warning`, `.permanent`, `.stalls`, ...), never compares
its text: the sets below are the one place each rule is written. Values are the CamelCase words
status and Events carry, so alerts and `kubectl get` read them unchanged.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Reason(StrEnum):
    # Pending: the spec and the target
    INVALID_SPEC = "InvalidSpec"
    INVALID_TARGET = "InvalidTarget"
    TARGET_NOT_FOUND = "TargetNotFound"
    ROLLOUT_CONFLICT = "RolloutConflict"
    CONTROL_RUNS_FP8 = "ControlRunsFP8"
    WAITING_FOR_TARGET = "WaitingForTarget"
    PREFLIGHT = "Preflight"
    # Preflight: the pool and the checkpoint
    SAMPLING_POOL = "SamplingPool"
    POOL_PRESSURED = "PoolPressured"
    POOL_HAS_ROOM = "PoolHasRoom"
    POOL_PRESSURE_UNKNOWN = "PoolPressureUnknown"
    SCALES_PRESENT = "ScalesPresent"
    SCALES_MISSING = "ScalesMissing"
    SCALES_DROPPED = "ScalesDropped"
    SCALES_BROKEN = "ScalesBroken"
    SCALES_UNUSED = "ScalesUnused"  # a per-(token, head) format computes its own (issue 39)
    SCALES_UNKNOWN = "ScalesUnknown"
    ENGINE_ADVICE = "EngineAdvice"  # the engine's own guidance applies (advice, not a gate)
    # Canary: the two arms, their logs and metrics
    CANARY_STARTING = "CanaryStarting"
    CANARY_CREATED = "CanaryCreated"
    WAITING_FOR_CANARY = "WaitingForCanary"
    READING_LOGS = "ReadingLogs"
    READING_METRICS = "ReadingMetrics"
    CANARY_HEALTHY = "CanaryHealthy"
    CANARY_CRASHED = "CanaryCrashed"
    CANARY_TIMEOUT = "CanaryTimeout"
    CANARY_UNSCHEDULABLE = "CanaryUnschedulable"  # no node took a canary: no verdict (Failed)
    LOG_SILENT = "LogSilent"
    METRICS_SILENT = "MetricsSilent"
    METRICS_UNREADABLE = "MetricsUnreadable"
    LOG_METRICS_AGREE = "LogMetricsAgree"
    LOG_METRICS_DISAGREE = "LogMetricsDisagree"
    BACKEND_UNCHANGED = "BackendUnchanged"
    BACKEND_CHANGED = "BackendChanged"
    BACKEND_NOT_ALLOWED = "BackendNotAllowed"
    BACKEND_UNKNOWN = "BackendUnknown"
    CANDIDATE_DTYPE_MISMATCH = "CandidateDtypeMismatch"
    CANDIDATE_DTYPE_UNREAD = "CandidateDtypeUnread"
    CONTROL_DTYPE_MISMATCH = "ControlDtypeMismatch"
    CAPACITY_GAINED = "CapacityGained"
    CAPACITY_NOT_GAINED = "CapacityNotGained"
    CAPACITY_UNKNOWN = "CapacityUnknown"
    THROUGHPUT_GAINED = "ThroughputGained"
    THROUGHPUT_NOT_NEEDED = "ThroughputNotNeeded"  # both arms serve production's load alike
    THROUGHPUT_NOT_GAINED = "ThroughputNotGained"  # the candidate does not relieve the bottleneck
    THROUGHPUT_UNKNOWN = "ThroughputUnknown"
    OUTPUT_DEGENERATE = "OutputDegenerate"  # the candidate's output cannot be counted (outputcheck)
    PREFIX_CACHE_OFF = "PrefixCacheOff"  # the candidate lost the control's prefix caching
    # Measuring: the load Job
    MEASURING = "Measuring"
    LOAD_STARTED = "LoadStarted"
    LOAD_RETRY = "LoadRetry"
    LOAD_ERROR = "LoadError"
    REMEDIATING = "Remediating"
    EVALUATING = "Evaluating"
    # Evaluating: accuracy, long context, divergence, speed
    EVAL_STARTED = "EvalStarted"
    EVAL_RETRY = "EvalRetry"
    EVAL_ERROR = "EvalError"
    ACCURACY_PENDING = "AccuracyPending"
    ACCURACY_NON_INFERIOR = "AccuracyNonInferior"
    ACCURACY_REGRESSED = "AccuracyRegressed"
    ACCURACY_INCONCLUSIVE = "AccuracyInconclusive"
    ACCURACY_OFF = "AccuracyOff"  # spec.gates.accuracy.mode off: no eval Job, Skipped
    LONG_CONTEXT_NON_INFERIOR = "LongContextNonInferior"
    LONG_CONTEXT_REGRESSED = "LongContextRegressed"
    LONG_CONTEXT_INCONCLUSIVE = "LongContextInconclusive"
    LONG_CONTEXT_ERROR = "LongContextError"
    DIVERGENCE_WITHIN_FLOOR = "DivergenceWithinFloor"
    DIVERGENCE_FLAGGED = "DivergenceFlagged"
    DIVERGENCE_UNKNOWN = "DivergenceUnknown"
    SPEED_WITHIN_LIMIT = "SpeedWithinLimit"
    SPEED_REGRESSED = "SpeedRegressed"
    SPEED_UNKNOWN = "SpeedUnknown"
    CLOCKS_DIFFER = "ClocksDiffer"
    GATE_OFF = "GateOff"
    # The verdict, approval and promotion
    AWAITING_APPROVAL = "AwaitingApproval"
    APPROVED = "Approved"
    APPROVAL_EXPIRED = "ApprovalExpired"
    VERDICT_REPORTED = "VerdictReported"
    ABORTED = "Aborted"
    PROMOTING = "Promoting"
    PATCHING = "Patching"
    ROLLING_OUT = "RollingOut"
    PROMOTION_FAILED = "PromotionFailed"
    PROMOTION_REVERTED = "PromotionReverted"
    VERIFYING = "Verifying"
    PROMOTED = "Promoted"
    # pullRequest mode: the pull request and the GitOps tool's apply
    OPENING_PULL_REQUEST = "OpeningPullRequest"
    PULL_REQUEST_OPEN = "PullRequestOpen"
    PULL_REQUEST_MERGED = "PullRequestMerged"
    PULL_REQUEST_CLOSED = "PullRequestClosed"  # kvgate closed it: the rollout ended otherwise
    WAITING_FOR_GITOPS = "WaitingForGitOps"
    DECLINED = "Declined"  # the pull request was closed without a merge
    NOT_APPLIED = "NotApplied"  # merged, but the Deployment did not carry it within the deadline
    # Changes behind kvgate's back, and the revert
    TARGET_CHANGED = "TargetChanged"
    TARGET_DELETED = "TargetDeleted"
    SUPERSEDED = "Superseded"
    SPEC_CHANGED = "SpecChanged"  # a new spec mid-run: this run's evidence is for the old one
    UNEXPECTED_PATCH = "UnexpectedPatch"
    REVERTING = "Reverting"
    REVERT_FAILED = "RevertFailed"
    # Outcomes and errors
    ROLLED_BACK = "RolledBack"
    NOT_NEEDED = "NotNeeded"
    ROLLOUT_FAILED = "RolloutFailed"
    EXTERNAL_ERRORS = "ExternalErrors"
    RECONCILE_ERROR = "ReconcileError"
    DRIFTED = "Drifted"
    STALE = "Stale"
    VERDICT_CURRENT = "VerdictCurrent"
    VERDICT_REUSED = "VerdictReused"  # spec.reuseVerdict: another rollout's gates, same key
    IN_SYNC = "InSync"
    TERMINAL = "Terminal"  # a reconcile of an ended rollout
    CLEANUP = "Cleanup"  # deleting an ended rollout's children
    DELETED = "Deleted"  # the rollout object is being deleted
    # A reason status holds that this release does not know (written by another release)
    UNKNOWN = "Unknown"

    @classmethod
    def read(cls, text: object) -> Reason:
        """A stored reason; one this release does not know reads as UNKNOWN (never a guess)."""
        try:
            return cls(str(text))
        except ValueError:
            return cls.UNKNOWN

    @property
    def warning(self) -> bool:
        """An Event with this reason is a Warning (failures, errors, changes behind our back)."""
        return self in _WARNING

    @property
    def permanent(self) -> bool:
        """Retrying cannot help: the rollout stays Failed until its spec changes."""
        return self in _PERMANENT

    @property
    def stalls(self) -> bool:
        """The rollout cannot make progress by itself (the Stalled condition)."""
        return self in _STALLS

    @property
    def own_event(self) -> bool:
        """A gate result that gets an Event of its own, whatever the verdict (alerts match it)."""
        return self in _OWN_EVENT

    @property
    def refutes(self) -> bool:
        """A gate that is not Failed but found its condition false (ScalesPresent=False)."""
        return self in _REFUTES


_WARNING: Final = frozenset(
    {
        Reason.INVALID_SPEC,
        Reason.TARGET_NOT_FOUND,
        Reason.ROLLOUT_CONFLICT,
        Reason.POOL_PRESSURE_UNKNOWN,
        Reason.SCALES_MISSING,
        Reason.SCALES_DROPPED,
        Reason.SCALES_BROKEN,
        Reason.CANARY_CRASHED,
        Reason.CANARY_TIMEOUT,
        Reason.CANARY_UNSCHEDULABLE,
        Reason.BACKEND_CHANGED,
        Reason.BACKEND_NOT_ALLOWED,
        Reason.CAPACITY_NOT_GAINED,
        Reason.THROUGHPUT_NOT_GAINED,
        Reason.THROUGHPUT_UNKNOWN,
        Reason.OUTPUT_DEGENERATE,
        Reason.PREFIX_CACHE_OFF,
        Reason.ACCURACY_REGRESSED,
        Reason.ACCURACY_INCONCLUSIVE,
        Reason.EVAL_ERROR,
        Reason.LOAD_ERROR,
        Reason.SPEED_REGRESSED,
        Reason.PROMOTION_FAILED,
        Reason.PROMOTION_REVERTED,
        Reason.ROLLED_BACK,
        Reason.ROLLOUT_FAILED,
        Reason.INVALID_TARGET,
        Reason.CANDIDATE_DTYPE_MISMATCH,
        Reason.CONTROL_DTYPE_MISMATCH,
        Reason.CAPACITY_UNKNOWN,
        Reason.SPEED_UNKNOWN,
        Reason.EXTERNAL_ERRORS,
        Reason.REVERT_FAILED,
        Reason.REVERTING,
        Reason.TARGET_CHANGED,
        Reason.TARGET_DELETED,
        Reason.SUPERSEDED,
        Reason.UNEXPECTED_PATCH,
        Reason.DRIFTED,
        Reason.STALE,
        Reason.RECONCILE_ERROR,
        Reason.NOT_APPLIED,
        Reason.ENGINE_ADVICE,
    }
)
_PERMANENT: Final = frozenset({Reason.INVALID_SPEC, Reason.INVALID_TARGET})
_STALLS: Final = frozenset({Reason.REVERT_FAILED, Reason.NOT_APPLIED})
_OWN_EVENT: Final = frozenset(
    {
        Reason.SCALES_MISSING,
        Reason.SCALES_DROPPED,
        Reason.SCALES_BROKEN,
        Reason.BACKEND_CHANGED,
        Reason.BACKEND_NOT_ALLOWED,
        Reason.DIVERGENCE_FLAGGED,
    }
)
_REFUTES: Final = frozenset(
    {Reason.SCALES_MISSING, Reason.SCALES_DROPPED, Reason.SCALES_BROKEN, Reason.POOL_HAS_ROOM}
)
