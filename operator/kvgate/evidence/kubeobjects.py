"""What does this Kubernetes object say? Pure readers of Pod, Deployment, Job and rollout
objects; nothing here does I/O."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kvgate.vocabulary import Phase, ended


@dataclass(frozen=True, slots=True)
class PodHealth:
    exists: bool
    ready: bool = False
    crashed: bool = False
    detail: str = ""
    restarts: int = 0
    ip: str | None = None
    unschedulable: bool = False  # the scheduler said why it cannot place the pod (in `detail`)
    image_id: str | None = None  # the image the kubelet runs, by digest (containerStatuses)
    deleting: bool = False  # the pod has a deletionTimestamp: someone is deleting it
    gpus: int | None = None  # an unschedulable pod's GPU ask (`gpu_count` over its containers)


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What kvgate reads of a pod: its health, the node it was scheduled to (None: not yet) and
    its container's GPU count (`gpu_count`)."""

    health: PodHealth
    node: str | None = None
    gpu_count: int | None = None


def pod_facts(
    pod: Mapping[str, Any] | None, container: str | None, spec: Mapping[str, Any]
) -> PodFacts:
    """`pod`'s facts; `spec` is its container `container` (`{}`: none)."""
    node = ((pod or {}).get("spec") or {}).get("nodeName")
    node = node if isinstance(node, str) and node else None
    return PodFacts(pod_health(pod, container), node, gpu_count(spec))


_CRASH_WAITING: Final = frozenset(
    {
        "CrashLoopBackOff",
        "Error",
        "RunContainerError",
        "CreateContainerError",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
    }
)


def pod_health(pod: Mapping[str, Any] | None, container: str | None = None) -> PodHealth:
    """Ready, crashed or starting, from a Pod object (dict form of the API object), and whether
    it is being deleted (a terminating pod's engine may already have exited cleanly)."""
    health = _health(pod, container)
    if pod is not None and (pod.get("metadata") or {}).get("deletionTimestamp"):
        return dataclasses.replace(health, deleting=True, detail=f"being deleted ({health.detail})")
    return health


def _health(pod: Mapping[str, Any] | None, container: str | None) -> PodHealth:
    if pod is None:
        return PodHealth(exists=False, detail="pod does not exist")
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    cs = next((s for s in statuses if container is None or s.get("name") == container), None)
    ip = status.get("podIP")
    if status.get("phase") == "Failed":
        return PodHealth(True, crashed=True, detail=_terminated_detail(cs, status), ip=ip)
    if status.get("phase") == "Succeeded":
        return PodHealth(True, crashed=True, detail="engine exited (pod Succeeded)", ip=ip)
    if cs is None:
        why = unschedulable_reason(status)
        if why is not None:
            return PodHealth(True, detail=why, ip=ip, unschedulable=True, gpus=_pod_gpus(pod))
        return PodHealth(True, detail=f"pod {status.get('phase', 'Pending')}", ip=ip)
    restarts = int(cs.get("restartCount") or 0)
    state = cs.get("state") or {}
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in _CRASH_WAITING:
        detail = f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
        return PodHealth(True, crashed=True, detail=detail, restarts=restarts, ip=ip)
    if "terminated" in state:
        return PodHealth(True, crashed=True, detail=_terminated_detail(cs, status), ip=ip)
    if restarts > 0:
        last = (cs.get("lastState") or {}).get("terminated") or {}
        why = f", {last['reason']}" if last.get("reason") else ""  # OOMKilled says what 137 is
        detail = f"restarted {restarts}x (last exit {last.get('exitCode', '?')}{why})"
        return PodHealth(True, crashed=True, detail=detail, restarts=restarts, ip=ip)
    ready = bool(cs.get("ready")) and status.get("phase") == "Running"
    image_id = cs.get("imageID") if isinstance(cs.get("imageID"), str) else None
    detail = "ready" if ready else "starting"
    return PodHealth(True, ready=ready, detail=detail, ip=ip, image_id=image_id or None)


_INSUFFICIENT: Final = re.compile(r"Insufficient ([A-Za-z0-9./_-]{1,100})")


def unschedulable_reason(status: Mapping[str, Any]) -> str | None:
    """The scheduler's own words for a pod it cannot place, led by the resources it lacks.

    A canary copies the Deployment's pod spec, so it asks for as many GPUs as a production
    pod: "waiting for nvidia.com/gpu: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    """
    conditions = status.get("conditions")
    for cond in conditions if isinstance(conditions, list) else ():
        if not isinstance(cond, Mapping) or cond.get("type") != "PodScheduled":
            continue
        if cond.get("status") != "False" or cond.get("reason") != "Unschedulable":
            return None
        message = " ".join(str(cond.get("message") or "no node fits").split())[:300]
        lacking = sorted({name.rstrip(".") for name in _INSUFFICIENT.findall(message)})
        lead = f"waiting for {', '.join(lacking)}" if lacking else "unschedulable"
        return f"{lead}: {message}"
    return None


def said_once(arms: Mapping[str, PodHealth]) -> str:
    """Each arm's state, words the arms share said once ("control and candidate waiting for
    nvidia.com/gpu: 0/4 nodes are available ...")."""
    details = {h.detail for h in arms.values()}
    if len(arms) > 1 and len(details) == 1:
        return f"{' and '.join(arms)} {details.pop()}"
    return ", ".join(f"{arm} {h.detail}" for arm, h in arms.items())


def never_fits(health: PodHealth) -> bool:
    """The scheduler's reason holds as long as production runs: its pod holds a
    ReadWriteOncePod claim the canary copies (`kvgate check` names it before any rollout)."""
    return health.unschedulable and "ReadWriteOncePod" in health.detail


def unschedulable_message(stuck: Mapping[str, PodHealth], within: str | None) -> str:
    """Why the arms in `stuck` never ran, in the scheduler's words once, the GPUs to free and
    how to run the rollout again (`within`: the startup timeout that passed; None: it never
    can fit)."""
    arms = " and ".join(stuck)
    gpus = sum(h.gpus or 0 for h in stuck.values())
    free = f"free {gpus} {GPU_RESOURCE} ({arms})" if gpus else "free what the scheduler names"
    when = f"not scheduled within {within}" if within else "cannot be scheduled"
    return (
        f"{arms} {when} ({said_once(stuck)}); no verdict: the candidate args were not tested; "
        f"{free}, then change the spec (or re-create the rollout) to run it again"
    )


def _pod_gpus(pod: Mapping[str, Any]) -> int | None:
    containers = (pod.get("spec") or {}).get("containers")
    if not isinstance(containers, list):
        return None
    return sum(gpu_count(c) or 0 for c in containers if isinstance(c, Mapping)) or None


def _terminated_detail(cs: Mapping[str, Any] | None, status: Mapping[str, Any]) -> str:
    term = ((cs or {}).get("state") or {}).get("terminated") or {}
    if term:
        return f"exited with code {term.get('exitCode', '?')} ({term.get('reason', 'Error')})"
    return f"pod {status.get('phase')}: {status.get('reason') or status.get('message') or 'failed'}"


def rolled_out(dep: Mapping[str, Any], generation: int) -> bool:
    """The Deployment controller saw `generation` and every replica is updated and available."""
    ds, spec = dep.get("status") or {}, dep.get("spec") or {}
    replicas = int(spec.get("replicas", 1))
    counts = ("updatedReplicas", "availableReplicas", "readyReplicas", "replicas")
    return (
        int(ds.get("observedGeneration") or 0) >= generation > 0
        and all(int(ds.get(count) or 0) == replicas for count in counts)
        and not int(ds.get("unavailableReplicas") or 0)
    )


def job_finished(job: Mapping[str, Any]) -> bool:
    """The Job failed, succeeded or completed (its status says so)."""
    js = job.get("status") or {}
    true = [c.get("type") for c in js.get("conditions") or [] if c.get("status") == "True"]
    return "Failed" in true or bool(js.get("succeeded")) or "Complete" in true


def job_failure(job: Mapping[str, Any]) -> str:
    """Why the Job failed, in its own words (else that it ended without a summary line)."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Failed":
            return str(c.get("message") or c.get("reason"))
    return "the Job ended without a summary line"


def rollout_conflict(other: Mapping[str, Any], mine: tuple[str, str], target: str) -> str | None:
    """`other`'s name when it is an active rollout of Deployment `target` ahead of this one.

    `mine` is this rollout's (creationTimestamp, name). A rollout past Pending has claimed the
    Deployment; between two Pending ones the older wins (creation time, then name, so both
    operators' views agree). Terminal rollouts and reported verdicts claim nothing.
    """
    om = other.get("metadata") or {}
    if om.get("name") == mine[1]:
        return None
    if ((other.get("spec") or {}).get("targetRef") or {}).get("name") != target:
        return None
    status = other.get("status") or {}
    phase = status.get("phase") or Phase.PENDING.value
    if ended(Phase(phase), status.get("reason")):
        return None
    claimed = phase != Phase.PENDING.value
    if claimed or (om.get("creationTimestamp") or "", om.get("name", "")) < mine:
        return str(om.get("name"))
    return None


GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"  # set by NVIDIA GPU feature discovery
GPU_RESOURCE: Final = "nvidia.com/gpu"
_GPU_TEXT_MAX: Final = 63  # a label value's limit in Kubernetes


def gpu_product(node: Mapping[str, Any] | None) -> str | None:
    """The node's GPU product as GPU feature discovery labels it (None: no node, no label).

    The value goes into status and Events: control and other unprintable characters are dropped,
    whitespace collapsed and the text cut to a label value's 63 characters."""
    labels = ((node or {}).get("metadata") or {}).get("labels")
    value = labels.get(GPU_PRODUCT_LABEL) if isinstance(labels, Mapping) else None
    if not isinstance(value, str):
        return None
    text = " ".join("".join(c if c.isprintable() else " " for c in value).split())
    return text[:_GPU_TEXT_MAX].rstrip() or None


def gpu_count(container: Mapping[str, Any]) -> int | None:
    """The container's `nvidia.com/gpu` limit, else its request (None: neither, or unreadable).

    Extended resources are whole numbers: "2", 2; anything else reads as unknown."""
    resources = container.get("resources")
    for kind in ("limits", "requests"):
        amounts = resources.get(kind) if isinstance(resources, Mapping) else None
        value = amounts.get(GPU_RESOURCE) if isinstance(amounts, Mapping) else None
        if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 4:
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value if 0 <= value <= 1024 else None
        if value is not None:
            return None  # "500m", a float, a list: not a GPU count kvgate can compare
    return None
