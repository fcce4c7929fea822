"""One reconcile's context: the rollout, its parsed spec and status (parsed once, in `begin`), the
clients (`kubeapi.KubeApi`), the clock, the cache of what it read (`Reads`, filled by `controller/seen.py`), the
`State` the machine reads, and what the reconcile came to (`Reconciled`). The candidate
container is `candidate`'s, ownership `ownership`'s, Events `events`'s.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from kvgate import redact
from kvgate.config import OperatorConfig
from kvgate.controller.changes import NOTHING, StatusUpdate
from kvgate.controller.kubeapi import KubeApi
from kvgate.errors import KvgateError
from kvgate.flow import superseding
from kvgate.flow.steps import State, Step
from kvgate.judge.approval import ApprovalRecord, abort_text, read_approval
from kvgate.records.status import PromotionStatus, RevertStatus, RolloutStatus, VerifyStatus
from kvgate.records.timestamps import parse_time
from kvgate.spec.rollout import RolloutSpec, TargetRef
from kvgate.vocabulary import (
    ANNOTATION_ABORT,
    ANNOTATION_ABORTED_BY,
    ANNOTATION_APPROVE,
    ANNOTATION_APPROVED_BY,
    ANNOTATION_APPROVED_GENERATION,
    ANNOTATION_CREATED_BY,
    Phase,
)

Logger = logging.Logger | logging.LoggerAdapter[Any]  # what kopf hands a handler


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class Reads:
    """What one reconcile read once and shares between its stages."""

    deployment: dict[str, Any] | None = None  # read once per reconcile (`target_deployment`)
    deployment_read: bool = False
    rollout_pods: dict[str, dict[str, Any]] | None = None  # by name, listed once (`own_pods`)
    node_gpus: dict[str, str | None] = field(default_factory=dict)  # by node (`node_gpu`)


@dataclass(frozen=True)
class RolloutRef:
    """Which rollout this is, as owner references and Events name it; the raw body goes no
    further than `begin`."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str | None
    created: str  # creationTimestamp: the older of two rollouts on a Deployment goes first
    labels: Mapping[str, str]

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> RolloutRef:
        meta = body.get("metadata") or {}
        return cls(str(body.get("apiVersion") or ""), str(body.get("kind") or ""),
                   str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                   meta.get("uid"), str(meta.get("creationTimestamp") or ""),
                   dict(meta.get("labels") or {}))  # fmt: skip

    def owner(self) -> kopf.Body:
        """The object kopf adopts children to and posts Events on."""
        meta = {"namespace": self.namespace, "name": self.name, "uid": self.uid}
        raw: dict[str, Any] = {"apiVersion": self.api_version, "kind": self.kind,
                               "metadata": {**meta, "labels": dict(self.labels)}}  # fmt: skip
        return kopf.Body(cast("kopf.RawBody", raw))


@dataclass
class Ctx:
    """One reconcile call: which rollout, its spec (as written, and parsed), the clients and the
    status so far (parsed once in `begin`)."""

    rollout: RolloutRef
    spec_source: Mapping[str, Any]  # the spec as written: the candidate's config hash covers it
    namespace: str
    name: str
    generation: int | None
    spec: RolloutSpec
    so_far: RolloutStatus
    kube: KubeApi
    config: OperatorConfig
    logger: Logger
    now: dt.datetime
    reads: Reads = field(default_factory=Reads)

    def seeing(self, update: StatusUpdate) -> Ctx:
        """This context with `update` applied to the status it sees (the reads are shared)."""
        if not update.fields:
            return self
        return dataclasses.replace(self, so_far=update.applied_to(self.so_far))


def parse_spec(
    raw: Mapping[str, Any], config: OperatorConfig | None = None
) -> tuple[RolloutSpec, tuple[str, ...]]:
    try:
        return RolloutSpec.from_dict(raw, allow=config.allowlist if config else None), ()
    except ExceptionGroup as group:
        target = raw.get("targetRef") if isinstance(raw.get("targetRef"), Mapping) else {}
        fallback = RolloutSpec(target=TargetRef(str((target or {}).get("name") or "?")))
        return fallback, tuple(str(e) for e in group.exceptions)


def read_state(ctx: Ctx, phase: Phase, meta: Mapping[str, Any]) -> State:
    status = ctx.so_far
    since = parse_time(status.phase_since) or ctx.now
    promo = status.promotion or PromotionStatus()
    verify = promo.verify or VerifyStatus()
    last = parse_time(verify.last_sample_at)
    window = parse_time(verify.window_started_at)
    revert = status.revert or RevertStatus()
    job = status.load if phase is Phase.MEASURING else status.eval
    annotations = meta.get("annotations") or {}
    record = ApprovalRecord(
        approve=annotations.get(ANNOTATION_APPROVE),
        created_by=annotations.get(ANNOTATION_CREATED_BY),
        approved_by=annotations.get(ANNOTATION_APPROVED_BY),
        approved_generation=annotations.get(ANNOTATION_APPROVED_GENERATION),
        abort=annotations.get(ANNOTATION_ABORT),
        aborted_by=annotations.get(ANNOTATION_ABORTED_BY),
    )
    approval, approver, ignored = read_approval(
        record, ctx.generation, require_identity=ctx.config.approval_identity
    )
    return State(
        phase=phase,
        phase_elapsed_s=(ctx.now - since).total_seconds(),
        config_hash=status.config_hash or "",
        eval_attempts=(status.eval.attempt if status.eval else None) or 0,
        load_attempts=(status.load.attempt if status.load else None) or 0,
        attempt_job_made=job is not None
        and (job.job or "").endswith(f"-{job.attempt or 1}"),  # its name ends in the attempt
        gates=status.gates,
        approval=approval,
        approver=redact.scrub_text(approver)[:253],
        approval_ignored=redact.scrub_text(ignored),
        abort=None if (text := abort_text(record)) is None else redact.scrub_text(text),
        patched=bool(promo.patched),
        verify_samples=verify.samples or 0,
        since_last_sample_s=None if last is None else (ctx.now - last).total_seconds(),
        window_elapsed_s=0.0 if window is None else (ctx.now - window).total_seconds(),
        revert=status.revert if revert.phase else None,
        revert_attempts=revert.attempts or 0,
        revert_error=revert.last_error,
        remedy_attempts=(status.remediation.attempt if status.remediation else None) or 0,
        consecutive_errors=status.consecutive_errors or 0,
        pull_request=status.pull_request,
        spec_changed_to=superseding.newer_generation(status, ctx.generation),
    )


@dataclass(frozen=True)
class Begun:
    """A reconcile's start. `ended`: the rollout ended and its spec did not change since, so
    only its recorded deletions are due (`state` None). A new spec after the end starts a new
    run from an empty status (`cleared`: the keys it removes), its deletions still due kept."""

    ctx: Ctx
    old: dict[str, Any]  # the body's status, our own copy
    phase: Phase
    spec_errors: tuple[str, ...] = ()
    state: State | None = None
    cleared: dict[str, Any] = field(default_factory=dict)
    ended: bool = False


def context_of(
    body: kopf.Body,
    meta: Mapping[str, Any],
    kube: KubeApi,
    config: OperatorConfig,
    logger: Logger,
    status: RolloutStatus,
) -> tuple[Ctx, tuple[str, ...]]:
    """The context of a handler of `body` seeing `status`, and its spec's errors."""
    source = copy.deepcopy(dict(body.get("spec") or {}))  # nothing may change kopf's body
    spec, spec_errors = parse_spec(source, config)
    ctx = Ctx(RolloutRef.of(body), source, meta["namespace"], meta["name"],
              meta.get("generation"), spec, status, kube, config, logger, utcnow())  # fmt: skip
    return ctx, spec_errors


def status_of(body: kopf.Body) -> dict[str, Any]:
    """Our own copy of the body's status: nothing may change kopf's body in place."""
    return copy.deepcopy(dict(body.get("status") or {}))


def begin(
    body: kopf.Body, meta: Mapping[str, Any], kube: KubeApi, config: OperatorConfig, logger: Logger
) -> Begun:
    """The context of one reconcile of `body`, from its status and spec as they are now."""
    old = status_of(body)
    found = status = RolloutStatus.from_dict(old)  # the one parse of this reconcile
    phase = found.phase or Phase.PENDING
    generation = meta.get("generation")
    ended = found.ended and superseding.newer_generation(found, generation) is None
    cleared: dict[str, Any] = {}
    if found.ended and not ended:
        # A new spec after the end (or during a run that had to finish first) starts a new
        # rollout, like Flagger's retry by spec change; the last run's findings are cleared so
        # none of them can vote in the new verdict. Its deletions still due go first.
        cleared = dict.fromkeys(old)
        status = RolloutStatus(phase=Phase.PENDING, pending_actions=found.pending_actions)
        phase = Phase.PENDING
    ctx, spec_errors = context_of(body, meta, kube, config, logger, status)
    if ended:
        return Begun(ctx, old, phase, ended=True)
    return Begun(ctx, old, phase, spec_errors, read_state(ctx, phase, meta), cleared)


@dataclass(frozen=True)
class Retry:
    """The reconcile failed and comes back: not evidence against the candidate."""

    what: str  # one line for status and Events (`describe`)
    error: BaseException
    # failures in a row, this one included; 0: not counted (an ended rollout's deletions, whose
    # status is final: nothing is written, they are tried again)
    errors: int = 0

    @property
    def message(self) -> str:
        return f"{self.what} (consecutive errors: {self.errors})" if self.errors else self.what

    @property
    def delay_s(self) -> float:
        return 10.0 if self.errors else 5.0


@dataclass(frozen=True)
class Reconciled:
    """What one reconcile came to: the step and what its stages found and did (kept up to a
    failing action); or a retry; or an ended rollout's deletions done (`cleaned`)."""

    step: Step | None = None
    done: StatusUpdate = NOTHING
    retry: Retry | None = None
    cleaned: bool = False


def describe(exc: BaseException) -> str:
    """One line for status and Events: the kind of failure and its message, bounded."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if not isinstance(exc, KvgateError):
        text = f"{type(exc).__name__}: {text}"
    return text[:500]
