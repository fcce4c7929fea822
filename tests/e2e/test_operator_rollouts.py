"""The operator end to end: five simulator Deployments, one `kvgate run`, real kopf and API.

All scenarios are applied at once (one namespace each) and run concurrently under one operator,
so the module takes about as long as its slowest rollout. Each test then checks its own outcome:
  (a) the L4 trap: the auto backend (FlashInfer) crashes; rolled back with the TRITON_ATTN remedy
  (b) TRITON_ATTN, no KV scales: scale warning, non-inferior, ~2x capacity, promoted and patched
  (c) a candidate that loses 20 points: rolled back as shown worse, production untouched
  (d) a pool with room: NotNeeded, no canary started
  (e) report mode: verdict and recommended args in status, Deployment untouched
  (f) canaries the scheduler cannot place: the reason while waiting, then `kvgate abort`
and the kubectl-side CLI (`kvgate get`, `wait`, `approve`, `abort`) against those ends.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import (
    FAST_GATES,
    GSM8K_DIR,
    ROOT,
    TERMINAL,
    VENV_BIN,
    ScenarioWorld,
    apply,
    condition,
    container_of,
    event_reasons,
    get,
    pods,
    rollout,
    send_completions,
    sim_deployment,
    wait_for,
    wait_phase,
)

from kvgate.vocabulary import Phase

pytestmark = pytest.mark.e2e

PRESSURE = "concurrency=64,prompt=2000,output=400"
ROOM = "concurrency=2,prompt=500,output=100"
TRITON = {"extraArgs": ["--attention-backend", "TRITON_ATTN"]}
CHECKPOINT = "<checkpoint>"  # replaced by a local checkpoint path in the fixture
FULL_CPU = "20"  # of the test node's 32: one production pod fits, its two canaries do not

# scenario -> (Deployment env, rollout spec overrides)
SCENARIOS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "trap": ({"KVGATE_SIM_LOAD": PRESSURE}, {}),
    "happy": (
        {"KVGATE_SIM_LOAD": PRESSURE},
        {**TRITON, "extraEnv": [{"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "0"}]},
    ),
    # 20 points: the fail boundary (its own 2.5% spending) shows it within the 150 questions;
    # a 10-point loss observed as 5 points on these questions ends Inconclusive (also no).
    "loss": ({"KVGATE_SIM_LOAD": PRESSURE, "KVGATE_SIM_FP8_LOSS": "0.20"}, TRITON),
    "room": ({"KVGATE_SIM_LOAD": ROOM}, TRITON),
    # Gate mode on a pool with room: NotNeeded, and the gate stays closed (fails closed).
    "gateroom": ({"KVGATE_SIM_LOAD": ROOM}, {**TRITON, "promotion": {"mode": "gate"}}),
    "report": (
        {"KVGATE_SIM_LOAD": PRESSURE},
        {
            **TRITON,
            "promotion": {"mode": "report"},
            "gates": {**FAST_GATES, "speed": {"concurrency": [8], "maxTpotRegression": 1.0}},
        },
    ),
    "manual": (
        {"KVGATE_SIM_LOAD": PRESSURE},
        {**TRITON, "promotion": {"mode": "manual", "verifyWindow": "2s"}},
    ),
    # The candidate passes every gate, but its config crashes a GPU after 300 requests: the
    # test sends them to the promoted pod during the verify window.
    "revert": (
        {"KVGATE_SIM_LOAD": PRESSURE},
        {
            **TRITON,
            "extraEnv": [{"name": "KVGATE_SIM_FAULTS", "value": "crash-after=300"}],
            "promotion": {"mode": "auto", "verifyWindow": "120s"},
        },
    ),
    # Each eval attempt is cut at 8 s by the Job's deadline: an eval error, retried, then given up.
    "evalerr": (
        {"KVGATE_SIM_LOAD": PRESSURE},
        {**TRITON, "canary": {"startupTimeout": "90s", "evalTimeout": "8s", "evalRetries": 1}},
    ),
    "sglang": (
        {"KVGATE_SIM_LOAD": PRESSURE},
        {
            "kvCacheDtype": "fp8_e4m3",
            "extraArgs": ["--attention-backend", "triton"],
            "promotion": {"mode": "report"},
        },
    ),
    # Production asks for 20 of the node's 32 CPUs; each canary copies that request, so the
    # scheduler can place neither: the rollout says why, and the test aborts it with the CLI.
    "full": (
        {"KVGATE_SIM_LOAD": PRESSURE},
        # a startup timeout far past the module's other tests: the abort, not the clock, ends it
        {**TRITON, "canary": {"startupTimeout": "30m", "evalTimeout": "300s", "evalRetries": 1}},
    ),
    # The checkpoint has k/v scales but the engine (no KVGATE_SIM_KV_SCALES) warns: dropped.
    "dropped": (
        {"KVGATE_SIM_LOAD": PRESSURE},
        {
            **TRITON,
            "model": {"name": CHECKPOINT},
            "gates": {**FAST_GATES, "scales": {"mode": "require"}},
        },
    ),
}


def _write_checkpoint(directory: Path) -> str:
    """A tiny Qwen3-8B-shaped checkpoint whose every attention layer has k/v scales."""
    import numpy as np
    from safetensors.numpy import save_file

    config = json.loads((ROOT / "tests" / "data" / "configs" / "qwen3-8b.json").read_text())
    (directory / "config.json").write_text(json.dumps(config))
    tensors = {}
    for i in range(config["num_hidden_layers"]):
        for kv in ("k", "v"):
            tensors[f"model.layers.{i}.self_attn.{kv}_proj.{kv}_scale"] = np.array(
                0.05, dtype=np.float32
            )
    save_file(tensors, str(directory / "model.safetensors"))
    return str(directory)


class World(ScenarioWorld):
    """The running scenarios: namespaces, the operator, the Deployments as first applied."""

    def __init__(self, cluster: Any, log_dir: Path) -> None:
        settled = TERMINAL | {"AwaitingApproval"}
        super().__init__(cluster, log_dir, "e2e", SCENARIOS, settled=settled, settle_timeout=420)

    def untouched(self, scenario: str) -> None:
        now, before = self.deployment(scenario), self.before[scenario]
        assert now["metadata"]["generation"] == before["metadata"]["generation"]
        assert container_of(now) == container_of(before)

    def children(self, scenario: str) -> list[dict[str, Any]]:
        return pods(self.cluster, self.ns[scenario], f"kvgate.io/rollout={scenario}-fp8")


@pytest.fixture(scope="module")
def world(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(cluster, tmp_path_factory.mktemp("operator"))
    w.operator.start()
    namespaces = w.ns
    try:
        deployments = {
            s: sim_deployment(s, env=env, engine="sglang" if s == "sglang" else "vllm")
            for s, (env, _) in SCENARIOS.items()
        }
        full = deployments["full"]["spec"]["template"]["spec"]["containers"][0]
        full["resources"] = {"requests": {"cpu": FULL_CPU}}
        w.deploy(deployments)
        checkpoint = _write_checkpoint(Path(tmp_path_factory.mktemp("checkpoint")))
        w.start_rollouts(
            {
                s: json.loads(json.dumps(spec).replace(CHECKPOINT, checkpoint))
                for s, (_, spec) in SCENARIOS.items()
            }
        )
        # Valid for the apiserver, wrong for the operator: a container the Deployment lacks.
        bad = rollout("room-bad", "room", **TRITON)
        bad["spec"]["targetRef"]["container"] = "sidecar"
        apply(cluster, namespaces["room"], bad)
        # A second rollout on a Deployment that already has an active one is refused.
        # (any phase that holds the Deployment: on an idle machine the first rollout was past
        # Canary within the 60 s, and waiting for Preflight or Canary alone timed out)
        active = {p.value for p in Phase if not p.terminal} - {"Pending"}
        wait_phase(cluster, namespaces["report"], "report-fp8", active, 60)
        apply(cluster, namespaces["report"], rollout("report-dup", "report", **TRITON))
        yield w
    finally:
        w.finish()


@pytest.mark.timeout(600)
def test_l4_trap_rolls_back_with_the_triton_remedy(world: World) -> None:
    obj = world.rollout("trap")
    status = obj["status"]
    assert status["phase"] == "RolledBack"
    assert status["reason"] == "CanaryCrashed"
    assert status["message"].startswith(
        "candidate crashed: the attention backend could not JIT-compile its FP8 KV kernels"
    )
    assert "--attention-backend TRITON_ATTN" in status["message"]
    assert status["arms"]["candidate"]["scan"]["attentionBackend"] == "FLASHINFER"
    assert condition(obj, "CanaryHealthy")["status"] == "False"
    assert condition(obj, "RolledBack")["status"] == "True"
    assert condition(obj, "Ready")["status"] == "False"
    world.cluster.kubectl(
        "wait",
        "--for=condition=RolledBack",
        "kvr/trap-fp8",
        "-n",
        world.ns["trap"],
        "--timeout=60s",
    )
    reasons = event_reasons(
        world.cluster,
        world.ns["trap"],
        "trap-fp8",
        ["CanaryCreated", "CanaryCrashed", "RolledBack"],
    )
    assert (
        reasons.index("CanaryCreated")
        < reasons.index("CanaryCrashed")
        < reasons.index("RolledBack")
    )
    world.untouched("trap")
    # The end is recorded first and the canaries are deleted by the next reconcile
    # (status.pendingActions), so the deletion is awaited, not assumed.
    wait_for(
        lambda: all(p["metadata"].get("deletionTimestamp") for p in world.children("trap")),
        120,
        "the trap's canaries to be deleted",
    )
    wait_for(
        lambda: (
            not (get(world.cluster, world.ns["trap"], "kvr", "trap-fp8") or {})
            .get("status", {})
            .get("pendingActions")
        ),
        60,
        "status.pendingActions to be cleared",
    )


@pytest.mark.timeout(600)
def test_a_promotion_that_fails_in_verification_is_reverted(world: World) -> None:
    ns = world.ns["revert"]
    wait_phase(world.cluster, ns, "revert-fp8", {"Verifying"} | TERMINAL, 420)
    promoted = [
        p
        for p in pods(world.cluster, ns, "app=revert")
        if "--kv-cache-dtype" in p["spec"]["containers"][0].get("args", [])
        and p["status"].get("podIP")
        and not p["metadata"].get("deletionTimestamp")
    ]
    assert promoted, "no promoted pod"
    # WHEN production traffic reaches the request that crashes the promoted config
    send_completions(
        f"http://{promoted[0]['status']['podIP']}:8000/v1/completions", 310, workers=16
    )
    # THEN the operator reverts the Deployment and says why
    obj = wait_phase(world.cluster, ns, "revert-fp8", TERMINAL, 180)
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("RolledBack", "PromotionReverted"), status[
        "message"
    ]
    assert status["message"].startswith("promotion reverted during verification: pod revert-")
    assert container_of(world.deployment("revert")) == container_of(world.before["revert"])
    reasons = event_reasons(
        world.cluster, ns, "revert-fp8", ["Promoting", "PromotionReverted", "RolledBack"]
    )
    assert (
        reasons.index("Promoting")
        < reasons.index("PromotionReverted")
        < reasons.index("RolledBack")
    )
    assert condition(obj, "Promoted")["status"] == "False"
    assert condition(obj, "RolledBack")["status"] == "True"


@pytest.mark.timeout(600)
def test_applying_the_remedy_to_the_trap_restarts_and_promotes(world: World) -> None:
    # GIVEN the trap rolled back WHEN the spec gets the remedy THEN a new run starts and promotes
    ns = world.ns["trap"]
    world.rollout("trap")
    world.cluster.kubectl(
        "patch", "kvr", "trap-fp8", "-n", ns, "--type=merge",
        "-p", json.dumps({"spec": TRITON}),
    )  # fmt: skip
    wait_for(
        lambda: (
            ((get(world.cluster, ns, "kvr", "trap-fp8") or {}).get("status") or {}).get(
                "observedGeneration"
            )
            == 2
        ),
        60,
        "the new generation to be picked up",
    )
    obj = wait_phase(world.cluster, ns, "trap-fp8", TERMINAL, 420)
    status = obj["status"]
    assert (status["phase"], status["observedGeneration"]) == ("Promoted", 2), status["message"]
    assert status["arms"]["candidate"]["scan"]["attentionBackend"] == "TRITON_ATTN"
    assert "crashed" not in json.dumps(status["gates"])  # the first run's findings are gone
    assert condition(obj, "Promoted")["observedGeneration"] == 2
    assert "--attention-backend" in container_of(world.deployment("trap"))["args"]


@pytest.mark.timeout(600)
def test_triton_without_scales_is_promoted(world: World) -> None:
    obj = world.rollout("happy")
    status = obj["status"]
    assert status["phase"] == "Promoted", status["message"]
    gates = status["gates"]
    assert gates["scales"]["reason"] == "ScalesMissing" and gates["scales"]["outcome"] == "Warning"
    assert gates["accuracy"]["reason"] == "AccuracyNonInferior"
    assert gates["backend"]["reason"] == "BackendChanged"
    assert 1.9 <= status["capacity"]["ratio"] <= 2.1
    assert status["accuracy"]["verdict"] == "pass"
    assert condition(obj, "ScalesPresent")["status"] == "False"
    assert condition(obj, "AccuracyNonInferior")["status"] == "True"
    assert condition(obj, "CapacityGained")["status"] == "True"
    assert condition(obj, "Promoted")["status"] == "True"
    world.cluster.kubectl(
        "wait", "--for=condition=Ready", "kvr/happy-fp8", "-n", world.ns["happy"], "--timeout=5s"
    )
    # The Deployment now runs the evaluated candidate; the old values are kept for a revert.
    c = container_of(world.deployment("happy"))
    assert c["args"] == [
        "--max-model-len",
        "8192",
        "--kv-cache-dtype",
        "fp8",
        "--attention-backend",
        "TRITON_ATTN",
    ]
    assert {"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "0"} in c["env"]
    # Status records the evaluated container with literal env values fingerprinted (a revert
    # restores only what kvgate changed, whose values it shows).
    before = container_of(world.before["happy"])
    assert status["previous"]["args"] == before["args"]
    assert [e["name"] for e in status["previous"]["env"]] == [e["name"] for e in before["env"]]
    literal = [e for e in status["previous"]["env"] if "valueFrom" not in e]
    assert literal and all(e["value"].startswith("sha256:") for e in literal)
    # a downward-API entry has no value to hide: kept whole, as the revert restores it
    assert (
        [e for e in status["previous"]["env"] if "valueFrom" in e]
        == [e for e in before["env"] if "valueFrom" in e]
        != []
    )
    assert GSM8K_DIR not in json.dumps([status["previous"], status["candidate"]])
    assert status["promotion"]["podScan"]["attentionBackend"] == "TRITON_ATTN"
    # The hub is not consulted here (HF_HUB_OFFLINE: test traffic stays on loopback): a finding,
    # and the logs decide the scales.
    assert status["preflight"]["checkpoint"].get("present") is None
    assert status["preflight"]["checkpoint"]["finding"] == (
        "Qwen/Qwen3-8B: hub not consulted (HF_HUB_OFFLINE)"
    )
    reasons = event_reasons(world.cluster, world.ns["happy"], "happy-fp8")
    for reason in (
        "CanaryCreated",
        "ScalesMissing",
        "BackendChanged",
        "EvalStarted",
        "Promoting",
        "Promoted",
    ):
        assert reason in reasons
    assert reasons.index("EvalStarted") < reasons.index("Promoting") < reasons.index("Promoted")
    report = get(world.cluster, world.ns["happy"], "configmap", "happy-fp8-report")
    assert report is not None
    assert json.loads(report["data"]["status.json"])["phase"] == "Promoted"
    assert "report.txt" in report["data"] and "report.html" in report["data"]
    assert report["metadata"]["ownerReferences"][0]["name"] == "happy-fp8"


@pytest.mark.timeout(600)
def test_a_twenty_point_loss_is_rolled_back(world: World) -> None:
    obj = world.rollout("loss")
    status = obj["status"]
    assert status["phase"] == "RolledBack", status["message"]
    assert status["reason"] == "AccuracyRegressed"
    assert status["accuracy"]["verdict"] == "fail"
    assert status["accuracy"]["differencePp"] < -3
    assert condition(obj, "AccuracyNonInferior")["status"] == "False"
    assert "AccuracyRegressed" in event_reasons(
        world.cluster, world.ns["loss"], "loss-fp8", ["AccuracyRegressed"]
    )
    world.untouched("loss")


@pytest.mark.timeout(600)
def test_pool_with_room_is_not_needed(world: World) -> None:
    obj = world.rollout("room")
    status = obj["status"]
    assert status["phase"] == "NotNeeded", status["message"]
    assert status["reason"] == "PoolHasRoom"
    assert status["preflight"]["pressure"]["pressured"] is False
    assert condition(obj, "PoolPressure")["status"] == "False"
    assert condition(obj, "Ready")["status"] == "True"
    reasons = event_reasons(world.cluster, world.ns["room"], "room-fp8", ["PoolHasRoom"])
    assert "PoolHasRoom" in reasons and "CanaryCreated" not in reasons
    assert "arms" not in status or not status["arms"]
    world.untouched("room")


@pytest.mark.timeout(600)
def test_a_gate_that_ends_without_a_passing_verdict_holds_the_sync(world: World) -> None:
    import lupa.lua51  # the Argo CD health check, as gopher-lua (Lua 5.1) runs it

    obj = world.rollout("gateroom")
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("NotNeeded", "PoolHasRoom"), status["message"]
    assert status["message"].startswith("gate closed: ")
    assert condition(obj, "Stalled")["status"] == "True"
    assert condition(obj, "Ready")["status"] == "False"
    assert condition(obj, "Reconciling")["status"] == "False"
    # kstatus: the generation is observed, not reconciling, stalled: Failed
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    lua = lupa.lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    health = lua.execute((ROOT / "charts/kvgate/argocd/health.lua").read_text())
    assert health["status"] == "Degraded", health["message"]
    world.untouched("gateroom")


@pytest.mark.timeout(600)
def test_report_mode_reports_and_never_patches(world: World) -> None:
    obj = world.rollout("report")
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("AwaitingApproval", "VerdictReported")
    assert status["verdict"]["decision"] == "Promote"
    assert status["recommendedArgs"][-4:] == [
        "--kv-cache-dtype",
        "fp8",
        "--attention-backend",
        "TRITON_ATTN",
    ]
    assert condition(obj, "Ready") | {"lastTransitionTime": None, "observedGeneration": None} == {
        "type": "Ready",
        "status": "True",
        "reason": "VerdictReported",
        "message": status["message"],
        "lastTransitionTime": None,
        "observedGeneration": None,
    }
    assert "VerdictReported" in event_reasons(
        world.cluster, world.ns["report"], "report-fp8", ["VerdictReported"]
    )
    # The optional speed gate: TPOT of both arms over the eval (its fixed concurrency).
    assert status["gates"]["speed"]["reason"] == "SpeedWithinLimit", status["gates"]["speed"]
    assert status["speed"]["concurrency"] == 8
    assert status["speed"]["control"]["tpotMs"] > 0 and status["speed"]["candidate"]["tpotMs"] > 0
    world.untouched("report")


@pytest.mark.timeout(120)
def test_operator_metrics(world: World) -> None:
    for s in SCENARIOS:
        # manual waits for a human and full for its abort: their own tests end them
        if s not in ("manual", "full"):
            world.rollout(s)
    wait_phase(world.cluster, world.ns["trap"], "trap-fp8", {"Promoted"}, 300)
    text = world.operator.metrics() or ""
    assert 'kvgate_rollouts_total{outcome="Promoted"} 2.0' in text  # happy, the trap remedied
    assert 'kvgate_rollouts_total{outcome="NotNeeded"} 2.0' in text  # room, gateroom
    assert 'kvgate_rollouts_total{outcome="Reported"} 2.0' in text  # report, sglang
    assert 'kvgate_rollbacks_total{reason="CanaryCrashed"} 1.0' in text
    assert 'kvgate_rollbacks_total{reason="AccuracyRegressed"} 1.0' in text
    assert 'kvgate_rollbacks_total{reason="ScalesDropped"} 1.0' in text
    assert 'kvgate_rollbacks_total{reason="PromotionReverted"} 1.0' in text
    assert 'kvgate_rollbacks_total{reason="EvalError"} 1.0' in text
    assert 'kvgate_capacity_ratio{name="happy-fp8"' in text
    assert "kvgate_events_total{" in text and "kvgate_rollout_phase{" in text


@pytest.mark.timeout(600)
def test_second_rollout_on_the_same_deployment_is_refused(world: World) -> None:
    obj = world.rollout("report", "report-dup")
    assert (obj["status"]["phase"], obj["status"]["reason"]) == ("Failed", "RolloutConflict")
    assert obj["status"]["message"] == (
        "Deployment report already has an active rollout: report-fp8; wait for it or delete it"
    )
    assert condition(obj, "Stalled")["status"] == "True"
    assert (
        world.cluster.kubectl(
            "get", "pod", "report-dup-candidate", "-n", world.ns["report"], check=False
        ).returncode
        != 0
    )


@pytest.mark.timeout(600)
def test_scales_dropped_by_the_loader_is_a_louder_finding(world: World) -> None:
    obj = world.rollout("dropped")
    status = obj["status"]
    assert status["preflight"]["checkpoint"]["present"] is True
    assert status["preflight"]["checkpoint"]["expectedCapacityGain"] == 2.0
    assert (status["phase"], status["reason"]) == ("RolledBack", "ScalesDropped")
    assert status["message"].startswith(
        "checkpoint has KV scales but the candidate warns they were not used: "
    )
    assert condition(obj, "ScalesPresent") | {"lastTransitionTime": None} == {
        "type": "ScalesPresent",
        "status": "False",
        "reason": "ScalesDropped",
        "message": status["message"],
        "observedGeneration": 1,
        "lastTransitionTime": None,
    }
    reasons = event_reasons(world.cluster, world.ns["dropped"], "dropped-fp8", ["ScalesDropped"])
    assert "ScalesDropped" in reasons and "EvalStarted" not in reasons
    world.untouched("dropped")


@pytest.mark.timeout(600)
def test_manual_mode_promotes_only_with_the_bound_approval(world: World) -> None:
    ns = world.ns["manual"]
    obj = world.rollout("manual")
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("AwaitingApproval", "AwaitingApproval")
    config_hash = status["configHash"]
    assert status["message"].startswith(
        f"all gates passed; approve with annotation kvgate.io/approve={config_hash}"
    )
    # A stale approval (another config's hash) is named and ignored.
    world.cluster.kubectl(
        "annotate", "kvr", "manual-fp8", "-n", ns, "kvgate.io/approve=0123456789abcdef"
    )
    wait_for(
        lambda: (
            "approval '0123456789abcdef' is for another config"
            in ((get(world.cluster, ns, "kvr", "manual-fp8") or {}).get("status") or {}).get(
                "message", ""
            )
        ),
        60,
        "the stale approval to be refused",
    )
    world.untouched("manual")
    approved = kvgate(world, "approve", "manual-fp8", "-n", ns)
    assert approved.returncode == 0, approved.stderr
    assert f"approved config {config_hash} of kvr/manual-fp8 in {ns}" in approved.stdout
    annotations = (get(world.cluster, ns, "kvr", "manual-fp8") or {})["metadata"]["annotations"]
    assert annotations["kvgate.io/approve"] == config_hash
    done = wait_phase(world.cluster, ns, "manual-fp8", TERMINAL, 300)
    assert done["status"]["phase"] == "Promoted", done["status"]["message"]
    assert "--kv-cache-dtype" in container_of(world.deployment("manual"))["args"]
    assert "Approved" in event_reasons(world.cluster, ns, "manual-fp8", ["Approved"])


@pytest.mark.timeout(600)
def test_sglang_rollout_reports_a_verdict(world: World) -> None:
    obj = world.rollout("sglang")
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("AwaitingApproval", "VerdictReported"), (
        json.dumps({"message": status["message"], "arms": status.get("arms")})[:4000]
    )
    assert status["engine"] == "sglang"
    assert status["arms"]["control"]["scan"]["attentionBackend"] == "flashinfer"
    assert status["arms"]["candidate"]["scan"]["attentionBackend"] == "triton"
    assert status["gates"]["scales"]["reason"] == "ScalesMissing"
    assert 1.9 <= status["capacity"]["ratio"] <= 2.1
    assert status["recommendedArgs"][-4:] == [
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--attention-backend",
        "triton",
    ]
    world.untouched("sglang")


@pytest.mark.timeout(300)
def test_a_target_the_operator_cannot_use_stalls_with_the_reason(world: World) -> None:
    obj = world.rollout("room", "room-bad")
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidTarget")
    assert status["message"] == (
        "spec.targetRef: container 'sidecar' not in the pod template (containers: engine)"
    )
    assert condition(obj, "Stalled")["status"] == "True"
    assert condition(obj, "Ready")["reason"] == "InvalidTarget"
    assert "InvalidTarget" in event_reasons(
        world.cluster, world.ns["room"], "room-bad", ["InvalidTarget"]
    )
    # the error is permanent: the rollout is not reconciled again until its spec changes
    log = world.operator.log()
    assert "room-bad" in log and "stalled, not retried until the spec changes" in log


@pytest.mark.timeout(600)
def test_an_eval_that_errors_is_retried_then_rolled_back_as_an_error(world: World) -> None:
    obj = world.rollout("evalerr")
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("RolledBack", "EvalError"), status["message"]
    assert status["message"].startswith("eval failed 2 time(s), last: ")
    assert status["eval"]["attempt"] == 2
    assert status["gates"]["accuracy"]["outcome"] == "Error"  # an error, not a failed eval
    assert condition(obj, "AccuracyNonInferior")["status"] == "Unknown"
    reasons = event_reasons(
        world.cluster,
        world.ns["evalerr"],
        "evalerr-fp8",
        ["EvalStarted", "EvalError", "RolledBack"],
    )
    assert reasons.count("EvalStarted") == 2
    assert reasons.index("EvalStarted") < reasons.index("EvalError") < reasons.index("RolledBack")
    world.untouched("evalerr")


def kvgate(world: World, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The kvgate CLI as an SRE runs it, with the cluster's kubeconfig."""
    return subprocess.run(
        [str(VENV_BIN / "kvgate"), *args],
        env={**os.environ, "KUBECONFIG": world.cluster.kubeconfig},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.timeout(600)
def test_a_canary_the_scheduler_cannot_place_says_why_then_is_aborted(world: World) -> None:
    ns = world.ns["full"]

    def waiting_for_cpu() -> dict[str, Any] | None:
        obj = get(world.cluster, ns, "kvr", "full-fp8") or {}
        status = obj.get("status") or {}
        return obj if "Insufficient cpu" in (status.get("message") or "") else None

    obj = wait_for(waiting_for_cpu, 300, "the scheduler's reason in status.message")
    status = obj["status"]
    production = world.deployment("full")
    assert container_of(production)["resources"] == {"requests": {"cpu": FULL_CPU}}
    assert production["status"].get("readyReplicas") == 1  # one pod of 20 CPUs fits the node
    # Still waiting (not timed out): the reason shows while the canary waits, not only at its end.
    assert (status["phase"], status["reason"]) == ("Canary", "WaitingForCanary"), status
    assert "waiting for cpu: 0/1 nodes are available: 1 Insufficient cpu" in status["message"]
    shown = kvgate(world, "get", "full-fp8", "-n", ns)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"kvr/full-fp8 in {ns}: Canary (WaitingForCanary): ")
    assert "Insufficient cpu" in shown.stdout.splitlines()[0]
    aborted = kvgate(world, "abort", "full-fp8", "-n", ns, "--reason", "no room for the canaries")
    assert aborted.returncode == 0, aborted.stderr
    waited = kvgate(world, "wait", "full-fp8", "-n", ns, "--timeout", "240s", "--interval", "1s")
    assert waited.returncode == 1, (waited.stdout, waited.stderr)
    assert waited.stdout.startswith(f"kvr/full-fp8 in {ns}: RolledBack (Aborted): ")
    assert "no room for the canaries" in waited.stdout
    world.untouched("full")
    again = kvgate(world, "abort", "full-fp8", "-n", ns, "--reason", "twice")
    assert again.returncode == 2 and "has ended (RolledBack)" in again.stderr


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("scenario", "code", "end"),
    [
        ("happy", 0, "Promoted (Promoted)"),
        ("report", 0, "AwaitingApproval (VerdictReported)"),
        ("loss", 1, "RolledBack (AccuracyRegressed)"),
        ("room", 0, "NotNeeded"),
        ("gateroom", 1, "NotNeeded (PoolHasRoom): gate closed:"),
    ],
)
def test_kvgate_wait_answers_with_the_end(world: World, scenario: str, code: int, end: str) -> None:
    ns = world.ns[scenario]
    world.rollout(scenario)
    waited = kvgate(world, "wait", f"{scenario}-fp8", "-n", ns, "--timeout", "60s")
    assert waited.returncode == code, (waited.stdout, waited.stderr)
    assert waited.stdout.startswith(f"kvr/{scenario}-fp8 in {ns}: {end}")
    watched = kvgate(world, "get", f"{scenario}-fp8", "-n", ns, "--watch", "--timeout", "60s")
    assert watched.returncode == code and watched.stdout.startswith(f"kvr/{scenario}-fp8 in {ns}:")
