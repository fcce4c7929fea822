"""Preflight's evidence: is the pool the limit (production's KV cache use, sampled from every
Ready production pod or asked of Prometheus over a window), and what would the control arm
store (production's dtype on this checkpoint; `machine` holds it to the spec)? What it sampled
stays in status.preflight, with the engine's own advice for this model (vLLM's FP8 study,
kvgate.checkpoint.advice): written once, with the checkpoint scan, and posted as one Warning
Event; advice never decides anything.
"""

from __future__ import annotations

import dataclasses

from kvgate.controller import sources
from kvgate.controller.changes import NOTHING, Observed, StatusUpdate
from kvgate.controller.context import Ctx
from kvgate.controller.seen import Seen
from kvgate.evidence import poolsample
from kvgate.flow.steps import Observation
from kvgate.judge import guidance
from kvgate.reasons import Reason
from kvgate.records.codec import read_record
from kvgate.records.status import CheckpointRecord, PreflightStatus, PressureRecord
from kvgate.records.timestamps import iso
from kvgate.vocabulary import PROMETHEUS_SOURCE, GateMode


def observe(ctx: Ctx, seen: Seen, elapsed_s: float) -> Observed:
    """One pool sample per interval from every Ready production pod, kept in status
    (`elapsed_s`: seconds in Preflight)."""
    gate = ctx.spec.capacity
    pre = ctx.so_far.preflight or PreflightStatus()
    found = NOTHING
    production = sources.production_kv_dtype(seen.container)
    if pre.checkpoint is None:
        checkpoint = read_record(CheckpointRecord, sources.scan_checkpoint(
            ctx.so_far.model,
            revision=ctx.spec.model.revision,
            model_dirs=ctx.config.model_dirs,
            hub_offline=ctx.config.hub_offline,
            token_secret=ctx.spec.model.token_secret if ctx.config.hub_token_secrets else None,
            kube=ctx.kube,
            namespace=ctx.namespace,
            kv_cache_dtype=ctx.spec.kv_cache_dtype,
            skip_layers=ctx.spec.kv_cache.skip_layers,
            control_kv_dtype=production,
            engine=ctx.so_far.engine or "vllm",
        ))  # fmt: skip
        notes = guidance.for_rollout(ctx.spec, ctx.so_far.engine, checkpoint)
        pre = dataclasses.replace(
            pre, checkpoint=checkpoint, checkpoint_has_scales=checkpoint.present, advice=notes
        )
        found = StatusUpdate.of(preflight=pre)
        if notes:
            found = found.then(StatusUpdate.event(Reason.ENGINE_ADVICE, guidance.event_line(notes)))
    problem = pre.checkpoint.skip_layers_problem if pre.checkpoint is not None else None
    if problem:  # the skip list names a layer this model does not have: fail before any canary
        return Observation(skip_layers_problem=problem), found
    # An explicit dtype is what runs; what `auto` stores is the checkpoint's to say (None: unread).
    read = pre.checkpoint.effective_control_format if pre.checkpoint else None
    control = Observation(
        engine=ctx.so_far.engine or "vllm",
        production_kv_dtype=production,
        control_stores=read or (production if production != "auto" else None),
        forces_fp8=pre.checkpoint.forces_fp8_kv if pre.checkpoint is not None else (),
    )
    if gate.mode is GateMode.OFF:
        return control, found
    series = {pod: list(v) for pod, v in pre.samples.items()}  # this round extends a copy
    ticks = pre.ticks or 0
    due = seen.production is not None  # `look` read production's pods: a round is due
    errors: list[str] = []
    if due and ctx.config.prometheus_url:
        # The window's history at once; a failed query is retried next interval, and a
        # Prometheus that never answers leaves the pool unknown at the sampling deadline.
        errors, history = pool_history(ctx, seen, elapsed_s)
        if history is not None:
            series, ticks = history, gate.samples
        pre = dataclasses.replace(pre, source=PROMETHEUS_SOURCE, last_sample_at=iso(ctx.now))
    elif due:
        sampled_before = sum(len(v) for v in series.values())
        ips, errors = ready_production_ips(ctx, seen)
        errors += sources.sample_pool(
            ips,
            series,
            lambda ip: sources.scrape_engine(ctx.so_far, ip, ctx.config.scrape_timeout_s),
        )
        if sum(len(v) for v in series.values()) > sampled_before:
            ticks += 1  # a round with no sample (no Ready pod yet) does not count
        pre = dataclasses.replace(pre, last_sample_at=iso(ctx.now))
    # The last round's errors stay until the next round (the verdict names them).
    pre = dataclasses.replace(
        pre,
        samples={pod: tuple(v) for pod, v in series.items()},
        ticks=ticks,
        errors=tuple(errors[-3:]) if due else pre.errors,
    )
    pressured: bool | None = None
    detail = "; ".join(errors) or f"{ticks} of {gate.samples} samples"
    if ticks >= gate.samples or elapsed_s >= gate.sampling_deadline_s:
        pressured, detail, per_pod = poolsample.pool_verdict(series, gate.usage_threshold)
        if pressured is None and pre.errors:
            detail = f"{detail}; last error: {pre.errors[-1]}"
        # `pressure` is the deciding replica's figures (what the report shows); all are kept.
        deciding = next((r for r in per_pod.values() if r.pressured is pressured), None)
        pressure = dataclasses.replace(deciding or PressureRecord(), pressured=pressured)
        pre = dataclasses.replace(pre, pressure=pressure, pressure_by_pod=per_pod)
    found = found.then(StatusUpdate.of(preflight=pre))  # the advice's Event kept
    observed = dataclasses.replace(
        control, pool_samples=ticks, pool_pressured=pressured, pool_detail=detail
    )
    return observed, found


def pool_history(ctx: Ctx, seen: Seen, elapsed_s: float) -> tuple[list[str], sources.Series | None]:
    """`sources.pool_history` of production's Ready pods."""
    ips, errors = ready_production_ips(ctx, seen)
    if not ips:
        return errors or [f"no Ready production pod of Deployment {ctx.spec.target.name}"], None
    return sources.pool_history(
        ctx.config.prometheus_url or "",
        ctx.so_far.engine or "",
        ips,
        gate=ctx.spec.capacity,
        now=ctx.now.timestamp(),
        elapsed_s=elapsed_s,
        timeout=ctx.config.scrape_timeout_s,
    )


def ready_production_ips(ctx: Ctx, seen: Seen) -> tuple[dict[str, str], list[str]]:
    """Production's Ready pods (name -> IP), and the error when the Deployment has no pods."""
    pods = seen.production or ()
    if not pods:
        return {}, [f"no production pods of Deployment {ctx.spec.target.name}"]
    return {p.name: p.health.ip for p in pods if p.health.ready and p.health.ip}, []
