"""Engine truth end to end: the canary gate checks each arm's startup log against its /metrics.

Scenarios run concurrently under one operator, one namespace each:
  (a) lie: the candidate's log says FP8, its /metrics `cache_config_info` says `auto`
      (the simulator's `metrics-kv-dtype` fault, given to the candidate through extraEnv)
  (b) reverse: the control's log says `auto`, its /metrics say `fp8` (the fault on the
      Deployment itself, so the control inherits it)
Both end RolledBack with LogMetricsDisagree naming the arm and both values, before any eval
Job, with the Deployment untouched.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_operator_support import (
    TERMINAL,
    Operator,
    apply,
    condition,
    container_of,
    create_namespace,
    delete_namespace,
    event_reasons,
    get,
    install_crd,
    no_tracebacks,
    rollout,
    sim_deployment,
    wait_deployment_ready,
    wait_phase,
)

pytestmark = pytest.mark.e2e

PRESSURE = "concurrency=64,prompt=2000,output=400"
TRITON = ["--attention-backend", "TRITON_ATTN"]

# scenario -> (Deployment env, rollout spec overrides)
SCENARIOS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "lie": (
        {"KVGATE_SIM_LOAD": PRESSURE},
        {
            "extraArgs": TRITON,
            "extraEnv": [{"name": "KVGATE_SIM_FAULTS", "value": "metrics-kv-dtype=auto"}],
        },
    ),
    "reverse": (
        {"KVGATE_SIM_LOAD": PRESSURE, "KVGATE_SIM_FAULTS": "metrics-kv-dtype=fp8"},
        {"extraArgs": TRITON},
    ),
}


class World:
    def __init__(self, cluster: Any, namespaces: dict[str, str]) -> None:
        self.cluster = cluster
        self.ns = namespaces
        self.before: dict[str, dict[str, Any]] = {}

    def rollout(self, scenario: str) -> dict[str, Any]:
        return wait_phase(self.cluster, self.ns[scenario], f"{scenario}-fp8", TERMINAL, 420)

    def deployment(self, scenario: str) -> dict[str, Any]:
        dep = get(self.cluster, self.ns[scenario], "deployment", scenario)
        assert dep is not None
        return dep


@pytest.fixture(scope="module")
def world(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    install_crd(cluster)
    suffix = secrets.token_hex(3)
    namespaces = {s: create_namespace(cluster, f"kvgate-truth-{s}-{suffix}") for s in SCENARIOS}
    log = Path(tmp_path_factory.mktemp("operator")) / "operator.log"
    operator = Operator(cluster, log, namespaces=list(namespaces.values())).start()
    w = World(cluster, namespaces)
    try:
        for s, (env, _) in SCENARIOS.items():
            apply(cluster, namespaces[s], sim_deployment(s, env=env))
        for s in SCENARIOS:
            wait_deployment_ready(cluster, namespaces[s], s)
            w.before[s] = w.deployment(s)
        for s, (_, spec) in SCENARIOS.items():
            apply(cluster, namespaces[s], rollout(f"{s}-fp8", s, **spec))
        yield w
    finally:
        for ns in namespaces.values():
            cluster.kubectl("delete", "kvr", "--all", "-n", ns, "--wait=false", check=False)
        for ns in namespaces.values():
            cluster.kubectl(
                "wait", "--for=delete", "kvr", "--all", "-n", ns, "--timeout=60s", check=False
            )
        code = operator.stop()
        text = operator.log()
        for ns in namespaces.values():
            delete_namespace(cluster, ns)
        assert no_tracebacks(text) == [], text[-5000:]
        assert code == 0, text[-3000:]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("scenario", "arm", "log_dtype", "metrics_dtype"),
    [("lie", "candidate", "fp8", "auto"), ("reverse", "control", "auto", "fp8")],
)
def test_log_and_metrics_disagreeing_rolls_back(
    world: World, scenario: str, arm: str, log_dtype: str, metrics_dtype: str
) -> None:
    obj = world.rollout(scenario)
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("RolledBack", "LogMetricsDisagree"), status[
        "message"
    ]
    assert status["message"].startswith("startup log and /metrics disagree: ")
    assert (
        f"{arm}: startup log says kv_cache_dtype={log_dtype}, /metrics cache_config_info says "
        f"cache_dtype={metrics_dtype}"
    ) in status["message"]
    other = "control" if arm == "candidate" else "candidate"
    assert f"{other}: " not in status["message"]  # the honest arm is not blamed
    assert status["gates"]["engineTruth"]["outcome"] == "Error"
    assert status["arms"][arm]["metrics"]["cacheConfig"]["cache_dtype"] == metrics_dtype
    assert status["arms"][arm]["scan"]["kv_cache_dtype"] == log_dtype
    assert condition(obj, "RolledBack")["status"] == "True"
    reasons = event_reasons(world.cluster, world.ns[scenario], f"{scenario}-fp8")
    assert "LogMetricsDisagree" in reasons and "RolledBack" in reasons
    assert "eval" not in status  # no eval Job was ever started
    now = world.deployment(scenario)
    assert now["metadata"]["generation"] == world.before[scenario]["metadata"]["generation"]
    assert container_of(now) == container_of(world.before[scenario])
