"""kopf handlers for KVCacheRollout: gather evidence, call `verdict.next_step`, act, write status.

Run with `kvgate run` (or `kopf run -m kvgate.handlers`). One handler, `reconcile`, drives a
rollout: it is level-based (everything it needs is in `status` and in the cluster), so an
operator restart resumes where the last status write left off, and a step that runs twice
creates nothing twice (deterministic child names, create-if-absent). Waits are
`kopf.TemporaryError`s with the delay the core chose; there are no sleeps.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import kopf
import prometheus_client as prom

from kvgate import conditions as cond
from kvgate import engines, manifests, promotion, verdict
from kvgate.adapters.kube import Kube, load_api_client
from kvgate.config import OperatorConfig
from kvgate.errors import ExternalError, InputError, KubeError, KvgateError, SpecError
from kvgate.model import (
    ANNOTATION_APPROVE,
    ANNOTATION_CONFIG_HASH,
    GROUP,
    LABEL_ARM,
    LABEL_ROLLOUT,
    PLURAL,
    VERSION,
    Condition,
    GateMode,
    Phase,
    RolloutSpec,
    TargetRef,
    config_hash,
)
from kvgate.verdict import (
    Action,
    GateResult,
    LiveTarget,
    Observation,
    PodHealth,
    RevertIntent,
    State,
    Step,
)

# --- operator metrics (on the operator's own /metrics) -----------------------------------------

ROLLOUTS = prom.Counter("kvgate_rollouts_total", "Rollouts finished, by outcome.", ["outcome"])
ROLLBACKS = prom.Counter("kvgate_rollbacks_total", "Rollbacks, by reason.", ["reason"])
PHASE = prom.Gauge(
    "kvgate_rollout_phase", "1 for the rollout's current phase.", ["namespace", "name", "phase"]
)
ACCURACY_DELTA = prom.Gauge(
    "kvgate_accuracy_difference_pp",
    "Candidate minus control accuracy (percentage points).",
    ["namespace", "name"],
)
CAPACITY_RATIO = prom.Gauge(
    "kvgate_capacity_ratio", "Candidate over control KV tokens.", ["namespace", "name"]
)
EVENTS = prom.Counter(
    "kvgate_events_total", "Kubernetes Events posted.", ["namespace", "name", "type", "reason"]
)
API_REQUESTS = prom.Counter("kvgate_api_requests_total", "Kubernetes API calls.", ["verb"])
RECONCILE_ERRORS = prom.Counter(
    "kvgate_reconcile_errors_total", "Reconciles that failed, by exception type.", ["type"]
)
REVERT_FAILURES = prom.Counter(
    "kvgate_revert_failures_total",
    "Revert patches refused or not confirmed.",
    ["namespace", "name"],
)
DRIFTED = prom.Gauge(
    "kvgate_promotion_drifted",
    "1 when a Promoted rollout's Deployment no longer carries the promoted config.",
    ["namespace", "name"],
)

_metrics_lock = threading.Lock()
_metrics_started: set[int] = set()

# --- startup -----------------------------------------------------------------------------------


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Operator settings in one place, each with its reason."""
    # `kvgate run` builds the config and passes it in memo; `kopf run -m` reads the environment.
    config = getattr(memo, "config", None) or OperatorConfig.from_env(os.environ)
    memo.config = config
    memo.kube = Kube(load_api_client(), on_request=lambda verb: API_REQUESTS.labels(verb).inc())
    # kvgate's own finalizer and storage keys, under its API group (not kopf.zalando.org).
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Explicit watch timeouts against silent watch freezes (kopf #585, #787; dask does the same).
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.watching.connect_timeout = 5
    settings.networking.request_timeout = 30
    # Only explicit kopf.event() calls become Events; handler logs stay logs.
    settings.posting.level = logging.WARNING
    # Handlers never sleep, but scrapes and log reads block: one thread each for many rollouts.
    settings.execution.max_workers = config.max_workers
    # Errors that are bugs retry with back-off rather than hot-looping.
    settings.execution.default_backoff = 5
    for noisy in ("httpx", "httpcore", "kubernetes.client.rest"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    with _metrics_lock:
        if config.metrics_port and config.metrics_port not in _metrics_started:
            prom.start_http_server(config.metrics_port)
            _metrics_started.add(config.metrics_port)


@kopf.on.probe(id="rollouts")
def probe_rollouts(memo: kopf.Memo, **_: Any) -> int:
    """Liveness detail: API calls made so far (shows the operator is working)."""
    kube: Kube | None = getattr(memo, "kube", None)
    return kube.requests if kube is not None else 0


# --- the reconcile handler ---------------------------------------------------------------------


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


@dataclass
class _Ctx:
    """One reconcile call: the object, its parsed spec, the clients and the status so far."""

    body: kopf.Body
    namespace: str
    name: str
    generation: int | None
    spec: RolloutSpec
    status: dict[str, Any]
    kube: Kube
    config: OperatorConfig
    logger: logging.Logger
    now: dt.datetime
    deployment: dict[str, Any] | None = None  # read once per reconcile (`_deployment`)
    deployment_read: bool = False


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def reconcile(
    body: kopf.Body,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: logging.Logger,
    **_: Any,
) -> None:
    """Drive one rollout a step; raise TemporaryError to come back after the core's delay."""
    status = dict(body.get("status") or {})
    phase = Phase(status.get("phase") or Phase.PENDING.value)
    generation = meta.get("generation")
    if phase.terminal or (
        phase is Phase.AWAITING_APPROVAL and status.get("reason") == "VerdictReported"
    ):
        if status.get("observedGeneration") == generation:
            if status.get("pendingActions"):  # the end was recorded; its deletions are due
                spec, _errors = _parse_spec(body.get("spec") or {}, memo.config)
                ctx = _Ctx(body, meta["namespace"], meta["name"], generation, spec, status,
                           memo.kube, memo.config, logger, _now())  # fmt: skip
                try:
                    _run_pending(ctx, Step(phase, "Cleanup", "deleting children"))
                except ExternalError as exc:
                    raise kopf.TemporaryError(f"cleanup: {exc}", delay=5) from exc
                patch.status["pendingActions"] = None
            return
        # A new spec after the end starts a new rollout (like Flagger's retry by spec change);
        # the last run's findings are cleared so none of them can vote in the new verdict.
        for key in status:
            patch.status[key] = None
        status = {"phase": Phase.PENDING.value}
        phase = Phase.PENDING
    spec, spec_errors = _parse_spec(body.get("spec") or {}, memo.config)
    ctx = _Ctx(
        body=body,
        namespace=meta["namespace"],
        name=meta["name"],
        generation=generation,
        spec=spec,
        status=status,
        kube=memo.kube,
        config=memo.config,
        logger=logger,
        now=_now(),
    )
    state = _state(ctx, phase, meta)
    try:
        _run_pending(ctx, Step(phase, "Pending actions", "deleting children"))
        obs = _observe(ctx, phase, spec_errors)
        step = verdict.next_step(spec, state, obs, poll_s=ctx.config.poll_interval_s)
        _act(ctx, step)
    except Exception as exc:
        # Not evidence against the candidate: retry, and past the limit (or the phase's
        # deadline) end the rollout, reverting first in the patched phases (never promoting).
        errors = int(status.get("consecutiveErrors", 0)) + 1
        what = _describe(exc)
        RECONCILE_ERRORS.labels(type(exc).__name__).inc()
        if isinstance(exc, KvgateError):
            logger.warning("reconcile failed: %s", what)
        else:  # a bug: keep the traceback in the log, never in status or Events
            logger.error("reconcile failed: %s", what, exc_info=exc)
        step = verdict.give_up(spec, state, what, errors, limit=ctx.config.error_limit)
        if step is None:
            patch.status["consecutiveErrors"] = errors
            patch.status["message"] = f"retrying after: {what}"
            if errors == 1 or errors % 10 == 0:
                _event(ctx, "ReconcileError", f"{what} (consecutive errors: {errors})",
                       warning=True)  # fmt: skip
            raise kopf.TemporaryError(f"{what} (consecutive errors: {errors})", delay=10) from exc
        _act_best_effort(ctx, step)
    _write_status(ctx, patch, phase, step)
    extra = {"phase": step.phase.value, "reason": step.reason}
    logger.info("%s: %s", step.phase.value, step.message, extra=extra)
    if step.phase is Phase.FAILED and step.reason in ("InvalidSpec", "InvalidTarget"):
        raise kopf.PermanentError(step.message)  # status says Stalled; retrying cannot help
    if step.requeue_s is not None and not step.terminal:
        raise kopf.TemporaryError(step.message, delay=step.requeue_s)
    if step.terminal and ctx.status.get("pendingActions"):
        raise kopf.TemporaryError("deleting the canaries and Jobs", delay=1)


def _parse_spec(
    raw: Mapping[str, Any], config: OperatorConfig | None = None
) -> tuple[RolloutSpec, tuple[str, ...]]:
    try:
        return RolloutSpec.from_dict(raw, allow=config.allowlist if config else None), ()
    except ExceptionGroup as group:
        target = raw.get("targetRef") if isinstance(raw.get("targetRef"), Mapping) else {}
        fallback = RolloutSpec(target=TargetRef(str((target or {}).get("name") or "?")))
        return fallback, tuple(str(e) for e in group.exceptions)


def _state(ctx: _Ctx, phase: Phase, meta: Mapping[str, Any]) -> State:
    since = _parse_time(ctx.status.get("phaseSince")) or ctx.now
    gates = {
        k: GateResult.from_dict(k, v)
        for k, v in (ctx.status.get("gates") or {}).items()
        if isinstance(v, Mapping)
    }
    promo = ctx.status.get("promotion") or {}
    verify = promo.get("verify") or {}
    last = _parse_time(verify.get("lastSampleAt"))
    window = _parse_time(verify.get("windowStartedAt"))
    revert = ctx.status.get("revert") or {}
    return State(
        phase=phase,
        phase_elapsed_s=(ctx.now - since).total_seconds(),
        config_hash=str(ctx.status.get("configHash") or ""),
        eval_attempts=int((ctx.status.get("eval") or {}).get("attempt") or 0),
        gates=gates,
        approval=(meta.get("annotations") or {}).get(ANNOTATION_APPROVE),
        patched=bool(promo.get("patched")),
        verify_samples=int(verify.get("samples") or 0),
        since_last_sample_s=None if last is None else (ctx.now - last).total_seconds(),
        window_elapsed_s=0.0 if window is None else (ctx.now - window).total_seconds(),
        revert=RevertIntent.from_dict(revert) if revert.get("phase") else None,
        revert_attempts=int(revert.get("attempts") or 0),
        revert_error=revert.get("lastError"),
    )


def _describe(exc: BaseException) -> str:
    """One line for status and Events: the kind of failure and its message, bounded."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if not isinstance(exc, KvgateError):
        text = f"{type(exc).__name__}: {text}"
    return text[:500]


def _deployment(ctx: _Ctx) -> dict[str, Any] | None:
    """The target Deployment, read once per reconcile."""
    if not ctx.deployment_read:
        ctx.deployment = ctx.kube.read_deployment(ctx.namespace, ctx.spec.target.name)
        ctx.deployment_read = True
    return ctx.deployment


def _evaluated(ctx: _Ctx) -> dict[str, Any]:
    """The production container as evaluated: image plus the command/args/env in status."""
    out = dict(ctx.status.get("previous") or {})
    if ctx.status.get("evaluatedImage") is not None:
        out["image"] = ctx.status["evaluatedImage"]
    return out


def _live_container(ctx: _Ctx, dep: Mapping[str, Any] | None) -> tuple[int, dict[str, Any]] | None:
    if dep is None:
        return None
    try:
        return manifests.find_container(
            ((dep.get("spec") or {}).get("template") or {}).get("spec") or {},
            ctx.status.get("container"),
        )
    except LookupError:
        return None


def _live_target(ctx: _Ctx) -> LiveTarget | None:
    """The live Deployment against the evaluated container and kvgate's edits."""
    if not ctx.status.get("candidate"):
        return None  # nothing evaluated yet (Pending)
    dep = _deployment(ctx)
    if dep is None:
        return LiveTarget(exists=False)
    found = _live_container(ctx, dep)
    if found is None:
        return LiveTarget(exists=True, container_found=False)
    _, live = found
    previous, candidate = ctx.status.get("previous") or {}, ctx.status.get("candidate") or {}
    evaluated = _evaluated(ctx)
    differences = tuple(promotion.differences(evaluated, live))
    return LiveTarget(
        exists=True,
        as_evaluated=not differences,
        differences=differences,
        carries_candidate=promotion.carries(live, previous, candidate),
        ours_present=not promotion.reverted(live, previous, candidate),
    )


# --- observing ---------------------------------------------------------------------------------


def _observe(ctx: _Ctx, phase: Phase, spec_errors: tuple[str, ...]) -> Observation:
    if phase is Phase.PENDING:
        return _observe_pending(ctx, spec_errors)
    # Every phase after Pending reads the live Deployment: what status says kvgate did is
    # checked against what is there.
    live = _live_target(ctx)
    return _replace_obs(_observe_phase(ctx, phase, live), live=live)


def _observe_phase(ctx: _Ctx, phase: Phase, live: LiveTarget | None) -> Observation:
    if phase is Phase.PREFLIGHT:
        return _observe_preflight(ctx)
    if phase is Phase.CANARY:
        return _observe_canary(ctx)
    if phase is Phase.EVALUATING:
        return _observe_eval(ctx)
    if phase is Phase.PROMOTING and live is not None and live.carries_candidate:
        return _observe_promoting(ctx)
    if phase is Phase.VERIFYING and live is not None and live.carries_candidate:
        return _observe_verifying(ctx)
    return Observation()


def _observe_pending(ctx: _Ctx, spec_errors: tuple[str, ...]) -> Observation:
    if spec_errors:
        return Observation(spec_errors=spec_errors)
    spec = ctx.spec
    dep = _deployment(ctx)
    if dep is None:
        return Observation(target_missing=True)
    template = (dep.get("spec") or {}).get("template") or {}
    try:
        index, container = manifests.find_container(
            template.get("spec") or {}, spec.target.container
        )
        info = engines.detect_engine(container)
        if spec.engine.value != "auto" and spec.engine.value != str(info.engine):
            raise InputError(
                f"spec.engine is {spec.engine.value} but container {container.get('name')} "
                f"runs {info.engine}; fix spec.engine or use auto"
            )
        candidate = manifests.candidate_container(spec, container)
    except LookupError as exc:
        return Observation(target_problem=f"spec.targetRef: {exc}")
    except SpecError as exc:
        if exc.field == "kv_cache_dtype":
            return Observation(dtype_problem=f"spec.kvCacheDtype: {str(exc).split(': ', 1)[-1]}")
        return Observation(target_problem=str(exc))
    except InputError as exc:
        return Observation(target_problem=str(exc))
    conflicts = _conflicts(ctx)
    previous, wanted = manifests.container_config(container), manifests.container_config(candidate)
    ctx.status.update(
        engine=str(info.engine),
        container=str(container.get("name")),
        containerIndex=index,
        port=info.port,
        metricsPath=info.metrics_path,
        model=spec.model.name or info.model,
        servedModel=info.served_model_name or info.model,
        previous=previous,
        evaluatedImage=container.get("image"),
        candidate=wanted,
        recommendedArgs=list(candidate.get("command") or []) + list(candidate.get("args") or []),
        recommendedEnv=[e.to_dict() for e in spec.extra_env],
        configHash=config_hash(
            {
                "deployment": spec.target.name,
                "container": container.get("name"),
                "image": container.get("image"),
                "previous": previous,
                "candidate": wanted,
                "spec": ctx.body.get("spec"),
            }
        ),
    )
    return Observation(conflicts=conflicts)


def _conflicts(ctx: _Ctx) -> tuple[str, ...]:
    """Older active rollouts on the same Deployment (the oldest one wins)."""
    mine = (ctx.body["metadata"].get("creationTimestamp") or "", ctx.name)
    out = []
    for other in ctx.kube.list_rollouts(ctx.namespace):
        om = other.get("metadata") or {}
        if om.get("name") == ctx.name:
            continue
        if ((other.get("spec") or {}).get("targetRef") or {}).get("name") != ctx.spec.target.name:
            continue
        phase = (other.get("status") or {}).get("phase") or Phase.PENDING.value
        if Phase(phase).terminal or (
            phase == Phase.AWAITING_APPROVAL.value
            and (other.get("status") or {}).get("reason") == "VerdictReported"
        ):
            continue
        # A rollout past Pending has claimed the Deployment; between two Pending ones the
        # older wins (creation time, then name, so both operators' views agree).
        claimed = phase != Phase.PENDING.value
        if claimed or (om.get("creationTimestamp") or "", om.get("name", "")) < mine:
            out.append(str(om.get("name")))
    return tuple(out)


def _production_pods(ctx: _Ctx) -> list[dict[str, Any]]:
    dep = _deployment(ctx)
    if dep is None:
        return []
    labels = (((dep.get("spec") or {}).get("selector") or {}).get("matchLabels")) or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    pods = ctx.kube.list_pods(ctx.namespace, selector) if selector else []
    return [p for p in pods if not (p["metadata"].get("labels") or {}).get(LABEL_ROLLOUT)]


def _metrics_url(ctx: _Ctx, ip: str) -> str:
    return f"http://{ip}:{ctx.status.get('port', 8000)}{ctx.status.get('metricsPath', '/metrics')}"


def _observe_preflight(ctx: _Ctx) -> Observation:
    """One pool sample per interval from every Ready production pod, kept in status."""
    gate = ctx.spec.capacity
    pre = dict(ctx.status.get("preflight") or {})
    if "checkpoint" not in pre:
        pre["checkpoint"] = _scan_checkpoint(ctx)
        pre["checkpointHasScales"] = pre["checkpoint"].get("present")
        ctx.status["preflight"] = pre
    if gate.mode is GateMode.OFF:
        return Observation()
    series: dict[str, list[dict[str, Any]]] = {
        k: list(v) for k, v in (pre.get("samples") or {}).items()
    }
    ticks = int(pre.get("ticks") or 0)
    last = _parse_time(pre.get("lastSampleAt"))
    due = last is None or (ctx.now - last).total_seconds() >= gate.interval_s * 0.9
    errors: list[str] = []
    if due and ticks < gate.samples:
        sampled_before = sum(len(v) for v in series.values())
        errors = _sample_pool(ctx, series)
        if sum(len(v) for v in series.values()) > sampled_before:
            ticks += 1  # a round with no sample (no Ready pod yet) does not count
        pre["lastSampleAt"] = _iso(ctx.now)
    pre.update(samples=series, ticks=ticks, errors=errors[-3:])
    pressured: bool | None = None
    detail = "; ".join(errors) or f"{ticks} of {gate.samples} samples"
    elapsed = (ctx.now - (_parse_time(ctx.status.get("phaseSince")) or ctx.now)).total_seconds()
    if ticks >= gate.samples or elapsed >= gate.window_s * 3:
        pressured, detail, per_pod = _pool_verdict(series, gate.usage_threshold)
        # `pressure` is the deciding replica's figures (what the report shows); all are kept.
        deciding = next((r for r in per_pod.values() if r.get("pressured") is pressured), None)
        pre["pressure"] = {**(deciding or {}), "pressured": pressured}
        pre["pressureByPod"] = per_pod
    ctx.status["preflight"] = pre
    return Observation(pool_samples=ticks, pool_pressured=pressured, pool_detail=detail)


def _scan_checkpoint(ctx: _Ctx) -> dict[str, Any]:
    """KV scales and capacity math from the checkpoint headers; any failure is a finding."""
    from kvgate.adapters import hub

    model = ctx.status.get("model")
    if not model:
        return {"present": None, "finding": "no model in the spec or the container args"}
    local = os.path.exists(model)
    if not local and not hub.looks_like_repo_id(model):
        return {"present": None, "finding": f"{model}: not a local path nor a hub repo id"}
    if not local and ctx.config.hub_offline:
        return {"present": None, "finding": f"{model}: hub not consulted (HF_HUB_OFFLINE)"}
    secret = ctx.spec.model.token_secret
    try:
        token = (
            ctx.kube.read_secret_value(ctx.namespace, secret.name, secret.key) if secret else None
        )
        headers = (
            hub.read_local_checkpoint(model)
            if local
            else hub.read_hub_checkpoint(model, revision=ctx.spec.model.revision, token=token)
        )
        layout, scales = headers.analyse()
    except KvgateError as exc:  # unreachable hub, no weights...: the scales gate decides
        return {"present": None, "finding": f"{type(exc).__name__}: {exc}"[:500]}
    return {
        "source": headers.source,
        "commit": headers.commit,
        "present": scales.present,
        "coverage": scales.coverage,
        "expectedCapacityGain": layout.bytes_per_token("bf16") / layout.bytes_per_token("fp8"),
        "kvBytesPerToken": {d: layout.bytes_per_token(d) for d in ("bf16", "fp8")},
    }


def _sample_pool(ctx: _Ctx, series: dict[str, list[dict[str, Any]]]) -> list[str]:
    from kvgate import metrics
    from kvgate.adapters import http

    errors: list[str] = []
    pods = _production_pods(ctx)
    for pod in pods:
        health = verdict.pod_health(pod, ctx.status.get("container"))
        if not (health.ready and health.ip):
            continue
        try:
            snap = metrics.parse_metrics(
                http.scrape(_metrics_url(ctx, health.ip), timeout=ctx.config.scrape_timeout_s),
                ctx.status.get("engine"),
            )
        except (ExternalError, InputError) as exc:  # a bad scrape is a missing sample
            errors.append(str(exc))
            continue
        # Nulls are left out (merge-patch drops them); whole floats as the apiserver stores them.
        sample = {k: _json_number(v) for k, v in metrics.pool_sample(snap).items()}
        series.setdefault(pod["metadata"]["name"], []).append(sample)
    if not pods:
        errors.append(f"no production pods of Deployment {ctx.spec.target.name}")
    return errors


def _json_number(value: Any) -> Any:
    """13.0 -> 13, as the apiserver stores it, so status round-trips unchanged."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _pool_verdict(
    series: Mapping[str, list[dict[str, Any]]], usage_threshold: float
) -> tuple[bool | None, str, dict[str, Any]]:
    """The pool verdict over the samples kept in status."""
    from kvgate import metrics

    snapshots = {
        pod: [metrics.snapshot_from_pool_sample(s) for s in samples]
        for pod, samples in series.items()
    }
    pressured, detail, results = metrics.pool_pressure_across_replicas(
        snapshots, usage_threshold=usage_threshold
    )
    return pressured, detail, {pod: r.to_dict() for pod, r in results.items()}


def _arm_scan(ctx: _Ctx, arm: str, health: PodHealth) -> dict[str, Any] | None:
    """The arm's startup-log scan: from status when already read, else from the pod log."""
    from kvgate import logs

    arms = ctx.status.setdefault("arms", {})
    block = dict(arms.get(arm) or {})
    if block.get("scan") is not None:
        return dict(block["scan"])
    if not (health.ready or health.crashed):
        return None
    pod = manifests.canary_name(ctx.name, arm)
    text = ctx.kube.read_log(ctx.namespace, pod, ctx.status.get("container")) or ""
    if health.restarts:
        previous = ctx.kube.read_log(ctx.namespace, pod, ctx.status.get("container"), previous=True)
        text = (previous or "") + "\n" + text
    scan = _compact_scan(logs.scan_log(text, engine=ctx.status.get("engine")).to_dict())
    if health.crashed:
        scan["tail"] = [line[:300] for line in text.strip().splitlines()[-3:]]
    block.update(pod=pod, ip=health.ip, scan=scan)
    block["attentionBackend"] = scan.get("attention_backend")
    block["kvTokens"] = verdict.kv_tokens(scan)
    arms[arm] = block
    return scan


def _compact_scan(scan: dict[str, Any]) -> dict[str, Any]:
    """Keep status small: at most 20 findings, each line text cut to 300 characters."""
    findings = []
    for f in (scan.get("findings") or [])[:20]:
        f = dict(f)
        if isinstance(f.get("text"), str):
            f["text"] = f["text"][:300]
        findings.append(f)
    return {**scan, "findings": findings}


def _arm_health(ctx: _Ctx, arm: str) -> PodHealth:
    pod = _current(ctx, ctx.kube.read_pod(ctx.namespace, manifests.canary_name(ctx.name, arm)))
    return verdict.pod_health(pod, ctx.status.get("container"))


def _current(ctx: _Ctx, obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """`obj` if it belongs to this run's config, else None (a leftover of an earlier run)."""
    if obj is None:
        return None
    annotations = obj["metadata"].get("annotations") or {}
    return obj if annotations.get(ANNOTATION_CONFIG_HASH) == ctx.status.get("configHash") else None


def _leftover(ctx: _Ctx, obj: dict[str, Any] | None) -> bool:
    """An object with our name from an earlier run: wait until it is gone, never reuse it."""
    return obj is not None and _current(ctx, obj) is None


def _observe_canary(ctx: _Ctx) -> Observation:
    control, candidate = _arm_health(ctx, "control"), _arm_health(ctx, "candidate")
    control_scan = _arm_scan(ctx, "control", control)
    candidate_scan = _arm_scan(ctx, "candidate", candidate)
    _record_capacity(ctx)
    return Observation(
        control=control,
        candidate=candidate,
        control_scan=control_scan,
        candidate_scan=candidate_scan,
        checkpoint_has_scales=(ctx.status.get("preflight") or {}).get("checkpointHasScales"),
    )


def _record_capacity(ctx: _Ctx) -> None:
    arms = ctx.status.get("arms") or {}
    control = (arms.get("control") or {}).get("kvTokens")
    candidate = (arms.get("candidate") or {}).get("kvTokens")
    block: dict[str, Any] = {"control": {"kvTokens": control}, "candidate": {"kvTokens": candidate}}
    if control and candidate:
        block["ratio"] = round(candidate / control, 3)
        CAPACITY_RATIO.labels(ctx.namespace, ctx.name).set(block["ratio"])
    ctx.status["capacity"] = block


def _observe_eval(ctx: _Ctx) -> Observation:
    control, candidate = _arm_health(ctx, "control"), _arm_health(ctx, "candidate")
    ev = dict(ctx.status.get("eval") or {})
    attempt = int(ev.get("attempt") or 1)
    job_name = manifests.eval_job_name(ctx.name, attempt)
    job = _current(ctx, ctx.kube.read_job(ctx.namespace, job_name))
    obs = Observation(control=control, candidate=candidate, job_exists=job is not None)
    if job is None:
        return obs
    js = job.get("status") or {}
    failed = any(
        c.get("type") == "Failed" and c.get("status") == "True" for c in js.get("conditions") or []
    )
    finished = (
        failed
        or bool(js.get("succeeded"))
        or any(
            c.get("type") == "Complete" and c.get("status") == "True"
            for c in js.get("conditions") or []
        )
    )
    pods = ctx.kube.list_pods(ctx.namespace, f"job-name={job_name}")
    text = ""
    if pods:
        text = ctx.kube.read_log(ctx.namespace, pods[-1]["metadata"]["name"]) or ""
    summary, progress = _eval_lines(text, ev.get("nonceSha256"))
    if progress is not None:
        ev["progress"] = progress
    ctx.status["eval"] = ev
    if summary is not None and finished:
        _record_accuracy(ctx, summary)
        control_tpot, candidate_tpot = _speed_after_eval(ctx)
        return _replace_obs(
            obs,
            job_finished=True,
            eval_summary=summary,
            control_tpot_s=control_tpot,
            candidate_tpot_s=candidate_tpot,
        )
    if finished:
        reason = next(
            (
                c.get("message") or c.get("reason")
                for c in js.get("conditions") or []
                if c.get("type") == "Failed"
            ),
            "the Job ended without a summary line",
        )
        tail = " | ".join(text.strip().splitlines()[-3:])
        return _replace_obs(obs, job_finished=True, eval_error=f"{reason}; log tail: {tail}"[:500])
    return obs


def _replace_obs(obs: Observation, **kw: Any) -> Observation:
    from dataclasses import replace

    return replace(obs, **kw)


def _eval_lines(
    text: str, nonce_sha256: str | None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(summary, latest progress) from the eval Job's log.

    Evidence integrity: the summary is the log's last line only, and only when it carries the
    attempt's nonce (whose hash status keeps). lm-eval logs an arm's error bodies into the same
    log, so a summary-shaped line anywhere else proves nothing. Progress lines are only shown.
    """
    progress = None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        obj = _json_object(line)
        if obj is not None and obj.get("kind") == "kvgate.eval/progress":
            progress = obj
    last = _json_object(lines[-1]) if lines else None
    if last is None or last.get("kind") != "kvgate.eval/summary" or not nonce_sha256:
        return None, progress
    nonce = last.get("nonce")
    if not isinstance(nonce, str) or hashlib.sha256(nonce.encode()).hexdigest() != nonce_sha256:
        return None, progress
    summary = {k: v for k, v in last.items() if k != "nonce"}
    return summary, progress


def _json_object(line: str) -> dict[str, Any] | None:
    if not line.startswith("{") or len(line) > 1_000_000:
        return None
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _record_accuracy(ctx: _Ctx, summary: Mapping[str, Any]) -> None:
    acc = dict(summary)
    diff = (summary.get("paired") or {}).get("difference")
    if isinstance(diff, int | float):
        acc["differencePp"] = round(diff * 100, 2)
        ACCURACY_DELTA.labels(ctx.namespace, ctx.name).set(acc["differencePp"])
    acc.pop("kind", None)
    ctx.status["accuracy"] = acc


def _observe_promoting(ctx: _Ctx) -> Observation:
    dep = _deployment(ctx)
    assert dep is not None  # the live target exists and carries the candidate
    promo = ctx.status.get("promotion") or {}
    wanted_gen = int(promo.get("generation") or dep["metadata"].get("generation") or 0)
    done = _rolled_out(dep, wanted_gen)
    candidate_args = (ctx.status.get("candidate") or {}).get("args")
    new_pods = [
        p
        for p in _production_pods(ctx)
        if _container(p, ctx.status.get("container")).get("args") == candidate_args
        and not p["metadata"].get("deletionTimestamp")
    ]
    for pod in new_pods:
        health = verdict.pod_health(pod, ctx.status.get("container"))
        if health.crashed:
            return Observation(rollout_crashed=f"pod {pod['metadata']['name']}: {health.detail}")
    scan = None
    if done and new_pods:
        scan = _production_scan(ctx, new_pods[0])
    candidate_scan = ((ctx.status.get("arms") or {}).get("candidate") or {}).get("scan")
    # The promoted pods are checked against the candidate canary: same backend, same scales.
    return Observation(rollout_done=done, rollout_scan=scan, control_scan=candidate_scan)


def _rolled_out(dep: Mapping[str, Any], generation: int) -> bool:
    """The Deployment controller saw `generation` and every replica is updated and available."""
    ds, spec = dep.get("status") or {}, dep.get("spec") or {}
    replicas = int(spec.get("replicas", 1))
    return (
        int(ds.get("observedGeneration") or 0) >= generation > 0
        and int(ds.get("updatedReplicas") or 0) == replicas
        and int(ds.get("availableReplicas") or 0) == replicas
        and int(ds.get("readyReplicas") or 0) == replicas
        and int(ds.get("replicas") or 0) == replicas
        and not int(ds.get("unavailableReplicas") or 0)
    )


def _container(pod: Mapping[str, Any], name: str | None) -> dict[str, Any]:
    try:
        return manifests.find_container(pod.get("spec") or {}, name)[1]
    except LookupError:
        return {}


def _production_scan(ctx: _Ctx, pod: Mapping[str, Any]) -> dict[str, Any]:
    from kvgate import logs

    name = pod["metadata"]["name"]
    text = ctx.kube.read_log(ctx.namespace, name, ctx.status.get("container")) or ""
    scan = _compact_scan(logs.scan_log(text, engine=ctx.status.get("engine")).to_dict())
    promo = dict(ctx.status.get("promotion") or {})
    promo["podScan"] = {
        "pod": name,
        "attentionBackend": scan.get("attention_backend"),
        "kvTokens": verdict.kv_tokens(scan),
    }
    ctx.status["promotion"] = promo
    return scan


def _observe_verifying(ctx: _Ctx) -> Observation:
    """One verify sample when one is due: every check must pass (fail closed)."""
    state = _state(ctx, Phase.VERIFYING, ctx.body.get("metadata") or {})
    if not verdict.verify_due(ctx.spec, state):
        return Observation()
    from kvgate import metrics
    from kvgate.adapters import http

    dep = _deployment(ctx)
    assert dep is not None  # the live target exists and carries the candidate
    problems = []
    generation = int(dep["metadata"].get("generation") or 0)
    if not _rolled_out(dep, generation):
        ds = dep.get("status") or {}
        problems.append(
            f"Deployment not fully available ({ds.get('availableReplicas') or 0}/"
            f"{(dep.get('spec') or {}).get('replicas', 1)} available, "
            f"{ds.get('updatedReplicas') or 0} updated)"
        )
    pods = [p for p in _production_pods(ctx) if not p["metadata"].get("deletionTimestamp")]
    if not pods:
        problems.append("no production pods")
    candidate = ctx.status.get("candidate") or {}
    previous = ctx.status.get("previous") or {}
    waiting: dict[str, float] = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        if not promotion.carries(_container(pod, ctx.status.get("container")), previous, candidate):
            problems.append(f"pod {name} does not run the candidate")
            continue
        health = verdict.pod_health(pod, ctx.status.get("container"))
        if health.crashed:
            problems.append(f"pod {name}: {health.detail}")
            continue
        if not (health.ready and health.ip):
            problems.append(f"pod {name} is not Ready ({health.detail})")
            continue
        try:
            snap = metrics.parse_metrics(
                http.scrape(_metrics_url(ctx, health.ip), timeout=ctx.config.scrape_timeout_s),
                ctx.status.get("engine"),
            )
        except (ExternalError, InputError) as exc:
            problems.append(f"pod {name} metrics unreachable: {exc}")
            continue
        if snap.waiting is not None:
            waiting[name] = snap.waiting
    problem = verdict.verify_metrics_problem(_baseline_waiting(ctx), waiting)
    if problem:
        problems.append(problem)
    return Observation(production_problem="; ".join(problems) or None, sampled=True)


def _baseline_waiting(ctx: _Ctx) -> float | None:
    """The most requests any production pod had waiting during the preflight window."""
    samples = ((ctx.status.get("preflight") or {}).get("samples")) or {}
    values = [
        float(s["waiting"])
        for series in samples.values()
        for s in series
        if isinstance(s, Mapping) and isinstance(s.get("waiting"), int | float)
    ]
    return max(values) if values else None


# --- acting ------------------------------------------------------------------------------------


# Deletions are write-ahead: recorded with the step that decides them, made on the next
# reconcile. A crash in between re-runs them (they are idempotent); done at once, a crash
# after deleting a canary and before the status write would read as "canary disappeared".
_DEFERRED: Final = (Action.DELETE_CANARIES, Action.DELETE_EVAL_JOB)


def _act(ctx: _Ctx, step: Step) -> None:
    for action in step.actions:
        if action in _DEFERRED:
            pending = set(ctx.status.get("pendingActions") or ())
            ctx.status["pendingActions"] = sorted(pending | {action.value})
        else:
            _ACTIONS[action](ctx, step)


def _act_best_effort(ctx: _Ctx, step: Step) -> None:
    """Giving up after errors: try every action; owner references clean up what fails."""
    try:
        _act(ctx, step)
    except (ExternalError, KvgateError) as exc:
        ctx.logger.warning("acting failed while giving up: %s", exc)


def _run_pending(ctx: _Ctx, step: Step) -> None:
    """The deletions an earlier reconcile recorded; cleared once they all went through."""
    known = {a.value for a in Action}
    pending = [Action(a) for a in ctx.status.get("pendingActions") or () if a in known]
    for action in pending:
        _ACTIONS[action](ctx, step)
    if pending:
        ctx.status["pendingActions"] = None


def _create_canaries(ctx: _Ctx, step: Step) -> None:
    dep = _deployment(ctx)
    if dep is None:
        raise KvgateError(f"Deployment {ctx.spec.target.name} disappeared")
    template = (dep.get("spec") or {}).get("template") or {}
    index, container = manifests.find_container(
        template.get("spec") or {}, ctx.status.get("container")
    )
    wanted = ctx.status.get("candidate")
    if not wanted or (not wanted.get("args") and not wanted.get("command")):
        # Fail closed: without the stored candidate config the "candidate" would be a control.
        raise KvgateError("status.candidate is missing; cannot build the candidate pod")
    candidate = {k: v for k, v in container.items() if k not in ("command", "args", "env")}
    arms = {"control": container, "candidate": {**candidate, **wanted}}
    created = []
    for arm, c in arms.items():
        pod = manifests.build_canary_pod(
            rollout=ctx.name,
            namespace=ctx.namespace,
            arm=arm,
            template=template,
            container_index=index,
            container=c,
            config_hash=str(ctx.status.get("configHash")),
        )
        _adopt(ctx, pod, arm)
        existing = ctx.kube.read_pod(ctx.namespace, pod["metadata"]["name"])
        if existing is not None and not _owned(ctx, existing):
            raise KvgateError(
                f"pod {pod['metadata']['name']} exists and is not this rollout's; kvgate does "
                "not touch it: rename the rollout or remove that pod"
            )
        if _leftover(ctx, existing):
            _delete_owned(ctx, "Pod", existing)
            raise KubeError(f"pod {pod['metadata']['name']} of an earlier run is still terminating")
        if existing is None:
            ctx.kube.create(pod)
            created.append(pod["metadata"]["name"])
    if created:
        _event(ctx, "CanaryCreated", f"created {', '.join(created)}")


def _adopt(ctx: _Ctx, obj: dict[str, Any], arm: str) -> None:
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


def _owned(ctx: _Ctx, obj: Mapping[str, Any]) -> bool:
    """Whether this rollout (this very object, by uid) owns `obj`."""
    uid = (ctx.body.get("metadata") or {}).get("uid")
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(r.get("uid") == uid for r in refs)


def _delete_owned(ctx: _Ctx, kind: str, obj: Mapping[str, Any]) -> None:
    """Delete `obj` only if this rollout owns it, and only that object (uid precondition)."""
    if _owned(ctx, obj):
        meta = obj["metadata"]
        ctx.kube.delete(kind, ctx.namespace, meta["name"], uid=meta.get("uid"))


def _delete_canaries(ctx: _Ctx, step: Step) -> None:
    for arm in manifests.ARMS:
        pod = ctx.kube.read_pod(ctx.namespace, manifests.canary_name(ctx.name, arm))
        if pod is not None:
            _delete_owned(ctx, "Pod", pod)


def _create_eval_job(ctx: _Ctx, step: Step) -> None:
    ev = dict(ctx.status.get("eval") or {})
    attempt = step.eval_attempts or int(ev.get("attempt") or 1)
    arms = ctx.status.get("arms") or {}
    ips = {arm: _arm_health(ctx, arm).ip for arm in manifests.ARMS}
    if not all(ips.values()):
        raise KvgateError("a canary pod has no IP")  # bug-level: the core checked readiness
    port = ctx.status.get("port", 8000)
    env = {"PYTHONUNBUFFERED": "1"}
    if ctx.config.gsm8k_dir:
        env["KVGATE_GSM8K_DIR"] = ctx.config.gsm8k_dir
    job = manifests.build_eval_job(
        rollout=ctx.name,
        namespace=ctx.namespace,
        attempt=attempt,
        image=ctx.config.eval_image,  # the judge is the operator's, never the rollout's
        command=manifests.eval_command(
            ctx.spec,
            control_url=f"http://{ips['control']}:{port}/v1/completions",
            candidate_url=f"http://{ips['candidate']}:{port}/v1/completions",
            model=ctx.status.get("servedModel") or ctx.status.get("model"),
            concurrency=_eval_concurrency(ctx),
        ),
        env=env,
        resources=ctx.spec.canary.resources,
        deadline_s=ctx.spec.canary.eval_timeout_s,
        config_hash=str(ctx.status.get("configHash")),
        service_account_name=ctx.config.eval_service_account,
        nonce=secrets.token_hex(16),
        writable_tmp=ctx.config.eval_writable_tmp,
    )
    _adopt(ctx, job, "eval")
    existing = ctx.kube.read_job(ctx.namespace, job["metadata"]["name"])
    if existing is not None and not _owned(ctx, existing):
        raise KvgateError(
            f"Job {job['metadata']['name']} exists and is not this rollout's; kvgate does not "
            "touch it"
        )
    if _leftover(ctx, existing):
        _delete_owned(ctx, "Job", existing)
        raise KubeError(f"Job {job['metadata']['name']} of an earlier run is still terminating")
    if existing is None:
        existing = ctx.kube.create(job)
        _event(ctx, "EvalStarted", f"eval attempt {attempt}: Job {job['metadata']['name']}")
    # The nonce of the Job that runs (a restarted operator finds its predecessor's); only its
    # hash is kept in status, which rollout readers can see.
    ev.update(attempt=attempt, job=job["metadata"]["name"], nonceSha256=_nonce_hash(existing))
    ev.pop("progress", None)
    ctx.status["eval"] = ev
    del arms  # arms' IPs are read fresh: a restarted operator must not use stale ones


def _nonce_hash(job: Mapping[str, Any]) -> str | None:
    containers = (((job.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers"
    ) or [{}]
    for env in containers[0].get("env") or []:
        if env.get("name") == "KVGATE_EVAL_NONCE" and env.get("value"):
            return hashlib.sha256(str(env["value"]).encode()).hexdigest()
    return None


def _delete_eval_jobs(ctx: _Ctx, step: Step) -> None:
    selector = f"{LABEL_ROLLOUT}={ctx.name},{LABEL_ARM}=eval"
    seen = set()
    for pod in ctx.kube.list_pods(ctx.namespace, selector):
        job = (pod["metadata"].get("labels") or {}).get("job-name")
        if job and job not in seen:
            seen.add(job)
    attempts = int((ctx.status.get("eval") or {}).get("attempt") or 0)
    seen.update(manifests.eval_job_name(ctx.name, a) for a in range(1, attempts + 1))
    for name in sorted(seen):
        job = ctx.kube.read_job(ctx.namespace, name)
        if job is not None:
            _delete_owned(ctx, "Job", job)


def _snapshot_speed(ctx: _Ctx, step: Step) -> None:
    """Speed: TPOT histogram totals of both arms before the eval, which is the fixed load."""
    if ctx.spec.speed is None:
        return
    speed = dict(ctx.status.get("speed") or {})
    speed["before"] = _tpot_totals(ctx)
    ctx.status["speed"] = speed


def _tpot_totals(ctx: _Ctx) -> dict[str, Any]:
    """{arm: {sum, count}} of each arm's TPOT histogram now (arms without one are left out)."""
    from kvgate import metrics
    from kvgate.adapters import http

    out: dict[str, Any] = {}
    for arm in manifests.ARMS:
        ip = _arm_health(ctx, arm).ip
        if not ip:
            continue
        try:
            snap = metrics.parse_metrics(
                http.scrape(_metrics_url(ctx, ip), timeout=ctx.config.scrape_timeout_s),
                ctx.status.get("engine"),
            )
        except (ExternalError, InputError) as exc:
            out[arm] = {"error": str(exc)[:300]}
            continue
        hist = snap.tpot or snap.itl
        if hist is not None:
            out[arm] = {"sum": _json_number(hist.sum), "count": _json_number(hist.count)}
    return out


def _speed_after_eval(ctx: _Ctx) -> tuple[float | None, float | None]:
    """Mean TPOT of each arm over the eval window, recorded in status.speed."""
    if ctx.spec.speed is None:
        return None, None
    speed = dict(ctx.status.get("speed") or {})
    if "after" not in speed:
        speed["after"] = _tpot_totals(ctx)
    before, after = speed.get("before") or {}, speed["after"]
    tpots = {arm: verdict.mean_between(before.get(arm), after.get(arm)) for arm in manifests.ARMS}
    for arm, tpot in tpots.items():
        speed[arm] = {"tpotMs": None if tpot is None else round(tpot * 1000, 3)}
    speed["concurrency"] = _eval_concurrency(ctx)
    ctx.status["speed"] = speed
    return tpots["control"], tpots["candidate"]


def _eval_concurrency(ctx: _Ctx) -> int:
    """The eval's fixed concurrency: the speed gate's first level, else the operator default."""
    if ctx.spec.speed is not None and ctx.spec.speed.concurrency:
        return ctx.spec.speed.concurrency[0]
    return ctx.config.eval_concurrency


def _patch_deployment(ctx: _Ctx, step: Step) -> None:
    """Apply the candidate, once, as a test-and-set on the evaluated container.

    The decision is already in status (phase Promoting); the patch is refused by the apiserver
    if the container changed since this read, and its result is recorded in status.promotion.
    """
    dep = _deployment(ctx)
    found = _live_container(ctx, dep)
    if dep is None or found is None:
        raise KubeError(f"Deployment {ctx.spec.target.name} or its container disappeared")
    index, live = found
    if promotion.differences(_evaluated(ctx), live):
        raise KubeError("the Deployment changed since the evaluation; not patching")
    wanted = ctx.status.get("candidate") or {}
    ops = promotion.patch_ops(index, live, wanted)
    if not ops:
        raise KvgateError("the candidate equals the evaluated container: nothing to promote")
    dep = ctx.kube.patch_deployment(ctx.namespace, ctx.spec.target.name, ops)
    promo = dict(ctx.status.get("promotion") or {})
    promo.update(
        patched=True,
        patchedAt=_iso(ctx.now),
        generation=dep["metadata"].get("generation"),
    )
    ctx.status["promotion"] = promo
    _event(
        ctx,
        "Promoting",
        f"patched Deployment {ctx.spec.target.name} (generation {promo['generation']}): "
        f"{' '.join(ctx.status.get('recommendedArgs') or [])}",
    )


def _revert_deployment(ctx: _Ctx, step: Step) -> None:
    """Take kvgate's edits out of the live container (three-way), as a test-and-set.

    A refused patch is recorded, not raised: the next reconcile reads the Deployment back and
    either confirms the revert or reports RevertFailed and tries again after a back-off.
    """
    dep = _deployment(ctx)
    found = _live_container(ctx, dep)
    if dep is None or found is None:
        return  # the observation says why; nothing to patch
    index, live = found
    previous, candidate = ctx.status.get("previous") or {}, ctx.status.get("candidate") or {}
    ops = promotion.patch_ops(index, live, promotion.revert(live, previous, candidate))
    if not ops:
        return
    revert = dict(ctx.status.get("revert") or {})
    revert["attempts"] = int(revert.get("attempts") or 0) + 1
    revert["lastAttemptAt"] = _iso(ctx.now)
    try:
        ctx.kube.patch_deployment(ctx.namespace, ctx.spec.target.name, ops)
        revert.pop("lastError", None)
    except ExternalError as exc:
        REVERT_FAILURES.labels(ctx.namespace, ctx.name).inc()
        revert["lastError"] = _describe(exc)
        ctx.logger.warning("revert of %s refused: %s", ctx.spec.target.name, revert["lastError"])
    ctx.status["revert"] = revert


_ACTIONS = {
    Action.CREATE_CANARIES: _create_canaries,
    Action.DELETE_CANARIES: _delete_canaries,
    Action.CREATE_EVAL_JOB: _create_eval_job,
    Action.DELETE_EVAL_JOB: _delete_eval_jobs,
    Action.SNAPSHOT_SPEED: _snapshot_speed,
    Action.PATCH_DEPLOYMENT: _patch_deployment,
    Action.REVERT_DEPLOYMENT: _revert_deployment,
}


# --- recording ---------------------------------------------------------------------------------


def _event(ctx: _Ctx, reason: str, message: str, *, warning: bool | None = None) -> None:
    warn = cond.is_warning(reason) if warning is None else warning
    type_ = "Warning" if warn else "Normal"
    kopf.event(ctx.body, type=type_, reason=reason, message=message[:1000])
    EVENTS.labels(ctx.namespace, ctx.name, type_, reason).inc()
    ctx.logger.info("event %s: %s", reason, message, extra={"reason": reason})


_GATE_CONDITIONS = {
    verdict.POOL: cond.POOL_PRESSURE,
    verdict.SCALES: cond.SCALES_PRESENT,
    verdict.CANARY: cond.CANARY_HEALTHY,
    verdict.ACCURACY: cond.ACCURACY_NON_INFERIOR,
    verdict.CAPACITY_GAIN: cond.CAPACITY_GAINED,
}


def _gate_condition_status(result: GateResult) -> str:
    if result.outcome in (verdict.Outcome.SUCCESSFUL,):
        return cond.TRUE
    if result.outcome in (verdict.Outcome.FAILED, verdict.Outcome.NOT_NEEDED):
        return cond.FALSE
    if result.gate == verdict.SCALES and result.reason in ("ScalesMissing", "ScalesDropped"):
        return cond.FALSE
    if result.gate == verdict.POOL and result.reason == "PoolHasRoom":
        return cond.FALSE
    return cond.UNKNOWN


def _write_status(ctx: _Ctx, patch: kopf.Patch, old_phase: Phase, step: Step) -> None:
    now = _iso(ctx.now)
    status = ctx.status
    conditions = tuple(Condition.from_dict(c) for c in status.get("conditions") or [])
    if not conditions:
        conditions = cond.initial_conditions(ctx.generation, now)
    gates = dict(status.get("gates") or {})
    for g in step.gates:
        gates[g.gate] = g.to_dict()
        ctype = _GATE_CONDITIONS.get(g.gate)
        if ctype is not None:
            conditions = cond.set_condition(
                conditions, ctype, _gate_condition_status(g), g.reason, g.message,
                generation=ctx.generation, now=now,
            )  # fmt: skip
    reported = step.reason == "VerdictReported"
    conditions = cond.summary_conditions(
        conditions, step.phase, step.reason, step.message,
        generation=ctx.generation, now=now, ready_without_terminal=reported,
        stalled=step.reason == "RevertFailed",
    )  # fmt: skip
    status.update(
        phase=step.phase.value,
        reason=step.reason,
        message=step.message,
        observedGeneration=ctx.generation,
        gates=gates,
        conditions=[c.to_dict() for c in conditions],
        consecutiveErrors=0,
    )
    status.setdefault("startedAt", now)
    if step.phase is not old_phase or "phaseSince" not in status:
        status["phaseSince"] = now
    if step.eval_attempts is not None:
        status.setdefault("eval", {})["attempt"] = step.eval_attempts
    if step.verdict is not None:
        status["verdict"] = step.verdict.to_dict()
    if (
        step.revert is not None
        and step.phase is Phase.REVERTING
        and old_phase is not Phase.REVERTING
    ):
        # The write-ahead record of the revert: how it ends once the Deployment reads back clean.
        status["revert"] = {**step.revert.to_dict(), "startedAt": now, "attempts": 0}
    promo = dict(status.get("promotion") or {})
    if step.patched:
        promo.update(patched=True, adoptedAt=now)
        promo.setdefault("generation", (ctx.deployment or {}).get("metadata", {}).get("generation"))
    if step.verify_samples is not None:
        verify = dict(promo.get("verify") or {})
        if step.restart_window:
            verify["windowStartedAt"] = now
            if verify.get("samples"):
                verify["restarts"] = int(verify.get("restarts") or 0) + 1
        verify["samples"] = step.verify_samples
        if step.verify_samples:
            verify["lastSampleAt"] = now
        promo["verify"] = verify
    if promo:
        status["promotion"] = promo
    finished = step.terminal or reported
    first_finish = finished and not status.get("finishedAt")
    if first_finish:
        status["finishedAt"] = now
    for key, value in status.items():
        patch.status[key] = value
    for e in step.events:
        _event(ctx, e.reason, e.message, warning=e.warning)
    for p in Phase:
        PHASE.labels(ctx.namespace, ctx.name, p.value).set(1 if p is step.phase else 0)
    if first_finish:
        ROLLOUTS.labels(step.phase.value if not reported else "Reported").inc()
        if step.phase is Phase.ROLLED_BACK:
            ROLLBACKS.labels(step.reason).inc()
        _write_report(ctx, status)


def _write_report(ctx: _Ctx, status: Mapping[str, Any]) -> None:
    """The `<rollout>-report` ConfigMap: status.json, plus text and HTML when report.py exists."""
    rollout = {**dict(ctx.body), "status": dict(status)}
    files = {"status.json": manifests.status_json(rollout)}
    try:
        from kvgate import report
    except ImportError:
        report = None  # type: ignore[assignment]
    if report is not None:
        try:
            files["report.txt"] = report.render_text(rollout)
            files["report.html"] = report.render_html(rollout)
        except (KvgateError, ValueError, KeyError, TypeError) as exc:
            ctx.logger.warning("report rendering failed: %s", exc)
    cm = manifests.build_report_configmap(rollout=ctx.name, namespace=ctx.namespace, files=files)
    _adopt(ctx, cm, "report")
    try:
        ctx.kube.replace_configmap(cm)
    except ExternalError as exc:  # the verdict is in status already; the report is a copy
        ctx.logger.warning("could not write the report ConfigMap: %s", exc)


# --- deletion ----------------------------------------------------------------------------------


@kopf.on.delete(GROUP, VERSION, PLURAL)
def cleanup(
    body: kopf.Body,
    meta: kopf.Meta,
    memo: kopf.Memo,
    logger: logging.Logger,
    retry: int,
    **_: Any,
) -> None:
    """Revert kvgate's change unless Promoted (read back), then delete canaries and Jobs."""
    status = dict(body.get("status") or {})
    spec, _errors = _parse_spec(body.get("spec") or {}, memo.config)
    ctx = _Ctx(body, meta["namespace"], meta["name"], meta.get("generation"), spec, status,
               memo.kube, memo.config, logger, _now())  # fmt: skip
    phase = Phase(status.get("phase") or Phase.PENDING.value)
    step = Step(phase, "Deleted", "rollout deleted")
    try:
        live = _live_target(ctx) if phase is not Phase.PROMOTED else None
        if live is not None and live.exists and live.ours_present:
            # Fail closed: a change that was not verified is undone before the rollout goes.
            if retry >= ctx.config.error_limit:
                _event(ctx, "RevertFailed", "rollout deleted; the revert was not confirmed after "
                       f"{retry} attempts: the Deployment may still carry kvgate's change",
                       warning=True)  # fmt: skip
            else:
                _revert_deployment(ctx, step)
                raise kopf.TemporaryError("rollout deleted: waiting for the revert to read back",
                                          delay=2)  # fmt: skip
        _delete_canaries(ctx, step)
        _delete_eval_jobs(ctx, step)
    except ExternalError as exc:
        raise kopf.TemporaryError(f"cleanup: {exc}", delay=5) from exc
    for p in Phase:
        with contextlib.suppress(KeyError):  # this operator never saw it in that phase
            PHASE.remove(ctx.namespace, ctx.name, p.value)
    with contextlib.suppress(KeyError):
        DRIFTED.remove(ctx.namespace, ctx.name)


# --- drift ---------------------------------------------------------------------------------------

DRIFT_INTERVAL_S: Final = float(os.environ.get("KVGATE_DRIFT_INTERVAL") or 60)


def _is_promoted(status: Mapping[str, Any], **_: Any) -> bool:
    return status.get("phase") == Phase.PROMOTED.value


@kopf.timer(GROUP, VERSION, PLURAL, interval=DRIFT_INTERVAL_S, when=_is_promoted)
def drift(
    body: kopf.Body,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: logging.Logger,
    **_: Any,
) -> None:
    """After Promoted: does the Deployment still carry the promoted config? Never re-applied."""
    status = dict(body.get("status") or {})
    spec, _errors = _parse_spec(body.get("spec") or {}, memo.config)
    ctx = _Ctx(body, meta["namespace"], meta["name"], meta.get("generation"), spec, status,
               memo.kube, memo.config, logger, _now())  # fmt: skip
    live = _live_target(ctx)
    if live is None:
        return
    drifted = not (live.exists and live.carries_candidate)
    DRIFTED.labels(ctx.namespace, ctx.name).set(1 if drifted else 0)
    conditions = tuple(Condition.from_dict(c) for c in status.get("conditions") or [])
    was = cond.get_condition(conditions, cond.DRIFTED)
    if (was is not None and was.status == cond.TRUE) == drifted and was is not None:
        return
    if drifted:
        what = "is gone" if not live.exists else "no longer carries the promoted config"
        message = f"Deployment {spec.target.name} {what}; kvgate does not re-apply it"
        reason = "Drifted"
        _event(ctx, reason, message, warning=True)
    else:
        reason, message = "InSync", f"Deployment {spec.target.name} carries the promoted config"
    patch.status["conditions"] = [
        c.to_dict()
        for c in cond.set_condition(
            conditions,
            cond.DRIFTED,
            cond.TRUE if drifted else cond.FALSE,
            reason,
            message,
            generation=ctx.generation,
            now=_iso(ctx.now),
        )
    ]
