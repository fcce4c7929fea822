"""The verdict key's GPU: what the candidate ran on (node label, GPU count), recorded with the
verdict, and a live move to other GPUs judged stale; unknown on either side is no evidence."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.evidence import kubeobjects
from kvgate.judge import verdictkey
from kvgate.judge.verdictkey import LiveKey
from kvgate.reasons import Reason
from kvgate.records.status import RolloutStatus, VerdictKey, VerdictRecord
from kvgate.spec.rollout import RolloutSpec, TargetRef

L4, H100 = "NVIDIA L4", "NVIDIA H100 80GB HBM3"
SPEC = RolloutSpec(target=TargetRef("vllm"))


def _status(**candidate: Any) -> RolloutStatus:
    return RolloutStatus.from_dict(
        {
            "evaluatedImage": "vllm/vllm-openai:v0.11.0",
            "arms": {"candidate": {"pod": "r-candidate", "imageID": "sha256:aa", **candidate}},
        }
    )


def test_key_of_records_the_candidate_arms_gpu() -> None:
    key = verdictkey.key_of(_status(node="n1", gpuProduct=L4, gpuCount=2), SPEC)
    assert (key.gpu_product, key.gpu_count) == (L4, 2)
    raw = RolloutStatus(verdict=VerdictRecord(key=key)).to_dict()
    assert (raw["verdict"]["key"]["gpuProduct"], raw["verdict"]["key"]["gpuCount"]) == (L4, 2)
    raw["verdict"]["key"]["digest"] = "sha256:x"
    record = RolloutStatus.from_dict(raw).verdict
    assert record is not None and record.key == key
    assert record.key.digest == key.digest != "sha256:x"  # computed again, never trusted
    # round-trips through status as camelCase
    written = RolloutStatus.from_dict({"arms": {"candidate": {"gpuProduct": L4, "gpuCount": 2}}})
    arm = written.to_dict()["arms"]["candidate"]
    assert (arm["gpuProduct"], arm["gpuCount"]) == (L4, 2)


def test_the_gpu_is_part_of_the_keys_digest() -> None:
    on_l4 = verdictkey.key_of(_status(gpuProduct=L4, gpuCount=1), SPEC)
    on_h100 = verdictkey.key_of(_status(gpuProduct=H100, gpuCount=1), SPEC)
    two = verdictkey.key_of(_status(gpuProduct=L4, gpuCount=2), SPEC)
    assert len({on_l4.digest, on_h100.digest, two.digest}) == 3


def test_an_unknown_gpu_is_none_in_the_key() -> None:
    key = verdictkey.key_of(_status(), SPEC)
    assert (key.gpu_product, key.gpu_count) == (None, None)
    assert verdictkey.key_of(RolloutStatus(), SPEC).gpu_product is None  # no arm at all


KEY = VerdictKey(image="img:1", image_digest="sha256:aa", gpu_product=L4, gpu_count=1)


def _live(**fields: Any) -> LiveKey:
    return LiveKey(image="img:1", image_digests=frozenset({"sha256:aa"}), **fields)


@pytest.mark.parametrize(
    ("live", "changed"),
    [
        (_live(gpu_products=frozenset({L4}), gpu_counts=frozenset({1})), ()),
        (_live(gpu_products=frozenset({H100}), gpu_counts=frozenset({1})), ("gpuProduct",)),
        (_live(gpu_products=frozenset({L4, H100})), ("gpuProduct",)),  # one replica moved
        (_live(gpu_counts=frozenset({2})), ("gpuCount",)),
        (_live(gpu_products=frozenset({H100}), gpu_counts=frozenset({4})),
         ("gpuProduct", "gpuCount")),
        (_live(), ()),  # the live GPU unknown (no label, nodes not readable): no evidence
    ],
)  # fmt: skip
def test_stale_fields_flag_a_known_gpu_that_differs(live: LiveKey, changed: tuple[str]) -> None:
    assert verdictkey.stale_fields(KEY, live) == changed


def test_a_key_without_a_gpu_is_never_stale_on_the_gpu() -> None:
    unknown = VerdictKey(image="img:1", image_digest="sha256:aa")
    live = _live(gpu_products=frozenset({H100}), gpu_counts=frozenset({8}))
    assert verdictkey.stale_fields(unknown, live) == ()
    # a known count of 0 (a CPU run) is a value, not an unknown
    zero = VerdictKey(gpu_count=0)
    assert verdictkey.stale_fields(zero, _live(gpu_counts=frozenset({1}))) == ("gpuCount",)


def test_judge_names_the_gpu_change() -> None:
    live = _live(gpu_products=frozenset({H100}), gpu_counts=frozenset({1}))
    stale, reason, message = verdictkey.judge(KEY, live)
    assert (stale, reason) == (True, Reason.STALE)
    assert "GPU NVIDIA L4 -> NVIDIA H100 80GB HBM3" in message
    stale, _, message = verdictkey.judge(KEY, _live(gpu_counts=frozenset({1, 2})))
    assert stale and "GPU count 1 -> 2" in message
    assert verdictkey.judge(KEY, _live(gpu_products=frozenset({L4})))[0] is False


def _node(product: Any) -> dict[str, Any]:
    return {"metadata": {"name": "n", "labels": {kubeobjects.GPU_PRODUCT_LABEL: product}}}


def test_gpu_product_reads_the_feature_discovery_label_and_bounds_it() -> None:
    assert kubeobjects.gpu_product(_node("NVIDIA-H100-80GB-HBM3")) == "NVIDIA-H100-80GB-HBM3"
    assert kubeobjects.gpu_product(None) is None
    assert kubeobjects.gpu_product({"metadata": {"name": "n"}}) is None  # no GFD on the node
    machine = {"metadata": {"labels": {"nvidia.com/gpu.machine": "x"}}}
    assert kubeobjects.gpu_product(machine) is None  # only the product label counts
    assert kubeobjects.gpu_product(_node(7)) is None  # not a string
    assert kubeobjects.gpu_product(_node("\x1b\x00\n\t\u200b")) is None  # nothing printable left
    hostile = kubeobjects.gpu_product(_node("L4\x1b[2J\r\nEvil: yes" + "A" * 10_000))
    assert hostile is not None and len(hostile) <= 63
    assert hostile.isprintable() and "\x1b" not in hostile and "\n" not in hostile
    assert hostile.startswith("L4 [2J Evil: yes")


@pytest.mark.parametrize(
    ("resources", "count"),
    [
        ({"limits": {"nvidia.com/gpu": "2"}}, 2),
        ({"limits": {"nvidia.com/gpu": 4}, "requests": {"nvidia.com/gpu": 1}}, 4),
        ({"requests": {"nvidia.com/gpu": "1"}}, 1),  # a request alone
        ({"limits": {"cpu": "2"}}, None),
        ({"limits": {"nvidia.com/gpu": "500m"}}, None),  # not a whole GPU: unknown, no guess
        ({"limits": {"nvidia.com/gpu": True}}, None),
        ({"limits": {"nvidia.com/gpu": "99999999"}}, None),
        ({"limits": {"nvidia.com/gpu": -1}}, None),
        ({"limits": "garbage"}, None),
        (None, None),
    ],
)
def test_gpu_count_reads_the_limit_else_the_request(resources: Any, count: int | None) -> None:
    assert kubeobjects.gpu_count({"name": "engine", "resources": resources}) == count
