"""While kvgate verifies a promotion under production traffic, anything wrong with production
reverts it: every check of a verify sample fails closed (`promoted.observe_verifying`).

Each fault is made behind kvgate's back once the rollout is Verifying, on the fake cluster of
test_controller with the operator's handler; the rollout must end RolledBack with the
Deployment back on its config before the rollout, the cause named in the message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from test_controller import World

from kvgate.adapters import http
from kvgate.errors import ScrapeError


def _production_pods(w: World) -> list[dict[str, Any]]:
    return [
        p
        for p in w.kube.of_kind("Pod")
        if not (p["metadata"].get("labels") or {}).get("kvgate.io/rollout")
        and "job-name" not in (p["metadata"].get("labels") or {})
    ]


def _not_ready(w: World, _: pytest.MonkeyPatch) -> str:
    for pod in _production_pods(w):
        pod["status"]["containerStatuses"][0]["ready"] = False
    return "is not Ready"


def _crashed(w: World, _: pytest.MonkeyPatch) -> str:
    (pod,) = _production_pods(w)
    status = pod["status"]["containerStatuses"][0]
    status.update(ready=False, restartCount=3)
    status["lastState"] = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    return f"pod {pod['metadata']['name']}: restarted 3x (last exit 137, OOMKilled)"


def _gone(w: World, _: pytest.MonkeyPatch) -> str:
    for pod in _production_pods(w):
        w.kube.objects.pop(("Pod", pod["metadata"]["name"]))
    return "no production pods"


def _unavailable(w: World, _: pytest.MonkeyPatch) -> str:
    dep = w.kube.objects[("Deployment", "vllm")]
    dep["status"] = {**dep["status"], "availableReplicas": 0, "readyReplicas": 0}
    return "Deployment not fully available (0/1 available"


def _metrics_refused(w: World, monkeypatch: pytest.MonkeyPatch) -> str:
    ips = {p["status"]["podIP"] for p in _production_pods(w)}
    scrape = w.kube.scrape

    def refusing(url: str, timeout: float) -> str:
        if url.split("//", 1)[-1].split(":", 1)[0] in ips:
            raise ScrapeError(url, "connection refused")
        return scrape(url, timeout)

    monkeypatch.setattr(http, "scrape", refusing)
    return "metrics unreachable"


FAULTS: dict[str, Callable[[World, pytest.MonkeyPatch], str]] = {
    "a pod not Ready": _not_ready,
    "a crashed pod": _crashed,
    "every pod gone": _gone,
    "the Deployment unavailable": _unavailable,
    "a pod's /metrics refused": _metrics_refused,
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fault_in_production_while_verifying_reverts_the_promotion(
    monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    world = World(
        monkeypatch, promotion={"mode": "auto", "verifyWindow": "60s", "verifySamples": 5}
    )
    said: list[str] = []

    def inject(w: World) -> None:
        if w.phase == "Verifying" and not said:
            said.append(FAULTS[fault](w, monkeypatch))

    world.before_reconcile = inject
    end = world.run()
    status = world.obj["status"]
    assert said, "the rollout never reached Verifying"
    assert (end, status["reason"]) == ("RolledBack", "PromotionReverted"), status["message"]
    assert status["message"].startswith("promotion reverted during verification: ")
    assert said[0] in status["message"]
    world.assert_invariant()  # the Deployment is back on the config before the rollout
    assert "--kv-cache-dtype" not in world.kube.container()["args"]
