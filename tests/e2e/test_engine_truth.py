"""Engine truth end to end: the canary gate checks each arm's startup log against its /metrics.

Scenarios run concurrently under one operator, one namespace each:
  (a) lie: the candidate's log says FP8, its /metrics `cache_config_info` says `auto`
      (the simulator's `metrics-kv-dtype` fault, given to the candidate through extraEnv)
  (b) reverse: the control's log says `auto`, its /metrics say `fp8` (the fault on the
      Deployment itself, so the control inherits it)
  (b2) sglie: SGLang 0.5.23, whose /metrics carry no KV dtype: the candidate's log says
      fp8_e4m3, its /server_info says kv_cache_dtype=auto (the same fault)
All end RolledBack with LogMetricsDisagree naming the arm and both values, before any eval
Job, with the Deployment untouched.

And the L4 FlashInfer trap with `spec.canary.remediation`:
  (c) auto33: vLLM 0.33, auto backend (FlashInfer) dies building its FP8 kernels; kvgate starts
      the candidate again with --attention-backend TRITON_ATTN and VLLM_USE_FLASHINFER_SAMPLER=0
      and promotes it (the Deployment gets the remedy with the dtype)
  (d) auto11: vLLM 0.11, production picks FlashInfer with VLLM_ATTENTION_BACKEND (0.11 has no
      --attention-backend flag); the remedy is VLLM_ATTENTION_BACKEND=TRITON_ATTN, promoted
  (e) off11: the same trap with remediation off: RolledBack naming 0.11's remedy
  (f) auto10: vLLM 0.10.2, the same trap (FlashInfer chosen with VLLM_ATTENTION_BACKEND keeps
      FP8 KV on the V1 engine); 0.10 spells the remedy VLLM_ATTENTION_BACKEND=TRITON_ATTN_VLLM_V1
      (TRITON_ATTN is an invalid backend there), promoted with VLLM_USE_FLASHINFER_SAMPLER=0
  (g) off10: the same with remediation off: RolledBack naming 0.10.2's remedy

And an engine whose startup lines say nothing kvgate reads (the simulator's `reworded-log`:
the KV dtype, backend, scale and KV-size lines worded as no release words them):
  (h) reworded: its /metrics still name the dtype and the KV size: kvgate takes them from
      there, says so in the gates, and the rollout goes on to the eval (never a guess)
  (i) unread: reworded and no `cache_config_info`: nothing names the candidate's dtype, so the
      canary gate is Inconclusive (CandidateDtypeUnread) and the rollout never reaches the eval
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support import (
    FAST_GATES,
    ScenarioWorld,
    condition,
    container_of,
    event_reasons,
    sim_deployment,
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
    "sglie": (
        {"KVGATE_SIM_LOAD": PRESSURE, "KVGATE_SIM_ENGINE_VERSION": "0.5.23"},
        {
            "kvCacheDtype": "fp8_e4m3",
            "extraArgs": ["--attention-backend", "triton"],
            "extraEnv": [{"name": "KVGATE_SIM_FAULTS", "value": "metrics-kv-dtype=auto"}],
        },
    ),
    "auto33": ({"KVGATE_SIM_LOAD": PRESSURE, "KVGATE_SIM_ENGINE_VERSION": "0.33.0"}, {}),
    "auto11": (
        {
            "KVGATE_SIM_LOAD": PRESSURE,
            "KVGATE_SIM_ENGINE_VERSION": "0.11.0",
            "VLLM_ATTENTION_BACKEND": "FLASHINFER",
        },
        {},
    ),
    "off11": (
        {
            "KVGATE_SIM_LOAD": PRESSURE,
            "KVGATE_SIM_ENGINE_VERSION": "0.11.0",
            "VLLM_ATTENTION_BACKEND": "FLASHINFER",
        },
        {"canary": {"startupTimeout": "90s", "remediation": "off"}},
    ),
    "auto10": (
        {
            "KVGATE_SIM_LOAD": PRESSURE,
            "KVGATE_SIM_ENGINE_VERSION": "0.10.2",
            "VLLM_ATTENTION_BACKEND": "FLASHINFER",
        },
        {},
    ),
    "off10": (
        {
            "KVGATE_SIM_LOAD": PRESSURE,
            "KVGATE_SIM_ENGINE_VERSION": "0.10.2",
            "VLLM_ATTENTION_BACKEND": "FLASHINFER",
        },
        {"canary": {"startupTimeout": "90s", "remediation": "off"}},
    ),
    "reworded": (
        {"KVGATE_SIM_LOAD": PRESSURE, "KVGATE_SIM_FAULTS": "reworded-log"},
        {"extraArgs": TRITON},
    ),
    "unread": (
        {"KVGATE_SIM_LOAD": PRESSURE, "KVGATE_SIM_FAULTS": "reworded-log,no-cache-info"},
        {"extraArgs": TRITON},
    ),
}
AUTO = {"startupTimeout": "90s", "evalTimeout": "300s", "evalRetries": 1, "remediation": "auto"}
for _s in ("auto33", "auto11", "auto10"):
    SCENARIOS[_s][1]["canary"] = AUTO
# Eight scenarios of simulators share two cores here: a longer pool window than FAST_GATES' 3 s.
for _env, _spec in SCENARIOS.values():
    _spec["gates"] = {**FAST_GATES, "capacity": {"mode": "require", "window": "12s", "samples": 3}}
IMAGES = {"auto33": "vllm/vllm-openai:v0.33.0"}


@pytest.fixture(scope="module")
def world(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScenarioWorld]:
    w = ScenarioWorld(cluster, tmp_path_factory.mktemp("operator"), "truth", SCENARIOS)
    w.operator.start()
    try:
        deployments = {}
        for s, (env, _) in SCENARIOS.items():
            dep = sim_deployment(s, env=env, engine="sglang" if s.startswith("sg") else "vllm")
            if s in IMAGES:
                dep["spec"]["template"]["spec"]["containers"][0]["image"] = IMAGES[s]
            deployments[s] = dep
        w.deploy(deployments)
        w.start_rollouts({s: spec for s, (_, spec) in SCENARIOS.items()})
        yield w
    finally:
        w.finish()


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("scenario", "arm", "log_dtype", "metrics_dtype"),
    [("lie", "candidate", "fp8", "auto"), ("reverse", "control", "auto", "fp8")],
)
def test_log_and_metrics_disagreeing_rolls_back(
    world: ScenarioWorld, scenario: str, arm: str, log_dtype: str, metrics_dtype: str
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
    assert status["arms"][arm]["scan"]["kvCacheDtype"] == log_dtype
    assert condition(obj, "RolledBack")["status"] == "True"
    reasons = event_reasons(
        world.cluster, world.ns[scenario], f"{scenario}-fp8", ["LogMetricsDisagree", "RolledBack"]
    )
    assert "LogMetricsDisagree" in reasons and "RolledBack" in reasons
    assert "eval" not in status  # no eval Job was ever started
    now = world.deployment(scenario)
    assert now["metadata"]["generation"] == world.before[scenario]["metadata"]["generation"]
    assert container_of(now) == container_of(world.before[scenario])


@pytest.mark.timeout(600)
def test_sglang_log_and_server_info_disagreeing_rolls_back(world: ScenarioWorld) -> None:
    obj = world.rollout("sglie")
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("RolledBack", "LogMetricsDisagree"), status[
        "message"
    ]
    assert (
        "candidate: startup log says kv_cache_dtype=fp8_e4m3, SGLang server info says "
        "kv_cache_dtype=auto"
    ) in status["message"]
    assert "control: " not in status["message"]
    assert status["engine"] == "sglang"
    arms = status["arms"]
    assert arms["candidate"]["metrics"]["serverInfo"]["kvCacheDtype"] == "auto"
    assert arms["control"]["metrics"]["serverInfo"]["kvCacheDtype"] == "auto"
    assert arms["candidate"]["scan"]["kvCacheDtype"] == "fp8_e4m3"
    # the pool size server info reports is the one the log names: only the dtype disagrees
    tokens = arms["candidate"]["scan"]["capacity"]["kvTokens"]
    assert arms["candidate"]["metrics"]["serverInfo"]["maxTotalNumTokens"] == tokens
    assert "max_total_num_tokens" not in status["message"]
    assert "eval" not in status
    now = world.deployment("sglie")
    assert container_of(now) == container_of(world.before["sglie"])


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("scenario", "version", "args", "env"),
    [
        ("auto33", "0.33.0", ["--attention-backend", "TRITON_ATTN"], {}),
        ("auto11", "0.11.0", [], {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}),
        ("auto10", "0.10.2", [], {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN_VLLM_V1"}),
    ],
)
def test_auto_remediation_promotes_with_the_remedy_of_that_version(
    world: ScenarioWorld, scenario: str, version: str, args: list[str], env: dict[str, str]
) -> None:
    obj = world.rollout(scenario)
    status = obj["status"]
    assert status["phase"] == "Promoted", status["message"]
    record = status["remediation"]
    assert (record["code"], record["engineVersion"], record["attempt"]) == (
        "attention-build-failed", version, 1,
    )  # fmt: skip
    assert record["firstAttempt"]["attentionBackend"] == "FLASHINFER"
    assert record.get("args", []) == args  # status leaves empty lists out
    assert record.get("env", {}) == {**env, "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    # the remedied candidate was gated like any other: it ran Triton and FP8, logs = metrics
    assert status["arms"]["candidate"]["scan"]["attentionBackend"] == "TRITON_ATTN"
    assert status["arms"]["candidate"]["scan"]["kvCacheDtype"] == "fp8"
    assert status["gates"]["engineTruth"]["reason"] == "LogMetricsAgree"
    assert status["gates"]["accuracy"]["outcome"] == "Successful"
    reasons = event_reasons(
        world.cluster, world.ns[scenario], f"{scenario}-fp8",
        ["CanaryCrashed", "Remediating", "Promoting", "Promoted"],
    )  # fmt: skip
    assert reasons.index("CanaryCrashed") < reasons.index("Remediating")
    assert reasons.index("Remediating") < reasons.index("Promoting") < reasons.index("Promoted")
    assert reasons.count("Remediating") == 1
    # the accuracy pass is an Event of its own, before the patch
    assert reasons.index("AccuracyNonInferior") < reasons.index("Promoting")
    # production now runs the candidate with the remedy
    container = container_of(world.deployment(scenario))
    live_args = container["args"]
    assert live_args[live_args.index("--kv-cache-dtype") + 1] == "fp8"
    for flag, value in zip(args[::2], args[1::2], strict=True):
        assert live_args[live_args.index(flag) + 1] == value
    live_env = _env(container)
    assert {k: live_env.get(k) for k in record["env"]} == record["env"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("scenario", "remedy"),
    [
        ("off11", "vllm 0.11.0: VLLM_ATTENTION_BACKEND=TRITON_ATTN"),
        ("off10", "vllm 0.10.2: VLLM_ATTENTION_BACKEND=TRITON_ATTN_VLLM_V1"),
    ],
)
def test_remediation_off_rolls_back_naming_the_remedy_of_that_version(
    world: ScenarioWorld, scenario: str, remedy: str
) -> None:
    obj = world.rollout(scenario)
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("RolledBack", "CanaryCrashed"), status["message"]
    assert status["message"].startswith("candidate crashed: ")
    # the remedy, then where it goes (an env-only remedy: spec.extraEnv), then the engine's line
    assert (
        f"; remedy for {remedy} and VLLM_USE_FLASHINFER_SAMPLER=0; set spec.extraEnv: "
        in (status["message"])
    )
    assert "remediation" not in status
    assert "Remediating" not in event_reasons(world.cluster, world.ns[scenario], f"{scenario}-fp8")
    now = world.deployment(scenario)
    assert container_of(now) == container_of(world.before[scenario])


@pytest.mark.timeout(600)
def test_a_reworded_log_takes_its_facts_from_the_engines_metrics(world: ScenarioWorld) -> None:
    obj = world.rollout("reworded")
    status = obj["status"]
    gates = status["gates"]
    # the log named no dtype; /metrics did, and the gate says where the fact came from
    assert gates["canary"]["reason"] == "CanaryHealthy", gates["canary"]
    assert "(read from its /metrics: its log does not say)" in gates["canary"]["message"]
    assert (gates["engineTruth"]["outcome"], gates["engineTruth"]["reason"]) == (
        "Warning",
        "LogSilent",
    )
    assert gates["capacityGain"]["reason"] == "CapacityGained", gates["capacityGain"]
    assert gates["scales"]["reason"] != "ScalesPresent"  # silence is not evidence of scales
    assert status["arms"]["candidate"]["scan"].get("kvCacheDtype") is None
    # it went on to the paired eval on facts it read, not on a guess
    assert status["phase"] in ("Promoted", "RolledBack"), status["message"]
    assert "accuracy" in gates, gates


@pytest.mark.timeout(600)
def test_an_engine_nothing_names_the_dtype_of_is_never_promoted(world: ScenarioWorld) -> None:
    obj = world.rollout("unread")
    status = obj["status"]
    assert status["phase"] == "RolledBack", status["message"]
    canary = status["gates"]["canary"]
    assert (canary["outcome"], canary["reason"]) == ("Inconclusive", "CandidateDtypeUnread")
    assert "cannot be shown to run fp8" in canary["message"]
    assert "eval" not in status  # no eval Job was ever started
    now = world.deployment("unread")
    assert container_of(now) == container_of(world.before["unread"])
