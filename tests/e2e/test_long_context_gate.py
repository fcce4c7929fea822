"""The accuracy gate over several tasks, end to end: GSM8K, long context and the divergence screen.

Two simulator Deployments serve Qwen3-8B with `--max-model-len 32768` (an L4 given 40 GiB so the
bf16 pool holds it); one `kvgate run` drives a rollout on each, concurrently:
  (collapse) the candidate's FP8 KV collapses from 16,384 cached tokens on (the simulator's
      `long-context-collapse` fault, passed through extraEnv): GSM8K (prompts of about a
      thousand tokens) passes, the long-context gate fails the 16k-32k bucket and rolls back
      with a reason naming it, and the divergence screen flags the 16,384-32,768 positions;
  (sound) a sound FP8 candidate passes all three and is promoted; its long-context buckets and
      its screen's document length come from the control's logged max model length.
Prompts are sized with a BPE tokenizer trained here on the GSM8K train set; nothing is
downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import (
    FAST_GATES,
    GSM8K_DIR,
    ScenarioWorld,
    apply,
    condition,
    container_of,
    event_reasons,
    get,
    install_crd,
    sim_deployment,
)

pytestmark = pytest.mark.e2e

ENV = {
    "KVGATE_SIM_GPU_MEMORY_GIB": "40",
    "KVGATE_SIM_LOAD": "concurrency=64,prompt=2000,output=400",
}
ARGS = ["--max-model-len", "32768"]
TOKENIZER = "<tokenizer>"  # replaced by the trained tokenizer's directory


def _spec(long_context: dict[str, Any], fault: str | None) -> dict[str, Any]:
    env = [{"name": "KVGATE_SIM_FAULTS", "value": fault}] if fault else []
    return {
        "extraArgs": ["--attention-backend", "TRITON_ATTN"],
        "extraEnv": env,
        "gates": {
            **FAST_GATES,
            "capacity": {"mode": "warn", "window": "3s", "samples": 3},
            "accuracy": {
                **FAST_GATES["accuracy"],
                "longContext": {
                    "tasks": ["niah_single_1"],
                    "items": 30,
                    "margin": 15,
                    "tokenizer": TOKENIZER,
                    **long_context,
                },
            },
            "divergence": {"mode": "require", "documents": 1},
        },
        "canary": {"startupTimeout": "90s", "evalTimeout": "900s", "evalRetries": 0},
    }


SCENARIOS: dict[str, dict[str, Any]] = {
    # explicit buckets well clear of the collapse point (the simulator counts its own tokens)
    "collapse": _spec({"contextLengths": [8192, 32768]}, "long-context-collapse=16384"),
    "sound": _spec({}, None),
}


def _train_tokenizer(directory: Path) -> str:
    tokenizers = pytest.importorskip("tokenizers")
    rows = [
        json.loads(line)
        for line in (Path(GSM8K_DIR) / "train.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=4000,
        special_tokens=["[UNK]"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((r["question"] + "\n" + r["answer"] for r in rows), trainer)
    tok.save(str(directory / "tokenizer.json"))
    return str(directory)


@pytest.fixture(scope="module")
def world(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScenarioWorld]:
    tokenizer = _train_tokenizer(Path(tmp_path_factory.mktemp("tokenizer")))
    log_dir = tmp_path_factory.mktemp("operator")
    w = ScenarioWorld(cluster, log_dir, "lc", SCENARIOS, settle_timeout=1000)
    w.operator.start()
    try:
        w.deploy({s: sim_deployment(s, env=ENV, args=ARGS) for s in SCENARIOS})
        w.start_rollouts(
            {
                s: json.loads(json.dumps(spec).replace(TOKENIZER, tokenizer))
                for s, spec in SCENARIOS.items()
            }
        )
        yield w
    finally:
        w.finish()


@pytest.mark.timeout(1200)
def test_gsm8k_passes_but_the_long_context_gate_rolls_back_naming_the_bucket(
    world: ScenarioWorld,
) -> None:
    obj = world.rollout("collapse")
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("RolledBack", "LongContextRegressed"), status[
        "message"
    ]
    assert status["message"].startswith("long-context bucket 16k-32k (32,768 tokens): ")
    gates = status["gates"]
    # GSM8K alone is blind to it
    assert gates["accuracy"]["outcome"] == "Successful", gates["accuracy"]
    assert (gates["longContext"]["outcome"], gates["longContext"]["reason"]) == (
        "Failed",
        "LongContextRegressed",
    )
    lc = status["accuracy"]["longContext"]  # the Job's long_context, camelCase in status
    assert (lc["verdict"], lc["failingBucket"], lc["contextLengths"]) == (
        "fail",
        "32768",
        [8192, 32768],
    )
    rows = {row["bucket"]: row for row in lc["buckets"]}
    assert rows["8192"]["verdict"] == "pass"
    assert rows["32768"]["candidate"]["accuracy"] < 0.2 < 0.8 < rows["32768"]["control"]["accuracy"]
    # the divergence screen flags the same candidate, at the positions past the collapse
    assert (gates["divergence"]["outcome"], gates["divergence"]["reason"]) == (
        "Failed",
        "DivergenceFlagged",
    )
    assert "position bucket 16,384-32,768" in gates["divergence"]["message"]
    div = status["accuracy"]["divergence"]
    assert div["verdict"] == "flag" and "16384-32768" in div["flaggedBuckets"]
    assert "0-512" not in div["flaggedBuckets"]
    reasons = event_reasons(
        world.cluster, world.ns["collapse"], "collapse-fp8",
        ["LongContextRegressed", "DivergenceFlagged", "RolledBack"],
    )  # fmt: skip
    assert {"LongContextRegressed", "DivergenceFlagged", "RolledBack"} <= set(reasons)
    assert condition(obj, "RolledBack")["status"] == "True"
    now = world.deployment("collapse")
    assert now["metadata"]["generation"] == world.before["collapse"]["metadata"]["generation"]
    assert container_of(now) == container_of(world.before["collapse"])


@pytest.mark.timeout(1200)
def test_a_sound_candidate_passes_all_three_and_is_promoted(world: ScenarioWorld) -> None:
    obj = world.rollout("sound")
    status = obj["status"]
    assert status["phase"] == "Promoted", status["message"]
    gates = status["gates"]
    for gate, reason in (
        ("accuracy", "AccuracyNonInferior"),
        ("longContext", "LongContextNonInferior"),
        ("divergence", "DivergenceWithinFloor"),
    ):
        assert (gates[gate]["outcome"], gates[gate]["reason"]) == ("Successful", reason), gates
    lc = status["accuracy"]["longContext"]  # the Job's long_context, camelCase in status
    # buckets from the control's logged --max-model-len 32768
    assert lc["contextLengths"] == [4096, 8192, 16384, 32768]
    assert all(row["verdict"] == "pass" for row in lc["buckets"])
    div = status["accuracy"]["divergence"]
    assert div["verdict"] == "pass" and div["maxTokens"] == 32768
    assert div["documentTokens"][0] > 16384
    args = container_of(world.deployment("sound")).get("args") or []
    assert "--kv-cache-dtype" in args and "fp8" in args


@pytest.mark.timeout(120)
def test_the_apiserver_defaults_and_refuses_the_new_fields(cluster: Any, namespace: str) -> None:
    install_crd(cluster)

    def cr(name: str, gates: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "kvgate.io/v1alpha1",
            "kind": "KVCacheRollout",
            "metadata": {"name": name},
            "spec": {"targetRef": {"name": "q"}, "gates": gates},
        }

    apply(cluster, namespace, cr("plain", {}), cr("lc", {"accuracy": {"longContext": {}}}))
    plain = get(cluster, namespace, "kvr", "plain")
    assert plain is not None
    gates = plain["spec"]["gates"]
    assert "longContext" not in gates["accuracy"]  # GSM8K only unless asked
    assert gates["divergence"] == {"mode": "off", "documents": 4, "factor": 10, "logprobs": 5}
    lc = get(cluster, namespace, "kvr", "lc")
    assert lc is not None
    assert lc["spec"]["gates"]["accuracy"]["longContext"] == {
        "tasks": ["niah_single_1"],
        "items": 50,
        "margin": 10,
        "recoveryFloor": 0.95,
    }
    for gates, message in (
        (
            {"accuracy": {"longContext": {"tasks": ["ruler_qa"]}}},
            'spec.gates.accuracy.longContext.tasks[0]: Unsupported value: "ruler_qa"',
        ),
        (
            {"accuracy": {"longContext": {"contextLengths": [100]}}},
            "spec.gates.accuracy.longContext.contextLengths[0]: Invalid value: 100",
        ),
        (
            {"divergence": {"mode": "always"}},
            'spec.gates.divergence.mode: Unsupported value: "always"',
        ),
    ):
        body = yaml.safe_dump(cr("bad", gates))
        proc = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=body, check=False)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr
