"""Preflight decides from a real Prometheus (KVGATE_PROMETHEUS_URL) on the local control plane.

Prometheus (hack/prometheus.py, on 127.0.0.1) scrapes the production pods on their loopback
pod IPs; the targets are the pods the apiserver lists, written as file_sd (Debian's prometheus
is built without kubernetes_sd_configs). The operator is given its URL, so it reads the pool's
window from Prometheus in one range query instead of scraping the pods:
  - a KV-bound production (64 concurrent 2,000+400-token requests on an L4) passes preflight;
  - a production with room ends NotNeeded, no canary started;
  - with the speed gate on, arms whose GPUs ran at different clocks (the simulator's
    dcgm-exporter, its FP8 arm held at 1,410 MHz, scraped by the same Prometheus) get no speed
    claim: the gate is Inconclusive, says why, and the rollout is rolled back;
  - with the throughput gate on instead, the same clocks over the load Job's run give its
    figures no throughput claim: the load is measured and kept, the gate is Inconclusive and
    says why, and the rollout is rolled back.
"""

from __future__ import annotations

import datetime as dt
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import (
    FAST_GATES,
    TERMINAL,
    ScenarioWorld,
    condition,
    event_reasons,
    pods,
    sim_deployment,
    wait_for,
    wait_phase,
)

from kvgate.load.runner import default_inference_perf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
from prometheus import Prometheus, binary

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(binary() is None, reason="prometheus is not installed"),
]

PRESSURE = "concurrency=64,prompt=2000,output=400"
ROOM = "concurrency=2,prompt=500,output=100"
TRITON = {"extraArgs": ["--attention-backend", "TRITON_ATTN"]}
SCENARIOS = {"pressure": PRESSURE, "room": ROOM, "clocks": PRESSURE, "clocksload": ROOM}
# The production Deployment's env: every arm's emulated GPU runs at the L4's 2,040 MHz SM
# clock except an FP8 one, held at 1,410 MHz (a GPU capped or throttled under the candidate).
ENV = {
    "clocks": {"KVGATE_SIM_DCGM": "fp8-sm-clock=1410"},
    "clocksload": {"KVGATE_SIM_DCGM": "fp8-sm-clock=1410"},
}
SPECS: dict[str, dict[str, Any]] = {
    "clocks": {
        **TRITON,
        "gates": {**FAST_GATES, "speed": {"concurrency": [8], "maxTpotRegression": 1.0}},
    },
    # A small production (2 concurrent) keeps the load short: the claim is what is tested, not
    # the gain. `warn`: a pool with room does not end the rollout before the load is measured.
    "clocksload": {
        **TRITON,
        "gates": {
            **FAST_GATES,
            "capacity": {"mode": "warn", "window": "3s", "samples": 3},
            "capacityGain": {"throughputGain": {"minRatio": 1.3, "maxConcurrency": 2}},
        },
    },
}


def production_targets(cluster: Any, ns: dict[str, str]) -> list[dict[str, Any]]:
    """file_sd groups of the Running production pods, <pod IP>:8000 with namespace/pod labels,
    and of every Running engine pod's dcgm-exporter, <pod IP>:9400 (its series carry their pod).

    Debian's Prometheus has no kubernetes_sd_configs, so the test lists the pods through the
    apiserver and writes what the pod role's relabelling would give.
    """
    groups = []
    for namespace in ns.values():
        for p in pods(cluster, namespace, "kvgate.io/arm!=eval"):
            labels = p["metadata"].get("labels") or {}
            ip = (p.get("status") or {}).get("podIP")
            if not ip or p["status"].get("phase") != "Running" or "job-name" in labels:
                continue
            groups.append({"targets": [f"{ip}:9400"], "labels": {"exporter": "dcgm"}})
            if "kvgate.io/rollout" not in labels:
                groups.append(
                    {
                        "targets": [f"{ip}:8000"],
                        "labels": {"namespace": namespace, "pod": p["metadata"]["name"]},
                    }
                )
    return groups


def follow_pods(
    cluster: Any, prom: Prometheus, ns: dict[str, str], stop: threading.Event
) -> threading.Thread:
    """Rewrite the targets every second, as service discovery would (canaries come and go)."""

    def run() -> None:
        while not stop.wait(1.0):
            try:
                prom.set_target_groups(production_targets(cluster, ns))
            except Exception:  # a kubectl hiccup: the next second tries again
                continue

    thread = threading.Thread(target=run, name="follow-pods", daemon=True)
    thread.start()
    return thread


class World(ScenarioWorld):
    def __init__(self, cluster: Any, log_dir: Path, prom: Prometheus) -> None:
        env = {"KVGATE_PROMETHEUS_URL": prom.url}
        super().__init__(cluster, log_dir, "e2e-prom", SCENARIOS, extra_env=env)
        self.prom = prom


@pytest.fixture(scope="module")
def world(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    prom = Prometheus(Path(tmp_path_factory.mktemp("prometheus")))
    w = World(cluster, tmp_path_factory.mktemp("operator"), prom)
    ns = w.ns
    prom.start()
    stop = threading.Event()
    try:
        w.deploy(
            {
                s: sim_deployment(s, env={"KVGATE_SIM_LOAD": load, **ENV.get(s, {})})
                for s, load in SCENARIOS.items()
            }
        )
        # The production pods and their exporters, as the apiserver lists them, scraped.
        prom.set_target_groups(production_targets(cluster, ns))
        prom.wait_up(2 * len(SCENARIOS), timeout=60)
        follow_pods(cluster, prom, ns, stop)
        w.operator.start()
        w.start_rollouts({s: SPECS.get(s, TRITON) for s in SCENARIOS})
        yield w
    finally:
        stop.set()
        try:
            w.finish()
        finally:
            prom.stop()


def _production_ip(world: World, scenario: str) -> str:
    (pod,) = [
        p
        for p in pods(world.cluster, world.ns[scenario], f"app={scenario}")
        if "kvgate.io/rollout" not in (p["metadata"].get("labels") or {})
    ]
    return str(pod["status"]["podIP"])


@pytest.mark.timeout(300)
def test_a_kv_bound_production_passes_preflight_from_prometheus(world: World) -> None:
    obj = wait_phase(
        world.cluster,
        world.ns["pressure"],
        "pressure-fp8",
        {"Canary", "Evaluating", "AwaitingApproval", "Promoting", "Verifying"} | TERMINAL,
        180,
    )
    status = obj["status"]
    pre = status["preflight"]
    assert pre["source"] == "prometheus"
    assert pre["pressure"]["pressured"] is True, pre
    assert pre["pressure"]["samples"] == 3  # the window's 3 steps from one range query
    assert condition(obj, "PoolPressure")["status"] == "True"
    # What Prometheus holds is that pod's own series, and what preflight read is in it. Its
    # value now is whatever the moment's batch holds (a KV-bound pool dips below 0.9 as
    # requests finish), so the series is judged over the time it has existed, as preflight did.
    ip = _production_ip(world, "pressure")
    answer = httpx.get(
        world.prom.url + "/api/v1/query",
        params={"query": f'max_over_time(vllm:kv_cache_usage_perc{{instance="{ip}:8000"}}[15m])'},
        timeout=5,
    ).json()
    (series,) = answer["data"]["result"]
    assert series["metric"]["pod"].startswith("pressure-")
    peak = float(series["value"][1])
    assert peak >= 0.9
    assert peak >= pre["pressure"]["maxUsage"] - 1e-9, (peak, pre)


@pytest.mark.timeout(300)
def test_a_production_with_room_is_not_needed_from_prometheus(world: World) -> None:
    obj = wait_phase(world.cluster, world.ns["room"], "room-fp8", TERMINAL, 180)
    status = obj["status"]
    assert status["phase"] == "NotNeeded", status.get("message")
    assert status["reason"] == "PoolHasRoom"
    assert status["preflight"]["source"] == "prometheus"
    assert status["preflight"]["pressure"]["pressured"] is False
    assert condition(obj, "PoolPressure")["status"] == "False"
    reasons = event_reasons(world.cluster, world.ns["room"], "room-fp8", ["PoolHasRoom"])
    assert "PoolHasRoom" in reasons and "CanaryCreated" not in reasons
    wait_for(lambda: _production_ip(world, "room"), 5, "the room production pod")


@pytest.mark.timeout(600)
def test_arms_at_different_gpu_clocks_get_no_speed_claim(world: World) -> None:
    # GIVEN the speed gate on, and the FP8 candidate's GPU at 1,410 MHz vs the control's 2,040
    ns = world.ns["clocks"]
    # WHEN the rollout has run its canaries and the eval (the speed window)
    obj = wait_phase(world.cluster, ns, "clocks-fp8", TERMINAL, 480)
    status = obj["status"]
    speed_gate = status["gates"]["speed"]
    # THEN no speed claim is made, the gate says why, and nothing is promoted on it
    assert (speed_gate["outcome"], speed_gate["reason"]) == ("Inconclusive", "ClocksDiffer"), (
        speed_gate
    )
    assert speed_gate["message"].startswith(
        "no speed claim: the arms ran at different GPU clocks: SM clock 1,410 MHz on the "
        "candidate vs 2,040 MHz on the control (31% apart, tolerance 5%)"
    )
    clocks = status["speed"]["clocks"]
    assert clocks["source"] == "prometheus" and "note" not in clocks
    assert clocks["control"]["smMHz"] == 2040.0 and clocks["candidate"]["smMHz"] == 1410.0
    assert clocks["candidate"]["memMHz"] == clocks["control"]["memMHz"] == 6251.0
    assert status["speed"]["control"]["tpotMs"] > 0 < status["speed"]["candidate"]["tpotMs"]
    assert status["phase"] == "RolledBack", status.get("message")
    assert "no speed claim: the arms ran at different GPU clocks" in status["message"]
    assert condition(obj, "Promoted").get("status") != "True"


@pytest.mark.timeout(600)
def test_arms_at_different_gpu_clocks_under_load_get_no_throughput_claim(world: World) -> None:
    # GIVEN the throughput gate on (the speed gate off), and the FP8 candidate's GPU at
    # 1,410 MHz vs the control's 2,040 while the load Job runs on both
    if not default_inference_perf().exists():
        pytest.skip(f"no {default_inference_perf()} (make loadenv)")
    ns = world.ns["clocksload"]
    # WHEN the load has been measured
    obj = wait_phase(world.cluster, ns, "clocksload-fp8", TERMINAL, 480)
    status = obj["status"]
    # THEN its figures are kept but make no claim; the gate says why; nothing is promoted
    gate = status["gates"]["throughputGain"]
    assert (gate["outcome"], gate["reason"]) == ("Inconclusive", "ClocksDiffer"), gate
    assert gate["message"].startswith(
        "no throughput claim: the arms ran at different GPU clocks: SM clock 1,410 MHz on the "
        "candidate vs 2,040 MHz on the control (31% apart, tolerance 5%)"
    ), gate
    load = status["load"]
    assert load["clocks"]["source"] == "prometheus" and "note" not in load["clocks"]
    assert load["clocks"]["control"]["smMHz"] == 2040.0
    assert load["clocks"]["candidate"]["smMHz"] == 1410.0
    # the clocks' window opens when the load Job was made: its creationTimestamp, whole
    # seconds (a whole number in JSON), within the rollout's life
    window = load["startedAt"]
    assert isinstance(window, int | float) and not isinstance(window, bool), load
    life = [dt.datetime.strptime(status[k], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
            for k in ("startedAt", "finishedAt")]  # fmt: skip
    assert life[0].timestamp() - 1 <= window <= life[1].timestamp(), (window, life)
    measured = [s for s in load["summary"]["candidate"]["stages"] if s["status"] == "measured"]
    assert measured and all(s["outputTokensPerS"] > 0 for s in measured), load["summary"]
    assert "speed" not in status["gates"] or status["gates"]["speed"]["outcome"] == "Skipped"
    assert status["phase"] == "RolledBack", status.get("message")
    assert status["reason"] == "ClocksDiffer"
    assert condition(obj, "Promoted").get("status") != "True"
