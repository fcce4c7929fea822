"""Gathering evidence for `machine.next_step`: one `observe_*` per phase, each returning an
`Observation` and the findings status keeps of what it read (a `StatusUpdate`; it writes no
status: `record.folded` does). The cluster reads a phase needs come in one `Seen`
(`controller/seen.py`, read once at the start); what only some reconciles read (a startup log,
/metrics, Prometheus, the checkpoint) is read in `controller/sources.py`; the object rules live
in `kubeobjects`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from kvgate import redact
from kvgate.change import manifests
from kvgate.controller import preflight, promoted, pullrequest, sources
from kvgate.controller.candidate import candidate_record
from kvgate.controller.changes import NOTHING, Observed, StatusFields, StatusUpdate
from kvgate.controller.context import Ctx
from kvgate.controller.seen import Seen, look
from kvgate.controller.telemetry import ACCURACY_DELTA, CAPACITY_RATIO
from kvgate.engines import launch as engines
from kvgate.errors import ExternalError, InputError, SpecError
from kvgate.evidence import kubeobjects
from kvgate.evidence.kubeobjects import PodHealth
from kvgate.flow import reuse
from kvgate.flow.steps import Observation, State
from kvgate.judge import gates, remedy
from kvgate.judge import target as targetcheck
from kvgate.records.evalsummary import AccuracyStatus, progress_line
from kvgate.records.joblog import eval_lines, job_lines
from kvgate.records.loadresult import LoadProgress, LoadSummary
from kvgate.records.status import (
    ArmStatus,
    CacheTruth,
    CapacityStatus,
    ClocksRecord,
    EvalStatus,
    LoadStatus,
    PreflightStatus,
    ScanRecord,
    SpeedStatus,
    read_eval_progress,
)
from kvgate.vocabulary import Phase, config_hash


def observe(ctx: Ctx, phase: Phase, spec_errors: tuple[str, ...], state: State) -> Observed:
    """The phase's evidence: its cluster reads once (`seen.look`), then its observer."""
    if phase is Phase.PENDING and spec_errors:
        return Observation(spec_errors=spec_errors), NOTHING
    seen = look(ctx, phase, state)  # the phase's reads, once
    obs, found = observe_phase(ctx, phase, seen, state)
    return dataclasses.replace(obs, live=seen.live), found


def observe_phase(ctx: Ctx, phase: Phase, seen: Seen, state: State) -> Observed:
    carried = seen.live is not None and seen.live.carries_candidate
    if phase is Phase.PENDING:
        return observe_pending(ctx, seen)
    if phase is Phase.PREFLIGHT:
        return preflight.observe(ctx, seen, state.phase_elapsed_s)
    if phase is Phase.CANARY:
        return observe_canary(ctx, seen)
    if phase is Phase.EVALUATING:
        return observe_eval(ctx, seen)
    if phase is Phase.MEASURING:
        return observe_load(ctx, seen)
    if phase in (Phase.PROMOTING, Phase.VERIFYING) and carried:
        return promoted.observe(ctx, phase, seen)
    if phase in (Phase.PULL_REQUEST_OPEN, Phase.PULL_REQUEST_MERGED):
        return pullrequest.observe(ctx, phase, seen), NOTHING
    return Observation(), NOTHING


def observe_pending(ctx: Ctx, seen: Seen) -> Observed:
    args = (ctx.kube, ctx.config, ctx.namespace, ctx.spec)
    secret_problem = sources.hub_token_problem(*args) or sources.forge_token_problem(*args)
    if secret_problem:  # fail closed before any Pod or Job exists
        return Observation(spec_errors=(secret_problem,)), NOTHING
    try:  # the eval Job's bounds: a rollout may lower them, never raise or drop them
        manifests.eval_resources(ctx.config.eval_resources, ctx.spec.canary.resources)
    except InputError as exc:
        return Observation(spec_errors=(str(exc),)), NOTHING
    spec = ctx.spec
    dep = seen.deployment
    if dep is None:
        return Observation(target_missing=True), NOTHING
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
        return Observation(target_problem=f"spec.targetRef: {exc}"), NOTHING
    except SpecError as exc:
        if exc.field == "kv_cache_dtype":
            why = str(exc).split(": ", 1)[-1]
            return Observation(dtype_problem=f"spec.kvCacheDtype: {why}"), NOTHING
        return Observation(target_problem=str(exc)), NOTHING
    except InputError as exc:
        return Observation(target_problem=str(exc)), NOTHING
    # What `kvgate check` calls an error: a target no rollout can reach a verdict on.
    problem = targetcheck.check(dep, container=spec.target.container).problem()
    if problem:
        return Observation(target_problem=problem), NOTHING
    conflicts = rollout_conflicts(ctx)
    # Status holds fingerprints, never literal env values or secret flag values: what is
    # patched is re-derived from the spec and the live container, not read back from status.
    show = ctx.config.allowlist.env_for(str(info.engine)) | {e.name for e in spec.extra_env}
    previous = redact.redact_config(manifests.container_config(container), show_env=show)
    record = candidate_record(spec, candidate, show)
    found = record.then(StatusUpdate.of(
        engine=str(info.engine),
        container=str(container.get("name")),
        container_index=index,
        port=info.port,
        metrics_path=info.metrics_path,
        model=spec.model.name or info.model,
        served_model=info.served_model_name or info.model,
        previous=previous,
        evaluated_image=container.get("image"),
        run_generation=ctx.generation,
        config_hash=config_hash(
            {
                "deployment": spec.target.name,
                "container": container.get("name"),
                "image": container.get("image"),
                "previous": previous,
                "candidate": record.fields["candidate"],
                "spec": ctx.spec_source,
            }
        ),
    ))  # fmt: skip
    return Observation(conflicts=conflicts), found


def rollout_conflicts(ctx: Ctx) -> tuple[str, ...]:
    """Older active rollouts on the same Deployment (the oldest one wins)."""
    mine = (ctx.rollout.created, ctx.name)
    found = (
        kubeobjects.rollout_conflict(other, mine, ctx.spec.target.name)
        for other in ctx.kube.list_rollouts(ctx.namespace)
    )
    return tuple(name for name in found if name is not None)


def arm_scan(ctx: Ctx, seen: Seen, arm: str) -> tuple[ScanRecord | None, ArmStatus | None]:
    """The arm's startup-log scan: from status, else from the pod log (with the status block
    that keeps it; None: as it was)."""
    health = seen.arm(arm)
    block = ctx.so_far.arms.get(arm) or ArmStatus()
    if block.scan is not None:
        return block.scan, None
    if arm not in seen.to_scan:  # not yet (or not again)
        return None, None
    pod = manifests.canary_name(ctx.name, arm)
    container = ctx.so_far.container
    # after a restart, the crash is in the previous container's log, the restart in this one
    previous, text = sources.pod_logs(
        ctx.kube, ctx.namespace, pod, container, previous=bool(health.restarts)
    )
    scan = sources.scan_engine_log(text, ctx.so_far.engine, previous=previous)
    if health.crashed:
        # scrubbed as the findings' lines are (`compact_scan`): status is readable like Events
        both = f"{previous}\n{text}"  # a container that died at once has an empty log
        tail = tuple(redact.clipped(line, 300) for line in both.strip().splitlines()[-3:])
        scan = dataclasses.replace(scan, tail=tail)
    block = dataclasses.replace(
        arm_gpu(seen, arm, block),
        pod=pod,
        ip=health.ip,
        scan=scan,
        # the image the verdict is reached on, by digest (its key)
        image_id=health.image_id or block.image_id,
    )
    return scan, block


def arm_gpu(seen: Seen, arm: str, block: ArmStatus) -> ArmStatus:
    """`block` with where the arm runs (the candidate's is in the verdict key); what is unknown
    now is left as it was."""
    place = seen.placement(arm)
    return dataclasses.replace(
        block,
        node=block.node if place.node is None else place.node,
        gpu_product=block.gpu_product if place.gpu_product is None else place.gpu_product,
        gpu_count=block.gpu_count if place.gpu_count is None else place.gpu_count,
    )


def arm_metrics(
    ctx: Ctx, arm: str, health: PodHealth, block: ArmStatus | None
) -> tuple[CacheTruth | None, str | None, ArmStatus | None]:
    """The arm's /metrics cache info: from its status `block`, else scraped once. Returns
    (truth, error, the block that keeps them; None: as it was); a failed scrape is kept in
    status (`metricsError`) and retried."""
    block = block or ArmStatus()
    if block.metrics is not None:
        return block.metrics, None, None
    if not (health.ready and health.ip):
        return None, None, None
    source = "/metrics"
    try:
        truth = sources.cache_truth(ctx.so_far, health.ip, ctx.config.scrape_timeout_s)
        if ctx.so_far.engine == "sglang":
            source = "server info"
            info = sources.server_info(
                health.ip, sources.canary_port(ctx.so_far), ctx.config.scrape_timeout_s
            )
            truth = dataclasses.replace(truth, server_info=info)
    except (ExternalError, InputError) as exc:
        error = f"{arm} {source}: {str(exc)[:300]}"
        return None, error, dataclasses.replace(block, metrics_error=error)
    return truth, None, dataclasses.replace(block, metrics=truth, metrics_error=None)


def observe_canary(ctx: Ctx, seen: Seen) -> Observed:
    control, candidate = seen.control, seen.candidate
    arms = dict(ctx.so_far.arms)  # each arm's status block as this look leaves it
    scans: dict[str, ScanRecord | None] = {}
    for arm in manifests.ARMS:
        scans[arm], block = arm_scan(ctx, seen, arm)
        if block is not None:
            arms[arm] = block
    control_scan, candidate_scan = scans["control"], scans["candidate"]
    capacity = capacity_of(ctx, arms)
    pre = ctx.so_far.preflight or PreflightStatus()
    truths: dict[str, CacheTruth | None] = {}
    errors = []
    if control_scan is not None and candidate_scan is not None:
        for arm in manifests.ARMS:
            truths[arm], error, block = arm_metrics(ctx, arm, seen.arm(arm), arms.get(arm))
            if block is not None:
                arms[arm] = block
            if error:
                errors.append(error)
    found = (
        StatusUpdate.of(arms=arms, capacity=capacity)
        if arms != dict(ctx.so_far.arms)
        else StatusUpdate.of(capacity=capacity)
    )
    obs = Observation(
        control=control,
        candidate=candidate,
        control_scan=control_scan,
        candidate_scan=candidate_scan,
        control_metrics=truths.get("control"),
        candidate_metrics=truths.get("candidate"),
        metrics_error="; ".join(errors) or None,
        remedy=remedy.find_remedy(
            candidate_scan if candidate.crashed else None,
            ctx.so_far.engine,
            engines.image_version(ctx.so_far.evaluated_image or ""),
            ctx.config.allowlist,
        ),
        checkpoint_has_scales=pre.checkpoint_has_scales,
        broken_scales=pre.checkpoint.broken_scales if pre.checkpoint else (),
    )
    if truths.get("control") is not None and truths.get("candidate") is not None:
        # spec.reuseVerdict: a verdict of another rollout this candidate may take, read once
        # both arms are read (the canary phase ends)
        reused = reuse.reusable(
            dataclasses.replace(ctx.so_far, arms=arms), ctx.spec,
            lambda: ctx.kube.list_rollouts(ctx.namespace),
            namespace=ctx.namespace, name=ctx.name, now=ctx.now,
        )  # fmt: skip
        obs = dataclasses.replace(obs, reused_verdict=reused)
    return obs, found


def capacity_of(ctx: Ctx, arms: Mapping[str, ArmStatus]) -> CapacityStatus | None:
    """Candidate over control KV tokens, once both scans state them."""
    control = arms["control"].kv_tokens if "control" in arms else None
    candidate = arms["candidate"].kv_tokens if "candidate" in arms else None
    if not (control and candidate):
        return None
    ratio = round(candidate / control, 3)
    CAPACITY_RATIO.labels(ctx.namespace, ctx.name).set(ratio)
    return CapacityStatus(ratio=ratio)


def observe_eval(ctx: Ctx, seen: Seen) -> Observed:
    control, candidate, job, text = seen.control, seen.candidate, seen.job, seen.job_log
    ev = ctx.so_far.eval or EvalStatus()
    obs = Observation(control=control, candidate=candidate, job_exists=job is not None)
    if job is None:
        return obs, NOTHING
    finished = kubeobjects.job_finished(job)
    summary, progress = eval_lines(text, ev.nonce_sha256)
    fields = StatusFields()  # what the look finds, one update
    if progress is not None:
        progress = progress_line(progress)  # the Job's spelling ends here
        fields["eval"] = dataclasses.replace(ev, progress=progress)
        obs = dataclasses.replace(obs, eval_progress=read_eval_progress(progress))
    if summary is not None and finished:
        accuracy = AccuracyStatus.from_summary(summary)  # read once: judged and kept
        fields["accuracy"] = accuracy
        publish_accuracy(ctx, accuracy)
        control_tpot, candidate_tpot, clocks, speed = speed_after_eval(ctx, seen)
        if speed is not None:
            fields["speed"] = speed
        obs = dataclasses.replace(
            obs,
            eval_summary=accuracy,
            control_tpot_s=control_tpot,
            candidate_tpot_s=candidate_tpot,
            speed_clocks=clocks,
        )
        return obs, StatusUpdate(fields)
    if finished:
        reason = kubeobjects.job_failure(job)
        tail = " | ".join(text.strip().splitlines()[-3:])
        obs = dataclasses.replace(obs, eval_error=f"{reason}; log tail: {tail}"[:500])
    return obs, StatusUpdate(fields)


def observe_load(ctx: Ctx, seen: Seen) -> Observed:
    """The load Job's summary once it finished (its log's nonce-carrying last line), or why it
    failed. `kvgate load-job` exits non-zero for a partial run too (exit 3: the control ran out
    of room at a stage), so the summary decides, not the exit; a finished Job without one
    (killed at its deadline, crashed) is an error."""
    control, candidate, job, text = seen.control, seen.candidate, seen.job, seen.job_log
    load = ctx.so_far.load or LoadStatus()
    speed = ctx.so_far.speed
    clocks = speed.clocks if speed is not None else None
    concurrency = load.concurrency
    obs = Observation(
        control=control,
        candidate=candidate,
        load_job_exists=job is not None,
        speed_clocks=clocks,
        production_concurrency=concurrency,
    )
    if job is None:
        return obs, NOTHING
    if not kubeobjects.job_finished(job):
        return dataclasses.replace(obs, load_progress=LoadProgress.from_log(text)), NOTHING
    summary, _ = job_lines(text, load.nonce_sha256, kind="kvgate.load")
    if summary is not None:
        # the arms' GPU clocks over the load, read once and kept: a claim needs matched clocks
        clocks = load.clocks
        found = NOTHING
        if clocks is None and ctx.config.prometheus_url:
            clocks = speed_clocks(ctx, load.started_at)
            found = StatusUpdate.of(load=dataclasses.replace(load, clocks=clocks))
        obs = dataclasses.replace(
            obs, load_summary=LoadSummary.from_dict(summary), load_clocks=clocks
        )
        return obs, found
    tail = " | ".join(text.strip().splitlines()[-3:])
    why = "no load summary with this attempt's nonce as the log's last line"
    error = f"{why} ({kubeobjects.job_failure(job)}); log tail: {tail}"
    return dataclasses.replace(obs, load_error=error[:500]), NOTHING


def speed_clocks(ctx: Ctx, started_at: float | None) -> ClocksRecord:
    return sources.speed_clocks(
        ctx.config.prometheus_url or "",
        ctx.namespace,
        ctx.name,
        started_at,
        now=ctx.now.timestamp(),
        timeout=ctx.config.scrape_timeout_s,
    )


def publish_accuracy(ctx: Ctx, acc: AccuracyStatus) -> None:
    """The difference in points as a metric."""
    if acc.paired is not None and acc.paired.difference is not None:
        ACCURACY_DELTA.labels(ctx.namespace, ctx.name).set(acc.difference_pp or 0.0)


def speed_after_eval(
    ctx: Ctx, seen: Seen
) -> tuple[float | None, float | None, ClocksRecord | None, SpeedStatus | None]:
    """Each arm's mean TPOT and GPU clocks over the eval window, and status.speed with them."""
    if ctx.spec.speed is None:
        return None, None, None, None
    speed = ctx.so_far.speed or SpeedStatus()
    if not speed.after:
        speed = dataclasses.replace(
            speed, after=sources.arm_tpot_totals(ctx.so_far, seen.ips, ctx.config.scrape_timeout_s)
        )
    tpots = {
        arm: gates.mean_between(speed.before.get(arm), speed.after.get(arm))
        for arm in manifests.ARMS
    }
    figures = {
        arm: {} if tpot is None else {"tpotMs": round(tpot * 1000, 3)}
        for arm, tpot in tpots.items()
    }
    speed = dataclasses.replace(
        speed,
        control=figures["control"],
        candidate=figures["candidate"],
        concurrency=manifests.eval_concurrency(ctx.spec, ctx.config.eval_concurrency),
    )
    clocks = speed.clocks  # read once, then from status
    if clocks is None and ctx.config.prometheus_url:
        clocks = speed_clocks(ctx, speed.started_at)
        speed = dataclasses.replace(speed, clocks=clocks)
    return tpots["control"], tpots["candidate"], clocks, speed
