"""What does this Kubernetes object say? Pure readers of Pod objects; nothing here does I/O."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True, slots=True)
class PodHealth:
    exists: bool
    ready: bool = False
    crashed: bool = False
    detail: str = ""
    restarts: int = 0
    ip: str | None = None
    unschedulable: bool = False  # the scheduler said why it cannot place the pod (in `detail`)


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
    """Ready, crashed or starting, from a Pod object (dict form of the API object)."""
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
            return PodHealth(True, detail=why, ip=ip, unschedulable=True)
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
        detail = f"restarted {restarts}x (last exit {last.get('exitCode', '?')})"
        return PodHealth(True, crashed=True, detail=detail, restarts=restarts, ip=ip)
    ready = bool(cs.get("ready")) and status.get("phase") == "Running"
    return PodHealth(True, ready=ready, detail="ready" if ready else "starting", ip=ip)


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


def _terminated_detail(cs: Mapping[str, Any] | None, status: Mapping[str, Any]) -> str:
    term = ((cs or {}).get("state") or {}).get("terminated") or {}
    if term:
        return f"exited with code {term.get('exitCode', '?')} ({term.get('reason', 'Error')})"
    return f"pod {status.get('phase')}: {status.get('reason') or status.get('message') or 'failed'}"
