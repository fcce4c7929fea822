"""One reconcile's context: the rollout, its parsed spec and status, the clients, the clock, the
cache of what it read (`Reads`, filled by `controller/seen.py`), what kvgate evaluated, and
ownership.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import kopf

from kvgate import (
    jsonrecord,
    manifests,
    promotion,
    redact,
    superseding,
)
from kvgate.approval import ApprovalRecord, abort_text, read_approval
from kvgate.config import OperatorConfig
from kvgate.errors import KvgateError
from kvgate.jsonrecord import whole
from kvgate.model import (
    ANNOTATION_ABORT,
    ANNOTATION_ABORTED_BY,
    ANNOTATION_APPROVE,
    ANNOTATION_APPROVED_BY,
    ANNOTATION_APPROVED_GENERATION,
    ANNOTATION_CREATED_BY,
    Phase,
)
from kvgate.spec import RolloutSpec, TargetRef
from kvgate.status import (
    EnvVar,
    PromotionStatus,
    RemediationStatus,
    RevertStatus,
    RolloutStatus,
    VerifyStatus,
)
from kvgate.steps import Observation, State, Step
from kvgate.timestamps import parse_time
from kvgate.verdict import GateResult, RevertIntent


class KubeApi(Protocol):
    """What the controller needs of the API (`kvgate.adapters.kube.Kube`; an in-memory fake in
    the unit tests). Objects are the API's JSON dicts; reads of absent objects return None."""

    requests: int

    def read_deployment(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def read_node(self, name: str) -> dict[str, Any] | None: ...
    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def read_network_policy(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]: ...
    def list_rollouts(self, namespace: str) -> list[dict[str, Any]]: ...
    def read_log(
        self, namespace: str, pod: str, container: str | None = None, *, previous: bool = False
    ) -> str | None: ...
    def read_secret_value(self, namespace: str, name: str, key: str) -> str: ...
    def check_hub_token_secret(self, namespace: str, name: str, key: str) -> None: ...
    def read_forge_token(
        self, namespace: str, name: str, key: str, *, api_url: str, repository: str
    ) -> str: ...
    def create(self, body: Mapping[str, Any]) -> dict[str, Any]: ...
    def ensure(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]: ...
    def replace_configmap(self, body: Mapping[str, Any]) -> dict[str, Any]: ...
    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool: ...
    def patch_deployment(
        self, namespace: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]: ...


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class StatusView(Mapping[str, Any]):
    """The status so far, read-only: the status this reconcile found with what its stages
    returned applied (`StatusUpdate.applied_to`). It has no way to be written (item assignment
    raises TypeError, and there is no update/setdefault/pop), and a value read is a copy, so an
    edit of a nested block changes only the reader's copy: stages return what they found or
    did, and `record.fold` alone builds the status that is written."""

    __slots__ = ("_data", "_record")

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = copy.deepcopy(dict(data or {}))
        self._record: RolloutStatus | None = None

    @property
    def record(self) -> RolloutStatus:
        """The status read as the typed record (read once per view: a view never changes)."""
        if self._record is None:
            self._record = RolloutStatus.from_dict(self._data)
        return self._record

    @classmethod
    def _owning(cls, data: dict[str, Any]) -> StatusView:
        """A view of `data`, which nobody else holds (no second copy)."""
        view = cls()
        view._data = data
        return view

    def __getitem__(self, key: str) -> Any:
        return copy.deepcopy(self._data[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"StatusView({self._data!r})"


@dataclass(frozen=True)
class StatusUpdate:
    """What a stage of the reconcile found (observe) or did (act), for status: top-level status
    keys with their whole new value (None removes the key, as in a merge patch), in the order
    made. Applied with later stages winning; `record.fold` turns it into the new status.

    An intermediate form on the way to a typed `RolloutStatus`: the values are the status blocks
    as dicts; `record.fold` refuses a key `RolloutStatus` does not declare."""

    changes: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, **changes: Any) -> StatusUpdate:
        """Top-level keys with their new values: status records (`kvgate.status`) or JSON."""
        return cls({k: copy.deepcopy(jsonrecord.write(v)) for k, v in changes.items()})

    def then(self, later: StatusUpdate) -> StatusUpdate:
        """This update followed by `later` (its keys win)."""
        return StatusUpdate({**self.changes, **later.changes})

    def applied_to(self, status: Mapping[str, Any]) -> dict[str, Any]:
        """A new dict: `status` with these keys replaced (a None value is kept as None, which
        the merge patch of the written status turns into a removal)."""
        return copy.deepcopy({**status, **self.changes})


NOTHING: Final = StatusUpdate()  # a stage that found or did nothing for status

# What observing a phase returns: the evidence for the core, and what status keeps of it.
Observed = tuple[Observation, StatusUpdate]


@dataclass
class Reads:
    """What one reconcile read once and shares between its stages."""

    deployment: dict[str, Any] | None = None  # read once per reconcile (`target_deployment`)
    deployment_read: bool = False
    rollout_pods: dict[str, dict[str, Any]] | None = None  # by name, listed once (`own_pods`)
    node_gpus: dict[str, str | None] = field(default_factory=dict)  # by node (`node_gpu`)


@dataclass
class Ctx:
    """One reconcile call: the object, its parsed spec, the clients and the status so far (a
    read-only view; `seeing` gives the context that sees a stage's update)."""

    body: kopf.Body
    namespace: str
    name: str
    generation: int | None
    spec: RolloutSpec
    status: StatusView
    kube: KubeApi
    config: OperatorConfig
    logger: logging.Logger | logging.LoggerAdapter[Any]
    now: dt.datetime
    reads: Reads = field(default_factory=Reads)

    @property
    def so_far(self) -> RolloutStatus:
        """The status so far as the typed record: how every stage reads it."""
        return self.status.record

    def seeing(self, update: StatusUpdate) -> Ctx:
        """This context with `update` applied to the status it sees (the reads are shared)."""
        if not update.changes:
            return self
        status = StatusView._owning(update.applied_to(self.status))
        return dataclasses.replace(self, status=status)


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
    gates = {k: GateResult.from_dict(k, jsonrecord.write(v)) for k, v in status.gates.items()}
    promo = status.promotion or PromotionStatus()
    verify = promo.verify or VerifyStatus()
    last = parse_time(verify.last_sample_at)
    window = parse_time(verify.window_started_at)
    revert = status.revert or RevertStatus()
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
        gates=gates,
        approval=approval,
        approver=redact.scrub_text(approver)[:253],
        approval_ignored=redact.scrub_text(ignored),
        abort=None if (text := abort_text(record)) is None else redact.scrub_text(text),
        patched=bool(promo.patched),
        verify_samples=verify.samples or 0,
        since_last_sample_s=None if last is None else (ctx.now - last).total_seconds(),
        window_elapsed_s=0.0 if window is None else (ctx.now - window).total_seconds(),
        revert=RevertIntent.from_dict(jsonrecord.write(revert)) if revert.phase else None,
        revert_attempts=revert.attempts or 0,
        revert_error=revert.last_error,
        remedy_attempts=(status.remediation.attempt if status.remediation else None) or 0,
        consecutive_errors=status.consecutive_errors or 0,
        pull_request=status.pull_request,
        spec_changed_to=superseding.newer_generation(status, ctx.generation),
    )


@dataclass(frozen=True)
class Begun:
    """A reconcile's start: its context, the status it found and what it goes on from.

    `ended`: the rollout ended and its spec did not change since, so only its recorded
    deletions are due (`state` is None then). A new spec after the end starts a new run from an
    empty status (`cleared`: the keys the new run removes), its deletions still due kept."""

    ctx: Ctx
    old: dict[str, Any]  # the body's status, our own copy
    phase: Phase
    spec_errors: tuple[str, ...] = ()
    state: State | None = None
    cleared: dict[str, Any] = field(default_factory=dict)
    ended: bool = False


def begin(
    body: kopf.Body,
    meta: Mapping[str, Any],
    kube: KubeApi,
    config: OperatorConfig,
    logger: logging.Logger | logging.LoggerAdapter[Any],
) -> Begun:
    """The context of one reconcile of `body`, from its status and spec as they are now."""
    old = copy.deepcopy(dict(body.get("status") or {}))  # nothing may change kopf's body
    status = copy.deepcopy(old)
    found = RolloutStatus.from_dict(old)
    phase = found.phase or Phase.PENDING
    generation = meta.get("generation")
    ended = found.ended and superseding.newer_generation(found, generation) is None
    cleared: dict[str, Any] = {}
    if found.ended and not ended:
        # A new spec after the end (or during a run that had to finish first) starts a new
        # rollout, like Flagger's retry by spec change; the last run's findings are cleared so
        # none of them can vote in the new verdict. Its deletions still due go first.
        cleared = dict.fromkeys(status)
        status = RolloutStatus(phase=Phase.PENDING, pending_actions=found.pending_actions).to_dict()
        phase = Phase.PENDING
    spec, spec_errors = parse_spec(body.get("spec") or {}, config)
    ctx = Ctx(body, meta["namespace"], meta["name"], generation, spec, StatusView(status),
              kube, config, logger, utcnow())  # fmt: skip
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
    """What one reconcile came to: the step decided and what its stages found and did, in
    order (kept up to a failing action); or a retry; or, for an ended rollout, whether its
    recorded deletions went through (`cleaned`)."""

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


def evaluated_container(ctx: Ctx) -> dict[str, Any]:
    """The production container as evaluated: image plus the command/args/env in status."""
    out = dict(ctx.so_far.previous)
    if ctx.so_far.evaluated_image is not None:
        out["image"] = ctx.so_far.evaluated_image
    return out


def shown_env(ctx: Ctx) -> frozenset[str]:
    """Env names whose values status may show: the engine's allowlist and the rollout's own
    extraEnv (the only variables kvgate changes, so the only ones a revert must restore)."""
    engine = ctx.so_far.engine
    return ctx.config.allowlist.env_for(engine) | {e.name for e in ctx.spec.extra_env}


@dataclass(frozen=True)
class CandidateRecord:
    """What status records of a candidate: its fingerprinted config and the args and env an SRE
    would set by hand."""

    config: dict[str, Any]
    args: tuple[str, ...]
    env: tuple[EnvVar, ...]

    def update(self) -> StatusUpdate:
        return StatusUpdate.of(
            candidate=self.config, recommendedArgs=self.args, recommendedEnv=self.env
        )


def candidate_record(
    spec: RolloutSpec,
    candidate: Mapping[str, Any],
    show_env: frozenset[str],
    remedy_env: Mapping[str, str] | None = None,
) -> CandidateRecord:
    """The candidate as status records it (env: the rollout's extraEnv, a remedy's on top)."""
    env = {e.name: e.value for e in spec.extra_env} | dict(remedy_env or {})
    return CandidateRecord(
        config=redact.redact_config(manifests.container_config(candidate), show_env=show_env),
        args=tuple(
            redact.redact_args(
                list(candidate.get("command") or []) + list(candidate.get("args") or [])
            )
        ),
        env=tuple(EnvVar(name=k, value=v) for k, v in env.items()),
    )


def status_view(ctx: Ctx, container: Mapping[str, Any]) -> dict[str, Any]:
    """A container as status records it: literal env values and secret-looking flag values
    fingerprinted (token for token, so positions in args are kept), image as it is."""
    view = redact.redact_config(manifests.container_config(container), show_env=shown_env(ctx))
    if "image" in container:
        view["image"] = container["image"]
    return view


def against(ctx: Ctx, container: Mapping[str, Any]) -> promotion.Comparison:
    """`container` against the evaluated container and status.previous -> status.candidate."""
    status = ctx.so_far
    view = status_view(ctx, container)
    return promotion.compare(view, evaluated_container(ctx), status.previous, status.candidate)


def canary_port(status: RolloutStatus) -> int:
    """The port the engine serves on, as Pending read it from the container."""
    return 8000 if status.port is None else status.port


def metrics_url(status: RolloutStatus, ip: str) -> str:
    """The engine's /metrics at `ip`, on the port and path Pending read from the container."""
    return f"http://{ip}:{canary_port(status)}{status.metrics_path or '/metrics'}"


json_number = whole  # 13.0 -> 13, as the apiserver stores it (`jsonrecord.whole`)


def adopt_child(ctx: Ctx, obj: dict[str, Any], arm: str) -> None:
    kopf.adopt(obj, owner=ctx.body)
    # adopt() copies the rollout's labels onto the child; a label like app=<model> would let a
    # production Service route traffic to a canary, so children keep kvgate's labels only.
    obj["metadata"]["labels"] = {
        **manifests.child_labels(ctx.name, arm),
        **{
            k: v
            for k, v in (obj["metadata"].get("labels") or {}).items()
            if k.startswith("kvgate.io/")
        },
    }


def owned(ctx: Ctx, obj: Mapping[str, Any]) -> bool:
    """Whether this rollout (this very object, by uid) owns `obj`."""
    uid = (ctx.body.get("metadata") or {}).get("uid")
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(r.get("uid") == uid for r in refs)


def derive_candidate(ctx: Ctx, live: Mapping[str, Any]) -> dict[str, Any]:
    """The candidate container, from the spec and the live container; fail closed.

    Status holds only fingerprints, so what is created or patched is derived again here; the
    live container must still be the evaluated one, and the derived candidate must match the
    one recorded in Pending. Anything else raises: a changed target or an edited status never
    reaches a pod or the Deployment.
    """
    if against(ctx, live).differences:
        raise KvgateError("the Deployment changed since it was evaluated; not acting on it")
    candidate = manifests.candidate_container(ctx.spec, live, remedy=recorded_remedy(ctx))
    recorded = ctx.so_far.candidate
    if not recorded or status_view(ctx, manifests.container_config(candidate)) != recorded:
        raise KvgateError("the candidate derived now differs from the one evaluated in Pending")
    return candidate


def derive_candidate_unchecked(ctx: Ctx, live: Mapping[str, Any]) -> dict[str, Any]:
    """The candidate with status.remediation applied, before status records its fingerprint
    (only `act.remediate` calls this, right after `derive_candidate` checked the unremedied)."""
    return manifests.candidate_container(ctx.spec, live, remedy=recorded_remedy(ctx))


def recorded_remedy(ctx: Ctx) -> tuple[tuple[str, ...], dict[str, str]] | None:
    """The remedy status.remediation names, derived again from the engine table (never the
    args or env status shows); None without one. A record no row answers raises."""
    from kvgate import engine_versions

    record = ctx.so_far.remediation
    if record is None or record == RemediationStatus():
        return None
    engine, version, code = (str(v) for v in (record.engine, record.engine_version, record.code))
    try:
        remedy = engine_versions.remedy_for(engine, version, code)
    except ValueError:
        remedy = None
    if remedy is None:
        raise KvgateError(f"status.remediation names no known remedy ({engine} {version} {code})")
    return remedy
