"""Canaries no node takes end `Failed`/`CanaryUnschedulable`, never a rollback (issue 40).

Two rollouts under one operator, on the real scheduler:
  (a) "rwop": production mounts a ReadWriteOncePod claim, which its canaries copy; the
      scheduler's reason holds as long as production runs, so the operator ends the rollout as
      soon as it reads it, not at the startup timeout (30 min here);
  (b) "full": production asks for 20 of the node's 32 CPUs, its canaries each as many; the
      reason may pass (another pod could leave), so the rollout ends at its startup timeout (1m).
Neither counts a rollback (the `KVGateRolloutRolledBack` alert's series), fires a `RolledBack`
event, touches production, or leaves a canary behind; the report shows the candidate args as
not tested.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import (
    VENV_BIN,
    ScenarioWorld,
    apply,
    container_of,
    event_reasons,
    get,
    pods,
    sim_deployment,
    wait_for,
)

pytestmark = pytest.mark.e2e

PRESSURE = "concurrency=64,prompt=2000,output=400"  # a full pool: Preflight goes on to Canary
TRITON = {"extraArgs": ["--attention-backend", "TRITON_ATTN"]}
FULL_CPU = "20"  # of the test node's 32: production fits, its two canaries do not
SCENARIOS: dict[str, dict[str, Any]] = {
    # the startup timeout is far past the test's wait: only the scheduler's reason can end it
    "rwop": {**TRITON, "canary": {"startupTimeout": "30m", "evalTimeout": "300s"}},
    "full": {**TRITON, "canary": {"startupTimeout": "1m", "evalTimeout": "300s"}},
}


class World(ScenarioWorld):
    def __init__(self, cluster: Any, log_dir: Path) -> None:
        super().__init__(cluster, log_dir, "unsched", SCENARIOS, settle_timeout=300)
        self.pv = f"kvgate-unsched-{secrets.token_hex(3)}"
        self.applied: dict[str, float] = {}


def claimed(deployment: dict[str, Any]) -> dict[str, Any]:
    """The Deployment with its model on the ReadWriteOncePod claim `models`."""
    pod = deployment["spec"]["template"]["spec"]
    pod["volumes"] = [{"name": "model", "persistentVolumeClaim": {"claimName": "models"}}]
    pod["containers"][0]["volumeMounts"] = [
        {"name": "model", "mountPath": "/models", "readOnly": True}
    ]
    return deployment


def rwop_volume(pv: str, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A static PersistentVolume and the claim bound to it, both ReadWriteOncePod."""
    mode = ["ReadWriteOncePod"]
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": mode,
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(path)},
        },
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "models"},
        "spec": {
            "accessModes": mode,
            "storageClassName": "",
            "volumeName": pv,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    return volume, claim


@pytest.fixture(scope="module")
def world(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(cluster, tmp_path_factory.mktemp("operator"))
    w.operator.start()
    try:
        volume, claim = rwop_volume(w.pv, tmp_path_factory.mktemp("models"))
        cluster.kubectl("apply", "-f", "-", input=_yaml(volume))
        apply(cluster, w.ns["rwop"], claim)
        wait_for(
            lambda: _claim_phase(cluster, w.ns["rwop"]) == "Bound",
            60,
            "the ReadWriteOncePod claim to be Bound",
        )
        deployments = {s: sim_deployment(s, env={"KVGATE_SIM_LOAD": PRESSURE}) for s in SCENARIOS}
        claimed(deployments["rwop"])
        full = deployments["full"]["spec"]["template"]["spec"]["containers"][0]
        full["resources"] = {"requests": {"cpu": FULL_CPU}}
        w.deploy(deployments)
        for s, spec in SCENARIOS.items():
            w.start_rollouts({s: spec})
            w.applied[s] = time.monotonic()
        yield w
    finally:
        try:
            w.finish()
        finally:
            cluster.kubectl("delete", "pv", w.pv, "--ignore-not-found", "--wait=false", check=False)


def _claim_phase(cluster: Any, ns: str) -> Any:
    return ((get(cluster, ns, "pvc", "models") or {}).get("status") or {}).get("phase")


def _yaml(obj: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(obj)


def kvgate(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "kvgate"), *args],
        env={**os.environ, "KUBECONFIG": world.cluster.kubeconfig},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ended_failed_without_a_rollback(world: World, scenario: str) -> dict[str, Any]:
    """The settled rollout, checked for what every unschedulable end shares; returns its status."""
    ns, name = world.ns[scenario], f"{scenario}-fp8"
    status = world.rollout(scenario)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "CanaryUnschedulable"), status
    assert "no verdict: the candidate args were not tested" in status["message"]
    assert "then change the spec (or re-create the rollout) to run it again" in status["message"]
    reasons = event_reasons(world.cluster, ns, name, ["CanaryUnschedulable"])
    assert "CanaryUnschedulable" in reasons and "RolledBack" not in reasons, reasons
    # production untouched, and no canary left waiting for a node
    now, before = world.deployment(scenario), world.before[scenario]
    assert now["metadata"]["generation"] == before["metadata"]["generation"]
    assert container_of(now) == container_of(before)
    wait_for(
        lambda: not pods(world.cluster, ns, f"kvgate.io/rollout={name}"),
        60,
        f"{name}'s canaries to be deleted",
    )
    shown = kvgate(world, "report", name, "-n", ns)
    assert shown.returncode == 0, shown.stderr
    assert "Candidate args (not tested)" in shown.stdout
    assert "Rejected candidate args" not in shown.stdout
    return dict(status)


@pytest.mark.timeout(420)
def test_a_readwriteoncepod_claim_ends_it_at_once_not_at_the_timeout(world: World) -> None:
    status = ended_failed_without_a_rollback(world, "rwop")
    took = time.monotonic() - world.applied["rwop"]
    assert took < 180, f"{took:.0f}s from apply to Failed; the startup timeout is 30 min"
    assert status["message"].startswith("control and candidate cannot be scheduled ("), status
    assert "ReadWriteOncePod" in status["message"]
    assert status["message"].count("ReadWriteOncePod access mode") == 1  # the scheduler, once


@pytest.mark.timeout(420)
def test_canaries_without_room_end_at_the_startup_timeout(world: World) -> None:
    status = ended_failed_without_a_rollback(world, "full")
    took = time.monotonic() - world.applied["full"]
    assert 60 <= took < 240, f"{took:.0f}s from apply to Failed (startup timeout 1m)"
    assert status["message"].startswith(
        "control and candidate not scheduled within 1 min (control and candidate waiting for "
        "cpu: 0/1 nodes are available: 1 Insufficient cpu"
    ), status["message"]


@pytest.mark.timeout(420)
def test_no_rollback_is_counted_for_the_alert(world: World) -> None:
    for s in SCENARIOS:
        world.rollout(s)
    text = world.operator.metrics() or ""
    assert 'kvgate_rollouts_total{outcome="Failed"} 2.0' in text, text[-3000:]
    # KVGateRolloutRolledBack fires on this counter's series: none was created
    assert "kvgate_rollbacks_total{" not in text
