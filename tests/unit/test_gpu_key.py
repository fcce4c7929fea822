"""The GPU in the verdict key, on the fake cluster: the candidate canary's node's GPU product
(GPU feature discovery's label) and its GPU count are recorded with the verdict; production
pods of the tested config that move to other GPUs make a promoted verdict Stale, naming the
GPU; a node kvgate may not read (403) or one without the label leaves the GPU unknown."""

from __future__ import annotations

from typing import Any

import pytest
from fake_cluster import gpu_node
from test_controller import World, _drift_check

L4, H100 = "NVIDIA L4", "NVIDIA H100 80GB HBM3"


def _gpu_world(monkeypatch: pytest.MonkeyPatch, *, gpus: int = 1) -> World:
    """A world whose engine asks for `gpus` GPUs and is scheduled to an L4 node."""
    world = World(monkeypatch)
    world.kube.add(gpu_node("l4-1", L4))
    world.kube.add(gpu_node("h100-1", H100))
    world.kube.node = "l4-1"
    world.kube.edit_container("vllm", resources={"limits": {"nvidia.com/gpu": str(gpus)}})
    world.original = dict(world.kube.container())
    return world


def _key(world: World) -> dict[str, Any]:
    return dict(world.obj["status"]["verdict"]["key"])


def test_the_verdict_records_the_gpu_it_was_reached_on(monkeypatch: pytest.MonkeyPatch) -> None:
    world = _gpu_world(monkeypatch, gpus=2)
    assert world.run() == "Promoted"
    candidate = world.obj["status"]["arms"]["candidate"]
    assert (candidate["node"], candidate["gpuProduct"], candidate["gpuCount"]) == ("l4-1", L4, 2)
    key = _key(world)
    assert (key["gpuProduct"], key["gpuCount"]) == (L4, 2)
    assert _drift_check(world)["Stale"]["status"] == "False"


@pytest.mark.parametrize("change", ["node", "count"])
def test_a_promoted_verdict_goes_stale_when_production_moves_to_other_gpus(
    monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    world = _gpu_world(monkeypatch)
    assert world.run() == "Promoted"
    assert _drift_check(world)["Stale"]["status"] == "False"
    if change == "node":  # the pods are rescheduled onto H100 nodes: same template, same image
        world.kube.reschedule("h100-1")
        what = f"GPU {L4} -> {H100}"
    else:  # the tested args kept, the GPU count edited from Git
        world.kube.edit_container("vllm", resources={"limits": {"nvidia.com/gpu": "2"}})
        what = "GPU count 1 -> 2"
    mutations = world.kube.mutations
    stale = _drift_check(world)["Stale"]
    assert (stale["status"], stale["reason"]) == ("True", "Stale")
    assert what in stale["message"]
    assert "image" not in stale["message"]  # the image did not change
    assert world.reasons().count("Stale") == 1
    _drift_check(world)  # no second Event while it stays stale
    assert world.reasons().count("Stale") == 1
    assert world.kube.mutations == mutations  # kvgate changes nothing


def test_a_node_kvgate_may_not_read_leaves_the_gpu_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a chart whose ClusterRole lacks `get` on nodes: every Node read answers 403
    world = _gpu_world(monkeypatch)
    world.kube.forbid_nodes = True
    # THEN the rollout proceeds, and the GPU product is unknown (the count is still read)
    assert world.run() == "Promoted"
    candidate = world.obj["status"]["arms"]["candidate"]
    assert candidate["node"] == "l4-1" and "gpuProduct" not in candidate
    key = _key(world)
    assert "gpuProduct" not in key and key["gpuCount"] == 1
    # and an unknown is no evidence: a move to H100 nodes, unreadable too, is not Stale
    world.kube.reschedule("h100-1")
    assert _drift_check(world)["Stale"]["status"] == "False"
    # nor does a key recorded with the GPU go stale when the live nodes become unreadable
    world.kube.forbid_nodes = False
    other = _gpu_world(monkeypatch)
    assert other.run() == "Promoted"
    other.kube.forbid_nodes = True
    other.kube.reschedule("h100-1")
    assert _drift_check(other)["Stale"]["status"] == "False"


def test_a_node_without_the_feature_discovery_label_is_an_unknown_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = _gpu_world(monkeypatch)
    world.kube.add(gpu_node("plain-1", None))
    world.kube.node = "plain-1"
    assert world.run() == "Promoted"
    assert "gpuProduct" not in _key(world)
    world.kube.reschedule("h100-1")  # known now, but nothing to compare it with
    assert _drift_check(world)["Stale"]["status"] == "False"


def test_a_hostile_gpu_label_is_bounded_and_scrubbed_in_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # label values are checked by the apiserver; an API (or proxy) that answers anything must
    # still not put control characters or an unbounded text into status and Events
    world = _gpu_world(monkeypatch)
    world.kube.add(gpu_node("evil-1", "L4\x1b[2J\r\nStale: False\x00" + "A" * 5000))
    world.kube.node = "evil-1"
    assert world.run() == "Promoted"
    product = _key(world)["gpuProduct"]
    assert product == world.obj["status"]["arms"]["candidate"]["gpuProduct"]
    assert len(product) <= 63 and product.isprintable()
    assert product.startswith("L4 [2J Stale: False")
    world.kube.reschedule("h100-1")
    stale = _drift_check(world)["Stale"]
    assert stale["status"] == "True"
    assert stale["message"].isprintable() and "A" * 64 not in stale["message"]
