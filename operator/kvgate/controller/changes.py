"""What did a stage of the reconcile find or do? A partial `RolloutStatus`, its fields by their
Python names (`StatusFields`, which mypy checks), and the Events to post: `record` alone writes
the one and posts the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, TypedDict

from typing_extensions import Unpack

from kvgate.flow.steps import Event, Observation
from kvgate.reasons import Reason
from kvgate.records.evalsummary import AccuracyStatus, JsonValue
from kvgate.records.status import (
    ArmStatus,
    CapacityStatus,
    EnvVar,
    EvalStatus,
    GateResult,
    LoadStatus,
    PreflightStatus,
    PromotionStatus,
    PullRequestStatus,
    RemediationStatus,
    RevertStatus,
    RolloutStatus,
    SpeedStatus,
    VerdictRecord,
)
from kvgate.vocabulary import Condition, Phase


class StatusFields(TypedDict, total=False):
    """`RolloutStatus`'s fields, any of them (a test keeps the two the same)."""

    phase: Phase | None
    reason: str | None
    message: str | None
    progress: str | None
    observed_generation: int | None
    run_generation: int | None
    started_at: str | None
    phase_since: str | None
    finished_at: str | None
    approval_expires_at: str | None
    consecutive_errors: int | None
    pending_actions: tuple[str, ...]
    engine: str | None
    container: str | None
    container_index: int | None
    port: int | None
    metrics_path: str | None
    model: str | None
    served_model: str | None
    evaluated_image: str | None
    config_hash: str | None
    previous: Mapping[str, JsonValue]
    candidate: Mapping[str, JsonValue]
    recommended_args: tuple[str, ...]
    recommended_env: tuple[EnvVar, ...]
    preflight: PreflightStatus | None
    arms: Mapping[str, ArmStatus]
    eval: EvalStatus | None
    accuracy: AccuracyStatus | None
    capacity: CapacityStatus | None
    speed: SpeedStatus | None
    load: LoadStatus | None
    gates: Mapping[str, GateResult]
    verdict: VerdictRecord | None
    promotion: PromotionStatus | None
    pull_request: PullRequestStatus | None
    revert: RevertStatus | None
    remediation: RemediationStatus | None
    conditions: tuple[Condition, ...]


@dataclass(frozen=True)
class StatusUpdate:
    """What a stage found (observe) or did (act): status fields with their whole new value (None
    or an empty collection removes the field), and Events, in the order made."""

    fields: StatusFields = field(default_factory=lambda: StatusFields())
    events: tuple[Event, ...] = ()

    @classmethod
    def of(cls, **fields: Unpack[StatusFields]) -> StatusUpdate:
        return cls(fields)

    @classmethod
    def event(cls, reason: Reason, message: str, *, warning: bool | None = None) -> StatusUpdate:
        """An Event to post (a warning when the reason says so, unless `warning` says)."""
        warn = reason.warning if warning is None else warning
        return cls(events=(Event(reason, message, warn),))

    def then(self, later: StatusUpdate) -> StatusUpdate:
        """This update followed by `later` (its fields win; the Events of both, in order)."""
        merged = StatusFields()
        merged.update(self.fields)
        merged.update(later.fields)
        return StatusUpdate(merged, self.events + later.events)

    def applied_to(self, status: RolloutStatus) -> RolloutStatus:
        """`status` with these fields replaced (no parse, no copy: the records are frozen)."""
        if not self.fields:
            return status
        return dataclasses.replace(status, **self.fields)


NOTHING: Final = StatusUpdate()  # a stage that found or did nothing for status

# What observing a phase returns: the evidence for the core, and what status keeps of it.
Observed = tuple[Observation, StatusUpdate]
