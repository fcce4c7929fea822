"""kopf handlers for KVCacheRollout: gather evidence, call `machine.next_step`, act, write status.

Run with `kvgate run` (or `kopf run -m kvgate.controller.handlers`). One handler, `reconcile`, drives a
rollout: it is level-based (everything it needs is in `status` and in the cluster), so an
operator restart resumes where the last status write left off, and a step that runs twice
creates nothing twice (deterministic child names, create-if-absent). A timer (`poll`) runs it
when due (`schedule`): after the delay the core chose, or at once on a new spec; there are no
sleeps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any, Final

import kopf
import prometheus_client as prom

from kvgate.adapters.kube import Kube, load_api_client
from kvgate.config import OperatorConfig
from kvgate.controller import context, stages
from kvgate.controller.act import delete_canaries, delete_eval_jobs, revert_target
from kvgate.controller.context import Ctx, Logger, describe
from kvgate.controller.pullrequest import close_pull_request
from kvgate.controller.record import patch_fields, post_events, write
from kvgate.controller.schedule import schedule_of
from kvgate.controller.seen import live_key, live_target
from kvgate.controller.telemetry import API_REQUESTS, DRIFTED, PHASE, STALE
from kvgate.errors import ExternalError, KvgateError
from kvgate.flow.steps import Event, LiveTarget, Step
from kvgate.judge import verdictkey
from kvgate.reasons import Reason
from kvgate.records import conditions as cond
from kvgate.records.status import RolloutStatus
from kvgate.records.timestamps import iso
from kvgate.vocabulary import (
    GROUP,
    PLURAL,
    VERSION,
    Condition,
    Phase,
    PromotionMode,
)

_metrics_lock = threading.Lock()
_metrics_started: set[int] = set()


class QuietTicks(logging.Filter):
    """Drops kopf's "Timer 'poll' succeeded." lines (one per rollout per second)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timer 'poll' succeeded")


class NoDiffBase(kopf.DiffBaseStorage):
    """No last-handled configuration: kvgate has no create, update, resume or field handler
    (the timers read the spec as it is; tests/unit/test_kopf_handlers.py keeps it so), so the
    diff kopf keeps for those is never read. Storing it cost a PATCH of each new rollout (and
    of each spec change) carrying the whole spec in an annotation."""

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


@kopf.on.login()
async def login(
    logger: Logger,
    settings: kopf.OperatorSettings,
    memo: kopf.Memo,
    **kwargs: Any,
) -> kopf.AiohttpSession | None:
    """kopf's login through the kubernetes client, with a bounded connection pool.

    kopf's own session opens one TLS connection per request in flight, without limit: 100
    rollouts written at once held ~80 connections, each with its buffers. `kvgate run` sets the
    bound (`memo.api_connections`: the watch streams plus a few for writes; 0, no bound, where a
    namespace glob may add streams); writes beyond it wait for a free connection."""
    info = kopf.login_via_client(logger=logger, settings=settings, **kwargs)
    if info is None:
        return None
    import aiohttp  # kopf's HTTP client

    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=int(getattr(memo, "api_connections", 0) or 0), ssl=info.as_ssl_context()
        ),
        headers=info.as_http_headers(),
        proxy=info.proxy_url,
        trust_env=info.trust_env,
    )
    return kopf.AiohttpSession(
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
        aiohttp_session=session,
    )


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Operator settings in one place, each with its reason."""
    # `kvgate run` builds the config and passes it in memo; `kopf run -m` reads the environment.
    config = getattr(memo, "config", None) or OperatorConfig.from_env(os.environ)
    memo.config = config
    memo.kube = Kube(
        load_api_client(),
        on_request=lambda verb, resource: API_REQUESTS.labels(verb, resource).inc(),
    )
    # kvgate's own finalizer and storage keys, under its API group (not kopf.zalando.org).
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    # Explicit watch timeouts against silent watch freezes (kopf #585, #787; dask does the same).
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.watching.connect_timeout = 5
    settings.networking.request_timeout = 30
    # Only explicit kopf.event() calls become Events; handler logs stay logs.
    settings.posting.level = logging.WARNING
    # Handlers never sleep, but scrapes and log reads block: one thread each for many rollouts.
    settings.execution.max_workers = config.max_workers
    # A deleted rollout waits for its poll timer to exit; kopf checks again after this long
    # (60 s by default, which held every deletion caught mid-tick for a minute).
    settings.background.cancellation_polling = 1.0
    # Errors that are bugs retry with back-off rather than hot-looping.
    settings.execution.default_backoff = 5
    for noisy in ("httpx", "httpcore", "kubernetes.client.rest"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # The poll timer ticks every second per rollout; kopf logs each tick's success.
    objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, QuietTicks) for f in objects.filters):
        objects.addFilter(QuietTicks())
    with _metrics_lock:
        if config.metrics_port and config.metrics_port not in _metrics_started:
            prom.start_http_server(config.metrics_port)
            _metrics_started.add(config.metrics_port)


@kopf.on.probe(id="rollouts")
def probe_rollouts(memo: kopf.Memo, **_: Any) -> int:
    """Liveness detail: API calls made so far (shows the operator is working)."""
    kube: Kube | None = getattr(memo, "kube", None)
    return kube.requests if kube is not None else 0


TICK_S: Final = float(os.environ.get("KVGATE_TICK") or 1.0)


@kopf.timer(GROUP, VERSION, PLURAL, interval=TICK_S)
def poll(
    body: kopf.Body, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo, logger: Logger, **_: Any
) -> None:
    """Reconcile the rollout when it is due (`schedule`): the core's delay has passed, or its
    spec changed. A rollout being deleted is the cleanup's."""
    if meta.get("deletionTimestamp"):
        return
    schedule = schedule_of(memo)
    generation, version = meta.get("generation"), meta.get("resourceVersion")
    if not schedule.due(time.monotonic(), generation, version):
        return
    with schedule.lock:
        if meta.get("deletionTimestamp"):  # deleted while we waited for the lock (a live view)
            return
        delay: float | None = None
        try:
            reconcile(body=body, meta=meta, patch=patch, memo=memo, logger=logger)
        except kopf.TemporaryError as exc:
            delay = float(exc.delay) if exc.delay is not None else TICK_S
        except kopf.PermanentError as exc:  # no delay: not retried until the spec changes
            logger.warning("stalled, not retried until the spec changes: %s", exc)
        wrote = bool(patch.get("status"))
        schedule.ran_on(time.monotonic(), generation, version, delay=delay, wrote=wrote)


def reconcile(
    body: kopf.Body, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo, logger: Logger, **_: Any
) -> None:
    """Drive one rollout a step; raise TemporaryError to come back after the core's delay
    (`poll` schedules it). Begin, run the stages, write what they came to: one way."""
    begun = context.begin(body, meta, memo.kube, memo.config, logger)
    outcome = stages.run(begun)
    written = write(begun, patch, outcome)
    retry, step = outcome.retry, outcome.step
    if retry is not None:
        raise kopf.TemporaryError(retry.message, delay=retry.delay_s) from retry.error
    if step is None:
        return
    extra = {"phase": step.phase.value, "reason": step.reason}
    logger.info("%s: %s", step.phase.value, step.message, extra=extra)
    if step.phase is Phase.FAILED and step.reason.permanent:
        raise kopf.PermanentError(step.message)  # status says Stalled; retrying cannot help
    if step.requeue_s is not None and not step.terminal:
        raise kopf.TemporaryError(step.message, delay=step.requeue_s)
    if step.terminal and written is not None and written.pending_actions:
        raise kopf.TemporaryError("deleting the canaries and Jobs", delay=1)


def _side_ctx(body: kopf.Body, meta: kopf.Meta, memo: kopf.Memo, logger: Logger) -> Ctx:
    """The context of the handlers beside reconcile (cleanup, drift, a terminal's deletions)."""
    status = RolloutStatus.from_dict(context.status_of(body))
    return context.context_of(body, meta, memo.kube, memo.config, logger, status)[0]


@kopf.on.delete(GROUP, VERSION, PLURAL)
def cleanup(
    body: kopf.Body, meta: kopf.Meta, memo: kopf.Memo, logger: Logger, retry: int, **_: Any
) -> None:
    """Revert kvgate's change unless Promoted (read back) or in pullRequest mode (kvgate made no
    change there: Git did), then delete canaries and Jobs."""
    with schedule_of(memo).lock:  # after a reconcile in flight, never beside it
        _clean_up(body, meta, memo, logger, retry)


def _clean_up(
    body: kopf.Body, meta: kopf.Meta, memo: kopf.Memo, logger: Logger, retry: int
) -> None:
    ctx = _side_ctx(body, meta, memo, logger)
    phase = ctx.so_far.phase or Phase.PENDING
    step = Step(phase, Reason.DELETED, "rollout deleted")
    try:
        # pullRequest mode: what is on the Deployment came from Git; kvgate never writes it.
        never = phase is Phase.PROMOTED or ctx.spec.promotion.mode is PromotionMode.PULL_REQUEST
        live = live_target(ctx) if not never else None
        if live is not None and live.exists and live.ours_present:
            # Fail closed: a change that was not verified is undone before the rollout goes.
            if retry >= ctx.config.error_limit:
                post_events(ctx, (Event(Reason.REVERT_FAILED, "rollout deleted; the revert was not "
                       f"confirmed after {retry} attempts: the Deployment may still carry kvgate's "
                       "change", warning=True),))  # fmt: skip
            else:
                revert_target(ctx, step)
                raise kopf.TemporaryError("rollout deleted: waiting for the revert to read back",
                                          delay=2)  # fmt: skip
        if ctx.spec.promotion.mode is PromotionMode.PULL_REQUEST:
            _close_pull_request(ctx, step, retry)
        delete_canaries(ctx, step)
        delete_eval_jobs(ctx, step)
    except ExternalError as exc:
        raise kopf.TemporaryError(f"cleanup: {exc}", delay=5) from exc
    for p in Phase:
        with contextlib.suppress(KeyError):  # this operator never saw it in that phase
            PHASE.remove(ctx.namespace, ctx.name, p.value)
    for gauge in (DRIFTED, STALE):
        with contextlib.suppress(KeyError):
            gauge.remove(ctx.namespace, ctx.name)


def _close_pull_request(ctx: Ctx, step: Step, retry: int) -> None:
    """A deleted rollout no longer stands behind its open pull request: close it (retried up to
    the error limit, then a Warning Event; the deletion is not held forever by a forge)."""
    try:
        post_events(ctx, close_pull_request(ctx, step).events)
    except KvgateError as exc:
        if retry < ctx.config.error_limit:
            raise kopf.TemporaryError(f"cleanup: closing the pull request: {exc}", delay=5) from exc
        post_events(ctx, (Event(Reason.RECONCILE_ERROR,
                   f"rollout deleted; its pull request could not be closed after {retry} "
                   f"attempts ({describe(exc)}): close it by hand", warning=True),))  # fmt: skip


DRIFT_INTERVAL_S: Final = float(os.environ.get("KVGATE_DRIFT_INTERVAL") or 60)


def _has_verdict_in_force(status: Mapping[str, Any], **_: Any) -> bool:
    """Promoted, or a passing verdict reported (report and gate mode): a verdict that can go
    stale."""
    found = RolloutStatus.from_dict(status)
    return found.phase is Phase.PROMOTED or found.reported


@kopf.timer(GROUP, VERSION, PLURAL, interval=DRIFT_INTERVAL_S, when=_has_verdict_in_force)
def drift(
    body: kopf.Body, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo, logger: Logger, **_: Any
) -> None:
    """After the verdict: does the Deployment still carry the promoted config (Promoted only),
    and does what runs still match what the verdict was reached on (Stale)? Never re-applied."""
    ctx = _side_ctx(body, meta, memo, logger)
    live = live_target(ctx)
    if live is None:
        return
    conditions = updated = ctx.so_far.conditions
    if ctx.so_far.phase is Phase.PROMOTED:
        updated = _drifted(ctx, live, updated)
    updated = _stale(ctx, live, updated)
    if updated != conditions:
        patch_fields(patch, context.status_of(body), conditions=updated)


def _drifted(
    ctx: Ctx, live: LiveTarget, conditions: tuple[Condition, ...]
) -> tuple[Condition, ...]:
    name = ctx.spec.target.name
    drifted = not (live.exists and live.carries_candidate)
    if drifted:
        what = "is gone" if not live.exists else "no longer carries the promoted config"
        reason, message = Reason.DRIFTED, f"Deployment {name} {what}; kvgate does not re-apply it"
    else:
        reason, message = Reason.IN_SYNC, f"Deployment {name} carries the promoted config"
    return _flagged(ctx, conditions, cond.DRIFTED, DRIFTED, drifted, reason, message)


def _stale(ctx: Ctx, live: LiveTarget, conditions: tuple[Condition, ...]) -> tuple[Condition, ...]:
    """Stale=True when the Deployment runs the tested config on another image than the one the
    verdict was reached on (a tag moved, an image bump from Git); an Event when it turns."""
    key = verdictkey.recorded(ctx.so_far)
    if key is None or not (live.exists and live.carries_candidate):
        return conditions  # nothing recorded, or the tested config is not there to judge
    stale, reason, message = verdictkey.judge(key, live_key(ctx))
    return _flagged(ctx, conditions, cond.STALE, STALE, stale, reason, message, by_message=True)


def _flagged(
    ctx: Ctx,
    conditions: tuple[Condition, ...],
    ctype: str,
    gauge: prom.Gauge,
    flagged: bool,
    reason: Reason,
    message: str,
    by_message: bool = False,
) -> tuple[Condition, ...]:
    """Condition `ctype` and its gauge set to `flagged`, with a Warning Event when it turns
    True; unchanged (no write, no second Event) while its status (`by_message`: and message) is
    as it was."""
    gauge.labels(ctx.namespace, ctx.name).set(1 if flagged else 0)
    status = cond.TRUE if flagged else cond.FALSE
    was = cond.get_condition(conditions, ctype)
    if was is not None and (
        (was.status, was.message) == (status, message)
        if by_message
        else (was.status == cond.TRUE) == flagged
    ):
        return conditions
    if flagged:
        post_events(ctx, (Event(reason, message, warning=True),))
    return cond.set_condition(conditions, ctype, status, reason, message,
                              generation=ctx.generation, now=iso(ctx.now))  # fmt: skip
