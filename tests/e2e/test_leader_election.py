"""Two operators on the same rollouts: only the Lease holder acts; the other takes over when the
holder dies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import (
    TERMINAL,
    Operator,
    apply,
    event_reasons,
    install_crd,
    no_tracebacks,
    rollout,
    sim_deployment,
    wait_deployment_ready,
    wait_for,
    wait_phase,
)

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(600)
def test_only_the_lease_holder_acts_and_a_follower_takes_over(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(cluster)
    first = Operator(cluster, tmp_path / "first.log", namespaces=[namespace]).start()
    # The second one waits for the Lease: its metrics endpoint only opens when it leads.
    second = Operator(cluster, tmp_path / "second.log", namespaces=[namespace])
    import threading

    started = threading.Thread(target=second.start, daemon=True)
    started.start()
    try:
        wait_for(lambda: "waiting for Lease" in second.log(), 60, "the follower to wait")
        apply(cluster, namespace, sim_deployment("leader"))
        wait_deployment_ready(cluster, namespace, "leader")
        spec = {
            "extraArgs": ["--attention-backend", "TRITON_ATTN"],
            "gates": {
                "capacity": {"mode": "off"},
                "accuracy": {"questions": 30, "chunk": 30, "margin": 10, "sequential": False},
            },
        }
        apply(cluster, namespace, rollout("leader-fp8", "leader", **spec))
        wait_phase(cluster, namespace, "leader-fp8", {"Canary", "Evaluating"}, 120)
        assert "leader-fp8" not in second.log(), "the follower acted"
        assert "acquired Lease" not in second.log()
        # WHEN the leader dies, THEN the follower takes the Lease and finishes the rollout
        first.kill()
        wait_for(lambda: "acquired Lease" in second.log(), 60, "the follower to lead")
        started.join(timeout=60)
        obj = wait_phase(cluster, namespace, "leader-fp8", TERMINAL, 420)
        assert obj["status"]["phase"] == "Promoted", obj["status"]["message"]
        assert event_reasons(cluster, namespace, "leader-fp8", ["CanaryCreated"]).count("CanaryCreated") == 1
    finally:
        first.kill()
        cluster.kubectl("delete", "kvr", "--all", "-n", namespace, "--timeout=60s", check=False)
        code = second.stop()
        assert no_tracebacks(first.log() + second.log()) == []
        assert code == 0
