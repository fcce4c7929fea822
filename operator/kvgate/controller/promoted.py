"""How is production doing on the promoted candidate? The evidence of Promoting (the rollout,
the promoted pods' startup logs) and of Verifying (one sample of every production pod against
the preflight's baseline), with what status keeps of it. Reads only, as `observe`.
"""

from __future__ import annotations

import dataclasses

from kvgate.controller import sources
from kvgate.controller.changes import NOTHING, Observed, StatusUpdate
from kvgate.controller.context import Ctx
from kvgate.controller.seen import ProductionPod, Seen
from kvgate.errors import ExternalError, InputError
from kvgate.evidence import kubeobjects
from kvgate.flow.steps import Observation
from kvgate.judge import verify as production
from kvgate.records.codec import whole
from kvgate.records.status import (
    PodCounters,
    PodScanRecord,
    PreflightStatus,
    PromotionStatus,
    ScanRecord,
    VerifyStatus,
)
from kvgate.records.timestamps import parse_time
from kvgate.vocabulary import Phase


def observe(ctx: Ctx, phase: Phase, seen: Seen) -> Observed:
    """Promoting or Verifying, once the live Deployment carries the candidate."""
    if phase is Phase.PROMOTING:
        return observe_promoting(ctx, seen)
    return observe_verifying(ctx, seen)


def observe_promoting(ctx: Ctx, seen: Seen) -> Observed:
    """Has the Deployment rolled the candidate out, and do its pods log what the candidate
    canary logged?"""
    dep = seen.deployment
    assert dep is not None  # the live target exists and carries the candidate
    status = ctx.so_far
    recorded = status.promotion.generation if status.promotion else None
    wanted_gen = int(recorded or dep["metadata"].get("generation") or 0)
    done = kubeobjects.rolled_out(dep, wanted_gen)
    new_pods = [p for p in seen.production or () if p.carries_candidate and not p.terminating]
    for pod in new_pods:
        if pod.health.crashed:
            crashed = f"pod {pod.name}: {pod.health.detail}"
            return Observation(rollout_crashed=crashed), NOTHING
    scan, found = None, NOTHING
    if done and new_pods:
        scan, found = production_scan(ctx, new_pods[0])
    arm = status.arms.get("candidate")
    candidate_scan = arm.scan if arm is not None else None
    # The promoted pods are checked against the candidate canary: same backend, same scales.
    obs = Observation(rollout_done=done, rollout_scan=scan, control_scan=candidate_scan)
    return obs, found


def production_scan(ctx: Ctx, pod: ProductionPod) -> tuple[ScanRecord, StatusUpdate]:
    name = pod.name
    _, text = sources.pod_logs(ctx.kube, ctx.namespace, name, ctx.so_far.container, previous=False)
    scan = sources.scan_engine_log(text, ctx.so_far.engine)
    pod_scan = PodScanRecord(pod=name, attention_backend=scan.attention_backend,
                             kv_tokens=scan.kv_tokens)  # fmt: skip
    promo = dataclasses.replace(ctx.so_far.promotion or PromotionStatus(), pod_scan=pod_scan)
    return scan, StatusUpdate.of(promotion=promo)


def observe_verifying(ctx: Ctx, seen: Seen) -> Observed:
    """One verify sample when one is due: every check must pass (fail closed)."""
    if seen.production is None:
        return Observation(), NOTHING

    dep = seen.deployment
    assert dep is not None  # the live target exists and carries the candidate
    problems = []
    pods = [p for p in seen.production if not p.terminating]
    if not pods:
        problems.append("no production pods")
    status = ctx.so_far
    waiting: dict[str, float] = {}
    counters: dict[str, PodCounters] = {}
    for pod in pods:
        name, health = pod.name, pod.health
        if not pod.carries_candidate:
            problems.append(f"pod {name} does not run the candidate")
            continue
        if health.crashed:
            problems.append(f"pod {name}: {health.detail}")
            continue
        if not (health.ready and health.ip):
            problems.append(f"pod {name} is not Ready ({health.detail})")
            continue
        try:
            snap = sources.scrape_engine(status, health.ip, ctx.config.scrape_timeout_s)
        except (ExternalError, InputError) as exc:
            problems.append(f"pod {name} metrics unreachable: {exc}")
            continue
        if snap.waiting is not None:
            waiting[name] = snap.waiting
        ttft = snap.ttft  # whole numbers as the status write keeps them, for the next rates
        counters[name] = PodCounters(
            ttft_sum=None if ttft is None else whole(ttft.sum),
            ttft_count=None if ttft is None else whole(ttft.count),
        )
    # Last: a crashed pod also makes the Deployment unavailable; the message leads with the cause.
    if not kubeobjects.rolled_out(dep, int(dep["metadata"].get("generation") or 0)):
        ds = dep.get("status") or {}
        problems.append(
            f"Deployment not fully available ({ds.get('availableReplicas') or 0}/"
            f"{(dep.get('spec') or {}).get('replicas', 1)} available, "
            f"{ds.get('updatedReplicas') or 0} updated)"
        )
    promo = status.promotion or PromotionStatus()
    verify = promo.verify or VerifyStatus()
    last = parse_time(verify.last_sample_at)
    elapsed = None if last is None else (ctx.now - last).total_seconds()
    baseline = production.baseline_from_preflight((status.preflight or PreflightStatus()).samples)
    problems += production.regressions(baseline, waiting, verify.counters, counters, elapsed)
    # Kept for the next sample's rates (the status write copies the promotion record whole).
    promo = dataclasses.replace(promo, verify=dataclasses.replace(verify, counters=counters))
    obs = Observation(production_problem="; ".join(problems) or None, sampled=True)
    return obs, StatusUpdate.of(promotion=promo)
