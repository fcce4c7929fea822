"""(f) The operator is SIGKILLed mid-evaluation and replaced: the rollout resumes from status and
finishes correctly, with no second canary and no second eval Job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import (
    Operator,
    apply,
    event_reasons,
    get,
    install_crd,
    no_tracebacks,
    phase,
    pods,
    rollout,
    sim_deployment,
    wait_deployment_ready,
    wait_for,
    wait_phase,
)

pytestmark = pytest.mark.e2e


def _uids(cluster: Any, namespace: str) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in pods(cluster, namespace, "kvgate.io/rollout=resume-fp8")
        if not p["metadata"].get("deletionTimestamp")
    }


@pytest.mark.timeout(600)
def test_operator_killed_mid_evaluation_resumes(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(cluster)
    first = Operator(cluster, tmp_path / "first.log", namespaces=[namespace]).start()
    second: Operator | None = None
    try:
        apply(
            cluster,
            namespace,
            sim_deployment(
                "resume", env={"KVGATE_SIM_LOAD": "concurrency=64,prompt=2000,output=400"}
            ),
        )
        wait_deployment_ready(cluster, namespace, "resume")
        apply(
            cluster,
            namespace,
            rollout("resume-fp8", "resume", extraArgs=["--attention-backend", "TRITON_ATTN"]),
        )
        # GIVEN the eval Job is running (its pod exists and the operator has seen progress)
        wait_phase(cluster, namespace, "resume-fp8", {"Evaluating"}, 180)
        wait_for(
            lambda: len(pods(cluster, namespace, "job-name=resume-fp8-eval-1")) == 1,
            60,
            "the eval Job's pod",
        )
        before = _uids(cluster, namespace)
        assert {"resume-fp8-candidate", "resume-fp8-control"} <= set(before) and len(before) == 3
        job_uid = get(cluster, namespace, "job", "resume-fp8-eval-1")["metadata"]["uid"]  # type: ignore[index]

        # WHEN the operator dies without a chance to clean up, and a new one starts
        first.kill()
        assert phase(cluster, namespace, "resume-fp8") == "Evaluating"
        second = Operator(cluster, tmp_path / "second.log", namespaces=[namespace]).start()
        wait_for(
            lambda: "resume-fp8" in second.log() and "Evaluating" in second.log(),
            60,
            "the new operator to resume",
        )
        # THEN it adopts the same canaries and the same Job
        assert _uids(cluster, namespace) == before
        assert get(cluster, namespace, "job", "resume-fp8-eval-1")["metadata"]["uid"] == job_uid  # type: ignore[index]
        assert get(cluster, namespace, "job", "resume-fp8-eval-2") is None

        # AND the rollout finishes correctly
        obj = wait_phase(
            cluster, namespace, "resume-fp8", {"Promoted", "RolledBack", "Failed", "NotNeeded"}, 420
        )
        assert obj["status"]["phase"] == "Promoted", obj["status"]["message"]
        assert obj["status"]["eval"]["attempt"] == 1
        reasons = event_reasons(
            cluster, namespace, "resume-fp8", ["CanaryCreated", "EvalStarted", "Promoted"]
        )
        assert reasons.count("CanaryCreated") == 1
        assert reasons.count("EvalStarted") == 1
        assert reasons.count("Promoted") == 1
        dep = get(cluster, namespace, "deployment", "resume")
        assert "--kv-cache-dtype" in dep["spec"]["template"]["spec"]["containers"][0]["args"]  # type: ignore[index]
    finally:
        first.kill()
        if second is not None:  # the finalizer needs a live operator to let the rollout go
            cluster.kubectl("delete", "kvr", "--all", "-n", namespace, "--timeout=60s", check=False)
        code = second.stop() if second is not None else None
        logs = first.log() + (second.log() if second is not None else "")
        assert no_tracebacks(logs) == [], logs[-5000:]
        assert second is None or code == 0


@pytest.mark.timeout(300)
def test_deleting_a_rollout_mid_canary_cleans_up(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(cluster)
    operator = Operator(cluster, tmp_path / "operator.log", namespaces=[namespace]).start()
    try:
        # A slow engine start keeps the rollout in Canary long enough to delete it there.
        apply(cluster, namespace, sim_deployment("slow", env={"KVGATE_SIM_STARTUP_DELAY": "60"}))
        apply(
            cluster,
            namespace,
            rollout(
                "slow-fp8",
                "slow",
                gates={"capacity": {"mode": "off"}},
                **{"extraArgs": ["--attention-backend", "TRITON_ATTN"]},
            ),
        )
        wait_phase(cluster, namespace, "slow-fp8", {"Canary"}, 120)
        wait_for(
            lambda: len(pods(cluster, namespace, "kvgate.io/rollout=slow-fp8")) == 2,
            60,
            "two canaries",
        )
        obj = get(cluster, namespace, "kvr", "slow-fp8")
        assert "kvgate.io/finalizer" in obj["metadata"]["finalizers"]  # type: ignore[index]
        cluster.kubectl("delete", "kvr", "slow-fp8", "-n", namespace, "--timeout=60s")
        wait_for(
            lambda: all(
                p["metadata"].get("deletionTimestamp")
                for p in pods(cluster, namespace, "kvgate.io/rollout=slow-fp8")
            ),
            30,
            "the canaries to be deleted",
        )
        wait_for(
            lambda: get(cluster, namespace, "kvr", "slow-fp8") is None, 30, "the rollout to be gone"
        )
    finally:
        code = operator.stop()
        assert no_tracebacks(operator.log()) == [], operator.log()[-5000:]
        assert code == 0
