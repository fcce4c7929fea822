"""A canary that never got a node is not a rollback: the rollout ends Failed/CanaryUnschedulable,
says the scheduler's words once and the GPUs to free, shows the candidate args as not tested,
and the rollback counter (the rollback alert's series) does not move."""

from __future__ import annotations

from typing import Any

import pytest
from test_controller import World

from kvgate import report
from kvgate.controller.telemetry import ROLLBACKS
from kvgate.evidence import kubeobjects
from kvgate.evidence.kubeobjects import PodHealth
from kvgate.flow import machine
from kvgate.flow.steps import Observation, State
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import Phase

SPEC = RolloutSpec.from_dict({"targetRef": {"name": "qwen"}, "canary": {"startupTimeout": "15m"}})
WHY = (
    "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are "
    "available: 4 No preemption victims found for incoming pod."
)
RWOP = (
    "0/1 nodes are available: 1 node has pod using PersistentVolumeClaim with the same name "
    "and ReadWriteOncePod access mode."
)


def pending_pod(why: str, gpus: int | None = 1) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": gpus}} if gpus else {}
    return {
        "metadata": {"name": "c"},
        "spec": {"containers": [{"name": "engine", "resources": resources}]},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False",
                            "reason": "Unschedulable", "message": why}],
        },
    }  # fmt: skip


def health(why: str = WHY, gpus: int | None = 1) -> PodHealth:
    return kubeobjects.pod_health(pending_pod(why, gpus), "engine")


def step(obs: Observation, elapsed: float) -> Any:
    state = State(phase=Phase.CANARY, phase_elapsed_s=elapsed)
    return machine.next_step(SPEC, state, obs, poll_s=5.0)


def test_an_unschedulable_pod_carries_its_gpu_ask() -> None:
    assert (health().gpus, health(gpus=4).gpus, health(gpus=None).gpus) == (1, 4, None)


def test_both_arms_waiting_say_the_schedulers_words_once() -> None:
    wait = step(Observation(control=health(), candidate=health()), 120)
    assert (wait.phase, wait.reason) == (Phase.CANARY, "WaitingForCanary")
    assert wait.message.count("Insufficient nvidia.com/gpu. preemption") == 1
    assert f"control and candidate waiting for nvidia.com/gpu: {WHY}" in wait.message


def test_at_the_startup_timeout_it_fails_without_a_rollback() -> None:
    end = step(Observation(control=health(gpus=2), candidate=health(gpus=2)), 15 * 60)
    assert (end.phase, end.reason) == (Phase.FAILED, "CanaryUnschedulable")
    assert end.message.count(WHY) == 1
    assert end.message.startswith("control and candidate not scheduled within 15 min (")
    assert "no verdict: the candidate args were not tested; free 4 nvidia.com/gpu" in end.message
    assert "then change the spec (or re-create the rollout) to run it again" in end.message
    assert [e.reason for e in end.events] == ["CanaryUnschedulable", "RolloutFailed"]
    assert "RolledBack" not in [e.reason for e in end.events]
    (gate,) = end.gates
    assert gate.reason == "CanaryUnschedulable"


def test_one_arm_stuck_names_that_arm_and_its_gpus() -> None:
    ready = PodHealth(True, ready=True, ip="10.0.0.1")
    end = step(Observation(control=ready, candidate=health(gpus=2)), 15 * 60)
    assert end.reason == "CanaryUnschedulable"
    assert end.message.startswith("candidate not scheduled within 15 min (candidate waiting for")
    assert "free 2 nvidia.com/gpu (candidate)" in end.message


def test_a_readwriteoncepod_claim_ends_it_at_once() -> None:
    # production holds the claim for as long as it runs: waiting 15 minutes cannot help
    end = step(Observation(control=health(RWOP), candidate=health(RWOP)), 5)
    assert (end.phase, end.reason) == (Phase.FAILED, "CanaryUnschedulable")
    assert end.message.startswith("control and candidate cannot be scheduled (")


def test_a_slow_start_that_was_scheduled_still_times_out_as_before() -> None:
    starting = PodHealth(True, detail="starting")
    end = step(Observation(control=starting, candidate=starting), 15 * 60)
    assert (end.phase, end.reason) == (Phase.ROLLED_BACK, "CanaryTimeout")


@pytest.mark.parametrize(
    ("status", "heading"),
    [
        ({"phase": "Failed", "reason": "CanaryUnschedulable"}, "Candidate args (not tested)"),
        ({"phase": "RolledBack", "reason": "AccuracyRegressed"}, "Rejected candidate args"),
        ({"phase": "Reverting", "revert": {"phase": "Failed"}}, "Candidate args (not tested)"),
        ({"phase": "Reverting"}, "Rejected candidate args"),
    ],
)
def test_the_report_shows_untested_args_as_not_tested(status: dict[str, Any], heading: str) -> None:
    assert report.view.args_heading(status) == heading


def test_on_the_fake_cluster_no_rollback_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(monkeypatch)
    dep = world.kube.objects[("Deployment", "vllm")]
    dep["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": 1}
    }

    def no_gpu_left(w: World) -> None:
        for pod in w.kube.of_kind("Pod"):
            if (pod["metadata"].get("labels") or {}).get("kvgate.io/arm") in (
                "control",
                "candidate",
            ):
                pod["status"] = pending_pod(WHY)["status"]

    world.before_reconcile = no_gpu_left
    counted = ROLLBACKS.labels("CanaryUnschedulable")._value.get()
    assert world.run() == "Failed"
    status = world.obj["status"]
    assert status["reason"] == "CanaryUnschedulable"
    assert "free 2 nvidia.com/gpu (control and candidate)" in status["message"]
    assert "RolledBack" not in world.reasons() and "CanaryUnschedulable" in world.reasons()
    assert ROLLBACKS.labels("CanaryUnschedulable")._value.get() == counted
    assert "Candidate args (not tested)" in report.render_text(world.obj)
    world.assert_invariant()
