"""vLLM's FP8-study cautions in a rollout (issue 39): the controller writes them once into
status.preflight.advice from the checkpoint's config and the spec, posts one Warning Event,
never lets them block a promotion, and `kvgate get` and the report show them; a skip list that
names a layer the checkpoint does not have fails the rollout at preflight, before any canary.
Through the controller on the fake cluster (tests/unit/fake_cluster.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import fake_cluster
import numpy as np
import pytest
from safetensors.numpy import save_file
from test_controller import World

from kvgate import report
from kvgate.commands.rollout_view import RolloutView
from kvgate.config import OperatorConfig
from kvgate.judge.guidance import for_rollout as advice
from kvgate.records.status import CheckpointRecord
from kvgate.spec.rollout import RolloutSpec

STUDY = "vLLM blog 'The State of FP8 KV-Cache and Attention Quantization in vLLM' (2026-04-22)"


def gemma_world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **spec: Any) -> World:
    """A rollout of a local gemma-3-4b-it checkpoint (head_dim 256; 29 of 34 layers slide)."""
    config = json.loads((fake_cluster.DATA / "configs" / "gemma-3-4b-it.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(
        {"model.embed_tokens.weight": np.ones((2, 2), np.float32)},
        str(tmp_path / "model.safetensors"),
    )
    world = World(monkeypatch, model={"name": str(tmp_path)}, **spec)
    world.memo.config = OperatorConfig(
        poll_interval_s=1, hub_offline=True, model_dirs=(str(tmp_path),)
    )
    return world


def advice_events(world: World) -> list[tuple[str, str, str]]:
    return [e for e in world.events if e[1] == "EngineAdvice"]


def test_the_advice_is_written_once_posted_once_and_does_not_block(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    world = gemma_world(monkeypatch, tmp_path)
    written: list[Any] = []
    world.before_reconcile = lambda w: written.append(
        copy.deepcopy(((w.obj.get("status") or {}).get("preflight") or {}).get("advice"))
    )
    end = world.run()
    world.assert_invariant()
    status = world.obj["status"]
    assert end == "Promoted", status["message"]  # advice, not a gate
    (note,) = status["preflight"]["advice"]
    assert note["code"] == "SlidingWindowLayers"
    assert note["message"].startswith("29 of 34 layers are sliding-window")
    assert note["source"].startswith(STUDY)
    assert status["preflight"]["checkpoint"]["headDim"] == 256
    assert status["preflight"]["checkpoint"]["slidingWindowLayers"] == 29
    # written once: once set, every later reconcile saw the same record
    first = next(i for i, a in enumerate(written) if a)
    assert all(a == written[first] for a in written[first:])
    # one Warning Event, whatever the number of reconciles in Preflight
    ((kind, _, message),) = advice_events(world)
    assert kind == "Warning"
    assert message.startswith("SlidingWindowLayers: 29 of 34 layers are sliding-window")
    assert "(advice, not a gate; source: vLLM blog" in message
    # shown by `kvgate get` and in the report
    lines = RolloutView.of(world.obj).lines()
    assert any(ln.startswith("  advice SlidingWindowLayers: 29 of 34 layers") for ln in lines)
    text = report.render_text(world.obj)
    assert "advice SlidingWindowLayers (not a gate): 29 of 34 layers are sliding-window" in text
    assert f"[source: {STUDY}" in text
    assert "advice SlidingWindowLayers (not a gate)" in report.render_html(world.obj)


def test_a_spec_that_skips_the_sliding_layers_gets_no_such_advice_and_its_capacity(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    world = gemma_world(monkeypatch, tmp_path, kvCache={"format": "fp8",
                                                        "skipLayers": ["sliding_window", "0"]})  # fmt: skip
    assert world.run() == "Promoted"
    status = world.obj["status"]
    assert "advice" not in status["preflight"] and advice_events(world) == []
    # the 29 sliding layers (layer 0 is one of them) kept 16-bit, 5 in FP8: 68 / (2 x 29 + 5)
    assert status["preflight"]["checkpoint"]["expectedCapacityGain"] == pytest.approx(68 / 63)
    args = world.kube.container()["args"]
    i = args.index("--kv-cache-dtype-skip-layers")
    assert args[i : i + 3] == ["--kv-cache-dtype-skip-layers", "sliding_window", "0"]


def test_a_skip_list_past_the_models_layers_fails_at_preflight(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    world = gemma_world(monkeypatch, tmp_path, kvCache={"format": "fp8",
                                                        "skipLayers": ["0", "40"]})  # fmt: skip
    end = world.run()
    world.assert_invariant()
    status = world.obj["status"]
    assert (end, status["reason"]) == ("Failed", "InvalidSpec")
    assert status["message"] == (
        "spec.kvCache.skipLayers[1]: '40' is neither a layer index below 34 nor "
        "'sliding_window' (Gemma3ForConditionalGeneration: num_hidden_layers 34)"
    )
    assert world.kube.get("Pod", "r-control") is None and "arms" not in status


def spec(**raw: Any) -> RolloutSpec:
    return RolloutSpec.from_dict({"targetRef": {"name": "qwen", "container": "engine"}, **raw})


GEMMA = CheckpointRecord(head_dim=256, kv_layers=34, sliding_window_layers=29)


def test_the_ttft_objective_brings_the_head_dim_note() -> None:
    ttft = {"capacityGain": {"throughputGain": {"ttftP99Ms": 800}}}
    codes = [n.code for n in advice(spec(engine="vllm", gates=ttft), "vllm", GEMMA)]
    assert codes == ["HeadDim256Ttft", "SlidingWindowLayers"]
    assert [n.code for n in advice(spec(engine="vllm"), "vllm", GEMMA)] == ["SlidingWindowLayers"]


def test_sglang_gets_no_note_naming_a_vllm_flag_and_no_config_no_advice() -> None:
    ttft = {"capacityGain": {"throughputGain": {"ttftP99Ms": 800}}}
    sglang = spec(engine="sglang", kvCache={"format": "fp8_e4m3"}, gates=ttft)
    assert [n.code for n in advice(sglang, "sglang", GEMMA)] == ["HeadDim256Ttft"]
    assert advice(spec(engine="vllm"), "vllm", CheckpointRecord()) == ()
