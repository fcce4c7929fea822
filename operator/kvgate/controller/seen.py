"""What does the cluster show this reconcile? The reads of the target Deployment, the rollout's
own pods and Jobs and production's pods, each made once per reconcile (`Ctx.reads` keeps them for
`act`), and `look`: the reads one phase's observation needs, made at its start and handed to the
observers as a typed `Seen`, so that they read attributes, not the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kvgate.change import manifests
from kvgate.controller.candidate import against
from kvgate.controller.context import Ctx
from kvgate.errors import KubeError
from kvgate.evidence import kubeobjects, poolsample
from kvgate.evidence.kubeobjects import PodHealth
from kvgate.flow import promoting
from kvgate.flow.steps import LiveTarget, State
from kvgate.judge import verdictkey
from kvgate.records.status import ArmStatus, PreflightStatus
from kvgate.vocabulary import ANNOTATION_CONFIG_HASH, LABEL_ROLLOUT, Phase

NO_POD = kubeobjects.pod_health(None)  # an arm not read, or not there

# The phases whose observation reads the canary arms (`phase_job` names the Job each waits for).
ARM_PHASES = frozenset({Phase.CANARY, Phase.EVALUATING, Phase.MEASURING})


@dataclass(frozen=True)
class ProductionPod:
    """A production pod as this reconcile listed it."""

    name: str
    health: PodHealth
    carries_candidate: bool  # every edit kvgate makes is in its container
    terminating: bool
    node: str | None = None  # the node it was scheduled to (None: not yet)
    gpu_count: int | None = None  # its container's GPU limit (None: none stated)


@dataclass(frozen=True)
class Placement:
    """Where a canary runs (None: not known, or not read)."""

    node: str | None = None
    gpu_product: str | None = None
    gpu_count: int | None = None


UNPLACED = Placement()


def scan_due(block: ArmStatus, health: PodHealth) -> bool:
    """Not read yet, and the engine got far enough (Ready, or crashed: the crash is the
    finding)."""
    return block.scan is None and (health.ready or health.crashed)


@dataclass(frozen=True)
class Seen:
    """The cluster as one phase's observation needs it, read once at the reconcile's start;
    what the phase does not read stays at its default (`production` None: not read, `()`: none
    there)."""

    deployment: Mapping[str, Any] | None = None
    container: Mapping[str, Any] | None = None  # the target container in it (None: not there)
    live: LiveTarget | None = None
    control: PodHealth = NO_POD
    candidate: PodHealth = NO_POD
    job: Mapping[str, Any] | None = None  # the phase's Job of this run (eval or load)
    job_log: str = ""  # the log of that Job's last pod ('' while it has none)
    production: tuple[ProductionPod, ...] | None = None
    # the arms whose startup log is read now (`scan_due`), with where they run
    to_scan: Mapping[str, Placement] = field(default_factory=dict)

    def arm(self, arm: str) -> PodHealth:
        return self.control if arm == "control" else self.candidate

    def placement(self, arm: str) -> Placement:
        return self.to_scan.get(arm, UNPLACED)

    @property
    def ips(self) -> dict[str, str | None]:
        return {"control": self.control.ip, "candidate": self.candidate.ip}


def look(ctx: Ctx, phase: Phase, state: State) -> Seen:
    """The reads `phase`'s observation needs (every phase after Pending checks what status says
    kvgate did against the live Deployment)."""
    live = live_target(ctx)
    seen = Seen(live=live)
    if live is not None or phase is Phase.PENDING:
        dep = target_deployment(ctx)
        found = live_container(ctx, dep)
        seen = replace(seen, deployment=dep, container=None if found is None else found[1])
    if phase in ARM_PHASES:
        pods = {arm: canary_pod(ctx, arm) for arm in manifests.ARMS}
        facts = {arm: pod_facts(ctx, pod)[0] for arm, pod in pods.items()}
        seen = replace(
            seen,
            control=facts["control"].health,
            candidate=facts["candidate"].health,
            to_scan={
                arm: Placement(fact.node, node_gpu(ctx, fact.node), fact.gpu_count)
                for arm, fact in facts.items()
                if scan_due(ctx.so_far.arms.get(arm) or ArmStatus(), fact.health)
            },
        )
    job_name = phase_job(ctx, phase)
    if job_name is not None:
        job = current_child(ctx, ctx.kube.read_job(ctx.namespace, job_name))
        seen = replace(seen, job=job, job_log="" if job is None else job_log(ctx, job_name))
    # Preflight samples the pool and Verifying production only when a round is due: what
    # Seen.production says.
    carried = live is not None and live.carries_candidate
    pre = ctx.so_far.preflight or PreflightStatus()
    if (
        (phase is Phase.PREFLIGHT and poolsample.round_due(ctx.spec.capacity, pre, ctx.now))
        or (carried and phase is Phase.PROMOTING)
        or (carried and phase is Phase.VERIFYING and promoting.verify_due(ctx.spec, state))
    ):
        seen = replace(seen, production=production_seen(ctx))
    return seen


def pod_facts(
    ctx: Ctx, pod: Mapping[str, Any] | None
) -> tuple[kubeobjects.PodFacts, dict[str, Any]]:
    """A pod's facts and its container of the target's name."""
    spec = pod_container(pod or {}, ctx.so_far.container)
    return kubeobjects.pod_facts(pod, ctx.so_far.container, spec), spec


def phase_job(ctx: Ctx, phase: Phase) -> str | None:
    """The current attempt's eval or load Job `phase` waits for."""
    status = ctx.so_far
    if phase is Phase.EVALUATING:
        return manifests.eval_job_name(ctx.name, (status.eval.attempt if status.eval else 0) or 1)
    if phase is Phase.MEASURING:
        return manifests.load_job_name(ctx.name, (status.load.attempt if status.load else 0) or 1)
    return None


def job_log(ctx: Ctx, job_name: str) -> str:
    """The log of a Job's last pod ('' while it has none), found by `own_pods`' one LIST."""
    pods = [
        p
        for p in own_pods(ctx).values()
        if (p["metadata"].get("labels") or {}).get("job-name") == job_name
    ]
    if not pods:
        return ""
    return ctx.kube.read_log(ctx.namespace, pods[-1]["metadata"]["name"]) or ""


def production_seen(ctx: Ctx) -> tuple[ProductionPod, ...]:
    """Production's pods, each with whether it runs the promoted candidate."""
    found = []
    for pod in production_pods(ctx):
        facts, spec = pod_facts(ctx, pod)
        found.append(
            ProductionPod(
                name=pod["metadata"]["name"],
                health=facts.health,
                carries_candidate=against(ctx, spec).carries_candidate,
                terminating=bool(pod["metadata"].get("deletionTimestamp")),
                node=facts.node,
                gpu_count=facts.gpu_count,
            )
        )
    return tuple(found)


def target_deployment(ctx: Ctx) -> dict[str, Any] | None:
    """The target Deployment, read once per reconcile."""
    if not ctx.reads.deployment_read:
        ctx.reads.deployment = ctx.kube.read_deployment(ctx.namespace, ctx.spec.target.name)
        ctx.reads.deployment_read = True
    return ctx.reads.deployment


def live_container(ctx: Ctx, dep: Mapping[str, Any] | None) -> tuple[int, dict[str, Any]] | None:
    if dep is None:
        return None
    try:
        return manifests.find_container(
            ((dep.get("spec") or {}).get("template") or {}).get("spec") or {},
            ctx.so_far.container,
        )
    except LookupError:
        return None


def evaluated_live(ctx: Ctx) -> tuple[int, dict[str, Any]]:
    """The target container as it is now (index, container); gone: a KubeError (retried)."""
    found = live_container(ctx, target_deployment(ctx))
    if found is None:
        raise KubeError(f"Deployment {ctx.spec.target.name} or its container disappeared")
    return found


def live_target(ctx: Ctx) -> LiveTarget | None:
    """The live Deployment against the evaluated container and kvgate's edits."""
    if not ctx.so_far.candidate:
        return None  # nothing evaluated yet (Pending)
    dep = target_deployment(ctx)
    if dep is None:
        return LiveTarget(exists=False)
    found = live_container(ctx, dep)
    if found is None:
        return LiveTarget(exists=True, container_found=False)
    live = against(ctx, found[1])
    return LiveTarget(
        exists=True,
        as_evaluated=not live.differences,
        differences=live.differences,
        carries_candidate=live.carries_candidate,
        ours_present=live.ours_present,
        changed_around=live.changed_around,
    )


def live_key(ctx: Ctx) -> verdictkey.LiveKey:
    """The live Deployment's image, and the digests, GPU products and counts its pods run the
    tested config on (what could not be read is left out: no evidence either way)."""
    found = live_container(ctx, target_deployment(ctx))
    live = live_target(ctx)
    digests, products, counts = set(), set(), set()
    for pod in production_seen(ctx):
        if pod.terminating or not pod.carries_candidate:
            continue
        if pod.health.image_id:
            digests.add(pod.health.image_id)
        if (product := node_gpu(ctx, pod.node)) is not None:
            products.add(product)
        if pod.gpu_count is not None:
            counts.add(pod.gpu_count)
    return verdictkey.LiveKey(
        image=found[1].get("image") if found else None,
        image_digests=frozenset(digests),
        gpu_products=frozenset(products),
        gpu_counts=frozenset(counts),
        config_changed=live.changed_around if live is not None else (),
    )


def production_pods(ctx: Ctx) -> list[dict[str, Any]]:
    dep = target_deployment(ctx)
    if dep is None:
        return []
    labels = (((dep.get("spec") or {}).get("selector") or {}).get("matchLabels")) or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    pods = ctx.kube.list_pods(ctx.namespace, selector) if selector else []
    return [p for p in pods if not (p["metadata"].get("labels") or {}).get(LABEL_ROLLOUT)]


def own_pods(ctx: Ctx) -> dict[str, dict[str, Any]]:
    """This rollout's pods by name, listed once per reconcile (`act` forgets it after creating
    a pod). A pod with a canary's name but not this rollout's label is not in it."""
    if ctx.reads.rollout_pods is None:
        pods = ctx.kube.list_pods(ctx.namespace, f"{LABEL_ROLLOUT}={ctx.name}")
        ctx.reads.rollout_pods = {p["metadata"]["name"]: p for p in pods}
    return ctx.reads.rollout_pods


def canary_pod(ctx: Ctx, arm: str) -> dict[str, Any] | None:
    """The arm's canary of this run (None: none, or a leftover of an earlier run)."""
    return current_child(ctx, own_pods(ctx).get(manifests.canary_name(ctx.name, arm)))


def arm_ips(ctx: Ctx) -> dict[str, str | None]:
    """Each arm's canary pod IP (None: not there yet)."""
    container = ctx.so_far.container
    return {
        arm: kubeobjects.pod_health(canary_pod(ctx, arm), container).ip for arm in manifests.ARMS
    }


def current_child(ctx: Ctx, obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """`obj` if it belongs to this run's config, else None (a leftover of an earlier run)."""
    if obj is None:
        return None
    annotations = obj["metadata"].get("annotations") or {}
    return obj if annotations.get(ANNOTATION_CONFIG_HASH) == ctx.so_far.config_hash else None


def leftover_child(ctx: Ctx, obj: dict[str, Any] | None) -> bool:
    """An object with our name from an earlier run: wait until it is gone, never reuse it."""
    return obj is not None and current_child(ctx, obj) is None


def pod_container(pod: Mapping[str, Any], name: str | None) -> dict[str, Any]:
    try:
        return manifests.find_container(pod.get("spec") or {}, name)[1]
    except LookupError:
        return {}


def node_gpu(ctx: Ctx, node: str | None) -> str | None:
    """The node's GPU product, read once per node per reconcile. None, never an error, when
    there is no node, label or such node, or kvgate may not read nodes (403: a chart without the
    nodes grant); other API failures raise, and the reconcile is retried."""
    if node is None:
        return None
    if node not in ctx.reads.node_gpus:
        try:
            obj = ctx.kube.read_node(node)
        except KubeError as exc:
            if exc.status != 403:
                raise
            obj = None
        ctx.reads.node_gpus[node] = kubeobjects.gpu_product(obj)
    return ctx.reads.node_gpus[node]
