"""spec.reuseVerdict: a candidate takes another rollout's verdict only for exactly what it runs.

The pure rule (`kvgate.flow.reuse.find`) against hostile and near-miss statuses, then the controller
on the fake cluster: a second rollout of the same change on the same GPU, image digest and
backend skips its eval and load and promotes with the first one's gates; off by default, and a
different GPU, image digest or a GPU nobody can read always runs its own eval.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

import pytest
from fake_cluster import gpu_node
from test_controller import World

from kvgate.flow import reuse
from kvgate.reasons import Reason
from kvgate.records.status import RolloutStatus, VerdictKey
from kvgate.spec.reader import SpecError
from kvgate.spec.rollout import RolloutSpec, VerdictReuse
from kvgate.vocabulary import Outcome

L4, H100 = "NVIDIA L4", "NVIDIA H100 80GB HBM3"
NOW = dt.datetime(2026, 12, 2, 12, 0, 0, tzinfo=dt.UTC)
KEY = VerdictKey(
    image="vllm/vllm-openai:v0.33.0",
    image_digest="docker.io/vllm/vllm-openai@sha256:" + "a" * 64,
    engine="vllm",
    engine_version="0.33.0",
    model="Qwen/Qwen3-8B",
    kv_cache_dtype="fp8",
    attention_backend="TRITON_ATTN",
    gpu_product=L4,
    gpu_count=1,
    config="sha256:" + "c" * 16,
    eval_policy="sha256:" + "e" * 16,
)
DAY = VerdictReuse(max_age_s=86400.0)
PASSED = {
    "accuracy": {"outcome": "Successful", "reason": "AccuracyNonInferior", "message": "+0.7 pp"},
    "longContext": {"outcome": "Skipped", "reason": "GateOff", "message": "off"},
    "throughputGain": {"outcome": "Successful", "reason": "ThroughputGained", "message": "+41%"},
    "scales": {"outcome": "Warning", "reason": "ScalesMissing", "message": "not reused"},
}


def promoted(
    name: str = "first", key: VerdictKey = KEY, *, ended: dt.datetime | None = None, **status: Any
) -> dict[str, Any]:
    """A rollout that ended Promoted with `key`, `ended` (default an hour before NOW)."""
    record = {
        **{_camel(k): v for k, v in dataclasses.asdict(key).items() if v is not None},
        "digest": key.digest,
    }
    body: dict[str, Any] = {
        "phase": "Promoted",
        "finishedAt": (ended or NOW - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gates": copy.deepcopy(PASSED),
        "verdict": {"decision": "Promote", "outcome": "Successful", "key": record},
        "conditions": [{"type": "Stale", "status": "False", "reason": "VerdictCurrent"}],
    }
    body.update(status)
    return {"metadata": {"name": name, "namespace": "ns"}, "status": body}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def find(*rollouts: Mapping[str, Any], key: VerdictKey = KEY) -> reuse.ReusedVerdict | None:
    return reuse.find(key, DAY, rollouts, namespace="ns", name="second", now=NOW)


def test_the_same_key_promoted_within_max_age_is_reused_with_its_eval_and_load_gates() -> None:
    found = find(promoted())
    assert found is not None
    assert found.source == "ns/first" and found.age_s == 3600.0
    assert found.key_digest == KEY.digest
    # the eval's and the load's gates stand in; the canary's own (scales) are judged again
    assert [(g.gate, g.outcome, g.reason) for g in found.gates] == [
        ("accuracy", Outcome.SUCCESSFUL, Reason.ACCURACY_NON_INFERIOR),
        ("longContext", Outcome.SKIPPED, Reason.GATE_OFF),
        ("throughputGain", Outcome.SUCCESSFUL, Reason.THROUGHPUT_GAINED),
    ]
    assert "reused the verdict of ns/first (Promoted 60 min ago" in found.message


@pytest.mark.parametrize(
    "field",
    [
        "image_digest", "engine_version", "attention_backend", "gpu_product", "gpu_count",
        "kv_cache_dtype", "config", "eval_policy", "model", "revision", "engine",
    ],
)  # fmt: skip
def test_any_other_key_field_never_reuses(field: str) -> None:
    other = dataclasses.replace(KEY, **{field: 2 if field == "gpu_count" else "other"})
    assert find(promoted(key=other)) is None
    assert find(promoted(), key=other) is None or field == "revision"


@pytest.mark.parametrize(
    "field", ["image_digest", "engine_version", "attention_backend", "gpu_product", "config"]
)
def test_a_candidate_key_with_an_unknown_field_never_reuses(field: str) -> None:
    unknown = dataclasses.replace(KEY, **{field: None})
    assert reuse.unknown_fields(unknown) == (field,)
    # even a rollout recorded with the same unknown: unknown is not the same
    assert find(promoted(key=unknown), key=unknown) is None


@pytest.mark.parametrize(
    ("why", "rollout"),
    [
        ("too old", promoted(ended=NOW - dt.timedelta(days=1, seconds=1))),
        ("ends in the future", promoted(ended=NOW + dt.timedelta(minutes=5))),
        ("rolled back", promoted(phase="RolledBack")),
        ("reported, not promoted", promoted(phase="AwaitingApproval")),
        ("stale", promoted(conditions=[{"type": "Stale", "status": "True", "reason": "Stale"}])),
        ("itself", promoted(name="second")),
        ("a reused verdict", promoted(verdict={**promoted()["status"]["verdict"],
                                                "reusedFrom": "ns/zeroth"})),
        ("accuracy not run", promoted(gates={"throughputGain": PASSED["throughputGain"]})),
        ("accuracy failed", promoted(gates={**PASSED, "accuracy": {"outcome": "Failed"}})),
        ("a gate inconclusive", promoted(gates={**PASSED, "throughputGain": {
            "outcome": "Inconclusive", "reason": "ClocksDiffer"}})),
        ("no finish time", promoted(finishedAt=None)),
        ("decision hold", promoted(verdict={**promoted()["status"]["verdict"],
                                            "decision": "Hold"})),
        ("being deleted", {**promoted(), "metadata": {"name": "first",
                                                     "deletionTimestamp": "2026-12-02T11:00:00Z"}}),
    ],
)  # fmt: skip
def test_what_is_never_reused(why: str, rollout: dict[str, Any]) -> None:
    assert find(rollout) is None, why


def test_a_tampered_digest_is_not_trusted() -> None:
    """A status whose stored digest is the candidate's but whose fields are another GPU's."""
    other = promoted(key=dataclasses.replace(KEY, gpu_product=H100))
    other["status"]["verdict"]["key"]["digest"] = KEY.digest
    assert find(other) is None


@pytest.mark.parametrize(
    "junk",
    [None, 7, "x", {}, {"metadata": []}, {"metadata": {"name": 3}}, {"metadata": {"name": "a"},
     "status": {"phase": "Promoted", "verdict": "yes", "gates": [], "finishedAt": 5}}],
)  # fmt: skip
def test_hostile_rollouts_read_as_not_reusable(junk: Any) -> None:
    assert find(junk, promoted(name="good")) is not None  # the good one is still found
    assert find(junk) is None


def test_the_freshest_of_several_is_taken() -> None:
    older = promoted("older", ended=NOW - dt.timedelta(hours=5))
    newer = promoted("newer", ended=NOW - dt.timedelta(minutes=10))
    found = find(older, newer)
    assert found is not None and found.source == "ns/newer"


def test_off_unless_the_spec_asks() -> None:
    assert reuse.find(KEY, None, [promoted()], namespace="ns", name="x", now=NOW) is None


def test_the_spec_field() -> None:
    base = {"targetRef": {"name": "vllm"}}
    assert RolloutSpec.from_dict(base).reuse_verdict is None
    assert RolloutSpec.from_dict({**base, "reuseVerdict": {}}).reuse_verdict == DAY
    short = RolloutSpec.from_dict({**base, "reuseVerdict": {"maxAge": "2h"}}).reuse_verdict
    assert short == VerdictReuse(max_age_s=7200.0)
    with pytest.raises(ExceptionGroup) as caught:
        RolloutSpec.from_dict({**base, "reuseVerdict": {"maxAge": "10s"}})
    (error,) = caught.value.exceptions
    assert isinstance(error, SpecError) and "spec.reuseVerdict.maxAge" in str(error)


# --- the controller, on the fake cluster -----------------------------------------------------


def _world(monkeypatch: pytest.MonkeyPatch, node: str = "l4-1", **spec: Any) -> World:
    world = World(monkeypatch, **spec)
    world.kube.add(gpu_node("l4-1", L4))
    world.kube.add(gpu_node("h100-1", H100))
    world.kube.add(gpu_node("plain-1", None))
    world.kube.node = node
    world.kube.edit_container("vllm", resources={"limits": {"nvidia.com/gpu": "1"}})
    world.original = dict(world.kube.container())
    return world


@pytest.fixture
def first(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A rollout of the change that ran its own eval and load and was promoted, on an L4."""
    world = _world(monkeypatch)
    assert world.run() == "Promoted"
    obj = copy.deepcopy(world.obj)
    obj["metadata"]["name"] = "first"
    return obj


class Listed:
    """The namespace's rollouts as the API lists them; `calls` counts the LISTs made in the
    canary phase (Pending lists them too, to refuse a second rollout on one Deployment)."""

    def __init__(self, world: World, *rollouts: dict[str, Any]) -> None:
        self.world, self.rollouts, self.calls = world, list(rollouts), 0

    def __call__(self, namespace: str) -> list[dict[str, Any]]:
        self.calls += self.world.phase == "Canary"
        return copy.deepcopy(self.rollouts)


def _second(
    monkeypatch: pytest.MonkeyPatch, first: dict[str, Any], *, node: str = "l4-1", **spec: Any
) -> tuple[World, Listed, list[str]]:
    """The same change again, an hour after the first ended; returns the kinds it created."""
    world = _world(monkeypatch, node=node, **spec)
    ended = dt.datetime.fromisoformat(first["status"]["finishedAt"].replace("Z", "+00:00"))
    world.now = ended + dt.timedelta(hours=1)
    listed = Listed(world, first)
    world.kube.list_rollouts = listed  # type: ignore[method-assign]
    created: list[str] = []
    ensure = world.kube.ensure

    def recording(body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        obj, made = ensure(body)
        if made:
            created.append(str(body["kind"]))
        return obj, made

    world.kube.ensure = recording  # type: ignore[method-assign]
    return world, listed, created


REUSE = {"reuseVerdict": {"maxAge": "24h"}}


def test_the_same_change_on_the_same_gpu_and_image_reuses_the_verdict(
    monkeypatch: pytest.MonkeyPatch, first: dict[str, Any]
) -> None:
    world, listed, created = _second(monkeypatch, first, **REUSE)
    assert world.run() == "Promoted", world.obj["status"].get("message")
    world.assert_invariant()
    status = world.obj["status"]
    # no eval and no load of its own: the canary phase went straight to the promotion
    assert "Evaluating" not in world.phases and "Job" not in created, (world.phases, created)
    assert created.count("Pod") == 2  # the canaries still ran: the key is read from them
    assert listed.calls == 1
    assert status["verdict"]["reusedFrom"] == "ns/first"
    assert status["verdict"]["key"] == first["status"]["verdict"]["key"]
    assert status["gates"]["accuracy"] == first["status"]["gates"]["accuracy"]
    reused = [(t, m) for t, r, m in world.events if r == "VerdictReused"]
    assert len(reused) == 1 and reused[0][0] == "Normal"
    assert reused[0][1].startswith("reused the verdict of ns/first (Promoted 60 min ago")
    assert "--kv-cache-dtype" in world.kube.container()["args"]


def test_reuse_is_off_by_default(monkeypatch: pytest.MonkeyPatch, first: dict[str, Any]) -> None:
    world, listed, created = _second(monkeypatch, first)
    assert world.run() == "Promoted"
    assert "Evaluating" in world.phases and "Job" in created
    assert listed.calls == 0
    assert "reusedFrom" not in world.obj["status"]["verdict"]


@pytest.mark.parametrize("change", ["gpu", "image digest", "unknown gpu", "too old"])
def test_anything_else_runs_its_own_eval(
    monkeypatch: pytest.MonkeyPatch, first: dict[str, Any], change: str
) -> None:
    node = {"gpu": "h100-1", "unknown gpu": "plain-1"}.get(change, "l4-1")
    spec = {"reuseVerdict": {"maxAge": "30m"}} if change == "too old" else REUSE
    world, listed, created = _second(monkeypatch, first, node=node, **spec)
    if change == "image digest":  # the same tag, pushed again: another digest
        world.kube.registry_epoch += 1
    assert world.run() == "Promoted"
    assert "Evaluating" in world.phases and "Job" in created, change
    assert "reusedFrom" not in world.obj["status"]["verdict"]
    assert not any(r == "VerdictReused" for _, r, _ in world.events)
    # an unknown GPU is decided without asking the API: nothing could match it
    assert listed.calls == (0 if change == "unknown gpu" else 1)


def test_a_reused_verdict_is_read_back_from_status() -> None:
    status = RolloutStatus.from_dict({"verdict": {"decision": "Promote", "reusedFrom": "ns/a"}})
    assert status.verdict is not None and status.verdict.reused_from == "ns/a"
    assert RolloutStatus.from_dict(status.to_dict()) == status


def test_the_report_says_whose_verdict_was_reused(
    monkeypatch: pytest.MonkeyPatch, first: dict[str, Any]
) -> None:
    from kvgate import report

    world, _, _ = _second(monkeypatch, first, **REUSE)
    assert world.run() == "Promoted"
    text = " ".join(report.render_text(world.obj).split())
    assert "(reused from ns/first: its eval and load, the same verdict key)" in text
    assert "reused from" not in " ".join(report.render_text(first).split())


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_an_operator_killed_at_any_write_of_a_reuse_still_ends_promoted_once(
    monkeypatch: pytest.MonkeyPatch, first: dict[str, Any], after: bool
) -> None:
    """Killed before or after each change kvgate makes to the cluster, the rollout resumes and
    ends as the clean run did: Promoted on the reused verdict, patched once, no eval Job."""
    clean, _, _ = _second(monkeypatch, first, **REUSE)
    assert clean.run() == "Promoted"
    mutations = clean.kube.mutations
    assert mutations >= 4
    for k in range(1, mutations + 1):
        world, _, created = _second(monkeypatch, first, **REUSE)
        world.kube.crash_at, world.kube.crash_after = k, after
        assert world.run() == "Promoted", f"crash at mutation {k}"
        assert world.crashes == 1, f"mutation {k} was never reached"
        world.assert_invariant()
        assert world.obj["status"]["verdict"]["reusedFrom"] == "ns/first"
        assert "Job" not in created and world.reasons().count("Promoting") <= 1


def test_an_approved_reuse_still_says_whose_verdict_it_was(
    monkeypatch: pytest.MonkeyPatch, first: dict[str, Any]
) -> None:
    """In manual mode the approval decides the verdict again; it rests on the reused gates, so
    `reusedFrom` stays, and the promoted rollout is never reused in turn (no chain of reuses
    that would outlive maxAge)."""
    manual = {"mode": "manual", "verifyWindow": "4s", "verifySamples": 3}
    world, _, created = _second(monkeypatch, first, promotion=manual, **REUSE)
    for _ in range(100):
        world.reconcile()
        world.now += dt.timedelta(seconds=5)
        if world.phase == "AwaitingApproval":
            break
    assert world.obj["status"]["verdict"]["reusedFrom"] == "ns/first"
    approval = world.obj["status"]["configHash"]
    world.obj["metadata"]["annotations"] = {"kvgate.io/approve": approval}
    assert world.run() == "Promoted"
    assert ("Normal", "Approved", f"approved for config {approval}") in world.events
    assert world.obj["status"]["verdict"]["reusedFrom"] == "ns/first"
    assert "Job" not in created
    # a third rollout a minute later would not take it: a reused verdict is not lent again
    status = RolloutStatus.from_dict(world.obj["status"])
    assert status.verdict is not None and status.verdict.key is not None
    key = status.verdict.key
    later = world.now + dt.timedelta(minutes=1)
    second = {**copy.deepcopy(world.obj), "metadata": {"name": "second"}}
    assert reuse.find(key, DAY, [second], namespace="ns", name="third", now=later) is None
    del second["status"]["verdict"]["reusedFrom"]  # what the approval used to write
    assert reuse.find(key, DAY, [second], namespace="ns", name="third", now=later) is not None
