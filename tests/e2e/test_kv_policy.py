"""KV policy end to end (issue 39): a rollout per policy class, and a load gate that checks the
output it measures, on the real apiserver with simulator Deployments under one `kvgate run`.

Scenarios, run at once (one namespace each):
  (dup)  an FP8 candidate that emits every second token twice (the simulator's duplicate-tokens
         fault, intel/llm-scaler#721): the load runs, and the throughput gate refuses it as
         OutputDegenerate whatever tok/s it measured; production untouched;
  (cold) an FP8 candidate with prefix caching off (no-prefix-caching, rwlove/home-ops#13384):
         refused as PrefixCacheOff; production untouched;
  (sub8) int4_per_token_head, a sub-8-bit format: refused at admission without a margin (the
         CRD's CEL); with one (6 points) decided, its verdict stating both sides (the accuracy
         bound, the KV tokens and the load gate's tok/s);
  (int8) int8_per_token_head (dynamic per-(token, head) scales) on a checkpoint whose scales
         include a zero: the scales gate says the checkpoint's scales are unused, and the
         rollout is decided by its other gates;
  (zero) FP8 on that checkpoint: rolled back before any eval (ScalesBroken);
  (fp8ctl) a checkpoint whose kv_cache_scheme makes an `auto` control run FP8: read as FP8,
         Failed in preflight (ControlRunsFP8), no canary.
dup and cold run with the accuracy gate off: their duplicated text would fail the eval first,
and the point here is that the load gate cannot be fooled on its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import (
    ROOT,
    ScenarioWorld,
    container_of,
    get,
    rollout,
    rollout_events,
    sim_deployment,
)

from kvgate.load.runner import default_inference_perf

pytestmark = pytest.mark.e2e

PRESSURE = "concurrency=64,prompt=2000,output=400"
# The load gate's scenarios: 8 short requests paced as test_load_gate's `room` (the stages last
# seconds, not milliseconds); the capacity gate warns instead of ending a pool with room.
ROOM = {"KVGATE_SIM_LOAD": "concurrency=8,prompt=500,output=100", "KVGATE_SIM_SPEED": "0.1"}
TRITON = ["--attention-backend", "TRITON_ATTN"]  # L4 + FlashInfer FP8: the JIT fault
CHECKPOINT = "<checkpoint>"  # replaced by the zero-scale checkpoint's path in the fixture
FORCES_FP8 = "<forces-fp8>"  # replaced by the kv_cache_scheme checkpoint's path
# The per-token-head formats are vLLM 0.20+ (int4: 0.25+): those scenarios run a 0.32 image
NEWER = ("sub8", "int8")
IMAGE_032 = "vllm/vllm-openai:v0.32.0"
GATES = {
    "capacity": {"mode": "require", "window": "3s", "samples": 3},
    "accuracy": {"questions": 150, "chunk": 50, "margin": 3},
}


def _load_spec(fault: str) -> dict[str, Any]:
    return {
        "extraArgs": TRITON,
        "extraEnv": [{"name": "KVGATE_SIM_FAULTS", "value": fault}],
        "gates": {
            "capacity": {"mode": "warn", "window": "3s", "samples": 3},
            "accuracy": {"mode": "off"},
            "capacityGain": {"throughputGain": {"minRatio": 1.3, "maxConcurrency": 8}},
        },
    }


def _sub8_gates(margin: float | None) -> dict[str, Any]:
    accuracy: dict[str, Any] = {"questions": 150, "chunk": 50}
    if margin is not None:
        accuracy["margin"] = margin
    # the load gate on too, so that the verdict's trade quotes the throughput bought as well
    gain = {"throughputGain": {"minRatio": 1.3, "maxConcurrency": 64}}
    return {"capacity": GATES["capacity"], "accuracy": accuracy, "capacityGain": gain}


# scenario -> (Deployment env, rollout spec overrides)
SCENARIOS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "dup": (ROOM, _load_spec("duplicate-tokens")),
    "cold": (ROOM, _load_spec("no-prefix-caching")),
    "sub8": (
        {"KVGATE_SIM_LOAD": PRESSURE, "KVGATE_SIM_ENGINE_VERSION": "0.32.0"},
        {
            "engine": "vllm",
            "kvCache": {"format": "int4_per_token_head"},
            "extraArgs": TRITON,
            "gates": _sub8_gates(6),
        },
    ),
    "int8": (
        {"KVGATE_SIM_LOAD": PRESSURE, "KVGATE_SIM_ENGINE_VERSION": "0.32.0"},
        {
            "engine": "vllm",
            "kvCache": {"format": "int8_per_token_head"},
            "extraArgs": TRITON,
            "model": {"name": CHECKPOINT},
            "gates": {**GATES, "scales": {"mode": "require"}},
        },
    ),
    "zero": (
        {"KVGATE_SIM_LOAD": PRESSURE},
        {"extraArgs": TRITON, "model": {"name": CHECKPOINT}, "gates": GATES},
    ),
    "fp8ctl": (
        {"KVGATE_SIM_LOAD": PRESSURE},
        {"extraArgs": TRITON, "model": {"name": FORCES_FP8}, "gates": GATES},
    ),
}


def _config() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(
        (ROOT / "tests" / "data" / "configs" / "qwen3-8b.json").read_text()
    )
    return loaded


def _zero_scale_checkpoint(directory: Path) -> str:
    """A Qwen3-8B-shaped checkpoint with k/v scales on every layer, layer 1's k_scale 0.0 (the
    llm-compressor#2853 calibration bug)."""
    import numpy as np
    from safetensors.numpy import save_file

    config = _config()
    (directory / "config.json").write_text(json.dumps(config))
    tensors = {
        f"model.layers.{i}.self_attn.{kind}": np.array(
            0.0 if (i, kind) == (1, "k_scale") else 0.02, np.float32
        )
        for i in range(config["num_hidden_layers"])
        for kind in ("k_scale", "v_scale")
    }
    tensors["model.embed_tokens.weight"] = np.ones((2, 2), np.float32)
    save_file(tensors, str(directory / "model.safetensors"))
    return str(directory)


def _fp8_scheme_checkpoint(directory: Path) -> str:
    """A checkpoint whose compressed-tensors kv_cache_scheme makes vLLM's `auto` cache FP8."""
    import numpy as np
    from safetensors.numpy import save_file

    config = _config()
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "kv_cache_scheme": {"type": "float", "num_bits": 8, "dynamic": False},
    }
    (directory / "config.json").write_text(json.dumps(config))
    save_file(
        {"model.embed_tokens.weight": np.ones((2, 2), np.float32)},
        str(directory / "model.safetensors"),
    )
    return str(directory)


def brief(status: dict[str, Any]) -> str:
    """What a failed assertion shows: the end, its reason and message, then the gates."""
    head = {k: status.get(k) for k in ("phase", "reason", "message")}
    return json.dumps(head) + " " + json.dumps(status.get("gates"))[:2000]


class World(ScenarioWorld):
    def untouched(self, scenario: str) -> None:
        now, before = self.deployment(scenario), self.before[scenario]
        assert now["metadata"]["generation"] == before["metadata"]["generation"]
        assert container_of(now) == container_of(before)

    def jobs(self, scenario: str) -> list[str]:
        proc = self.kubectl("get", "jobs", "-n", self.ns[scenario], "-o", "json")
        return [j["metadata"]["name"] for j in json.loads(proc.stdout)["items"]]


def _load_venv_or_skip() -> None:
    if not default_inference_perf().is_file():
        pytest.skip(f"{default_inference_perf()} missing: run `make loadenv`")


# What kubectl said when the sub-8-bit rollouts without a margin (or with accuracy off) were
# applied: filled by the fixture before the scenarios start.
REFUSED: dict[str, Any] = {}


@pytest.fixture(scope="module")
def world(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    _load_venv_or_skip()
    w = World(cluster, tmp_path_factory.mktemp("operator"), "policy", SCENARIOS, settle_timeout=600)
    w.operator.start()
    try:
        deployments = {s: sim_deployment(s, env=env) for s, (env, _) in SCENARIOS.items()}
        for s in NEWER:
            deployments[s]["spec"]["template"]["spec"]["containers"][0]["image"] = IMAGE_032
        w.deploy(deployments)
        paths = {
            CHECKPOINT: _zero_scale_checkpoint(Path(tmp_path_factory.mktemp("zero"))),
            FORCES_FP8: _fp8_scheme_checkpoint(Path(tmp_path_factory.mktemp("fp8ctl"))),
        }
        specs = {}
        for s, (_, spec) in SCENARIOS.items():
            text = json.dumps(spec)
            for marker, path in paths.items():
                text = text.replace(marker, path)
            specs[s] = json.loads(text)
        # admission, before the scenarios: a sub-8-bit format without a margin, and one with
        # the accuracy gate off, are refused by the apiserver (the CRD's CEL rules)
        for name, gates in (
            ("sub8-nomargin", _sub8_gates(None)),
            ("sub8-off", {**_sub8_gates(6), "accuracy": {"mode": "off", "margin": 6}}),
        ):
            body = rollout(name, "sub8", **{**specs["sub8"], "gates": gates})
            proc = w.kubectl(
                "apply", "-n", w.ns["sub8"], "-f", "-", input=json.dumps(body), check=False
            )
            REFUSED[name] = proc
        w.start_rollouts(specs)
        yield w
    finally:
        w.finish()


@pytest.mark.timeout(900)
def test_a_candidate_that_doubles_its_tokens_is_not_called_faster(world: World) -> None:
    status = world.rollout("dup")["status"]
    assert (status["phase"], status["reason"]) == ("RolledBack", "OutputDegenerate"), brief(status)
    gate = status["gates"]["throughputGain"]
    assert (gate["outcome"], gate["reason"]) == ("Failed", "OutputDegenerate")
    assert gate["message"].startswith(
        "not counted as faster: the candidate repeats the token before it in "
    ), gate["message"]
    # the load ran and measured both arms; the candidate's output, not its tok/s, decided
    summary = status["load"]["summary"]
    control, candidate = summary["control"]["output"], summary["candidate"]["output"]
    assert control["requests"] > 0 and candidate["requests"] > 0
    assert candidate["repeated"] * 4 > candidate["pieces"]  # about one piece in two
    assert control["repeated"] * 20 < control["pieces"]
    assert any(s["status"] == "measured" for s in summary["candidate"]["stages"])
    assert "throughputGain" not in status["load"] or status["load"]["throughputGain"] is None
    events = rollout_events(world.cluster, world.ns["dup"], "dup-fp8", ["OutputDegenerate"])
    assert ("OutputDegenerate", gate["message"]) in events
    world.untouched("dup")


@pytest.mark.timeout(900)
def test_a_candidate_without_prefix_caching_is_not_called_faster(world: World) -> None:
    status = world.rollout("cold")["status"]
    assert (status["phase"], status["reason"]) == ("RolledBack", "PrefixCacheOff"), brief(status)
    gate = status["gates"]["throughputGain"]
    assert (gate["outcome"], gate["reason"]) == ("Failed", "PrefixCacheOff")
    refusal, _, clock = gate["message"].partition("; ")
    assert refusal == (
        "not counted as faster: cache_config_info says enable_prefix_caching False on the "
        "candidate, True on the control"
    )
    # the gate's line says its figures come from sped-up simulators (issue 40 item 4)
    assert clock.startswith("simulated engines at 10x real time (KVGATE_SIM_SPEED=0.1)"), clock
    summary = status["load"]["summary"]
    control, candidate = summary["control"]["prefixCache"], summary["candidate"]["prefixCache"]
    assert control["enabled"] is True and control["hits"] > 0  # the probe's second send hit
    assert candidate["enabled"] is False and candidate["hits"] == 0
    world.untouched("cold")


@pytest.mark.timeout(900)
def test_a_sub8bit_format_needs_a_margin_and_its_verdict_states_both_sides(world: World) -> None:
    nomargin, off = REFUSED["sub8-nomargin"], REFUSED["sub8-off"]
    assert nomargin.returncode != 0 and "gates.accuracy.margin is required" in nomargin.stderr
    assert off.returncode != 0 and "gates.accuracy.mode off is refused" in off.stderr
    for name in ("sub8-nomargin", "sub8-off"):  # nothing was created
        assert get(world.cluster, world.ns["sub8"], "kvr", name) is None
    obj = world.rollout("sub8")
    status = obj["status"]
    decided = ("Promoted", "RolledBack", "NotNeeded")  # whichever: the trade is stated
    assert status["phase"] in decided, brief(status)
    verdict = status["verdict"]["message"]
    # the accuracy given up, bounded: the one-sided bound against the stated 6 points
    assert "trade: accuracy given up (bounded): " in verdict
    assert "one-sided" in verdict and "(margin 6 pp" in verdict
    # what it bought, measured: the arms' KV tokens as the capacity gate read them
    bought = verdict.split("bought (measured): ", 1)[1]
    assert bought.startswith("capacity: ") and "KV tokens = " in bought
    capacity = status["gates"]["capacityGain"]["message"]
    assert capacity in bought
    # and the load gate's line: the tok/s at production's load, measured on both arms
    throughput = status["gates"]["throughputGain"]["message"]
    assert f"; throughput: {throughput}" in bought
    assert throughput.startswith(f"at production load {status['load']['concurrency']}")
    if status["phase"] == "Promoted":
        args = container_of(world.deployment("sub8")).get("args", [])
        assert args[args.index("--kv-cache-dtype") + 1] == "int4_per_token_head"


@pytest.mark.timeout(900)
def test_a_per_token_head_rollout_says_the_checkpoint_scales_are_unused(world: World) -> None:
    status = world.rollout("int8")["status"]
    assert "gates" in status, brief(status)
    gate = status["gates"]["scales"]
    assert (gate["outcome"], gate["reason"]) == ("Successful", "ScalesUnused"), gate
    assert gate["message"].startswith(
        "checkpoint scales unused: int8_per_token_head computes a scale per (token, head)"
    )
    assert "(broken ones included)" in gate["message"]
    # the zero scale does not stop it (the format never reads it): the other gates decide
    assert status["preflight"]["checkpoint"]["brokenScales"] == ["layer 1: k_scale 0.0"]
    assert status["reason"] != "ScalesBroken"
    assert "accuracy" in status["gates"]
    assert status["arms"]["candidate"]["scan"]["kvCacheDtype"] == "int8_per_token_head"


@pytest.mark.timeout(900)
def test_zero_scales_roll_an_fp8_candidate_back_before_any_eval(world: World) -> None:
    status = world.rollout("zero")["status"]
    assert (status["phase"], status["reason"]) == ("RolledBack", "ScalesBroken"), brief(status)
    gate = status["gates"]["scales"]
    assert gate["message"].startswith(
        "the checkpoint's k/v scales cannot scale (layer 1: k_scale 0.0) and fp8 reads them"
    )
    assert "accuracy" not in status["gates"] and not world.jobs("zero")
    world.untouched("zero")


@pytest.mark.timeout(900)
def test_a_control_that_runs_fp8_is_read_as_fp8(world: World) -> None:
    status = world.rollout("fp8ctl")["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "ControlRunsFP8"), brief(status)
    assert status["preflight"]["checkpoint"]["forcesFp8Kv"] == [
        "quantization_config.kv_cache_scheme is set: vLLM 0.26+ switches an auto KV cache to fp8"
    ]
    assert "arms" not in status and not world.jobs("fp8ctl")
    world.untouched("fp8ctl")
