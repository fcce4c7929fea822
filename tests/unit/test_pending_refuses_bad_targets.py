"""A rollout whose spec cannot apply to its Deployment ends at Pending with one line naming the
field, before any pod, Job or patch: a spec.engine the container does not run, and a KV dtype
the engine it runs rejects. The fake cluster of test_controller, with the operator's handler.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_controller import World


def _untouched(world: World) -> None:
    world.assert_invariant()
    assert world.kube.container() == world.original
    assert (
        world.kube.get("Pod", "r-control") is None and world.kube.get("Pod", "r-candidate") is None
    )
    assert "arms" not in world.obj["status"] and "Canary" not in world.phases


def _run_sglang(world: World) -> None:
    dep = world.kube.objects[("Deployment", "vllm")]
    container: dict[str, Any] = dep["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "lmsysorg/sglang:v0.5.3"
    container["command"] = ["python3", "-m", "sglang.launch_server"]
    container["args"] = ["--model-path", "Qwen/Qwen3-8B", "--port", "8000"]
    world.original = world.kube.container()


def test_a_spec_engine_the_container_does_not_run_fails_naming_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a rollout that says SGLang for a Deployment that runs vLLM
    world = World(monkeypatch, engine="sglang", kvCacheDtype="fp8_e4m3")
    assert world.run() == "Failed"
    status = world.obj["status"]
    assert status["reason"] == "InvalidTarget"
    assert status["message"] == (
        "spec.engine is sglang but container engine runs vllm; fix spec.engine or use auto"
    )
    _untouched(world)


def test_an_fp8_spelling_the_engine_rejects_fails_at_pending_saying_what_to_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN engine auto and an SGLang Deployment: the spec's `fp8` parses, SGLang would refuse it
    world = World(monkeypatch, kvCacheDtype="fp8")
    _run_sglang(world)
    assert world.run() == "Failed"
    status = world.obj["status"]
    assert status["reason"] == "InvalidSpec"
    assert status["message"] == (
        "spec.kvCacheDtype: SGLang rejects 'fp8' (its choices are auto, fp8_e4m3, fp8_e5m2...); "
        "use 'fp8_e4m3', which is what vLLM's 'fp8' means on CUDA"
    )
    _untouched(world)
