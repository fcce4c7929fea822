"""The promises of the guarded controller on the real control plane, all scenarios at once:
(a) a kubectl revert during Verifying: Superseded, never re-patched
(b) an arg added and the image bumped during the eval: TargetChanged, no promotion
(c) production pods unready during the verify window: not Promoted, reverted
(d) a revert refused by a ValidatingAdmissionPolicy: Stalled/RevertFailed (never
    PromotionReverted) until the policy goes, then RolledBack with the read-back
(e) drift after Promoted sets Drifted; kvgate does not re-apply
(f) a foreign pod named <rollout>-control survives
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import (
    TERMINAL,
    ScenarioWorld,
    apply,
    condition,
    container_of,
    event_reasons,
    get,
    pods,
    policy_binding,
    send_completions,
    sim_deployment,
    wait_for,
    wait_phase,
)

from kvgate.flow.deadlines import REVERT_BACKOFF_MAX_S

pytestmark = pytest.mark.e2e

TRITON = ["--attention-backend", "TRITON_ATTN"]
FREEZE_S = 75.0  # how long admission refuses the revert (issue 25's scenario)
CONFIRM_S = 30.0  # from the Deployment reading back clean to RolledBack
GATES = {
    "capacity": {"mode": "off"},
    "accuracy": {"questions": 30, "chunk": 30, "margin": 10, "sequential": False},
}
CRASH = [{"name": "KVGATE_SIM_FAULTS", "value": "crash-after=150"}]
SCENARIOS: dict[str, dict[str, Any]] = {
    "superseded": {"promotion": {"mode": "auto", "verifyWindow": "120s", "verifySamples": 5}},
    "changed": {
        "gates": {
            **GATES,
            "accuracy": {"questions": 150, "chunk": 150, "margin": 10, "sequential": False},
        }
    },
    "unready": {
        "promotion": {"mode": "auto", "verifyWindow": "120s", "verifySamples": 10},
        "extraEnv": [{"name": "KVGATE_SIM_STARTUP_DELAY", "value": "30"}],
    },
    "refused": {
        "extraEnv": CRASH,
        "promotion": {"mode": "auto", "verifyWindow": "120s", "verifySamples": 5},
    },
    "drift": {"promotion": {"mode": "auto", "verifyWindow": "3s", "verifySamples": 2}},
    "foreign": {},
}


def _policy(namespace: str) -> list[dict[str, Any]]:
    """Deny any update that takes --kv-cache-dtype out of the Deployment "refused"."""
    name = f"kvgate-e2e-keep-fp8-{namespace}"
    keep = (
        "!has(oldObject.spec.template.spec.containers[0].args) || "
        "!oldObject.spec.template.spec.containers[0].args.exists(a, a == '--kv-cache-dtype') || "
        "object.spec.template.spec.containers[0].args.exists(a, a == '--kv-cache-dtype')"
    )
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": ["deployments"],
                        }
                    ]
                },
                "matchConditions": [
                    {"name": "refused", "expression": "object.metadata.name == 'refused'"}
                ],
                "validations": [
                    {"expression": keep, "message": "e2e: FP8 stays (a webhook that is down)"}
                ],
            },
        },
        policy_binding(name, namespace),
    ]


class World(ScenarioWorld):
    """The scenarios, and a director that does each one's fault at the phase it is aimed at."""

    def __init__(self, cluster: Any, log_dir: Path) -> None:
        # A low error limit: the foreign-pod rollout fails after 8 refusals rather than 30.
        env = {"KVGATE_ERROR_LIMIT": "8"}
        super().__init__(cluster, log_dir, "guard", SCENARIOS, extra_env=env)
        self.stop = threading.Event()
        self.done = {s: threading.Event() for s in SCENARIOS}

    def direct(self) -> None:
        """Do each scenario's fault the moment its rollout reaches the phase it is aimed at,
        whatever test is running (the rollouts run concurrently, the tests one by one)."""
        original = {s: container_of(self.before[s]) for s in self.before}
        actions: dict[str, tuple[str, Any]] = {
            "superseded": ("Verifying", lambda: self.set_args("superseded", original["superseded"]["args"])),
            "changed": ("Evaluating", lambda: self.set_args(
                "changed", [*original["changed"]["args"], "--max-num-seqs", "32"],
                image="vllm/vllm-openai:v0.11.1")),
            "unready": ("Verifying", lambda: self.kubectl(
                "delete", "pods", "-n", self.ns["unready"], "-l", "app=unready", "--wait=false")),
            "refused": ("Verifying", lambda: _hammer(self.cluster, self.ns["refused"], "refused")),
        }  # fmt: skip
        while actions and not self.stop.is_set():
            for s, (phase, act) in list(actions.items()):
                try:
                    if self.status(s).get("phase") != phase:
                        continue
                    act()
                except Exception as exc:  # a failed kubectl is tried again on the next round
                    print(f"director: {s}: {exc}")
                    continue
                del actions[s]
                self.done[s].set()
            self.stop.wait(0.5)

    def set_args(self, s: str, args: list[str], image: str | None = None) -> None:
        ops = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}]
        if image:
            ops.append(
                {"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": image}
            )
        self.kubectl(
            "patch", "deployment", s, "-n", self.ns[s], "--type=json", "-p", json.dumps(ops)
        )


def _hammer(cluster: Any, namespace: str, app: str, requests: int = 170) -> None:
    """Crash the promoted pods of `app` (crash-after=150) with production traffic."""
    for pod in pods(cluster, namespace, f"app={app}"):
        ip = (pod.get("status") or {}).get("podIP")
        if ip and "--kv-cache-dtype" in (pod["spec"]["containers"][0].get("args") or []):
            send_completions(f"http://{ip}:8000/v1/completions", requests)


@pytest.fixture(scope="module")
def world(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(cluster, tmp_path_factory.mktemp("operator"))
    w.operator.start()
    ns = w.ns
    policy = _policy(ns["refused"])
    try:
        w.deploy({s: sim_deployment(s) for s in SCENARIOS})
        apply(cluster, ns["refused"], *policy)
        foreign = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "foreign-fp8-control"},
                   "spec": {"containers": [{"name": "x", "image": "busybox",
                                            "command": ["sleep", "3600"]}]}}  # fmt: skip
        apply(cluster, ns["foreign"], foreign)
        director = threading.Thread(target=w.direct, daemon=True)
        director.start()
        w.start_rollouts(
            {s: {"extraArgs": TRITON, "gates": GATES, **extra} for s, extra in SCENARIOS.items()}
        )
        yield w
    finally:
        w.stop.set()
        for p in policy:
            cluster.kubectl(
                "delete", p["kind"], p["metadata"]["name"], "--ignore-not-found", check=False
            )
        w.finish()


@pytest.mark.timeout(600)
def test_a_kubectl_revert_while_verifying_is_superseded_not_repatched(world: World) -> None:
    ns = world.ns["superseded"]
    assert world.done["superseded"].wait(420), "never reached Verifying"
    original = container_of(world.before["superseded"])
    obj = wait_phase(world.cluster, ns, "superseded-fp8", TERMINAL, 120)
    assert (obj["status"]["phase"], obj["status"]["reason"]) == ("Failed", "Superseded")
    assert event_reasons(world.cluster, ns, "superseded-fp8", ["Promoting"]).count("Promoting") == 1
    assert container_of(world.deployment("superseded"))["args"] == original["args"]


@pytest.mark.timeout(600)
def test_an_image_bump_and_an_arg_during_the_eval_are_not_promoted(world: World) -> None:
    ns = world.ns["changed"]
    assert world.done["changed"].wait(300), "never reached Evaluating"
    obj = wait_phase(world.cluster, ns, "changed-fp8", TERMINAL, 420)
    assert (obj["status"]["phase"], obj["status"]["reason"]) == ("Failed", "TargetChanged"), obj[
        "status"
    ]
    live = container_of(world.deployment("changed"))
    assert live["image"] == "vllm/vllm-openai:v0.11.1" and "--kv-cache-dtype" not in live["args"]
    assert "Promoting" not in event_reasons(world.cluster, ns, "changed-fp8")


@pytest.mark.timeout(600)
def test_unready_production_pods_while_verifying_are_reverted(world: World) -> None:
    ns = world.ns["unready"]
    assert world.done["unready"].wait(420), "never reached Verifying"
    obj = wait_phase(world.cluster, ns, "unready-fp8", TERMINAL, 180)
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("RolledBack", "PromotionReverted"), status
    assert container_of(world.deployment("unready")) == container_of(world.before["unready"])


@pytest.mark.timeout(600)
def test_a_refused_revert_is_stalled_until_it_can_be_read_back(world: World) -> None:
    ns = world.ns["refused"]
    assert world.done["refused"].wait(420), "never reached Verifying"
    wait_for(lambda: world.status("refused").get("reason") == "RevertFailed", 180, "RevertFailed")
    refused_at = time.monotonic()
    status = world.status("refused")
    assert status["phase"] == "Reverting"
    assert condition({"status": status}, "Stalled")["status"] == "True"
    assert "not confirmed" in status["message"]
    assert "--kv-cache-dtype" in container_of(world.deployment("refused"))["args"]
    assert re.search(r"next try in \d+s|trying again now", status["message"]), status["message"]
    # The freeze an SRE's cluster holds: template changes refused for 75 s from the first refusal
    # (by then the back-off between attempts has grown past the 30 s the lifted freeze gets).
    time.sleep(max(0.0, FREEZE_S - (time.monotonic() - refused_at)))
    for p in _policy(ns):  # the freeze lifts: the next attempt goes through and reads back
        world.kubectl("delete", p["kind"], p["metadata"]["name"])
    wait_for(
        lambda: container_of(world.deployment("refused")) == container_of(world.before["refused"]),
        REVERT_BACKOFF_MAX_S + 60,
        "the revert to land once the freeze lifted",
    )
    # THEN the rollout confirms the landed revert at once, not at the next scheduled attempt
    obj = wait_phase(world.cluster, ns, "refused-fp8", TERMINAL, CONFIRM_S)
    assert (obj["status"]["phase"], obj["status"]["reason"]) == ("RolledBack", "PromotionReverted")
    assert container_of(world.deployment("refused")) == container_of(world.before["refused"])
    assert "RevertFailed" in event_reasons(world.cluster, ns, "refused-fp8", ["RevertFailed"])


@pytest.mark.timeout(600)
def test_drift_after_promotion_is_reported_not_reapplied(world: World) -> None:
    ns = world.ns["drift"]
    obj = wait_phase(world.cluster, ns, "drift-fp8", TERMINAL, 420)
    assert obj["status"]["phase"] == "Promoted", obj["status"]
    world.set_args("drift", container_of(world.before["drift"])["args"])
    wait_for(
        lambda: condition({"status": world.status("drift")}, "Drifted").get("status") == "True",
        60,
        "Drifted=True",
    )
    assert "--kv-cache-dtype" not in container_of(world.deployment("drift"))["args"]
    assert "Drifted" in event_reasons(world.cluster, ns, "drift-fp8", ["Drifted"])


@pytest.mark.timeout(600)
def test_a_foreign_pod_with_the_canary_name_survives(world: World) -> None:
    ns = world.ns["foreign"]
    obj = wait_phase(world.cluster, ns, "foreign-fp8", TERMINAL, 600)
    assert obj["status"]["phase"] == "Failed"
    pod = get(world.cluster, ns, "pod", "foreign-fp8-control")
    assert pod is not None and not pod["metadata"].get("deletionTimestamp")
    assert container_of(world.deployment("foreign")) == container_of(world.before["foreign"])
