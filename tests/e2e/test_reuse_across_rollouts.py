"""spec.reuseVerdict on the local control plane: the same change, tested once, promoted twice.

Two simulator Deployments in one namespace run the same container (one L4 node, labelled
`nvidia.com/gpu.product` as GPU feature discovery would). `first-fp8` runs its canaries, its
eval and its verdict and is promoted. `second-fp8`, the same change on the other Deployment with
`reuseVerdict`, starts its canaries (their image digest, engine version, backend and GPU are
its key), finds first-fp8's verdict with the same key, and promotes without an eval Job of its
own: `status.verdict.reusedFrom` names first-fp8 and a `VerdictReused` Event says so. A third,
`late-fp8` with `maxAge` shorter than first-fp8's age, runs its own eval. Then the node is
relabelled with other GPUs: the promoted verdicts turn Stale, and current again once back.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import (
    FAST_GATES,
    TERMINAL,
    ScenarioWorld,
    apply,
    condition,
    container_of,
    event_reasons,
    get,
    rollout,
    sim_deployment,
    wait_deployment_ready,
    wait_for,
    wait_phase,
)

pytestmark = pytest.mark.e2e

GPU = "NVIDIA-L4"
LABEL = "nvidia.com/gpu.product"
SPEC: dict[str, Any] = {
    "extraArgs": ["--attention-backend", "TRITON_ATTN"],
    # warn: a pool with room does not end these rollouts before their verdict
    "gates": {**FAST_GATES, "capacity": {"mode": "warn", "window": "3s", "samples": 3}},
}
DEPLOYMENTS = ("first", "second", "late")


@pytest.fixture(scope="module")
def world(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScenarioWorld]:
    w = ScenarioWorld(cluster, Path(tmp_path_factory.mktemp("operator")), "reuse", ["reuse"])
    nodes = cluster.kubectl("get", "nodes", "-o", "name").stdout.split()
    for node in nodes:
        cluster.kubectl("label", node, f"{LABEL}={GPU}", "--overwrite")
    ns = w.ns["reuse"]
    try:
        apply(cluster, ns, *(sim_deployment(name) for name in DEPLOYMENTS))
        for name in DEPLOYMENTS:
            wait_deployment_ready(cluster, ns, name)
        w.operator.start()
        apply(cluster, ns, rollout("first-fp8", "first", **SPEC))
        yield w
    finally:
        try:
            w.finish()
        finally:
            for node in nodes:
                cluster.kubectl("label", node, f"{LABEL}-")


@pytest.mark.timeout(900)
def test_the_same_change_is_promoted_on_a_verdict_reused_from_the_first(
    world: ScenarioWorld,
) -> None:
    cluster, ns = world.cluster, world.ns["reuse"]
    # GIVEN first-fp8 promoted on its own eval
    first = wait_phase(cluster, ns, "first-fp8", TERMINAL, 420)
    assert first["status"]["phase"] == "Promoted", first["status"].get("message")
    key = first["status"]["verdict"]["key"]
    assert key["gpuProduct"] == GPU and key["imageDigest"] and key["attentionBackend"]
    assert "EvalStarted" in event_reasons(cluster, ns, "first-fp8", ["EvalStarted"])
    # WHEN the same change is rolled out to the second Deployment, reuse allowed
    apply(cluster, ns, rollout("second-fp8", "second", **SPEC, reuseVerdict={"maxAge": "1h"}))
    second = wait_phase(cluster, ns, "second-fp8", TERMINAL, 300)
    # THEN it is promoted on first-fp8's verdict, without an eval of its own
    status = second["status"]
    assert status["phase"] == "Promoted", status.get("message")
    assert status["verdict"]["reusedFrom"] == f"{ns}/first-fp8"
    assert status["verdict"]["key"] == key
    assert status["gates"]["accuracy"] == first["status"]["gates"]["accuracy"]
    reasons = event_reasons(cluster, ns, "second-fp8", ["VerdictReused"])
    assert "VerdictReused" in reasons and "EvalStarted" not in reasons, reasons
    assert "eval" not in status  # no attempt, no Job
    assert get(cluster, ns, "job", "second-fp8-eval-1") is None
    assert (
        "--kv-cache-dtype" in container_of(get(cluster, ns, "deployment", "second") or {})["args"]
    )


@pytest.mark.timeout(600)
def test_a_verdict_older_than_max_age_is_not_reused(world: ScenarioWorld) -> None:
    cluster, ns = world.cluster, world.ns["reuse"]
    first = wait_phase(cluster, ns, "first-fp8", TERMINAL, 420)
    assert first["status"]["phase"] == "Promoted"
    # maxAge is at least 1m: the rollout allows verdicts at most 1m old and is applied once
    # first-fp8's is older than that (second-fp8's, itself reused, never counts)
    wait_until_older(first["status"]["finishedAt"], 61.0)
    apply(cluster, ns, rollout("late-fp8", "late", **SPEC, reuseVerdict={"maxAge": "1m"}))
    late = wait_phase(cluster, ns, "late-fp8", TERMINAL, 420)
    status = late["status"]
    assert status["phase"] == "Promoted", status.get("message")
    assert "reusedFrom" not in status["verdict"]
    reasons = event_reasons(cluster, ns, "late-fp8", ["EvalStarted"])
    assert "EvalStarted" in reasons and "VerdictReused" not in reasons, reasons


def wait_until_older(iso: str, seconds: float) -> None:
    """Sleep until `seconds` have passed since the RFC 3339 time `iso` (an age, not a pause)."""
    ended = dt.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    while (dt.datetime.now(dt.UTC) - ended).total_seconds() < seconds:
        time.sleep(1.0)


@pytest.mark.timeout(300)
def test_a_move_to_other_gpus_makes_the_promoted_verdicts_stale(world: ScenarioWorld) -> None:
    # Last in the module: it relabels the node (the fixture removes the label at the end).
    cluster, ns = world.cluster, world.ns["reuse"]
    first = wait_phase(cluster, ns, "first-fp8", TERMINAL, 420)
    assert first["status"]["phase"] == "Promoted"
    assert condition(first, "Stale").get("status") in (None, "False")
    # WHEN the pods' node turns out to carry other GPUs (what GPU feature discovery writes
    # after a node pool change)
    nodes = cluster.kubectl("get", "nodes", "-o", "name").stdout.split()
    for node in nodes:
        cluster.kubectl("label", node, f"{LABEL}=NVIDIA-H100-80GB-HBM3", "--overwrite")

    def stale(name: str) -> dict[str, Any] | None:
        obj = get(cluster, ns, "kvr", name) or {}
        return obj if condition(obj, "Stale").get("status") == "True" else None

    # THEN every verdict reached on the L4 is Stale, naming the GPUs, and nothing is changed
    for name in ("first-fp8", "second-fp8"):
        obj = wait_for(lambda name=name: stale(name), 120, f"{name} Stale after the GPU move")
        message = condition(obj, "Stale")["message"]
        assert f"GPU {GPU} -> NVIDIA-H100-80GB-HBM3" in message, message
        assert obj["status"]["phase"] == "Promoted"
        assert "Stale" in event_reasons(cluster, ns, name, ["Stale"])
    # AND back on the GPUs it was tested on, the verdict is current again
    for node in nodes:
        cluster.kubectl("label", node, f"{LABEL}={GPU}", "--overwrite")

    def fresh() -> dict[str, Any] | None:
        obj = get(cluster, ns, "kvr", "first-fp8") or {}
        return obj if condition(obj, "Stale").get("status") == "False" else None

    wait_for(fresh, 120, "first-fp8 current again on the L4")
